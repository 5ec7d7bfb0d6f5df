//! The page of a sweep folder, from `sweep.json` alone: rate and throughput at target with their
//! intervals per cache mode, latency against throughput through the probes with the SLO and the
//! rate at target marked, every probe's verdict, and — when the sweep covers several block sizes
//! — throughput at target against block size.

use std::path::Path;

use super::super::plot::data::{self, Probe, Sweep, SweepRun};
use super::super::plot::ticks::fmt_time_ms;
use super::super::plot::{blocks, latency, Series};
use super::{esc, figure, note, table, verdict, ReportError};

/// One latency-against-throughput plot: which probe figure it draws and its target.
struct ProbePlot {
    title: &'static str,
    y_label: &'static str,
    unit: &'static str,
    slo: Option<f64>,
    value: fn(&Probe) -> f64,
    interval: fn(&Probe) -> Option<[f64; 2]>,
}

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "-".into(),
    }
}

fn ci(v: Option<[f64; 2]>, decimals: usize) -> String {
    match v {
        Some([lo, hi]) => format!("[{}, {}]", num(Some(lo), decimals), num(Some(hi), decimals)),
        None => "-".into(),
    }
}

fn run_label(r: &SweepRun) -> String {
    match r.block_size {
        Some(b) => format!("{} bs{b}", r.cache),
        None => r.cache.clone(),
    }
}

fn summary_table(s: &Sweep) -> String {
    let head = [
        "cache",
        "rate at target (req/s)",
        "95% CI",
        "throughput at target (tok/s)",
        "95% CI",
        "TTFT p50 / p99",
        "ITL p50 / p99",
        "probes",
    ]
    .map(String::from);
    let dist = |d: &Option<data::Dist>| {
        d.as_ref().map_or("-".into(), |d| {
            format!("{} / {}", fmt_time_ms(d.p50), fmt_time_ms(d.p99))
        })
    };
    let rows: Vec<Vec<String>> = s
        .runs
        .iter()
        .map(|r| {
            vec![
                run_label(r),
                num(r.rate_at_target_rps, 3),
                ci(r.rate_at_target_rps_ci, 3),
                num(r.throughput_at_target_tokens_per_s, 1),
                ci(r.throughput_at_target_tokens_per_s_ci, 1),
                dist(&r.ttft_ms),
                dist(&r.itl_ms),
                r.probes.len().to_string(),
            ]
        })
        .collect();
    table(&head, &rows)
}

