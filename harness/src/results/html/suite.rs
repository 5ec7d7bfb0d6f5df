//! The page of a suite folder: `suite.csv`'s table, headline bars per cell (throughput and p99
//! TTFT, paged against contiguous), the block-size trade-off of every scenario run at several
//! block sizes, hit share and TTFT against host-tier capacity for every scenario run at several
//! ([`super::tiers`]), and links to each cell's own page. Works on a suite written before `suite.json`
//! existed (the committed reference) from `suite.csv` and the cell folders alone.

use std::path::{Path, PathBuf};

use super::super::plot::data::{self, file_error};
use super::super::plot::ticks::{fmt_sig, fmt_time_ms, time_unit};
use super::super::plot::{bars, blocks, ratios};
use super::super::suite::{self, SuiteMeta};
use super::{esc, figure, note, table, ReportError};
use crate::stats;

/// The cell folders of a suite: from `suite.json`'s plan when present, else every
/// sub-folder holding a `summary.json`, in name order.
pub fn cell_dirs(dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    if dir.join("suite.json").is_file() {
        let meta = suite::read(dir)?;
        return Ok(meta.ran().iter().map(|c| dir.join(&c.dir)).collect());
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| file_error(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("summary.json").is_file())
        .collect();
    out.sort();
    Ok(out)
}

struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }
}

fn read_table(dir: &Path) -> Result<Table, ReportError> {
    let path = dir.join("suite.csv");
    let mut r = csv::Reader::from_path(&path).map_err(|e| file_error(&path, e))?;
    let header: Vec<String> = r
        .headers()
        .map_err(|e| file_error(&path, e))?
        .iter()
        .map(String::from)
        .collect();
    let rows = r
        .records()
        .map(|rec| {
            rec.map(|r| r.iter().map(String::from).collect())
                .map_err(|e| file_error(&path, e))
        })
        .collect::<Result<_, _>>()?;
    Ok(Table { header, rows })
}

/// The figures the ratio chart and the compact table show: `suite.csv` column, words with
/// unit, whether larger is better for the system.
const FIGURES: [(&str, &str, bool); 3] = [
    ("goodput_requests_per_s", "goodput (requests/s)", true),
    ("throughput_tokens_per_s", "throughput (tokens/s)", true),
    ("ttft_p99_ms", "TTFT p99", false),
];

/// One row of the ratio chart: a scenario (at one block size where it lists several) and its
/// seeds, each with its paged and contiguous rows of `suite.csv`.
struct Group {
    label: String,
    scenario: String,
    /// `(seed, paged row, contiguous row)`.
    seeds: Vec<(String, Option<usize>, Option<usize>)>,
}

fn groups(t: &Table) -> Vec<Group> {
    let (sc, bs, seed, cache) = (
        t.col("scenario"),
        t.col("block_size"),
        t.col("seed"),
        t.col("cache"),
    );
    let get =
        |r: &Vec<String>, c: Option<usize>| c.and_then(|c| r.get(c)).cloned().unwrap_or_default();
    let mut out: Vec<Group> = Vec::new();
    for (i, r) in t.rows.iter().enumerate() {
        let scenario = get(r, sc);
        let sizes = {
            let mut v: Vec<String> = t
                .rows
                .iter()
                .filter(|x| get(x, sc) == scenario)
                .map(|x| get(x, bs))
                .collect();
            v.sort();
            v.dedup();
            v.len()
        };
        let mut label = if sizes > 1 {
            format!("{scenario} bs{}", get(r, bs))
        } else {
            scenario.clone()
        };
        // A scenario run at several host-tier capacities: a group per capacity.
        let host = t.col("host_tier");
        let capacities = {
            let mut v: Vec<String> = t
                .rows
                .iter()
                .filter(|x| get(x, sc) == scenario)
                .map(|x| get(x, host))
                .collect();
            v.sort();
            v.dedup();
            v.len()
        };
        if capacities > 1 {
            label = format!("{label} host {}", get(r, host));
        }
        let gi = match out.iter().position(|g| g.label == label) {
            Some(gi) => gi,
            None => {
                out.push(Group {
                    label,
                    scenario,
                    seeds: Vec::new(),
                });
                out.len() - 1
            }
        };
        let s = get(r, seed);
        let g = &mut out[gi];
        let si = match g.seeds.iter().position(|x| x.0 == s) {
            Some(si) => si,
            None => {
                g.seeds.push((s, None, None));
                g.seeds.len() - 1
            }
        };
        match get(r, cache).as_str() {
            "paged" => g.seeds[si].1 = Some(i),
            "contiguous" => g.seeds[si].2 = Some(i),
            _ => {}
        }
    }
    out
}

