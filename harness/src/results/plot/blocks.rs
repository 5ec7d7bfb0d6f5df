//! The block-size trade-off: per cache mode, one point per block size at (KV waste, throughput)
//! — or throughput at target when the figures come from a sweep — labelled with its block size.
//! Smaller blocks waste less of the last block but cost more table entries and gather work.

use plotters::prelude::*;

use super::{color, msg, render, Axis, PlotError, FONT, HEIGHT_PX, WIDTH_PX};

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
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x.coord(), y.coord())
            .map_err(msg)?;
        let xf = |c: &f64| x.label(*c);
        let yf = |c: &f64| y.label(*c);
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .label_style((FONT, 14))
            .draw()
            .map_err(msg)?;
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
