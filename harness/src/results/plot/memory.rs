//! The KV memory timeline by ledger category (live, allocated-but-unfilled, cached free,
//! pending free, free), one panel per cache mode on one time axis: per step the categories
//! stack to the KV budget, so what the cache wastes shows as the width of the "allocated,
//! unfilled" band. Long runs are drawn through at most
//! [`MAX_POINTS`] steps, each bucket represented by its step of largest allocation.

use plotters::prelude::*;

use super::{
    byte_unit, msg, render, time_unit, Axis, PlotError, Swatch, FONT, LEGEND_PX, PALETTE, WIDE_PX,
};

pub const MAX_POINTS: usize = 600;

/// A timeline: `t_ms` per step and, per category, its bytes at each step (bottom layer first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub t_ms: Vec<f64>,
    pub layers: Vec<(String, Vec<u64>)>,
}

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(220, 220, 220),
];

/// Indices of the steps drawn: all of them, or per bucket the step whose first two layers (live +
/// allocated-unfilled) are largest, so peaks survive thinning.
pub fn thin(t: &Timeline) -> Vec<usize> {
    let n = t.t_ms.len();
    if n <= MAX_POINTS {
        return (0..n).collect();
    }
    let held = |i: usize| -> u64 { t.layers.iter().take(2).map(|(_, v)| v[i]).sum() };
    let per = n.div_ceil(MAX_POINTS);
    (0..n)
        .step_by(per)
        .map(|start| {
            (start..(start + per).min(n))
                .max_by_key(|&i| (held(i), std::cmp::Reverse(i)))
                .unwrap_or(start)
        })
        .collect()
}

/// One cache mode's panel: its timeline, its KV budget (from `summary.json`) and, when
/// `memory.csv` holds one row per interval rather than per step, that interval.
pub struct Panel<'a> {
    pub cache: &'a str,
    pub timeline: &'a Timeline,
    pub budget_bytes: Option<u64>,
    pub interval_ms: Option<f64>,
}

