//! The page of a suite folder: `suite.csv`'s table, headline bars per cell (throughput and p99
//! TTFT, paged against contiguous), the block-size trade-off of every scenario run at several
//! block sizes, and links to each cell's own page. Works on a suite written before `suite.json`
//! existed (the committed reference) from `suite.csv` and the cell folders alone.

use std::path::{Path, PathBuf};

use super::super::plot::data::file_error;
use super::super::plot::{bars, blocks};
use super::super::suite::{self, SuiteMeta};
use super::{esc, figure, note, table, ReportError};

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

/// Per row, a label naming its cell: the scenario, plus block size and seed where the table
/// holds several of them for that scenario.
fn cell_labels(t: &Table) -> Vec<String> {
    let (sc, bs, seed) = (t.col("scenario"), t.col("block_size"), t.col("seed"));
    let get =
        |r: &Vec<String>, c: Option<usize>| c.and_then(|c| r.get(c)).cloned().unwrap_or_default();
    let distinct = |scenario: &str, c: Option<usize>| {
        let mut v: Vec<String> = t
            .rows
            .iter()
            .filter(|r| get(r, sc) == scenario)
            .map(|r| get(r, c))
            .collect();
        v.sort();
        v.dedup();
        v.len()
    };
    t.rows
        .iter()
        .map(|r| {
            let name = get(r, sc);
            let mut label = name.clone();
            if distinct(&name, bs) > 1 {
                label.push_str(&format!(" bs{}", get(r, bs)));
            }
            if distinct(&name, seed) > 1 {
                label.push_str(&format!(" seed {}", get(r, seed)));
            }
            label
        })
        .collect()
}

/// Grouped bars of column `metric`: one row per cell, one bar per cache mode.
fn headline(
    t: &Table,
    labels: &[String],
    metric: &str,
    title: &str,
    x_label: &str,
) -> Result<Option<String>, ReportError> {
    let (Some(m), Some(cache)) = (t.col(metric), t.col("cache")) else {
        return Ok(None);
    };
    let mut categories: Vec<String> = Vec::new();
    for l in labels {
        if !categories.contains(l) {
            categories.push(l.clone());
        }
    }
    let mut groups: Vec<(String, Vec<f64>)> = Vec::new();
    for (r, label) in t.rows.iter().zip(labels) {
        let mode = r.get(cache).cloned().unwrap_or_default();
        let v: f64 = r.get(m).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
        let i = match groups.iter().position(|g| g.0 == mode) {
            Some(i) => i,
            None => {
                groups.push((mode, vec![f64::NAN; categories.len()]));
                groups.len() - 1
            }
        };
        if let Some(c) = categories.iter().position(|c| c == label) {
            groups[i].1[c] = v;
        }
    }
    if categories.is_empty() {
        return Ok(None);
    }
    Ok(Some(bars::svg(title, x_label, &categories, &groups)?))
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
    body.push_str(&table(&t.header, &t.rows));
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

    let labels = cell_labels(&t);
    body.push_str("<h2>Headline figures</h2>\n");
    let mut any = false;
    for (metric, title, x) in [
        (
            "throughput_tokens_per_s",
            "Throughput per cell",
            "throughput (tokens/s)",
        ),
        ("ttft_p99_ms", "p99 TTFT per cell", "p99 TTFT (ms)"),
    ] {
        if let Some(svg) = headline(&t, &labels, metric, title, x)? {
            body.push_str(&figure(
                &svg,
                &format!("`{metric}` of each row of `suite.csv`."),
            ));
            any = true;
        }
    }
    if !any {
        body.push_str(&note("suite.csv holds no rows to plot."));
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
