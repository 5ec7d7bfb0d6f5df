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
    /// Allow a log scale when the values span more than [`LOG_SPAN`]× (latencies past
    /// saturation grow without bound and would flatten everything below the target).
    pub log_ok: bool,
}

pub const LOG_SPAN: f64 = 30.0;

/// Whether `values` (positive ones) span more than [`LOG_SPAN`]×.
pub fn wants_log(values: impl IntoIterator<Item = f64>) -> bool {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.into_iter().filter(|v| v.is_finite() && *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    lo.is_finite() && hi / lo > LOG_SPAN
}

/// A 3-significant-digit label of `10^v`, for a log axis drawn as linear in log10.
fn pow10_label(v: &f64) -> String {
    let x = 10f64.powf(*v);
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        format!("{x:.3e}")
    }
}

pub fn svg(p: &LatencyPlot<'_>) -> Result<String, PlotError> {
    let all_y = p
        .series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(|q| q.1)
                .chain(s.ci.iter().flat_map(|c| [c.0, c.1]))
        })
        .chain(p.slo);
    let log = p.log_ok && wants_log(all_y);
    // On a log scale values are drawn as log10 (non-positive ones cannot be, and are dropped).
    let y = |v: f64| -> f64 {
        if !log {
            v
        } else if v > 0.0 {
            v.log10()
        } else {
            f64::NAN
        }
    };
    let series: Vec<Series> = p
        .series
        .iter()
        .map(|s| Series {
            label: s.label.clone(),
            points: s.points.iter().map(|&(a, b)| (a, y(b))).collect(),
            ci: s.ci.iter().map(|&(lo, hi)| (y(lo), y(hi))).collect(),
        })
        .collect();
    let slo = p.slo.map(y).filter(|v| v.is_finite());
    let y_label = if log {
        format!("{} (log scale)", p.y_label)
    } else {
        p.y_label.to_string()
    };
    render(p.title, (WIDTH_PX, HEIGHT_PX), |root| {
        let xs = series
            .iter()
            .flat_map(|s| s.points.iter().map(|q| q.0))
            .chain(p.targets.iter().map(|t| t.1));
        let ys = series
            .iter()
            .flat_map(|s| s.points.iter().map(|q| q.1).chain(s.ci.iter().map(|c| c.1)))
            .chain(slo);
        let mut chart = ChartBuilder::on(root)
            .caption(p.title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(span(xs, true), span(ys, !log))
            .map_err(msg)?;
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(p.x_label)
            .y_desc(y_label.as_str())
            .label_style((FONT, 12));
        if log {
            mesh.y_label_formatter(&pow10_label);
        }
        mesh.draw().map_err(msg)?;
        for (i, s) in series.iter().enumerate() {
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
        if let (Some(slo), Some(stated)) = (slo, p.slo) {
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
                .label(format!("target {stated}"))
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
        super::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_scale_only_past_the_span() {
        assert!(!wants_log([1.0, 20.0, 0.0]));
        assert!(wants_log([1.0, 31.0]));
        assert_eq!(pow10_label(&2.0), "100");
        assert_eq!(pow10_label(&0.0), "1");
        assert_eq!(pow10_label(&0.5), "3.162");
    }
}
