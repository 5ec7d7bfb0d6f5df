//! A scenario the suite ran at several host-tier capacities: the prefix hit share against
//! capacity (achieved, with the offline optimum and the infinite-cache ceiling as their own
//! series) and TTFT p50/p99 against capacity. Every point is a figure of one cell's
//! `summary.json` (its paged run: `tiers[0].capacity_bytes`, `prefix_cache.achieved_hit_rate`,
//! `prefix_cache.bounds.{optimum,ceiling}_hit_rate`, `ttft_ms.{p50,p99}`), copied and never
//! recomputed; the points are embedded beside each plot as JSON (`class="tier-capacity-data"`)
//! so a reader or a test can check each against its cell.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;
use serde_json::Value;

use super::super::plot::data::file_error;
use super::super::plot::ticks::{fmt_sig, time_unit};
use super::super::plot::PlotError;
use super::super::plot::{
    byte_unit, color, draw_legend, msg, render, xy_chart, Axis, HEIGHT_PX, WIDTH_PX,
};
use super::super::suite::Cell;
use super::{esc, figure, note, ReportError};

/// One cell's figures, as its `summary.json` states them.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// The cell's folder, relative to the suite.
    pub dir: String,
    pub seed: u64,
    /// As the scenario writes it, and the paged run's `tiers[0].capacity_bytes`.
    pub host_tier: String,
    pub capacity_bytes: u64,
    pub achieved_hit_rate: Option<f64>,
    pub optimum_hit_rate: Option<f64>,
    pub ceiling_hit_rate: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
}

/// One scenario (at one block size) run at several capacities.
struct Group {
    label: String,
    points: Vec<Point>,
}

fn read_point(dir: &Path, cell: &Cell, host_tier: &str) -> Result<Option<Point>, ReportError> {
    let path = dir.join(&cell.dir).join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|e| file_error(&path, e))?;
    let j: Value = serde_json::from_str(&text).map_err(|e| file_error(&path, e))?;
    let Some(paged) = j["runs"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["cache"] == "paged"))
    else {
        return Ok(None);
    };
    let Some(capacity_bytes) = paged["tiers"][0]["capacity_bytes"].as_u64() else {
        return Ok(None);
    };
    let pc = &paged["prefix_cache"];
    Ok(Some(Point {
        dir: cell.dir.clone(),
        seed: cell.seed,
        host_tier: host_tier.to_string(),
        capacity_bytes,
        achieved_hit_rate: pc["achieved_hit_rate"].as_f64(),
        optimum_hit_rate: pc["bounds"]["optimum_hit_rate"].as_f64(),
        ceiling_hit_rate: pc["bounds"]["ceiling_hit_rate"].as_f64(),
        ttft_p50_ms: paged["ttft_ms"]["p50"].as_f64(),
        ttft_p99_ms: paged["ttft_ms"]["p99"].as_f64(),
    }))
}

/// The scenarios (per block size) of `cells` that ran at two or more capacities, in plan order.
fn groups(dir: &Path, cells: &[Cell]) -> Result<Vec<Group>, ReportError> {
    let mut keys: Vec<(String, u32)> = Vec::new();
    for c in cells.iter().filter(|c| c.host_capacity.is_some()) {
        let k = (c.scenario.clone(), c.block_size);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut out = Vec::new();
    for (scenario, bs) in keys {
        let of: Vec<&Cell> = cells
            .iter()
            .filter(|c| c.scenario == scenario && c.block_size == bs)
            .collect();
        let mut caps: Vec<&String> = of.iter().filter_map(|c| c.host_capacity.as_ref()).collect();
        caps.sort();
        caps.dedup();
        if caps.len() < 2 {
            continue;
        }
        let sizes = cells
            .iter()
            .filter(|c| c.scenario == scenario)
            .map(|c| c.block_size)
            .fold(Vec::new(), |mut v, b| {
                if !v.contains(&b) {
                    v.push(b);
                }
                v
            });
        let label = if sizes.len() > 1 {
            format!("{scenario} bs{bs}")
        } else {
            scenario
        };
        let mut points = Vec::new();
        for c in of {
            if let Some(h) = &c.host_capacity {
                if let Some(p) = read_point(dir, c, h)? {
                    points.push(p);
                }
            }
        }
        points.sort_by(|a, b| {
            a.capacity_bytes
                .cmp(&b.capacity_bytes)
                .then(a.seed.cmp(&b.seed))
        });
        out.push(Group { label, points });
    }
    Ok(out)
}

/// One drawn line: its label, whether dashed, and its `(capacity bytes, value)` points.
struct Line {
    label: String,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// Lines against capacity on a log axis of bytes (scaled to one unit).
fn lines_svg(
    title: &str,
    y_label: &str,
    y_scale: f64,
    lines: &[Line],
) -> Result<String, PlotError> {
    let max_bytes = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(0.0, f64::max);
    let (div, unit) = byte_unit(max_bytes);
    let x = Axis::log(
        lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.0 / div)),
    );
    let y = Axis::linear(
        lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1 / y_scale)),
        true,
    );
    let x_label = format!("host-tier capacity ({unit}, log scale)");
    render(title, (WIDTH_PX, HEIGHT_PX), |root| {
        let mut chart = xy_chart(root, title, (&x, x_label.as_str()), (&y, y_label), 64)?;
        for (i, l) in lines.iter().enumerate() {
            let c = color(&l.label, i);
            let pts: Vec<(f64, f64)> = l
                .points
                .iter()
                .map(|p| (x.at(p.0 / div), p.1 / y_scale))
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .collect();
            let style = c.stroke_width(if l.dashed { 1 } else { 2 });
            let series = if l.dashed {
                chart
                    .draw_series(DashedLineSeries::new(pts.iter().copied(), 6, 4, style))
                    .map_err(msg)?
            } else {
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), style))
                    .map_err(msg)?
            };
            series
                .label(l.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c));
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
                .map_err(msg)?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        Ok(())
    })
}

