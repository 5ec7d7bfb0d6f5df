//! The KV memory timeline stacked by ledger category (live, allocated-but-unfilled, cached free,
//! pending free, free): the stack's top is the KV budget, so what the cache wastes shows as the
//! width of the "allocated, unfilled" band. Long runs are drawn through at most
//! [`MAX_POINTS`] steps, each bucket represented by its step of largest allocation.

use plotters::prelude::*;

use super::{byte_unit, msg, render, span, PlotError, FONT, HEIGHT_PX, PALETTE, WIDTH_PX};

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

pub fn svg(title: &str, t: &Timeline) -> Result<String, PlotError> {
    render(title, (WIDTH_PX, HEIGHT_PX), |root| {
        let idx = thin(t);
        let total = |i: usize| -> u64 { t.layers.iter().map(|(_, v)| v[i]).sum() };
        let max_total = idx.iter().map(|&i| total(i)).max().unwrap_or(0) as f64;
        let (div, unit) = byte_unit(max_total);
        let y_label = format!("KV memory ({unit})");
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(
                span(idx.iter().map(|&i| t.t_ms[i]), true),
                span([max_total / div], true),
            )
            .map_err(msg)?;
        chart
            .configure_mesh()
            .x_desc("time (ms)")
            .y_desc(y_label)
            .label_style((FONT, 12))
            .draw()
            .map_err(msg)?;
        // Draw the cumulative tops from the highest down, each over the one before.
        for k in (0..t.layers.len()).rev() {
            let c = COLORS.get(k).copied().unwrap_or(PALETTE[k % PALETTE.len()]);
            let pts: Vec<(f64, f64)> = idx
                .iter()
                .map(|&i| {
                    let top: u64 = t.layers[..=k].iter().map(|(_, v)| v[i]).sum();
                    (t.t_ms[i], top as f64 / div)
                })
                .collect();
            chart
                .draw_series(AreaSeries::new(pts, 0.0, c.filled()))
                .map_err(msg)?
                .label(t.layers[k].0.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        super::draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
