//! Grouped horizontal bars: one row per category (a suite's scenarios), one bar per group (cache
//! mode) — the suite's headline figures side by side, on a log axis where they span decades
//! (latencies), with a per-row target mark (the scenario's SLO) where one is known.

use plotters::prelude::*;

use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{color, msg, render, Axis, PlotError, Swatch, FONT, LEGEND_PX, WIDE_PX};

pub struct Bars<'a> {
    pub title: &'a str,
    /// The quantity with its unit, e.g. "p99 TTFT (ms)".
    pub x_label: &'a str,
    pub categories: &'a [String],
    /// Per group (cache mode), one value per category.
    pub groups: &'a [(String, Vec<f64>)],
    pub log: bool,
    /// Per category, a target drawn as a red tick across its row (`None`: no target known).
    pub marks: &'a [Option<f64>],
    /// What the marks are, for the legend.
    pub mark_label: &'a str,
}

pub fn svg(b: &Bars<'_>) -> Result<String, PlotError> {
    let rows = b.categories.len().max(1);
    let height = (110 + 14 * rows * b.groups.len().max(1)).min(4000) as u32;
    let values = b
        .groups
        .iter()
        .flat_map(|g| g.1.iter().copied())
        .chain(b.marks.iter().flatten().copied());
    let x = if b.log {
        Axis::log(values)
    } else {
        Axis::linear(values, true)
    };
    let x_desc = x.describe(b.x_label);
    render(b.title, (WIDE_PX, height), |root| {
        let (plot, key) = root.split_horizontally(WIDE_PX - LEGEND_PX);
        let mut entries: Vec<(String, RGBColor, Swatch)> = Vec::new();
        let label_px = b
            .categories
            .iter()
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(4, 40) as u32
            * 7
            + 12;
        let mut chart = ChartBuilder::on(&plot)
            .caption(b.title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(label_px)
            .build_cartesian_2d(x.coord(), 0.0..rows as f64)
            .map_err(msg)?;
        let xf = |c: &f64| x.label(*c);
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_desc(x_desc.as_str())
            .x_label_formatter(&xf)
            .label_style((FONT, 14))
            .draw()
            .map_err(msg)?;
        let g = b.groups.len().max(1) as f64;
        let base = x.range.start;
        for (k, (label, values)) in b.groups.iter().enumerate() {
            let c = color(label, k);
            let bars = values
                .iter()
                .enumerate()
                .filter(|(_, v)| x.at(**v).is_finite())
                .map(|(r, &v)| {
                    let top = rows as f64 - r as f64 - 0.1 - 0.8 * k as f64 / g;
                    Rectangle::new([(base, top), (x.clamped(v), top - 0.8 / g)], c.filled())
                });
            chart.draw_series(bars).map_err(msg)?;
            entries.push((label.clone(), c, Swatch::Box));
        }
        let red = RGBColor(200, 0, 0);
        let marks: Vec<PathElement<(f64, f64)>> = b
            .marks
            .iter()
            .enumerate()
            .filter_map(|(r, m)| m.map(|m| (r, x.at(m))))
            .filter(|(_, m)| m.is_finite())
            .map(|(r, m)| {
                let top = rows as f64 - r as f64;
                PathElement::new(vec![(m, top - 0.02), (m, top - 0.98)], red.stroke_width(3))
            })
            .collect();
        if !marks.is_empty() {
            chart.draw_series(marks).map_err(msg)?;
            entries.push((b.mark_label.to_string(), red, Swatch::Line));
        }
        let style =
            TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        for (r, name) in b.categories.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(base, rows as f64 - r as f64 - 0.5));
            root.draw(&Text::new(name.as_str(), (px - 6, py), style.clone()))
                .map_err(msg)?;
        }
        super::side_legend(&key, &entries)?;
        Ok(())
    })
}