/// `(capacity, value)` of every point that has the value, one line per seed where there are
/// several (a line joins one seed's cells, never a mean).
fn per_seed(
    g: &Group,
    label: &str,
    dashed: bool,
    value: impl Fn(&Point) -> Option<f64>,
) -> Vec<Line> {
    let mut seeds: Vec<u64> = g.points.iter().map(|p| p.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    seeds
        .iter()
        .map(|&s| Line {
            label: if seeds.len() > 1 {
                format!("{label}, seed {s}")
            } else {
                label.to_string()
            },
            dashed,
            points: g
                .points
                .iter()
                .filter(|p| p.seed == s)
                .filter_map(|p| value(p).map(|v| (p.capacity_bytes as f64, v)))
                .collect(),
        })
        .filter(|l| !l.points.is_empty())
        .collect()
}

/// The data a plot draws, as a JSON script element beside it (`</` escaped).
fn embed(label: &str, plot: &str, points: &[Point]) -> String {
    let json = serde_json::to_string(points)
        .unwrap_or_else(|_| "[]".into())
        .replace("</", "<\\/");
    format!(
        "<script type=\"application/json\" class=\"tier-capacity-data\" data-scenario=\"{}\" data-plot=\"{plot}\">{json}</script>\n",
        esc(label)
    )
}

/// The section of the suite page, empty when no scenario ran at several capacities.
pub fn section(dir: &Path, cells: &[Cell]) -> Result<String, ReportError> {
    let gs = groups(dir, cells)?;
    if gs.is_empty() {
        return Ok(String::new());
    }
    let mut body = String::from("<h2>Host-tier capacity</h2>\n");
    for g in &gs {
        let mut share = per_seed(g, "achieved", false, |p| p.achieved_hit_rate);
        share.extend(per_seed(g, "offline optimum", true, |p| p.optimum_hit_rate));
        share.extend(per_seed(g, "infinite-cache ceiling", true, |p| {
            p.ceiling_hit_rate
        }));
        if share.is_empty() {
            body.push_str(&note(&format!(
                "{}: no cell's summary.json states a prefix hit share.",
                g.label
            )));
        } else {
            let svg = lines_svg(
                &format!("Prefix hit share against host-tier capacity, {}", g.label),
                "prefix hit share (of looked-up prompt tokens)",
                1.0,
                &share,
            )?;
            body.push_str(&figure(
                &svg,
                &format!(
                    "{}: the paged run of each cell, from its summary.json: prefix_cache.achieved_hit_rate (solid), and prefix_cache.bounds' optimum_hit_rate and ceiling_hit_rate (dashed) at the same capacity. The gap from achieved to the optimum is eviction policy; from the optimum to the ceiling, capacity.",
                    g.label
                ),
            ));
            let missing = g
                .points
                .iter()
                .filter(|p| p.optimum_hit_rate.is_none())
                .count();
            if missing > 0 {
                body.push_str(&note(&format!(
                    "{missing} cell(s) state no bounds (their summary.json says why in prefix_cache.bounds_unavailable)."
                )));
            }
        }
        let max_ms = g
            .points
            .iter()
            .filter_map(|p| p.ttft_p99_ms)
            .fold(0.0, f64::max);
        let (div, unit) = time_unit(max_ms);
        let mut ttft = per_seed(g, "TTFT p50", false, |p| p.ttft_p50_ms);
        ttft.extend(per_seed(g, "TTFT p99", false, |p| p.ttft_p99_ms));
        if !ttft.is_empty() {
            let svg = lines_svg(
                &format!("TTFT against host-tier capacity, {}", g.label),
                &format!("TTFT ({unit})"),
                div,
                &ttft,
            )?;
            body.push_str(&figure(
                &svg,
                &format!(
                    "{}: ttft_ms.p50 and ttft_ms.p99 of each cell's paged run (summary.json). The contiguous baseline has no host tier, so capacity does not change it; its rows are in suite.csv. Largest p99: {} ms.",
                    g.label,
                    fmt_sig(max_ms, 3)
                ),
            ));
        }
        body.push_str(&embed(&g.label, "hit-share ttft", &g.points));
    }
    Ok(body)
}