/// One panel per cache mode, stacked vertically on one time axis so the modes compare at a
/// glance. A row per step is drawn stacked: its categories add up to the budget. A row per
/// interval holds each category's maximum over the interval — maxima of different steps, which
/// do not add up — so those are drawn as one line per category under the budget line, never
/// stacked past it.
pub fn svg(title: &str, panels: &[Panel<'_>]) -> Result<String, PlotError> {
    const PANEL_PX: u32 = 300;
    let n = panels.len().max(1) as u32;
    let max_t = panels
        .iter()
        .flat_map(|p| p.timeline.t_ms.iter().copied())
        .fold(0.0f64, f64::max);
    let (tdiv, tunit) = time_unit(max_t);
    let x = Axis::linear([0.0, max_t / tdiv], true);
    let top_bytes = |p: &Panel<'_>| -> u64 {
        let t = p.timeline;
        let total = |i: usize| -> u64 { t.layers.iter().map(|(_, v)| v[i]).sum() };
        let observed = if p.interval_ms.is_some() {
            (0..t.t_ms.len())
                .flat_map(|i| t.layers.iter().map(move |(_, v)| v[i]))
                .max()
                .unwrap_or(0)
        } else {
            (0..t.t_ms.len()).map(total).max().unwrap_or(0)
        };
        p.budget_bytes.unwrap_or(0).max(observed)
    };
    let max_bytes = panels.iter().map(top_bytes).max().unwrap_or(0) as f64;
    let (div, unit) = byte_unit(max_bytes);
    render(title, (WIDE_PX, 40 + PANEL_PX * n), |root| {
        let titled = root.titled(title, (FONT, 18)).map_err(msg)?;
        let areas = titled.split_evenly((panels.len().max(1), 1));
        for (p, area) in panels.iter().zip(areas.iter()) {
            let (area, key) = area.split_horizontally(WIDE_PX - LEGEND_PX);
            let mut entries: Vec<(String, RGBColor, Swatch)> = Vec::new();
            let t = p.timeline;
            let idx = thin(t);
            let y = Axis::fixed(0.0..(top_bytes(p) as f64 / div).max(f64::MIN_POSITIVE) * 1.04);
            let caption = match p.interval_ms {
                Some(ms) => format!(
                    "{}: each category's maximum per {} interval",
                    p.cache,
                    super::ticks::fmt_time_ms(ms)
                ),
                None => format!("{}: every step, stacked to the KV budget", p.cache),
            };
            let mut chart = ChartBuilder::on(&area)
                .caption(caption, (FONT, 14))
                .margin(8)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d(x.coord(), y.coord())
                .map_err(msg)?;
            let xf = |c: &f64| x.label(*c);
            let yf = |c: &f64| y.label(*c);
            chart
                .configure_mesh()
                .x_desc(format!("time since the run started ({tunit})"))
                .y_desc(format!("KV memory ({unit})"))
                .x_label_formatter(&xf)
                .y_label_formatter(&yf)
                .label_style((FONT, 14))
                .draw()
                .map_err(msg)?;
            let at = |i: usize, bytes: u64| (t.t_ms[i] / tdiv, bytes as f64 / div);
            if p.interval_ms.is_some() {
                for (k, (name, values)) in t.layers.iter().enumerate() {
                    if name == "free" {
                        continue;
                    }
                    let c = COLORS.get(k).copied().unwrap_or(PALETTE[k % PALETTE.len()]);
                    let pts: Vec<(f64, f64)> = idx.iter().map(|&i| at(i, values[i])).collect();
                    chart
                        .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                        .map_err(msg)?;
                    entries.push((format!("{name}, max"), c, Swatch::Line));
                }
            } else {
                // Draw the cumulative tops from the highest down, each over the one before.
                for k in (0..t.layers.len()).rev() {
                    let c = COLORS.get(k).copied().unwrap_or(PALETTE[k % PALETTE.len()]);
                    let pts: Vec<(f64, f64)> = idx
                        .iter()
                        .map(|&i| at(i, t.layers[..=k].iter().map(|(_, v)| v[i]).sum()))
                        .collect();
                    chart
                        .draw_series(AreaSeries::new(pts, 0.0, c.filled()))
                        .map_err(msg)?;
                    entries.push((t.layers[k].0.clone(), c, Swatch::Box));
                }
            }
            if let Some(b) = p.budget_bytes {
                let level = b as f64 / div;
                let red = RGBColor(200, 0, 0);
                chart
                    .draw_series(DashedLineSeries::new(
                        vec![(x.range.start, level), (x.range.end, level)],
                        6,
                        4,
                        red.stroke_width(1),
                    ))
                    .map_err(msg)?;
                entries.push((
                    format!("KV budget {} {unit}", super::ticks::fmt_short(level, 3)),
                    red,
                    Swatch::Dashed,
                ));
            }
            // Top of the stack first, as the bands lie.
            super::side_legend(&key, &entries)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Interval maxima of different steps can add up past the budget: drawn as lines, never as
    /// stacked areas, and the axis stops at the budget.
    #[test]
    fn interval_maxima_are_not_stacked_past_the_budget() {
        let budget = 20u64 << 30;
        let t = Timeline {
            t_ms: vec![1.0, 2.0, 3.0],
            layers: vec![
                ("live".into(), vec![15 << 30; 3]),
                ("allocated, unfilled".into(), vec![12 << 30; 3]),
                ("free".into(), vec![5 << 30; 3]),
            ],
        };
        let panel = |interval_ms| Panel {
            cache: "paged",
            timeline: &t,
            budget_bytes: Some(budget),
            interval_ms,
        };
        let lines = svg("m", &[panel(Some(10.0))]).expect("svg");
        assert!(!lines.contains("<polygon"), "interval maxima stacked");
        assert!(lines.contains("maximum per 10 ms interval"));
        // The y axis' top tick is the budget (20 GiB), not the 32 GiB the maxima would stack to.
        assert!(lines.contains(">\n20\n</text>") || lines.contains(">20</text>"));
        assert!(!lines.contains(">\n30\n</text>") && !lines.contains(">30</text>"));
        let stacked = svg("m", &[panel(None)]).expect("svg");
        assert!(stacked.contains("<polygon"), "steps are stacked");
    }

    #[test]
    fn thinning_keeps_the_peak() {
        let n = 5 * MAX_POINTS + 3;
        let mut live = vec![1u64; n];
        live[1234] = 1_000;
        let t = Timeline {
            t_ms: (0..n).map(|i| i as f64).collect(),
            layers: vec![("live".into(), live), ("unfilled".into(), vec![0; n])],
        };
        let idx = thin(&t);
        assert!(idx.len() <= MAX_POINTS);
        assert!(idx.contains(&1234));
        assert!(idx.windows(2).all(|w| w[0] < w[1]));
    }
}
