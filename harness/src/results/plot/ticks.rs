//! Axes whose tick labels a reader can take in at a glance: ticks at 1-2-5 steps (or decades on a
//! log scale) chosen here, labels of at most four significant digits with `k`/`M`/`G` for large
//! values — never a raw float such as `3500000.0` — and times in ms or s by their magnitude.
//!
//! Every chart builds its axes from an [`Axis`]; on a log axis values are drawn as their
//! base-10 logarithm and labelled with the value itself.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;

/// A linear f64 coordinate whose ticks are exactly ours (plotters' own pick 3500000.0-style
/// values, and its key-point wrapper cannot take a label formatter).
pub struct Coord {
    inner: RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ranged for Coord {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

/// A value axis: drawn range (log10 of the values on a log axis) and its ticks, in the same
/// space.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub range: Range<f64>,
    pub ticks: Vec<f64>,
    pub log: bool,
}

impl Axis {
    /// A linear axis over `values` (finite ones), from zero when `from_zero`, padded by 5%.
    pub fn linear(values: impl IntoIterator<Item = f64>, from_zero: bool) -> Axis {
        let range = super::span(values, from_zero);
        let ticks = linear_ticks(&range);
        Axis {
            range,
            ticks,
            log: false,
        }
    }

    /// A linear axis over exactly `range` (no padding).
    pub fn fixed(range: Range<f64>) -> Axis {
        let ticks = linear_ticks(&range);
        Axis {
            range,
            ticks,
            log: false,
        }
    }

    /// A log axis over the positive finite `values`, widened to whole 1-2-5 steps around them.
    pub fn log(values: impl IntoIterator<Item = f64>) -> Axis {
        let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
        for v in values.into_iter().filter(|v| v.is_finite() && *v > 0.0) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = (1.0, 10.0);
        }
        let (lo, hi) = (step_below(lo), step_above(hi));
        let (lo, hi) = if hi <= lo { (lo, lo * 2.0) } else { (lo, hi) };
        let (a, b) = (lo.log10(), hi.log10());
        let decades = b - a;
        let mantissas: &[f64] = if decades <= 2.5 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let stride = if decades > 8.0 { 2 } else { 1 };
        let mut ticks = Vec::new();
        let mut e = a.floor() as i32;
        while f64::from(e) <= b.ceil() {
            if (e - a.floor() as i32) % stride == 0 {
                for m in mantissas {
                    let t = (m * 10f64.powi(e)).log10();
                    if t >= a - 1e-9 && t <= b + 1e-9 {
                        ticks.push(t);
                    }
                }
            }
            e += 1;
        }
        Axis {
            range: a..b,
            ticks,
            log: true,
        }
    }

    /// Where `v` is drawn: itself, or its log10 on a log axis (`NaN` for a non-positive value,
    /// which a log axis cannot show).
    pub fn at(&self, v: f64) -> f64 {
        if !self.log {
            v
        } else if v > 0.0 {
            v.log10()
        } else {
            f64::NAN
        }
    }

    /// `at(v)` held inside the drawn range (bars and bands that run off the axis end there).
    pub fn clamped(&self, v: f64) -> f64 {
        let c = self.at(v);
        if c.is_nan() {
            self.range.start
        } else {
            c.clamp(self.range.start, self.range.end)
        }
    }

    /// The plotters coordinate with exactly our ticks.
    pub fn coord(&self) -> Coord {
        Coord {
            inner: self.range.clone().into(),
            ticks: self.ticks.clone(),
        }
    }

    /// The label of a tick (a drawn coordinate).
    pub fn label(&self, c: f64) -> String {
        if self.log {
            fmt_tick(10f64.powf(c))
        } else {
            fmt_tick(c)
        }
    }

    /// `what` with ", log scale" where the axis is one.
    pub fn describe(&self, what: &str) -> String {
        if self.log {
            format!("{what}, log scale")
        } else {
            what.to_string()
        }
    }
}

/// The largest 1-2-5 step at or below `v > 0`.
fn step_below(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [5.0, 2.0, 1.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s <= v * (1.0 + 1e-9))
        .unwrap_or(p)
}

