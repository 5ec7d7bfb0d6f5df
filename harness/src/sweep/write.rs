//! `sweep.json` and `sweep.md`, written together into one folder.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::aggregate::{ProbeJson, RunJson, SweepJson};

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

fn ci(v: [Option<f64>; 2], digits: usize) -> String {
    let side =
        |x: Option<f64>, inf: &str| x.map_or_else(|| inf.to_string(), |x| format!("{x:.digits$}"));
    format!("[{}, {}]", side(v[0], "-inf"), side(v[1], "inf"))
}

fn verdict_cell(p: &ProbeJson) -> String {
    let mut s = p.verdict.name().to_string();
    if p.oversaturated {
        s.push_str(", oversaturated");
    }
    if p.request_factor > 1 {
        let _ = write!(s, ", {}x requests", p.request_factor);
    }
    s
}

/// The runs whose probes are listed: `runs`, or — over several host-tier capacities — each
/// capacity's paged run and then the contiguous one (so the first capacity is not listed twice).
fn probe_runs(j: &SweepJson) -> Vec<&RunJson> {
    if j.capacities.is_empty() {
        return j.runs.iter().collect();
    }
    j.capacities
        .iter()
        .map(|c| &c.paged)
        .chain(j.runs.iter().filter(|r| r.host_tier.is_none()))
        .collect()
}

/// A probe's cache column: the mode, and the capacity where the sweep lists several.
fn cache_cell(p: &ProbeJson) -> String {
    match &p.host_tier {
        Some(h) => format!("{} (host {h})", p.cache),
        None => p.cache.clone(),
    }
}

/// A run's cache column: the mode, and the capacity where the sweep lists several.
fn run_cell(r: &RunJson) -> String {
    match &r.host_tier {
        Some(h) => format!("{} (host {h})", r.cache),
        None => r.cache.clone(),
    }
}

/// Rate at target against host-tier capacity: one row per capacity for the paged cache, and the
/// contiguous baseline stated once (it has no tier).
fn capacity_table(j: &SweepJson) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Rate at target by host-tier capacity

| host tier | paged rate at target (req/s offered) | 95% interval | achieved there (req/s) | throughput at target (tok/s) | 95% interval | TTFT p99 (ms) | paged / contiguous | 95% interval |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for c in &j.capacities {
        let r = &c.paged;
        let _ = writeln!(
            md,
            "| {} | {} | {} | [{:.3}, {:.3}] |",
            c.host_tier,
            at_target_cells(r),
            opt(c.ratio_paged_over_contiguous, 3),
            c.ratio_paged_over_contiguous_ci[0],
            c.ratio_paged_over_contiguous_ci[1],
        );
    }
    if let Some(r) = j.runs.iter().find(|r| r.host_tier.is_none()) {
        let _ = writeln!(
            md,
            "
The {} cache has no host tier: one search serves every capacity, rate at target {} req/s offered [{:.3}, {:.3}]. The first table shows the paged cache at the first capacity listed.
",
            r.cache,
            opt(r.rate_at_target_rps, 3),
            r.rate_at_target_rps_ci[0],
            r.rate_at_target_rps_ci[1],
        );
    }
    md
}

/// The cells every rate-at-target row shares: rate (with its interval), achieved rate,
/// throughput (with its interval) and p99 TTFT at target.
fn at_target_cells(r: &RunJson) -> String {
    format!(
        "{}{} | [{:.3}, {:.3}] | {} | {} | [{:.1}, {:.1}] | {:.1}",
        opt(r.rate_at_target_rps, 3),
        if r.capped { " (search limit)" } else { "" },
        r.rate_at_target_rps_ci[0],
        r.rate_at_target_rps_ci[1],
        opt(r.achieved_at_target_rps, 3),
        opt(r.throughput_at_target_tokens_per_s, 1),
        r.throughput_at_target_tokens_per_s_ci[0],
        r.throughput_at_target_tokens_per_s_ci[1],
        r.ttft_ms.p99,
    )
}

/// The markdown table of a sweep: one row per cache mode, then every probe.
pub fn markdown(j: &SweepJson) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# kvbench sweep: {}\n", j.scenario);
    let target = [
        j.slo.ttft_p99_ms.map(|t| format!("p99 TTFT ≤ {t} ms")),
        j.slo
            .itl_p99_ms
            .map(|t| format!("p99 inter-token gap ≤ {t} ms")),
        j.slo.attainment.map(|a| format!("attainment ≥ {a}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    let _ = writeln!(
        md,
        "Backend `{}`, by {}, seeds {:?}, precision {}%; target: {target}. Intervals are {}%; the first and last {}% of requests are trimmed.\n",
        j.backend,
        j.by.name(),
        j.seeds,
        j.precision_pct,
        j.confidence * 100.0,
        j.trim_share * 100.0
    );
    let _ = writeln!(
        md,
        "| cache | rate at target (req/s offered) | 95% interval | achieved there (req/s) | throughput at target (tok/s) | 95% interval | TTFT p99 (ms) | ITL p99 (ms) |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in &j.runs {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} |",
            run_cell(r),
            at_target_cells(r),
            r.itl_ms.p99,
        );
    }
    let _ = writeln!(
        md,
        "\nPaged / contiguous rate at target: {} (95% interval [{:.3}, {:.3}]).\n",
        opt(j.ratio_paged_over_contiguous, 3),
        j.ratio_paged_over_contiguous_ci[0],
        j.ratio_paged_over_contiguous_ci[1]
    );
    if !j.capacities.is_empty() {
        md.push_str(&capacity_table(j));
    }
    let _ = writeln!(
        md,
        "## Probes\n\n| cache | seed | load | offered (req/s) | achieved (req/s) | throughput (tok/s) | TTFT p99 (ms) [95%] | ITL p99 (ms) [95%] | attainment [95%] | samples | verdict |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in probe_runs(j) {
        for p in &r.probes {
            let _ = writeln!(
                md,
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.1} | {:.1} {} | {:.1} {} | {:.3} [{:.3}, {:.3}] | {} | {} |",
                cache_cell(p),
                p.seed,
                p.load,
                p.offered_rps,
                p.achieved_rps,
                p.throughput_tokens_per_s,
                p.ttft_p99_ms,
                ci(p.ttft_p99_ms_ci_ends, 1),
                p.itl_p99_ms,
                ci(p.itl_p99_ms_ci_ends, 1),
                p.attainment,
                p.attainment_ci[0],
                p.attainment_ci[1],
                p.samples,
                verdict_cell(p),
            );
        }
    }
    if !j.check_failures.is_empty() {
        let _ = writeln!(md, "\n## Check failures\n");
        for f in &j.check_failures {
            let _ = writeln!(md, "- {f}");
        }
    }
    md
}

