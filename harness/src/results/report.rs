//! The side-by-side table (terminal and `report.md`): paged next to contiguous on one request
//! list.

use super::experiment::Experiment;
use crate::units::format_bytes;

/// What a figure of a run stopped early prints instead of itself.
pub const ABORTED: &str = "aborted";

/// The goodput row's name: its unit and each per-request target it counts, with units.
pub fn goodput_label(slo: &crate::scenario::SloSpec) -> String {
    let mut targets = Vec::new();
    if let Some(ms) = slo.ttft_p99_ms {
        targets.push(format!("TTFT <= {ms} ms"));
    }
    if let Some(ms) = slo.itl_p99_ms {
        targets.push(format!("TPOT <= {ms} ms"));
    }
    if targets.is_empty() {
        "goodput (req/s, no SLO: every completed request)".into()
    } else {
        format!("goodput (req/s with {})", targets.join(", "))
    }
}

/// Rows of (metric, paged, contiguous).
pub fn rows(exp: &Experiment) -> Vec<(String, Vec<String>)> {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut add = |name: &str, f: &dyn Fn(&super::experiment::ModeRun) -> String| {
        rows.push((name.to_string(), exp.runs.iter().map(f).collect()));
    };
    // A run stopped by a violation (a planted fault caught, a cache error) has partial figures:
    // they are not measurements of the scenario and print as "aborted".
    let measured = |r: &super::experiment::ModeRun, text: String| {
        if r.end.violation.is_some() {
            ABORTED.to_string()
        } else {
            text
        }
    };
    add("throughput (tok/s)", &|r| {
        measured(r, format!("{:.1}", r.metrics.throughput_tokens_per_s))
    });
    add(&goodput_label(&exp.scenario.slo), &|r| {
        measured(r, format!("{:.3}", r.metrics.goodput_requests_per_s))
    });
    add("TTFT p50 / p99 (ms)", &|r| {
        measured(
            r,
            format!("{:.1} / {:.1}", r.metrics.ttft.p50, r.metrics.ttft.p99),
        )
    });
    add("TPOT p50 / p99 (ms, per request)", &|r| {
        measured(
            r,
            format!("{:.2} / {:.2}", r.metrics.tpot.p50, r.metrics.tpot.p99),
        )
    });
    add("ITL p50 / p99 (ms, every gap)", &|r| {
        measured(
            r,
            format!("{:.2} / {:.2}", r.metrics.itl.p50, r.metrics.itl.p99),
        )
    });
    add("E2E p50 / p99 (ms)", &|r| {
        measured(
            r,
            format!("{:.1} / {:.1}", r.metrics.e2e.p50, r.metrics.e2e.p99),
        )
    });
    add("peak concurrent sequences", &|r| {
        measured(r, r.end.peak_running.to_string())
    });
    add("KV waste (time-weighted)", &|r| {
        measured(
            r,
            format!("{:.1}%", 100.0 * r.metrics.ledger.kv_waste_fraction),
        )
    });
    add("KV peak allocated", &|r| {
        measured(r, format_bytes(r.metrics.ledger.kv_peak_allocated_bytes))
    });
    add("preemptions", &|r| {
        measured(r, r.metrics.preemptions.to_string())
    });
    add("prefix hit rate", &|r| {
        let p = &r.end.prefix;
        if p.lookup_tokens == 0 {
            "-".into()
        } else {
            format!(
                "{:.1}%",
                100.0 * p.hit_tokens as f64 / p.lookup_tokens as f64
            )
        }
    });
    if let Some(ideal) = exp
        .workload
        .trace
        .as_ref()
        .and_then(|t| t.ideal_prefix_hit_rate)
    {
        add("prefix hit ceiling (infinite cache)", &|r| {
            if r.end.prefix.lookup_tokens == 0 {
                "-".into()
            } else {
                format!("{:.1}%", 100.0 * ideal)
            }
        });
    }
    // Achieved beside the bounds, where the request list gives them and there is reuse to bound.
    if let Some(b) = exp
        .prefix_bounds
        .as_ref()
        .ok()
        .filter(|b| b.ceiling_hit_tokens > 0)
    {
        let policy = exp.scenario.cache.eviction.name();
        let label = format!(
            "prefix hit at admission / offline optimum / ceiling ({} blocks)",
            b.capacity_blocks
        );
        add(&label, &|r| {
            if r.end.mode != kvbench_cache_api::CacheMode::Paged || b.lookup_tokens == 0 {
                return "-".into();
            }
            let pct = |t: u64| 100.0 * t as f64 / b.lookup_tokens as f64;
            format!(
                "{:.1}% ({policy}) / {:.1}% / {:.1}%",
                pct(r.metrics.request_prefix_hit_tokens),
                pct(b.optimum_hit_tokens),
                pct(b.ceiling_hit_tokens)
            )
        });
    }
    add("completed / cancelled / rejected", &|r| {
        let c = &r.metrics.counts;
        format!("{} / {} / {}", c.completed, c.cancelled, c.rejected)
    });
    add("reclamation", &|r| {
        if r.end.reclamation.ok {
            "ok".into()
        } else {
            "FAILED".into()
        }
    });
    add("invariants", &|r| {
        if r.end.violation.is_none() {
            "ok".into()
        } else {
            "VIOLATED".into()
        }
    });
    // Only compute backends check numerics; on `sim` there is no figure to show.
    if exp.runs.iter().any(|r| r.end.numerics.is_some()) {
        add(
            "numerics max rel err (tolerance)",
            &|r| match r.end.numerics {
                Some(n) => format!(
                    "{:.2e} ({:.0e}){}",
                    n.max_rel_err,
                    n.tolerance,
                    if n.ok { "" } else { " FAILED" }
                ),
                None => "-".into(),
            },
        );
    }
    rows
}

