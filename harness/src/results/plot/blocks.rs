//! The block-size trade-off: per cache mode, one point per block size at (KV waste, throughput)
//! — or throughput at target when the figures come from a sweep — labelled with its block size.
//! Smaller blocks waste less of the last block but cost more table entries and gather work.

use plotters::prelude::*;

use super::{color, msg, render, xy_chart, Axis, PlotError, FONT, HEIGHT_PX, WIDTH_PX};

/// One cache mode's points: `(block size, x, y)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tradeoff {
    pub label: String,
    pub points: Vec<(u32, f64, f64)>,
}

pub fn svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Tradeoff],
) -> Result<String, PlotError> {
    let x = Axis::linear(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        true,
    );
    let y = Axis::linear(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.2)),
        true,
    );
    render(title, (WIDTH_PX, HEIGHT_PX), |root| {
        let mut chart = xy_chart(root, title, (&x, x_label), (&y, y_label), 64)?;
        for (i, s) in series.iter().enumerate() {
            let c = color(&s.label, i);
            let mut pts: Vec<(u32, f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|p| p.1.is_finite() && p.2.is_finite())
                .collect();
            pts.sort_by_key(|p| p.0);
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.1, p.2)),
                    c.stroke_width(1),
                ))
                .map_err(msg)?
                .label(s.label.as_str())
                .legend(move |(x, y)| Circle::new((x + 8, y), 4, c.filled()));
            chart
                .draw_series(pts.iter().map(|p| {
                    EmptyElement::at((p.1, p.2))
                        + Circle::new((0, 0), 4, c.filled())
                        + Text::new(format!("{}", p.0), (6, -14), (FONT, 14).into_font())
                }))
                .map_err(msg)?;
        }
        super::draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        Ok(())
    })
}
