//! The suite's answer at a glance: per scenario, paged ÷ contiguous of each headline figure as a
//! point with its interval over seeds, one panel per figure sharing the rows, on log axes centred
//! on 1× (no difference), coloured by which mode the figure favours.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{msg, render, Axis, PlotError, FONT};

pub const WIDTH_PX: u32 = 940;

/// One figure's ratio in one row: the mean over seeds and, with two or more seeds, its 95%
/// interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    pub mean: f64,
    pub ci: Option<(f64, f64)>,
}

/// One panel: the figure's name and whether a larger value is better for the system.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: String,
    pub higher_is_better: bool,
}

/// Which mode a ratio favours: 1 paged, -1 contiguous, 0 neither — its interval holds 1×, or,
/// without an interval (one seed), it lies within 1% of 1×.
pub fn leaning(r: &Ratio, higher_is_better: bool) -> i32 {
    let (lo, hi) = r.ci.unwrap_or((r.mean * 0.99, r.mean * 1.01));
    let sign = if lo > 1.0 {
        1
    } else if hi < 1.0 {
        -1
    } else {
        0
    };
    if higher_is_better {
        sign
    } else {
        -sign
    }
}

const BETTER: RGBColor = RGBColor(31, 140, 60);
const WORSE: RGBColor = RGBColor(200, 40, 40);
const EVEN: RGBColor = RGBColor(120, 120, 120);

/// `rows`: a label and, per panel, the ratio (`None` where it cannot be formed, e.g. a zero
/// denominator).
pub fn svg(
    title: &str,
    panels: &[Panel],
    rows: &[(String, Vec<Option<Ratio>>)],
) -> Result<String, PlotError> {
    let n = rows.len().max(1);
    let height = (120 + 28 * n).min(4000) as u32;
    render(title, (WIDTH_PX, height), |root| {
        let label_px = rows
            .iter()
            .map(|r| r.0.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(4, 40) as u32
            * 7
            + 16;
        let titled = root.titled(title, (FONT, 18)).map_err(msg)?;
        let (names, plots) = titled.split_horizontally(label_px);
        let _ = names;
        let areas = plots.split_evenly((1, panels.len().max(1)));
        let mut row_px: Vec<(i32, i32)> = Vec::new();
        for (k, (panel, area)) in panels.iter().zip(areas.iter()).enumerate() {
            let values = rows.iter().filter_map(|r| r.1.get(k).copied().flatten());
            let axis = Axis::log(
                values
                    .flat_map(|r| {
                        let (lo, hi) = r.ci.unwrap_or((r.mean, r.mean));
                        [r.mean, lo, hi]
                    })
                    .chain([1.0]),
            );
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, (FONT, 15))
                .margin(8)
                .margin_right(26)
                .x_label_area_size(36)
                .build_cartesian_2d(axis.coord(), 0.0..n as f64)
                .map_err(msg)?;
            let fmt = |c: &f64| format!("{}×", axis.label(*c));
            chart
                .configure_mesh()
                .disable_y_mesh()
                .y_labels(0)
                .x_label_formatter(&fmt)
                .x_desc("paged ÷ contiguous, log scale")
                .label_style((FONT, 13))
                .draw()
                .map_err(msg)?;
            let one = axis.at(1.0);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(one, 0.0), (one, n as f64)],
                    4,
                    3,
                    BLACK.stroke_width(1),
                ))
                .map_err(msg)?;
            for (r, (_, ratios)) in rows.iter().enumerate() {
                let y = n as f64 - r as f64 - 0.5;
                if k == 0 {
                    row_px.push(chart.backend_coord(&(axis.range.start, y)));
                }
                let Some(ratio) = ratios.get(k).copied().flatten() else {
                    continue;
                };
                if ratio.mean == f64::INFINITY {
                    // Contiguous at 0: an arrow at the axis end, labelled.
                    let end = axis.range.end;
                    chart
                        .draw_series([EmptyElement::at((end, y))
                            + Polygon::new(vec![(-10, -6), (0, 0), (-10, 6)], BETTER.filled())
                            + Text::new(
                                "∞: contiguous 0",
                                (-110, -17),
                                (FONT, 13).into_font().color(&BETTER),
                            )])
                        .map_err(msg)?;
                    continue;
                }
                if !(ratio.mean.is_finite() && ratio.mean > 0.0) {
                    continue;
                }
                let (lo, hi) = ratio.ci.unwrap_or((ratio.mean, ratio.mean));
                let c = match leaning(&ratio, panel.higher_is_better) {
                    1 => BETTER,
                    -1 => WORSE,
                    _ => EVEN,
                };
                if ratio.ci.is_some() {
                    let (a, b) = (axis.clamped(lo), axis.clamped(hi));
                    chart
                        .draw_series([
                            PathElement::new(vec![(a, y), (b, y)], c.stroke_width(2)),
                            PathElement::new(vec![(a, y - 0.25), (a, y + 0.25)], c.stroke_width(2)),
                            PathElement::new(vec![(b, y - 0.25), (b, y + 0.25)], c.stroke_width(2)),
                        ])
                        .map_err(msg)?;
                }
                let x = axis.clamped(ratio.mean);
                chart
                    .draw_series([EmptyElement::at((x, y))
                        + Circle::new((0, 0), 4, c.filled())
                        + Text::new(
                            format!(
                                "{}×",
                                super::ticks::fmt_short(
                                    ratio.mean,
                                    if ratio.mean < 1.0 { 2 } else { 3 }
                                )
                            ),
                            (6, -17),
                            (FONT, 13).into_font().color(&c),
                        )])
                    .map_err(msg)?;
            }
        }
        let style =
            TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        for ((label, _), (_, py)) in rows.iter().zip(&row_px) {
            root.draw(&Text::new(
                label.as_str(),
                (label_px as i32 - 8, *py),
                style.clone(),
            ))
            .map_err(msg)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_leans_only_when_its_interval_or_band_excludes_one() {
        let r = |mean, ci| Ratio { mean, ci };
        assert_eq!(leaning(&r(2.0, Some((1.5, 2.5))), true), 1);
        assert_eq!(leaning(&r(2.0, Some((0.9, 3.1))), true), 0);
        // Lower is better (latency): a ratio under 1 favours paging.
        assert_eq!(leaning(&r(0.2, Some((0.1, 0.3))), false), 1);
        assert_eq!(leaning(&r(1.004, None), true), 0);
        assert_eq!(leaning(&r(0.98, None), true), -1);
    }

    #[test]
    fn the_chart_draws_a_row_per_scenario_with_its_value() {
        let panels = [Panel {
            title: "goodput".into(),
            higher_is_better: true,
        }];
        let rows = vec![
            (
                "a".to_string(),
                vec![Some(Ratio {
                    mean: 17.26,
                    ci: None,
                })],
            ),
            ("b".to_string(), vec![None]),
        ];
        let svg = svg("t", &panels, &rows).expect("svg");
        assert!(svg.contains("17.3×"), "{svg}");
        assert!(svg.contains(">\na\n</text>") || svg.contains(">a</text>"));
    }
}