/// The per-mode figures as a few lines for the terminal (the probes are in `sweep.md`).
pub fn summary_lines(j: &SweepJson) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{} on {} (by {}):", j.scenario, j.backend, j.by.name());
    for r in &j.runs {
        let _ =
            writeln!(
            s,
            "  {:<10} rate at target {} req/s offered [{:.3}, {:.3}], {} req/s achieved, throughput {} tok/s [{:.1}, {:.1}]{}",
            r.cache,
            opt(r.rate_at_target_rps, 3),
            r.rate_at_target_rps_ci[0],
            r.rate_at_target_rps_ci[1],
            opt(r.achieved_at_target_rps, 3),
            opt(r.throughput_at_target_tokens_per_s, 1),
            r.throughput_at_target_tokens_per_s_ci[0],
            r.throughput_at_target_tokens_per_s_ci[1],
            if r.capped { " (search limit: a lower bound)" } else { "" }
        );
    }
    let _ = writeln!(
        s,
        "  paged/contiguous {} [{:.3}, {:.3}]",
        opt(j.ratio_paged_over_contiguous, 3),
        j.ratio_paged_over_contiguous_ci[0],
        j.ratio_paged_over_contiguous_ci[1]
    );
    for c in &j.capacities {
        let r = &c.paged;
        let _ = writeln!(
            s,
            "  paged, host {:<9} rate at target {} req/s offered [{:.3}, {:.3}], paged/contiguous {} [{:.3}, {:.3}]{}",
            c.host_tier,
            opt(r.rate_at_target_rps, 3),
            r.rate_at_target_rps_ci[0],
            r.rate_at_target_rps_ci[1],
            opt(c.ratio_paged_over_contiguous, 3),
            c.ratio_paged_over_contiguous_ci[0],
            c.ratio_paged_over_contiguous_ci[1],
            if r.capped { " (search limit: a lower bound)" } else { "" }
        );
    }
    s
}

fn io(p: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", p.display())
}

/// May a sweep folder be written at `out`? Refused: a file or link there, an existing folder
/// without `force`, and — whatever `force` says — a folder that is neither empty nor a sweep
/// folder kvbench marked (`results::staging::check_target`): that is someone's data.
pub fn check_target(out: &Path, force: bool) -> Result<(), String> {
    use crate::results::{marker, staging, ResultsError};
    staging::check_target(out, marker::Kind::Sweep, force).map_err(|e| match e {
        ResultsError::NotAFolder(_) => format!("{}: exists and is not a folder", out.display()),
        ResultsError::NotResults { why, .. } => format!(
            "{}: not a sweep folder ({why}); refusing to replace it",
            out.display()
        ),
        other => other.to_string(),
    })
}

/// Write both files into `out` via a temporary sibling folder renamed into place; a replaced
/// folder is moved aside first and removed only once the new one is in place.
pub fn write_folder(j: &SweepJson, out: &Path, force: bool) -> Result<(), String> {
    check_target(out, force)?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io(&parent, e))?;
    let name = out
        .file_name()
        .map_or_else(|| "sweep".into(), |n| n.to_string_lossy().to_string());
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    std::fs::create_dir(&tmp).map_err(|e| io(&tmp, e))?;
    let result = (|| {
        let mut text = serde_json::to_string_pretty(j).map_err(|e| e.to_string())?;
        text.push('\n');
        std::fs::write(tmp.join("sweep.json"), text).map_err(|e| io(&tmp, e))?;
        std::fs::write(tmp.join("sweep.md"), markdown(j)).map_err(|e| io(&tmp, e))?;
        crate::results::marker::mark(&tmp, crate::results::marker::Kind::Sweep)
            .map_err(|e| e.to_string())?;
        if out.exists() {
            std::fs::rename(out, &old).map_err(|e| io(out, e))?;
            std::fs::rename(&tmp, out).map_err(|e| io(out, e))?;
            std::fs::remove_dir_all(&old).map_err(|e| io(&old, e))
        } else {
            std::fs::rename(&tmp, out).map_err(|e| io(out, e))
        }
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}