fn value(t: &Table, row: usize, col: Option<usize>) -> Option<f64> {
    let v: f64 = t.rows.get(row)?.get(col?)?.parse().ok()?;
    v.is_finite().then_some(v)
}

/// Mean over the group's seeds of one mode's figure.
fn mode_mean(t: &Table, g: &Group, metric: &str, paged: bool) -> Option<f64> {
    let col = t.col(metric);
    let xs: Vec<f64> = g
        .seeds
        .iter()
        .filter_map(|s| value(t, if paged { s.1? } else { s.2? }, col))
        .collect();
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// Paged ÷ contiguous of `metric` over the group's seeds: the mean of the per-seed ratios and,
/// with two or more seeds, its 95% Student-t interval.
fn group_ratio(t: &Table, g: &Group, metric: &str) -> Option<ratios::Ratio> {
    let col = t.col(metric);
    let rs: Vec<f64> = g
        .seeds
        .iter()
        .filter_map(|s| {
            let (p, c) = (value(t, s.1?, col)?, value(t, s.2?, col)?);
            (c > 0.0).then(|| p / c)
        })
        .collect();
    if rs.is_empty() {
        // Only contiguous at 0 (no contiguous request met the SLO): paging wins outright.
        let only_paged = g.seeds.iter().any(|s| {
            matches!((s.1.and_then(|i| value(t, i, col)), s.2.and_then(|i| value(t, i, col))),
                (Some(p), Some(c)) if p > 0.0 && c == 0.0)
        });
        return only_paged.then_some(ratios::Ratio {
            mean: f64::INFINITY,
            ci: None,
        });
    }
    let (mean, _) = stats::mean_sd(&rs);
    let ci = if rs.len() >= 2 {
        stats::mean_interval(&rs, stats::CONFIDENCE)
    } else {
        None
    };
    Some(ratios::Ratio { mean, ci })
}

/// One trade-off plot per scenario that ran at several block sizes: mean KV waste against mean
/// throughput over its seeds, per cache mode and block size.
fn tradeoffs(t: &Table) -> Result<Vec<(String, String)>, ReportError> {
    let cols = [
        "scenario",
        "cache",
        "block_size",
        "kv_waste_fraction",
        "throughput_tokens_per_s",
    ]
    .map(|c| t.col(c));
    let [Some(sc), Some(cache), Some(bs), Some(waste), Some(tput)] = cols else {
        return Ok(Vec::new());
    };
    let mut scenarios: Vec<String> = Vec::new();
    for r in &t.rows {
        if !scenarios.contains(&r[sc]) {
            scenarios.push(r[sc].clone());
        }
    }
    let mut out = Vec::new();
    for s in scenarios {
        // (cache, block size) -> (sum waste %, sum throughput, n)
        let mut acc: Vec<(String, u32, f64, f64, u32)> = Vec::new();
        for r in t.rows.iter().filter(|r| r[sc] == s) {
            let (Ok(b), Ok(w), Ok(x)) = (
                r[bs].parse::<u32>(),
                r[waste].parse::<f64>(),
                r[tput].parse::<f64>(),
            ) else {
                continue;
            };
            match acc.iter_mut().find(|a| a.0 == r[cache] && a.1 == b) {
                Some(a) => {
                    a.2 += 100.0 * w;
                    a.3 += x;
                    a.4 += 1;
                }
                None => acc.push((r[cache].clone(), b, 100.0 * w, x, 1)),
            }
        }
        let mut series: Vec<blocks::Tradeoff> = Vec::new();
        for (mode, b, w, x, n) in acc {
            let p = (b, w / f64::from(n), x / f64::from(n));
            match series.iter_mut().find(|t| t.label == mode) {
                Some(t) => t.points.push(p),
                None => series.push(blocks::Tradeoff {
                    label: mode,
                    points: vec![p],
                }),
            }
        }
        if series.iter().any(|t| t.points.len() >= 2) {
            let svg = blocks::svg(
                &format!("Block size trade-off, {s}"),
                "KV waste (time-weighted, %)",
                "throughput (tokens/s)",
                &series,
            )?;
            out.push((s, svg));
        }
    }
    Ok(out)
}

fn describe(meta: &SuiteMeta) -> String {
    let shard = match (meta.shard, meta.merged_from.len()) {
        (Some(s), _) => format!(
            "shard {s} ({} of {} cells)",
            meta.results.len(),
            meta.plan.len()
        ),
        (None, 0) => format!("{} cells", meta.plan.len()),
        (None, n) => format!("{} cells, merged from {n} shards", meta.plan.len()),
    };
    format!(
        "<p>backend <code>{}</code>, {}, revision <code>{}</code>, plan <code>{}</code></p>\n",
        esc(&meta.backend),
        esc(&shard),
        esc(&meta.revision),
        esc(&meta.plan_hash[..meta.plan_hash.len().min(16)])
    )
}

/// The SLO's TTFT target per scenario, from the cells' `summary.json` where they record one.
fn ttft_targets(dir: &Path) -> Result<Vec<(String, f64)>, ReportError> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for cell in cell_dirs(dir)? {
        if !cell.join("summary.json").is_file() {
            continue;
        }
        let s = data::run_folder(&cell)?;
        let slo = s
            .slo
            .as_ref()
            .or_else(|| s.runs.iter().find_map(|r| r.slo.as_ref()));
        if let Some(t) = slo.and_then(|x| x.ttft_p99_ms) {
            if !out.iter().any(|(n, _)| *n == s.scenario) {
                out.push((s.scenario.clone(), t));
            }
        }
    }
    Ok(out)
}

