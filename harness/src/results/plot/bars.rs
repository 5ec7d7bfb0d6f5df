//! Grouped horizontal bars: one row per category (a suite's scenarios), one bar per group (cache
//! mode) — the suite's headline figures side by side.

use plotters::prelude::*;

use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{color, msg, render, span, PlotError, FONT, WIDTH_PX};

pub fn svg(
    title: &str,
    x_label: &str,
    categories: &[String],
    groups: &[(String, Vec<f64>)],
) -> Result<String, PlotError> {
    let rows = categories.len().max(1);
    let height = (90 + 30 * rows * groups.len().max(1)).min(4000) as u32;
    render(title, (WIDTH_PX, height), |root| {
        let label_px = categories
            .iter()
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(4, 40) as u32
            * 7
            + 12;
        let xs = groups.iter().flat_map(|g| g.1.iter().copied());
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(label_px)
            .build_cartesian_2d(span(xs, true), 0.0..rows as f64)
            .map_err(msg)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_desc(x_label)
            .label_style((FONT, 12))
            .draw()
            .map_err(msg)?;
        let g = groups.len().max(1) as f64;
        for (k, (label, values)) in groups.iter().enumerate() {
            let c = color(label, k);
            let bars = values
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(r, &v)| {
                    let top = rows as f64 - r as f64 - 0.1 - 0.8 * k as f64 / g;
                    Rectangle::new([(0.0, top), (v, top - 0.8 / g)], c.filled())
                });
            chart
                .draw_series(bars)
                .map_err(msg)?
                .label(label.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        let style =
            TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        for (r, name) in categories.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(0.0, rows as f64 - r as f64 - 0.5));
            root.draw(&Text::new(name.as_str(), (px - 6, py), style.clone()))
                .map_err(msg)?;
        }
        super::draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        Ok(())
    })
}