/// The smallest 1-2-5 step at or above `v > 0`.
fn step_above(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= v * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// About six ticks at a 1-2-5 step inside `range`.
fn linear_ticks(range: &Range<f64>) -> Vec<f64> {
    let width = range.end - range.start;
    if !(width.is_finite() && width > 0.0) {
        return vec![range.start];
    }
    let raw = width / 6.0;
    let p = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p);
    let first = (range.start / step).ceil() as i64;
    let last = (range.end / step).floor() as i64;
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    (first..=last)
        .map(|k| {
            // 0.6000000000000001 -> 0.6: ticks are round numbers.
            let t = k as f64 * step;
            format!("{t:.decimals$}").parse().unwrap_or(t)
        })
        .collect()
}

/// A tick label: at most four significant digits, `k`/`M`/`G` from 10,000 up, no trailing zeros.
pub fn fmt_tick(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let ax = x.abs();
    if ax < 1e-3 {
        return format!("{v:.0e}");
    }
    // Digits after the point so that at most four significant digits show.
    let int_digits = if ax >= 1.0 {
        ax.log10().floor() as i32 + 1
    } else {
        0
    };
    let lead_zeros = if ax < 1.0 {
        (-ax.log10()).floor() as i32
    } else {
        0
    };
    let decimals = (4 - int_digits).max(0) + lead_zeros;
    let mut s = format!("{x:.*}", decimals.clamp(0, 8) as usize);
    if s.contains('.') {
        s = s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    s.push_str(suffix);
    s
}

/// The unit times whose largest value is `max_ms` read best in: `(divisor from ms, "ms" | "s")`.
pub fn time_unit(max_ms: f64) -> (f64, &'static str) {
    if max_ms.is_finite() && max_ms >= 10_000.0 {
        (1000.0, "s")
    } else {
        (1.0, "ms")
    }
}

/// A time in ms as text with its unit: `"157 ms"`, `"26.3 s"`.
pub fn fmt_time_ms(ms: f64) -> String {
    if !ms.is_finite() {
        return "-".into();
    }
    if ms.abs() >= 1000.0 {
        format!("{} s", fmt_short(ms / 1000.0, 3))
    } else {
        format!("{} ms", fmt_short(ms, 3))
    }
}

/// [`fmt_sig`] without trailing zeros after the point: `2.00` -> `2`, `4.50` -> `4.5`.
pub fn fmt_short(v: f64, sig: i32) -> String {
    let s = fmt_sig(v, sig);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// `v` with `sig` significant digits (at least the integer part), no exponent.
pub fn fmt_sig(v: f64, sig: i32) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let mag = v.abs().log10().floor() as i32 + 1;
    let decimals = (sig - mag).clamp(0, 6) as usize;
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_stay_short() {
        assert_eq!(fmt_tick(3_500_000.0), "3.5M");
        assert_eq!(fmt_tick(12_000.0), "12k");
        assert_eq!(fmt_tick(7000.0), "7000");
        assert_eq!(fmt_tick(0.25), "0.25");
        assert_eq!(fmt_tick(0.30000000000000004), "0.3");
        assert_eq!(fmt_tick(1234.5678), "1235");
        assert_eq!(fmt_tick(-40.0), "-40");
        assert_eq!(fmt_tick(0.0), "0");
        assert_eq!(fmt_tick(0.0001), "1e-4");
    }

    #[test]
    fn linear_ticks_are_round() {
        let a = Axis::fixed(0.0..27.3);
        assert_eq!(a.ticks, vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0]);
        let a = Axis::fixed(0.0..1.02);
        assert_eq!(a.ticks, vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
    }

    #[test]
    fn log_axes_cover_their_values_with_decade_ticks() {
        let a = Axis::log([3.0, 27_000.0]);
        assert!(a.log && a.range.start <= 3f64.log10() && a.range.end >= 27_000f64.log10());
        let labels: Vec<String> = a.ticks.iter().map(|&t| a.label(t)).collect();
        assert_eq!(labels, ["10", "100", "1000", "10k"]);
        let a = Axis::log([2.2, 8.0]);
        let labels: Vec<String> = a.ticks.iter().map(|&t| a.label(t)).collect();
        assert_eq!(labels, ["2", "5", "10"]);
        assert!(a.at(-1.0).is_nan());
    }

    #[test]
    fn times_take_their_unit() {
        assert_eq!(time_unit(27_000.0), (1000.0, "s"));
        assert_eq!(time_unit(135.0).1, "ms");
        assert_eq!(fmt_time_ms(26_306.675), "26.3 s");
        assert_eq!(fmt_time_ms(135.528), "136 ms");
        assert_eq!(fmt_time_ms(4.168), "4.17 ms");
    }
}
