//! Empirical CDFs (TTFT, inter-token gaps), one step line per cache mode. Large sample sets are
//! drawn through at most [`MAX_POINTS`] order statistics; each drawn point is an exact sample.

use plotters::prelude::*;

use super::{
    color, msg, render, time_unit, xy_chart, Axis, PlotError, Series, Swatch, HEIGHT_PX, LEGEND_PX,
    WIDE_PX,
};

pub const MAX_POINTS: usize = 400;

/// `(value_ms, fraction ≤ value)` for sorted nanosecond samples: every sample when there are few,
/// else [`MAX_POINTS`] evenly spaced order statistics plus the maximum.
pub fn points(sorted_ns: &[u64]) -> Vec<(f64, f64)> {
    let n = sorted_ns.len();
    if n == 0 {
        return Vec::new();
    }
    let mut idx: Vec<usize> = if n <= MAX_POINTS {
        (0..n).collect()
    } else {
        (0..MAX_POINTS)
            .map(|i| i * (n - 1) / (MAX_POINTS - 1))
            .collect()
    };
    idx.dedup();
    idx.into_iter()
        .map(|i| (sorted_ns[i] as f64 / 1e6, (i + 1) as f64 / n as f64))
        .collect()
}

/// The CDFs of `series` (x in ms), the time axis in ms or s by the largest sample, on a log
/// scale when `log` (latencies spanning decades: a linear axis would draw the fast mode as a
/// line at zero). `what` names the quantity; the unit and scale are appended.
pub fn svg(title: &str, what: &str, series: &[Series], log: bool) -> Result<String, PlotError> {
    let max_ms = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let (div, unit) = time_unit(max_ms);
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0 / div));
    let x = if log {
        Axis::log(xs)
    } else {
        Axis::linear(xs, true)
    };
    let y = Axis::fixed(0.0..1.02);
    let x_label = x.describe(&format!("{what} ({unit})"));
    render(title, (WIDE_PX, HEIGHT_PX), |root| {
        let (plot, key) = root.split_horizontally(WIDE_PX - LEGEND_PX);
        let mut entries: Vec<(String, RGBColor, Swatch)> = Vec::new();
        let mut chart = xy_chart(
            &plot,
            title,
            (&x, x_label.as_str()),
            (&y, "fraction of samples ≤ x"),
            56,
        )?;
        for (i, s) in series.iter().enumerate() {
            let c = color(&s.label, i);
            let mut steps = Vec::with_capacity(2 * s.points.len());
            let mut below = 0.0;
            for &(v, q) in &s.points {
                let at = x.at(v / div);
                if at.is_finite() {
                    steps.push((at, below));
                    steps.push((at, q));
                }
                below = q;
            }
            chart
                .draw_series(LineSeries::new(steps, c.stroke_width(2)))
                .map_err(msg)?;
            entries.push((s.label.clone(), c, Swatch::Line));
        }
        super::side_legend(&key, &entries)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::points;

    #[test]
    fn few_samples_are_all_drawn_and_the_last_reaches_one() {
        let p = points(&[1_000_000, 2_000_000, 4_000_000]);
        assert_eq!(p, vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (4.0, 1.0)]);
    }

    #[test]
    fn many_samples_keep_min_and_max() {
        let v: Vec<u64> = (1..=10_000).collect();
        let p = points(&v);
        assert!(p.len() <= super::MAX_POINTS);
        assert_eq!(p[0], (1e-6, 1e-4));
        assert_eq!(*p.last().expect("points"), (10_000.0 / 1e6, 1.0));
    }
}