fn compact_table(t: &Table, gs: &[Group], rs: &[Vec<Option<ratios::Ratio>>]) -> String {
    let head = [
        "scenario",
        "seeds",
        "goodput (req/s), paged / contiguous",
        "× [95% CI]",
        "throughput (tok/s), paged / contiguous",
        "× [95% CI]",
        "TTFT p99, paged / contiguous",
        "checks",
    ]
    .map(String::from);
    let (ok_col, recl_col) = (t.col("checks_ok"), t.col("reclamation_ok"));
    let rows: Vec<Vec<String>> = gs
        .iter()
        .zip(rs)
        .map(|(g, r)| {
            let pair = |metric: &str, f: &dyn Fn(f64) -> String| {
                let v = |paged| mode_mean(t, g, metric, paged).map_or("-".into(), f);
                format!("{} / {}", v(true), v(false))
            };
            let x = |k: usize| {
                r[k].map_or("-".into(), |r| match r.ci {
                    _ if r.mean.is_infinite() => "∞ (contiguous 0)".into(),
                    Some((lo, hi)) => format!("{:.2} [{:.2}, {:.2}]", r.mean, lo, hi),
                    None => format!("{:.2}", r.mean),
                })
            };
            let all_ok = g.seeds.iter().all(|s| {
                [s.1, s.2].iter().flatten().all(|&i| {
                    [ok_col, recl_col]
                        .iter()
                        .flatten()
                        .all(|&c| t.rows[i].get(c).map(String::as_str) == Some("true"))
                })
            });
            vec![
                g.label.clone(),
                g.seeds.len().to_string(),
                pair("goodput_requests_per_s", &|v| fmt_sig(v, 4)),
                x(0),
                pair("throughput_tokens_per_s", &|v| fmt_sig(v, 4)),
                x(1),
                pair("ttft_p99_ms", &fmt_time_ms),
                if all_ok { "ok" } else { "FAILED" }.to_string(),
            ]
        })
        .collect();
    table(&head, &rows).replacen("<table>", "<table class=\"compact\">", 1)
}

