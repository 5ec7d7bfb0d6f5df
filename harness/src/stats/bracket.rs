//! Intervals over per-seed brackets: each seed's search (or comparison) yields a bracket
//! `[a, b]` for a figure, with `a` shown to hold and `b` where it stops holding. The interval
//! over n seeds is `[mean(a) − t·sd(a)/√n, mean(b) + t·sd(b)/√n]`, so it covers both the spread
//! between workload draws and each bracket's own width (with one seed it is the bracket itself).

use super::interval::{mean_sd, t_critical, CONFIDENCE};

/// `[mean(a) − t·sd(a)/√n, mean(b) + t·sd(b)/√n]`, clamped at 0 (module doc).
pub fn bracket_interval(a: &[f64], b: &[f64]) -> [f64; 2] {
    let [lo, hi] = signed_bracket_interval(a, b);
    [lo.max(0.0), hi]
}

/// [`bracket_interval`] without the clamp (for changes, which may be negative).
pub fn signed_bracket_interval(a: &[f64], b: &[f64]) -> [f64; 2] {
    let half = |xs: &[f64]| {
        if xs.len() < 2 {
            0.0
        } else {
            let (_, sd) = mean_sd(xs);
            t_critical(xs.len() as f64 - 1.0, CONFIDENCE) * sd / (xs.len() as f64).sqrt()
        }
    };
    let (ma, _) = mean_sd(a);
    let (mb, _) = mean_sd(b);
    [ma - half(a), mb + half(b)]
}