/// A markdown table (also readable in a terminal).
pub fn table(exp: &Experiment) -> String {
    let rows = rows(exp);
    let heads: Vec<&str> = exp.runs.iter().map(|r| r.end.mode.name()).collect();
    let mut width = [6usize; 3];
    width[0] = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(6).max(6);
    for (i, h) in heads.iter().enumerate() {
        width[i + 1] = rows
            .iter()
            .map(|(_, v)| v[i].len())
            .max()
            .unwrap_or(0)
            .max(h.len());
    }
    let mut out = String::new();
    let line = |cells: &[&str]| {
        let mut s = String::from("|");
        for (i, c) in cells.iter().enumerate() {
            s.push_str(&format!(" {:<w$} |", c, w = width[i.min(2)]));
        }
        s.push('\n');
        s
    };
    let mut head = vec!["metric"];
    head.extend(heads.iter().copied());
    out.push_str(&line(&head));
    let dashes: Vec<String> = (0..head.len())
        .map(|i| "-".repeat(width[i.min(2)]))
        .collect();
    out.push_str(&line(
        &dashes.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    for (name, vals) in &rows {
        let mut cells = vec![name.as_str()];
        cells.extend(vals.iter().map(String::as_str));
        out.push_str(&line(&cells));
    }
    out
}

pub fn markdown(exp: &Experiment) -> String {
    let mut s = format!(
        "# kvbench run: {}\n\nbackend `{}`{}, seed {}, workload `{}`, block size {}, KV budget {}{}\n\n",
        exp.scenario.name,
        exp.backend,
        exp.recorded_manager()
            .map(|m| format!(", cache manager `{}`", m.name()))
            .unwrap_or_default(),
        exp.seed,
        exp.workload.workload_hash,
        exp.scenario.block_size(),
        format_bytes(exp.kv_budget_bytes),
        exp.fault.map(|f| format!(", planted fault `{}`", f.name())).unwrap_or_default()
    );
    if exp.backend == "cuda-emu" {
        s.push_str(
            "Timings are emulated: the host CPU running an emulated CUDA device, never \
             comparable with a GPU's.\n\n",
        );
    }
    if let Some(line) = trace_line(exp) {
        s.push_str(&line);
        s.push_str("\n\n");
    }
    s.push_str(&table(exp));
    let failures = exp.failures();
    for r in &exp.runs {
        if let Some(v) = &r.end.violation {
            s.push_str(&format!(
                "\nThe {} run was aborted ({v}): its figures are partial and are not shown as \
                 measurements.\n",
                r.end.mode.name()
            ));
        }
    }
    s.push_str(&super::tier_report::markdown(exp));
    s.push_str("\n## Checks\n\n");
    if failures.is_empty() {
        s.push_str("All checks passed (invariants, reclamation, numerics where computed).\n");
    } else {
        for f in failures {
            s.push_str(&format!("- FAILED: {f}\n"));
        }
    }
    if exp.backend == "sim" && !exp.shadow {
        // A reader must not take a clean sim run for a shadow-checked one.
        s.push_str(
            "\nThe shadow KV payload was switched off (`--no-shadow`): reads were not checked \
             against what was written.\n",
        );
    }
    s
}

/// What a replay took from its trace: the file, rows replayed of rows read, why the rest were
/// left out (a cap inherited from `traffic.requests` must not pass for the whole trace) and the
/// rows rejected at arrival as longer than `max_seq_len`.
pub fn trace_line(exp: &Experiment) -> Option<String> {
    let t = exp.workload.trace.as_ref()?;
    let traffic = &exp.scenario.traffic;
    let start_s = match &traffic.arrival {
        crate::scenario::ArrivalSpec::Trace(spec) => spec.start_s,
        _ => 0.0,
    };
    let limits = crate::workload::trace::ReplayLimits {
        max_requests: traffic.requests,
        duration_s: traffic.duration_s,
    };
    let mut s = format!(
        "trace `{}` ({}): {} of {} rows replayed",
        t.path, t.format, t.replayed, t.rows
    );
    if let Some(b) = t.hash_block_tokens {
        s.push_str(&format!(" ({b} tokens per hash id)"));
    }
    let left = t.left_out(&limits, start_s);
    if !left.is_empty() {
        s.push_str(&format!("; left out: {}", left.join(", ")));
    }
    let rejected: Vec<String> = exp
        .runs
        .iter()
        .map(|r| format!("{} {}", r.metrics.counts.rejected, r.end.mode.name()))
        .collect();
    s.push_str(&format!(
        "; rejected at arrival (prompt + output over max_seq_len = {} tokens, or empty): {}",
        exp.scenario.cache.max_seq_len,
        rejected.join(", ")
    ));
    Some(s)
}
