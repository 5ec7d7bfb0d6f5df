//! Latency against throughput: one line per cache mode through a sweep's probes, the SLO as a
//! horizontal line, and each mode's throughput at target as a vertical line, so the "highest
//! load at which the target holds" reads straight off the plot.

use plotters::prelude::*;

use super::{
    color, fmt_tick, msg, render, time_unit, xy_chart, Axis, PlotError, Series, Swatch, HEIGHT_PX,
    LEGEND_PX, WIDE_PX,
};

pub struct LatencyPlot<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// One per cache mode: `(throughput, latency)` per probe, with the latency's interval.
    pub series: &'a [Series],
    /// The target the latency must stay under, if the scenario states one.
    pub slo: Option<f64>,
    /// The unit of the values and the target ("ms", "share of requests").
    pub unit: &'a str,
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
    // Times past 10 s read in s: the values are divided by `div` before they are drawn.
    let (div, unit) = if p.unit == "ms" {
        time_unit(all_y.clone().filter(|v| v.is_finite()).fold(0.0, f64::max))
    } else {
        (1.0, p.unit)
    };
    let all_y = all_y.map(|v| v / div);
    let log = p.log_ok && wants_log(all_y.clone());
    let y = if log {
        Axis::log(all_y)
    } else {
        Axis::linear(all_y, true)
    };
    let x = Axis::linear(
        p.series
            .iter()
            .flat_map(|s| s.points.iter().map(|q| q.0))
            .chain(p.targets.iter().map(|t| t.1)),
        true,
    );
    let y_label = y.describe(&p.y_label.replace("(ms)", &format!("({unit})")));
    render(p.title, (WIDE_PX, HEIGHT_PX), |root| {
        let (plot, key) = root.split_horizontally(WIDE_PX - LEGEND_PX);
        let mut entries: Vec<(String, RGBColor, Swatch)> = Vec::new();
        let mut chart = xy_chart(&plot, p.title, (&x, p.x_label), (&y, y_label.as_str()), 64)?;
        // Error-bar caps a few pixels wide: wide enough to see, narrow enough to stay apart.
        let cap = (x.range.end - x.range.start) * 0.008;
        for (i, s) in p.series.iter().enumerate() {
            let c = color(&s.label, i);
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|&(a, b)| (a, y.at(b / div)))
                .filter(|q| q.0.is_finite() && q.1.is_finite())
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(msg)?;
            entries.push((s.label.clone(), c, Swatch::Line));
            let bars: Vec<PathElement<(f64, f64)>> = s
                .points
                .iter()
                .zip(&s.ci)
                .map(|(q, ci)| (q.0, y.at(ci.0 / div), y.at(ci.1 / div)))
                .filter(|(a, lo, hi)| a.is_finite() && lo.is_finite() && hi.is_finite())
                .flat_map(|(a, lo, hi)| {
                    [
                        PathElement::new(vec![(a, lo), (a, hi)], c.stroke_width(2)),
                        PathElement::new(vec![(a - cap, lo), (a + cap, lo)], c.stroke_width(2)),
                        PathElement::new(vec![(a - cap, hi), (a + cap, hi)], c.stroke_width(2)),
                    ]
                })
                .collect();
            chart.draw_series(bars).map_err(msg)?;
            chart
                .draw_series(pts.iter().map(|&q| Circle::new(q, 3, c.filled())))
                .map_err(msg)?;
        }
        if let Some(stated) = p.slo {
            let level = y.at(stated / div);
            if level.is_finite() {
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
                    format!("target {} {unit}", fmt_tick(stated / div)),
                    red,
                    Swatch::Dashed,
                ));
            }
        }
        for (i, (mode, at)) in p.targets.iter().enumerate() {
            if !at.is_finite() {
                continue;
            }
            let c = color(mode, i);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(*at, y.range.start), (*at, y.range.end)],
                    3,
                    3,
                    c.stroke_width(1),
                ))
                .map_err(msg)?;
            entries.push((
                format!("{mode} at target: {} tok/s", fmt_tick(*at)),
                c,
                Swatch::Dashed,
            ));
        }
        super::side_legend(&key, &entries)?;
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
    }
}
