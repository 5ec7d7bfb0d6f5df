//! Empirical CDFs (TTFT, inter-token gaps), one step line per cache mode. Large sample sets are
//! drawn through at most [`MAX_POINTS`] order statistics; each drawn point is an exact sample.

use plotters::prelude::*;

use super::{color, msg, render, span, PlotError, Series, FONT, HEIGHT_PX, WIDTH_PX};

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

pub fn svg(title: &str, x_label: &str, series: &[Series]) -> Result<String, PlotError> {
    render(title, (WIDTH_PX, HEIGHT_PX), |root| {
        let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(span(xs, true), 0.0..1.02)
            .map_err(msg)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc("fraction of samples ≤ x")
            .label_style((FONT, 12))
            .draw()
            .map_err(msg)?;
        for (i, s) in series.iter().enumerate() {
            let c = color(&s.label, i);
            let mut steps = Vec::with_capacity(2 * s.points.len());
            let mut below = 0.0;
            for &(x, q) in &s.points {
                steps.push((x, below));
                steps.push((x, q));
                below = q;
            }
            chart
                .draw_series(LineSeries::new(steps, c.stroke_width(2)))
                .map_err(msg)?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
        }
        super::draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
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