pub fn page(dir: &Path) -> Result<(String, String), ReportError> {
    let title = "kvbench suite".to_string();
    let mut body = format!("<h1>{title}</h1>\n");
    let meta = if dir.join("suite.json").is_file() {
        Some(suite::read(dir)?)
    } else {
        None
    };
    if let Some(m) = &meta {
        body.push_str(&describe(m));
    }
    let t = read_table(dir)?;

    // First: paged ÷ contiguous per scenario, sorted by goodput ratio (then throughput).
    let mut gs = groups(&t);
    let mut rs: Vec<Vec<Option<ratios::Ratio>>> = gs
        .iter()
        .map(|g| FIGURES.iter().map(|f| group_ratio(&t, g, f.0)).collect())
        .collect();
    let key = |r: &Vec<Option<ratios::Ratio>>| r[0].or(r[1]).map_or(f64::NEG_INFINITY, |x| x.mean);
    let mut order: Vec<usize> = (0..gs.len()).collect();
    order.sort_by(|&a, &b| key(&rs[b]).total_cmp(&key(&rs[a])));
    gs = order
        .iter()
        .map(|&i| {
            std::mem::replace(
                &mut gs[i],
                Group {
                    label: String::new(),
                    scenario: String::new(),
                    seeds: Vec::new(),
                },
            )
        })
        .collect();
    rs = order.iter().map(|&i| std::mem::take(&mut rs[i])).collect();

    let tally = |k: usize| {
        let mut c = [0usize; 3];
        for r in rs.iter().filter_map(|r| r[k]) {
            c[(ratios::leaning(&r, FIGURES[k].2) + 1) as usize] += 1;
        }
        c
    };
    let [worse, even, better] = tally(0);
    let with_seeds = gs.iter().filter(|g| g.seeds.len() >= 2).count();
    body.push_str(&format!(
        "<p id=\"verdict\" class=\"verdict\">By goodput, <b>paging pays in <span data-figure=\"pays\">{better}</span> of {} scenarios</b>, makes no difference in <span data-figure=\"even\">{even}</span> and does not pay in <span data-figure=\"worse\">{worse}</span> (paged ÷ contiguous from `suite.csv`{}). Green: paging better; red: contiguous better; grey: no clear difference.</p>\n",
        gs.len(),
        if with_seeds > 0 {
            "; mean over seeds with its 95% interval where a scenario ran at several"
        } else {
            "; one seed each, so no intervals"
        }
    ).replace('`', ""));
    if let Some(m) = &meta {
        let failures = m.failures();
        if !failures.is_empty() {
            body.push_str("<h2>Failed checks</h2>\n<ul>\n");
            for f in failures {
                body.push_str(&format!("<li>{}</li>\n", esc(&f)));
            }
            body.push_str("</ul>\n");
        }
    }
    let panels: Vec<ratios::Panel> = FIGURES
        .iter()
        .map(|(_, what, higher)| ratios::Panel {
            title: format!(
                "{what}: {} is better",
                if *higher { "> 1×" } else { "< 1×" }
            ),
            higher_is_better: *higher,
        })
        .collect();
    let rows: Vec<(String, Vec<Option<ratios::Ratio>>)> = gs
        .iter()
        .zip(&rs)
        .map(|(g, r)| (g.label.clone(), r.clone()))
        .collect();
    if rows.is_empty() {
        body.push_str(&note("suite.csv holds no rows to plot."));
    } else {
        let svg = ratios::svg("Paged ÷ contiguous per scenario", &panels, &rows)?;
        body.push_str(&figure(
            &svg,
            "Per scenario, each figure of paged over the same figure of contiguous (`suite.csv`, paired by seed, mean over seeds; bars: 95% Student-t interval over seeds where there are two or more). Sorted by the goodput ratio. An arrow at the right end: contiguous is 0 there (no request met the SLO), so paging wins outright; no point: no figure on either side.",
        ));
    }
    body.push_str("<h2>Headline figures</h2>\n");
    body.push_str(&compact_table(&t, &gs, &rs));
    body.push_str(&note(
        "Means over seeds; × is paged ÷ contiguous with its 95% interval. Every column of every cell is in suite.csv.",
    ));
    body.push_str("<p>All columns: <a href=\"suite.csv\">suite.csv</a>.</p>\n");

    let categories: Vec<String> = gs.iter().map(|g| g.label.clone()).collect();
    let mean_of = |metric: &str, paged: bool| -> Vec<f64> {
        gs.iter()
            .map(|g| mode_mean(&t, g, metric, paged).unwrap_or(f64::NAN))
            .collect()
    };
    let targets = ttft_targets(dir)?;
    let marks: Vec<Option<f64>> = gs
        .iter()
        .map(|g| targets.iter().find(|(n, _)| *n == g.scenario).map(|x| x.1))
        .collect();
    for (metric, title, x_label, log) in [
        (
            "ttft_p99_ms",
            "p99 TTFT per scenario",
            "p99 TTFT (ms)",
            true,
        ),
        (
            "throughput_tokens_per_s",
            "Throughput per scenario",
            "throughput (tokens/s)",
            false,
        ),
    ] {
        if t.col(metric).is_none() || categories.is_empty() {
            continue;
        }
        let mut groups = vec![
            ("paged".to_string(), mean_of(metric, true)),
            ("contiguous".to_string(), mean_of(metric, false)),
        ];
        // Latencies (the log chart) past 10 s read in s.
        let (div, unit) = if log {
            time_unit(
                groups
                    .iter()
                    .flat_map(|g| g.1.iter().copied())
                    .filter(|v| v.is_finite())
                    .fold(0.0, f64::max),
            )
        } else {
            (1.0, "ms")
        };
        for g in &mut groups {
            g.1.iter_mut().for_each(|v| *v /= div);
        }
        let shown_marks: Vec<Option<f64>> = if log {
            marks.iter().map(|m| m.map(|v| v / div)).collect()
        } else {
            Vec::new()
        };
        let x_label = x_label.replace("(ms)", &format!("({unit})"));
        let svg = bars::svg(&bars::Bars {
            title,
            x_label: &x_label,
            categories: &categories,
            groups: &groups,
            log,
            marks: &shown_marks,
            mark_label: "SLO: TTFT target",
        })?;
        let slo_note = if !log {
            ""
        } else if marks.iter().any(Option::is_some) {
            " Red ticks: each scenario's TTFT target (its cells' summary.json)."
        } else {
            " No cell's summary.json records an SLO, so no target is drawn."
        };
        body.push_str(&figure(
            &svg,
            &format!("`{metric}` of `suite.csv`, mean over seeds.{slo_note}"),
        ));
    }
    let trade = tradeoffs(&t)?;
    if !trade.is_empty() {
        body.push_str("<h2>Block size</h2>\n");
        for (s, svg) in trade {
            body.push_str(&figure(
                &svg,
                &format!("{s} at each block size it lists: `kv_waste_fraction` and `throughput_tokens_per_s` of `suite.csv`, averaged over seeds; labels are block sizes."),
            ));
        }
    }

    if let Some(m) = &meta {
        let ran: Vec<suite::Cell> = m.ran().into_iter().cloned().collect();
        body.push_str(&super::tiers::section(dir, &ran)?);
    }

    let cells = cell_dirs(dir)?;
    if !cells.is_empty() {
        body.push_str("<h2>Cells</h2>\n<ul>\n");
        for c in cells {
            let name = c
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().to_string());
            let link = if c.join("report.html").is_file() {
                format!("<a href=\"{0}/report.html\">{0}</a>", esc(&name))
            } else {
                esc(&name)
            };
            body.push_str(&format!("<li>{link}</li>\n"));
        }
        body.push_str("</ul>\n");
    }
    Ok((title, body))
}
