//! Latency against throughput: one line per cache mode through a sweep's probes, the SLO as a
//! horizontal line, and each mode's throughput at target as a vertical line, so the "highest
//! load at which the target holds" reads straight off the plot.

use plotters::prelude::*;

use super::{color, msg, render, span, PlotError, Series, FONT, HEIGHT_PX, WIDTH_PX};

pub struct LatencyPlot<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// One per cache mode: `(throughput, latency)` per probe, with the latency's interval.
    pub series: &'a [Series],
    /// The target the latency must stay under, if the scenario states one.
    pub slo: Option<f64>,
    /// `(cache mode, throughput at target)`: drawn as vertical lines.
    pub targets: &'a [(String, f64)],
}

pub fn svg(p: &LatencyPlot<'_>) -> Result<String, PlotError> {
    render(p.title, (WIDTH_PX, HEIGHT_PX), |root| {
        let xs = p
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|q| q.0))
            .chain(p.targets.iter().map(|t| t.1));
        let ys = p
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|q| q.1).chain(s.ci.iter().map(|c| c.1)))
            .chain(p.slo);
        let mut chart = ChartBuilder::on(root)
            .caption(p.title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(span(xs, true), span(ys, true))
            .map_err(msg)?;
        chart
            .configure_mesh()
            .x_desc(p.x_label)
            .y_desc(p.y_label)
            .label_style((FONT, 12))
            .draw()
            .map_err(msg)?;
        for (i, s) in p.series.iter().enumerate() {
            let c = color(&s.label, i);
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|q| q.0.is_finite() && q.1.is_finite())
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(msg)?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&q| Circle::new(q, 3, c.filled())))
                .map_err(msg)?;
            let bars = s
                .points
                .iter()
                .zip(&s.ci)
                .filter(|(q, c)| q.0.is_finite() && c.0.is_finite() && c.1.is_finite())
                .map(|(q, ci)| PathElement::new(vec![(q.0, ci.0), (q.0, ci.1)], c.stroke_width(1)));
            chart.draw_series(bars).map_err(msg)?;
        }
        if let Some(slo) = p.slo {
            let x = chart.x_range();
            let red = RGBColor(200, 0, 0);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x.start, slo), (x.end, slo)],
                    6,
                    4,
                    red.stroke_width(1),
                ))
                .map_err(msg)?
                .label(format!("target {slo} ms"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], red));
        }
        for (i, (mode, at)) in p.targets.iter().enumerate() {
            if !at.is_finite() {
                continue;
            }
            let c = color(mode, i);
            let y = chart.y_range();
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(*at, y.start), (*at, y.end)],
                    3,
                    3,
                    c.stroke_width(1),
                ))
                .map_err(msg)?
                .label(format!("{mode} at target"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, 12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(msg)?;
        Ok(())
    })
}
