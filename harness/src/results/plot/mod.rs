//! Plots for `report.html`, drawn with plotters into SVG strings.
//!
//! Built without plotters' `ttf`/`ab_glyph` features: the SVG backend writes text as `<text>`
//! elements that the browser lays out with its own fonts, and plotters sizes label areas with its
//! naive built-in estimate, so rendering needs no system fonts (no fontconfig) on the machine that
//! writes the report. Each plot function takes plain numbers; [`data`] reads them from a results
//! folder's own files, so every plotted figure is recomputable from that folder.

pub mod bars;
pub mod blocks;
pub mod cdf;
pub mod data;
pub mod latency;
pub mod memory;
pub mod ratios;
pub mod ticks;

pub use ticks::{fmt_tick, time_unit, Axis};

use std::ops::Range;

use plotters::coord::Shift;
use plotters::prelude::*;

pub const WIDTH_PX: u32 = 720;
pub const HEIGHT_PX: u32 = 380;
/// Charts with their legend in a strip beside the plot.
pub const WIDE_PX: u32 = 900;
pub const LEGEND_PX: u32 = 210;
pub const FONT: &str = "sans-serif";

/// One line of a plot: `(x, y)` points, with an optional `[low, high]` interval per point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Empty, or one `(low, high)` per point (drawn as a vertical error bar).
    pub ci: Vec<(f64, f64)>,
}

#[derive(Debug, thiserror::Error)]
#[error("plot {title:?}: {message}")]
pub struct PlotError {
    pub title: String,
    pub message: String,
}

pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The colour of a series: the two cache modes keep theirs in every plot.
pub fn color(label: &str, i: usize) -> RGBColor {
    if label.starts_with("paged") {
        RGBColor(31, 119, 180)
    } else if label.starts_with("contiguous") {
        RGBColor(230, 115, 0)
    } else {
        PALETTE[i % PALETTE.len()]
    }
}

pub const PALETTE: [RGBColor; 8] = [
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(214, 39, 40),
];

/// Draw into a fresh white SVG of `size` pixels and return its text.
pub fn render(
    title: &str,
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> Result<(), String>,
) -> Result<String, PlotError> {
    let fail = |message: String| PlotError {
        title: title.to_string(),
        message,
    };
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
        draw(&root).map_err(fail)?;
        root.present().map_err(|e| fail(e.to_string()))?;
    }
    Ok(buf)
}

/// How a legend entry is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swatch {
    Line,
    Dashed,
    Box,
}

/// A legend in its own strip beside the plot (`area`), so it never covers data.
pub fn side_legend(area: &Area<'_>, entries: &[(String, RGBColor, Swatch)]) -> Result<(), String> {
    for (i, (label, c, kind)) in entries.iter().enumerate() {
        let y = 24 + 20 * i as i32;
        match kind {
            Swatch::Line => area
                .draw(&PathElement::new(vec![(4, y), (24, y)], c.stroke_width(2)))
                .map_err(msg)?,
            Swatch::Dashed => {
                for x in [4, 12, 20] {
                    area.draw(&PathElement::new(
                        vec![(x, y), (x + 5, y)],
                        c.stroke_width(2),
                    ))
                    .map_err(msg)?;
                }
            }
            Swatch::Box => area
                .draw(&Rectangle::new([(6, y - 6), (22, y + 6)], c.filled()))
                .map_err(msg)?,
        }
        area.draw(&Text::new(
            label.as_str(),
            (30, y - 7),
            (FONT, 14).into_font(),
        ))
        .map_err(msg)?;
    }
    Ok(())
}

/// Every chart's legend looks the same; only where it sits depends on where the data leaves room.
pub fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(msg)
}

/// A chart of `y` against `x` in the house layout (caption, margins, label areas, tick labels
/// and axis descriptions), its mesh already drawn: what every x-y plot of the reports starts
/// from, so they keep one look. `y_label_px` is the room for the y tick labels.
pub fn xy_chart<'a, 'b>(
    area: &'a Area<'b>,
    title: &str,
    (x, x_desc): (&Axis, &str),
    (y, y_desc): (&Axis, &str),
    y_label_px: u32,
) -> Result<ChartContext<'a, SVGBackend<'b>, Cartesian2d<ticks::Coord, ticks::Coord>>, String> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(y_label_px)
        .build_cartesian_2d(x.coord(), y.coord())
        .map_err(msg)?;
    let xf = |c: &f64| x.label(*c);
    let yf = |c: &f64| y.label(*c);
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .label_style((FONT, 14))
        .draw()
        .map_err(msg)?;
    Ok(chart)
}

pub fn msg<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// An axis range covering `values` (finite ones), from zero when `from_zero`, padded by 5% so
/// points on the edge stay visible and a single value still spans some room.
pub fn span(values: impl IntoIterator<Item = f64>, from_zero: bool) -> Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.into_iter().filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        hi.abs().max(1.0) * 0.5
    };
    let lo = if from_zero && lo >= 0.0 {
        0.0
    } else {
        lo - pad
    };
    lo..hi + pad
}

/// A byte count scaled to the largest unit that keeps `max_bytes` at or above 1.
pub fn byte_unit(max_bytes: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 4] = [
        (1_073_741_824.0, "GiB"),
        (1_048_576.0, "MiB"),
        (1024.0, "KiB"),
        (1.0, "B"),
    ];
    UNITS
        .iter()
        .copied()
        .find(|(d, _)| max_bytes >= *d)
        .unwrap_or((1.0, "B"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_pads_and_starts_at_zero_when_asked() {
        let r = span([2.0, 4.0], true);
        assert_eq!(r.start, 0.0);
        assert!(r.end > 4.0);
        let r = span([5.0], false);
        assert!(r.start < 5.0 && r.end > 5.0);
        assert_eq!(span([f64::NAN], false), 0.0..1.0);
    }

    #[test]
    fn byte_units() {
        assert_eq!(byte_unit(3.0 * 1_073_741_824.0).1, "GiB");
        assert_eq!(byte_unit(2048.0).1, "KiB");
        assert_eq!(byte_unit(0.0).1, "B");
    }
}