fn probe_table(r: &SweepRun) -> String {
    let head = [
        "load",
        "offered (req/s)",
        "achieved (req/s)",
        "throughput (tok/s)",
        "TTFT p99 [95% CI]",
        "ITL p99 (ms) [95% CI]",
        "attainment [95% CI]",
        "samples",
        "verdict",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = r
        .probes
        .iter()
        .map(|p| {
            vec![
                format!("{:.3}", p.load),
                format!("{:.3}", p.offered_rps),
                format!("{:.3}", p.achieved_rps),
                format!("{:.1}", p.throughput_tokens_per_s),
                format!(
                    "{} {}",
                    fmt_time_ms(p.ttft_p99_ms),
                    p.ttft_p99_ms_ci.map_or("-".into(), |[lo, hi]| format!(
                        "[{}, {}]",
                        fmt_time_ms(lo),
                        fmt_time_ms(hi)
                    ))
                ),
                format!("{:.3} {}", p.itl_p99_ms, ci(p.itl_p99_ms_ci, 3)),
                format!("{:.4} {}", p.attainment, ci(p.attainment_ci, 4)),
                p.samples.to_string(),
                format!(
                    "{}{}",
                    p.verdict,
                    if p.oversaturated {
                        " (oversaturated)"
                    } else {
                        ""
                    }
                ),
            ]
        })
        .collect();
    table(&head, &rows)
}

/// Probes in throughput order, as `(throughput, value)` with the value's interval.
fn probe_series(
    r: &SweepRun,
    value: impl Fn(&Probe) -> f64,
    interval: impl Fn(&Probe) -> Option<[f64; 2]>,
) -> Series {
    let mut probes: Vec<&Probe> = r.probes.iter().collect();
    probes.sort_by(|a, b| {
        a.throughput_tokens_per_s
            .total_cmp(&b.throughput_tokens_per_s)
    });
    let ci: Vec<(f64, f64)> = probes
        .iter()
        .map(|p| interval(p).map_or((f64::NAN, f64::NAN), |[lo, hi]| (lo, hi)))
        .collect();
    Series {
        label: run_label(r),
        points: probes
            .iter()
            .map(|p| (p.throughput_tokens_per_s, value(p)))
            .collect(),
        ci,
    }
}

/// Rate at target against host-tier capacity, from `sweep.json`'s `capacities[]` (present only
/// when the scenario lists several): one row per capacity for the paged cache, the contiguous
/// baseline stated once below (it has no tier).
fn capacity_table(dir: &Path, s: &Sweep) -> Result<String, ReportError> {
    let path = dir.join("sweep.json");
    let text = std::fs::read_to_string(&path).map_err(|e| data::file_error(&path, e))?;
    let j: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| data::file_error(&path, e))?;
    let Some(caps) = j["capacities"].as_array().filter(|c| !c.is_empty()) else {
        return Ok(String::new());
    };
    let f = |v: &serde_json::Value| v.as_f64();
    let pair = |v: &serde_json::Value| Some([v[0].as_f64()?, v[1].as_f64()?]);
    let head = [
        "host tier",
        "paged rate at target (req/s)",
        "95% CI",
        "throughput at target (tok/s)",
        "95% CI",
        "TTFT p50 / p99",
        "paged ÷ contiguous",
        "95% CI",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = caps
        .iter()
        .map(|c| {
            let r = &c["paged"];
            let dist = match (f(&r["ttft_ms"]["p50"]), f(&r["ttft_ms"]["p99"])) {
                (Some(a), Some(b)) => format!("{} / {}", fmt_time_ms(a), fmt_time_ms(b)),
                _ => "-".into(),
            };
            vec![
                c["host_tier"].as_str().unwrap_or("-").to_string(),
                num(f(&r["rate_at_target_rps"]), 3),
                ci(pair(&r["rate_at_target_rps_ci"]), 3),
                num(f(&r["throughput_at_target_tokens_per_s"]), 1),
                ci(pair(&r["throughput_at_target_tokens_per_s_ci"]), 1),
                dist,
                num(f(&c["ratio_paged_over_contiguous"]), 3),
                ci(pair(&c["ratio_paged_over_contiguous_ci"]), 3),
            ]
        })
        .collect();
    let mut out = String::from("<h2>Rate at target by host-tier capacity</h2>\n");
    out.push_str(&table(&head, &rows));
    if let Some(r) = s.runs.iter().find(|r| r.cache == "contiguous") {
        out.push_str(&note(&format!(
            "The contiguous cache has no host tier: one search serves every capacity (rate at target {} req/s, 95% CI {}). The summary above shows the paged cache at the first capacity listed.",
            num(r.rate_at_target_rps, 3),
            ci(r.rate_at_target_rps_ci, 3)
        )));
    }
    Ok(out)
}

pub fn page(dir: &Path) -> Result<(String, String), ReportError> {
    let s = data::sweep(dir)?;
    let title = format!("kvbench sweep: {}", s.scenario);
    let mut body = format!("<h1>{}</h1>\n", esc(&title));
    let stated: Vec<String> = [
        ("p99 TTFT ≤", s.slo.ttft_p99_ms, " ms"),
        ("p99 inter-token gap ≤", s.slo.itl_p99_ms, " ms"),
        ("attainment ≥", s.slo.attainment, " of requests"),
    ]
    .iter()
    .filter_map(|(what, v, unit)| v.map(|v| format!("{what} {v}{unit}")))
    .collect();
    let slo_words = if stated.is_empty() {
        "none stated".to_string()
    } else {
        stated.join(", ")
    };
    body.push_str(&verdict::sweep(&s, &slo_words));
    body.push_str(&format!(
        "<p>backend <code>{}</code>, by {}, seeds {:?}, precision {}%, workload <code>{}</code>; \
         SLO: {}</p>\n",
        esc(&s.backend),
        esc(&s.by),
        s.seeds,
        num(s.precision_pct, 1),
        esc(&s.workload_hash),
        esc(&slo_words),
    ));
    body.push_str(&summary_table(&s));
    body.push_str(&format!(
        "<p>throughput at target, paged ÷ contiguous: <b>{}</b> (95% CI {})</p>\n",
        num(s.ratio_paged_over_contiguous, 3),
        ci(s.ratio_paged_over_contiguous_ci, 3)
    ));
    body.push_str(&capacity_table(dir, &s)?);

    let targets: Vec<(String, f64)> = s
        .runs
        .iter()
        .filter_map(|r| {
            r.throughput_at_target_tokens_per_s
                .map(|t| (run_label(r), t))
        })
        .collect();
    let plots = [
        ProbePlot {
            title: "p99 TTFT against throughput",
            y_label: "p99 TTFT (ms)",
            unit: "ms",
            slo: s.slo.ttft_p99_ms,
            value: |p| p.ttft_p99_ms,
            interval: |p| p.ttft_p99_ms_ci,
        },
        ProbePlot {
            title: "p99 inter-token gap against throughput",
            y_label: "p99 inter-token gap (ms)",
            unit: "ms",
            slo: s.slo.itl_p99_ms,
            value: |p| p.itl_p99_ms,
            interval: |p| p.itl_p99_ms_ci,
        },
        ProbePlot {
            title: "SLO attainment against throughput",
            y_label: "SLO attainment (share of requests)",
            unit: "of requests",
            slo: s.slo.attainment,
            value: |p| p.attainment,
            interval: |p| p.attainment_ci,
        },
    ];
    body.push_str("<h2>Latency against throughput</h2>\n");
    for (i, plot) in plots.into_iter().enumerate() {
        // Attainment is plotted only when the scenario targets it.
        if i == 2 && plot.slo.is_none() {
            continue;
        }
        let series: Vec<Series> = s
            .runs
            .iter()
            .map(|r| probe_series(r, plot.value, plot.interval))
            .collect();
        let svg = latency::svg(&latency::LatencyPlot {
            title: plot.title,
            x_label: "throughput (tokens/s)",
            y_label: plot.y_label,
            series: &series,
            slo: plot.slo,
            unit: plot.unit,
            targets: &targets,
            log_ok: i != 2,
        })?;
        body.push_str(&figure(
            &svg,
            "Each probe of `sweep.json`, with error bars for its 95% interval over seeds; dashed red: the target; dashed verticals: each mode's throughput at target (tokens/s).",
        ));
    }

    let mut by_cache: Vec<blocks::Tradeoff> = Vec::new();
    for r in &s.runs {
        if let (Some(b), Some(t)) = (r.block_size, r.throughput_at_target_tokens_per_s) {
            match by_cache.iter_mut().find(|x| x.label == r.cache) {
                Some(x) => x.points.push((b, f64::from(b), t)),
                None => by_cache.push(blocks::Tradeoff {
                    label: r.cache.clone(),
                    points: vec![(b, f64::from(b), t)],
                }),
            }
        }
    }
    if by_cache.iter().any(|t| t.points.len() >= 2) {
        let svg = blocks::svg(
            "Block size against throughput at target",
            "block size (tokens)",
            "throughput at target (tokens/s)",
            &by_cache,
        )?;
        body.push_str(&figure(
            &svg,
            "Throughput at target per block size, from `sweep.json`.",
        ));
    }

    body.push_str("<h2>Probes</h2>\n");
    for r in &s.runs {
        body.push_str(&format!("<h3>{}</h3>\n", esc(&run_label(r))));
        if r.probes.is_empty() {
            body.push_str(&note("No probes."));
        } else {
            body.push_str(&probe_table(r));
        }
    }
    Ok((title, body))
}
