//! Fitting a device profile to a measured grid.
//!
//! Under `combine = "sum"` the cost model is linear in its overheads and in the reciprocal of
//! each rate, so the fit is a least-squares problem over the columns [`PARAMS`]. Two choices
//! make it fit what a serving run sees:
//! - rows are weighted by 1 / measured time, so a 50 µs decode counts as much as a 50 ms
//!   prefill (latency errors are relative);
//! - coefficients are non-negative (Lawson–Hanson NNLS): a cost below the noise is 0, never a
//!   negative time that would cancel another term.
//!
//! Paged KV reads get a column of their own (time per paged KV byte read), from which
//! `paged_attention_efficiency` follows as its ratio to the contiguous one. A rate whose coefficient comes out 0 is written at its
//! range's upper bound; a column the grid never exercises keeps the base profile's value. Each
//! constant's source line says which of the three happened.
//!
//! The attention rate's half-saturation length (`attention_half_tokens`, L½) is not linear: the
//! attention column is each sequence's FLOPs × `(L + L½) ÷ L`. It is fitted by a search over L½
//! — 0 and lengths √2 apart up to four times the grid's longest attended length, then a
//! golden-section refinement (in log L½) around the best — with the linear fit above at each
//! candidate, keeping the L½ whose fit has the least sum of squared relative errors. L½ = 0
//! (one rate at every length) is always a candidate, so the curve is written only where it
//! explains the measured times better than one rate does.
//!
//! Tensor parallelism: a grid measured at `tp = N` (the model's `tp`; each device's share of
//! weights, heads and FLOPs is what the cost model's columns already count) also pays two
//! all-reduces per layer per step, which are not a column: each point's all-reduce time is
//! priced at the base profile's `nvlink_bytes_per_s` and `nvlink_latency_s` and taken off its
//! measured time before the fit, so the fitted constants are the one device's. A `tp > 1` grid
//! with a base profile that states no device link is refused; so is a point measured faster
//! than its all-reduces alone.

use nalgebra::{DMatrix, DVector};

use super::grid::Grid;
use crate::backend::sim::cost::CostModel;
use crate::backend::sim::profile::{Combine, DeviceProfile, RANGES};

/// The fitted columns, by the profile key each one sets.
pub const PARAMS: [&str; 9] = [
    "step_overhead_s",
    "seq_overhead_s",
    "weight_bytes_per_s",
    "hbm_effective_bytes_per_s",
    "paged_attention_efficiency",
    "peak_flops_per_s",
    "attention_flops_per_s",
    "copy_bytes_per_s",
    "host_link_bytes_per_s",
];

/// How one constant got its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Fitted,
    /// The fit found no measurable cost; the rate is its range's upper bound.
    AtBound,
    /// The grid never exercises it; the base profile's value.
    Kept,
}

/// The one constant fitted by search rather than least squares (module doc).
pub const HALF_TOKENS: &str = "attention_half_tokens";

#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub profile: DeviceProfile,
    /// Per [`PARAMS`] entry.
    pub origins: [Origin; 9],
    /// How [`HALF_TOKENS`] got its value: fitted when the attention rate was; kept from the base
    /// when the grid has no attention to fit it to, or the attention rate sits on its bound.
    pub half_tokens_origin: Origin,
    pub points: usize,
    /// Of the medians, unweighted: 1 − SS_res / SS_tot.
    pub r2: f64,
    pub median_abs_rel_err: f64,
    pub max_abs_rel_err: f64,
    /// (measured median, model) per point, grid order.
    pub predictions: Vec<(f64, f64)>,
    /// The machine's own noise: over the points probed more than once, the median of each
    /// point's half p10–p90 spread of its repeated identical probes, relative to its median.
    /// None when no point was probed twice.
    pub noise_rel: Option<f64>,
    /// Over the same points, the median of |model − measured| ÷ that point's half spread: above
    /// 1, the model misses more than the repeated probes scatter ([`Fit::refusal`]).
    pub error_over_noise: Option<f64>,
}

/// A point's half p10–p90 spread is floored at this share of its median, so a noiseless grid
/// (a synthetic one) compares its rounding error to something above zero.
pub const NOISE_FLOOR_REL: f64 = 1e-6;

/// The least R² a fit must reach to be written: below it the linear cost model does not explain
/// the measured times (a loaded machine, a backend the model does not describe).
pub const R2_FLOOR: f64 = 0.95;

impl Fit {
    /// Why this fit must not become a profile, if it must not: a constant on its range's bound
    /// (the fit found no measurable cost, or was cut at the range: the value is the range's,
    /// not the device's), or an R² below [`R2_FLOOR`].
    pub fn refusal(&self) -> Option<String> {
        let mut why = Vec::new();
        let bound: Vec<&str> = PARAMS
            .iter()
            .zip(&self.origins)
            .filter(|(_, o)| **o == Origin::AtBound)
            .map(|(k, _)| *k)
            .collect();
        if !bound.is_empty() {
            why.push(format!(
                "{} sit on their range's bound (no measurable cost in the grid)",
                bound.join(", ")
            ));
        }
        if let (Some(ratio), Some(noise)) = (self.error_over_noise, self.noise_rel) {
            if ratio.is_nan() || ratio > 1.0 {
                why.push(format!(
                    "its residuals exceed the machine's own noise: the median point misses by \
                     {ratio:.2}× its repeated probes' half p10–p90 spread (median spread {:.1}%, \
                     median |error| {:.1}%), so the cost model leaves out something the noise \
                     does not explain",
                    100.0 * noise,
                    100.0 * self.median_abs_rel_err
                ));
            }
        }
        if self.r2.is_nan() || self.r2 < R2_FLOOR {
            why.push(format!(
                "R² {:.4} is below the floor {R2_FLOOR} (the cost model does not explain the \
                 measured times)",
                self.r2
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error("grid: {0}")]
    Grid(String),
}

/// The base profile with the attention half-saturation length `half_tokens` (0: none), whose
/// cost model's loads are what the design matrix needs.
fn with_half(base: &DeviceProfile, half_tokens: f64) -> DeviceProfile {
    let mut p = base.clone();
    p.attention_half_tokens = (half_tokens > 0.0).then_some(half_tokens);
    p
}

/// The linear fit at one attention half-saturation length.
struct Linear {
    half_tokens: f64,
    coef: [f64; 9],
    used: Vec<usize>,
    /// Measured times (medians), full: all-reduces included.
    ys: Vec<f64>,
    /// Σ ((model − measured) ÷ measured)² over the points.
    rel_ss: f64,
}

/// The design row of a point: the cost model's features folded into [`PARAMS`] columns.
fn row(f: &[f64; 10]) -> [f64; 9] {
    // features: step, seqs, weight, kv_write, kv_read_contiguous, kv_read_paged, dense, attn,
    // copy, swap.
    [f[0], f[1], f[2], f[3] + f[4], f[5], f[6], f[7], f[8], f[9]]
}

/// Fits `grid`; constants it cannot see keep `base`'s values, and `name` names the result.
pub fn fit(grid: &Grid, base: &DeviceProfile, name: &str) -> Result<Fit, FitError> {
    let flat = linear(grid, base, 0.0)?;
    let attention = PARAMS.iter().position(|k| *k == "attention_flops_per_s");
    let attention_used = attention.is_some_and(|j| flat.used.contains(&j));
    let best = if attention_used {
        search_half_tokens(grid, base, flat)?
    } else {
        flat
    };
    let Linear {
        half_tokens,
        coef,
        used,
        ys,
        ..
    } = best;
    let mut seen = [false; 9];
    for &j in &used {
        seen[j] = true;
    }
    let (mut profile, origins) = to_profile(&coef, &seen, base, name);
    let attention_fitted = attention.is_some_and(|j| origins[j] == Origin::Fitted);
    let half_tokens_origin = if attention_fitted {
        // 0 is written too: the fit found one rate at every length.
        profile.attention_half_tokens = Some(half_tokens);
        Origin::Fitted
    } else {
        Origin::Kept
    };
    let fitted = CostModel::new(&grid.model, &profile, None);
    let mut predictions = Vec::new();
    let (mut spreads, mut ratios) = (Vec::new(), Vec::new());
    for p in &grid.points {
        let Some(y) = p.median_s() else { continue };
        if y <= 0.0 {
            continue;
        }
        let paged = p.cache == kvbench_cache_api::CacheMode::Paged;
        let t = fitted
            .step(&p.seq_work(), &p.copies(grid.block_size), &p.swaps(), paged)
            .total_s;
        predictions.push((y, t));
        if p.samples_s.len() > 1 {
            if let Some(spread) = p.spread() {
                let half = (spread / 2.0).max(NOISE_FLOOR_REL);
                spreads.push(half);
                ratios.push(((t - y) / y).abs() / half);
            }
        }
    }
    spreads.sort_by(f64::total_cmp);
    ratios.sort_by(f64::total_cmp);
    let mean = ys.iter().sum::<f64>() / ys.len().max(1) as f64;
    let ss_tot: f64 = ys.iter().map(|y| (y - mean).powi(2)).sum();
    let ss_res: f64 = predictions.iter().map(|(y, t)| (y - t).powi(2)).sum();
    let mut rel: Vec<f64> = predictions
        .iter()
        .map(|(y, t)| ((t - y) / y).abs())
        .collect();
    rel.sort_by(f64::total_cmp);
    Ok(Fit {
        profile,
        origins,
        half_tokens_origin,
        points: predictions.len(),
        r2: if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            0.0
        },
        median_abs_rel_err: super::grid::quantile(&rel, 0.5).unwrap_or(0.0),
        max_abs_rel_err: rel.last().copied().unwrap_or(0.0),
        predictions,
        noise_rel: super::grid::quantile(&spreads, 0.5),
        error_over_noise: super::grid::quantile(&ratios, 0.5),
    })
}

/// The longest length any grid point's last query attends to.
fn longest_attended(grid: &Grid) -> f64 {
    grid.points
        .iter()
        .flat_map(|p| &p.groups)
        .map(|g| f64::from(g.context_tokens) + f64::from(g.new_tokens))
        .fold(1.0, f64::max)
}

/// The L½ whose linear fit has the least relative squared error (module doc), `flat` being the
/// fit at L½ = 0.
fn search_half_tokens(grid: &Grid, base: &DeviceProfile, flat: Linear) -> Result<Linear, FitError> {
    let top = (4.0 * longest_attended(grid)).min(range(HALF_TOKENS).1);
    let mut tried = vec![flat];
    let mut h = 1.0f64;
    while h <= top {
        tried.push(linear(grid, base, h)?);
        h *= std::f64::consts::SQRT_2;
    }
    let at = tried
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.rel_ss.total_cmp(&b.1.rel_ss))
        .map_or(0, |(i, _)| i);
    if at == 0 {
        return Ok(tried.swap_remove(0));
    }
    // Golden section in log L½ between the best candidate's neighbours (the first candidate
    // above 0 is 1 token, so its lower neighbour is taken as 1/√2).
    let log_at = tried[at].half_tokens.ln();
    let (mut lo, mut hi) = (
        log_at - std::f64::consts::LN_2 / 2.0,
        log_at + std::f64::consts::LN_2 / 2.0,
    );
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    let mut best = tried.swap_remove(at);
    let (mut x1, mut x2) = (hi - phi * (hi - lo), lo + phi * (hi - lo));
    let (mut f1, mut f2) = (linear(grid, base, x1.exp())?, linear(grid, base, x2.exp())?);
    for _ in 0..40 {
        if f1.rel_ss <= f2.rel_ss {
            hi = x2;
            x2 = x1;
            x1 = hi - phi * (hi - lo);
            f2 = std::mem::replace(&mut f1, linear(grid, base, x1.exp())?);
        } else {
            lo = x1;
            x1 = x2;
            x2 = lo + phi * (hi - lo);
            f1 = std::mem::replace(&mut f2, linear(grid, base, x2.exp())?);
        }
    }
    for f in [f1, f2] {
        if f.rel_ss < best.rel_ss {
            best = f;
        }
    }
    Ok(best)
}

/// The weighted NNLS fit of the linear columns with the attention column computed at
/// `half_tokens`.
fn linear(grid: &Grid, base: &DeviceProfile, half_tokens: f64) -> Result<Linear, FitError> {
    if let Some(why) = base.tp_refusal(grid.model.tp) {
        return Err(FitError::Grid(format!(
            "{why}: a tp > 1 grid's all-reduces are priced at the base profile's link and taken \
             off each measured time before the fit (choose a --base that states one)"
        )));
    }
    let model = CostModel::new(&grid.model, &with_half(base, half_tokens), None);
    let mut rows = Vec::new();
    let mut ys = Vec::new();
    // Each point's all-reduce time at the base profile's link (0 at tp = 1).
    let mut all_reduce = Vec::new();
    for (i, p) in grid.points.iter().enumerate() {
        let Some(y) = p.median_s() else { continue };
        if y <= 0.0 {
            continue;
        }
        let paged = p.cache == kvbench_cache_api::CacheMode::Paged;
        let load = model.load(&p.seq_work(), &p.copies(grid.block_size), &p.swaps());
        let a = model.time(&load, paged).all_reduce_s;
        if a >= y {
            return Err(FitError::Grid(format!(
                "points.{i}: measured {y:e} s, no more than its all-reduces alone at the base \
                 profile's link ({a:e} s at tp = {})",
                grid.model.tp
            )));
        }
        rows.push(row(&load.features(paged)));
        ys.push(y);
        all_reduce.push(a);
    }
    if rows.len() < PARAMS.len() {
        return Err(FitError::Grid(format!(
            "{} measured points; the fit needs at least {}",
            rows.len(),
            PARAMS.len()
        )));
    }
    let used: Vec<usize> = (0..PARAMS.len())
        .filter(|&j| rows.iter().any(|r| r[j] != 0.0))
        .collect();
    // Relative residuals: weight each row by 1 / time. Weighting by the noisy measured time
    // pulls the fit towards the fastest samples, so the weights are then re-based on the
    // model's own prediction (iteratively reweighted, as for a gamma GLM).
    // The columns explain each time less its all-reduces; the weights stay the whole time's.
    let targets: Vec<f64> = ys.iter().zip(&all_reduce).map(|(y, a)| y - a).collect();
    let mut weight_by: Vec<f64> = ys.clone();
    let mut coef = [0.0f64; 9];
    for _ in 0..4 {
        coef = solve(&rows, &targets, &weight_by, &used);
        for ((w, r), a) in weight_by.iter_mut().zip(&rows).zip(&all_reduce) {
            let t: f64 = r.iter().zip(&coef).map(|(x, c)| x * c).sum::<f64>() + a;
            if t > 0.0 {
                *w = t;
            }
        }
    }
    let rel_ss = rows
        .iter()
        .zip(&ys)
        .zip(&all_reduce)
        .map(|((r, y), a)| {
            let t: f64 = r.iter().zip(&coef).map(|(x, c)| x * c).sum::<f64>() + a;
            ((t - y) / y).powi(2)
        })
        .sum();
    Ok(Linear {
        half_tokens,
        coef,
        used,
        ys,
        rel_ss,
    })
}

/// Weighted NNLS over the `used` columns, columns scaled to unit norm for conditioning.
fn solve(rows: &[[f64; 9]], ys: &[f64], weight_by: &[f64], used: &[usize]) -> [f64; 9] {
    let a = DMatrix::from_fn(rows.len(), used.len(), |i, k| {
        rows[i][used[k]] / weight_by[i]
    });
    let scale: Vec<f64> = (0..used.len())
        .map(|k| a.column(k).norm().max(f64::MIN_POSITIVE))
        .collect();
    let a = DMatrix::from_fn(a.nrows(), a.ncols(), |i, k| a[(i, k)] / scale[k]);
    let b = DVector::from_fn(rows.len(), |i, _| ys[i] / weight_by[i]);
    let z = nnls(&a, &b);
    let mut coef = [0.0f64; 9];
    for (k, &j) in used.iter().enumerate() {
        coef[j] = z[k] / scale[k];
    }
    coef
}

fn range(key: &str) -> (f64, f64) {
    RANGES
        .iter()
        .find(|(k, _, _)| *k == key)
        .map_or((0.0, f64::MAX), |&(_, lo, hi)| (lo, hi))
}

/// A rate from its coefficient (seconds per unit), clamped to the key's range.
fn rate(key: &str, coef: f64) -> (f64, Origin) {
    let (lo, hi) = range(key);
    if coef <= 1.0 / hi {
        (hi, Origin::AtBound)
    } else {
        ((1.0 / coef).max(lo), Origin::Fitted)
    }
}

fn to_profile(
    coef: &[f64; 9],
    seen: &[bool; 9],
    base: &DeviceProfile,
    name: &str,
) -> (DeviceProfile, [Origin; 9]) {
    let mut p = base.clone();
    p.name = name.to_string();
    p.combine = Combine::Sum;
    let mut origins = [Origin::Kept; 9];
    let time = |key: &str, c: f64| c.clamp(range(key).0, range(key).1);
    if seen[0] {
        p.step_overhead_s = time(PARAMS[0], coef[0]);
        origins[0] = Origin::Fitted;
    }
    if seen[1] {
        p.seq_overhead_s = time(PARAMS[1], coef[1]);
        origins[1] = Origin::Fitted;
    }
    let mut set = |j: usize, slot: &mut f64| {
        if seen[j] {
            let (v, o) = rate(PARAMS[j], coef[j]);
            *slot = v;
            origins[j] = o;
        }
    };
    let mut weight = base
        .weight_bytes_per_s
        .unwrap_or(base.hbm_effective_bytes_per_s);
    set(2, &mut weight);
    set(3, &mut p.hbm_effective_bytes_per_s);
    set(5, &mut p.peak_flops_per_s);
    let mut attn = base.attention_flops_per_s.unwrap_or(base.peak_flops_per_s);
    set(6, &mut attn);
    let mut copy = base
        .copy_bytes_per_s
        .unwrap_or(base.hbm_effective_bytes_per_s);
    set(7, &mut copy);
    set(8, &mut p.host_link_bytes_per_s);
    p.weight_bytes_per_s = Some(weight);
    p.attention_flops_per_s = Some(attn);
    p.copy_bytes_per_s = Some(copy);
    if seen[4] {
        // Seconds per paged KV byte read; efficiency = (1/bw) / that (above 1 where paged reads
        // measured faster). Where the contiguous cost is too small for the efficiency's range
        // (1/bw at its bound), the bandwidth gives way instead, so that paged reads keep their
        // fitted cost exactly.
        let per_byte = 1.0 / p.hbm_effective_bytes_per_s;
        let per_paged = coef[4].max(per_byte / range(PARAMS[4]).1);
        let (lo, hi) = range(PARAMS[4]);
        let eff = per_byte / per_paged;
        if eff < lo {
            p.hbm_effective_bytes_per_s = 1.0 / (per_paged * lo);
            origins[3] = Origin::Fitted;
        }
        p.paged_attention_efficiency = eff.clamp(lo, hi);
        origins[4] = if coef[4] > 0.0 {
            Origin::Fitted
        } else {
            Origin::AtBound
        };
    }
    (p, origins)
}

/// Non-negative least squares, min ‖Ax − b‖ subject to x ≥ 0 (Lawson & Hanson, 1974, ch. 23).
pub fn nnls(a: &DMatrix<f64>, b: &DVector<f64>) -> DVector<f64> {
    let n = a.ncols();
    let mut x = DVector::zeros(n);
    let mut passive = vec![false; n];
    let tol = 1e-10 * a.norm() * b.norm().max(1.0);
    for _ in 0..(3 * n + 10) {
        let w = a.transpose() * (b - a * &x);
        let candidate = (0..n)
            .filter(|&j| !passive[j] && w[j] > tol)
            .max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(j) = candidate else { break };
        passive[j] = true;
        for _ in 0..(3 * n + 10) {
            let s = solve_passive(a, b, &passive);
            if (0..n).all(|i| !passive[i] || s[i] > 0.0) {
                x = s;
                break;
            }
            let alpha = (0..n)
                .filter(|&i| passive[i] && s[i] <= 0.0)
                .map(|i| x[i] / (x[i] - s[i]))
                .fold(f64::INFINITY, f64::min);
            x = &x + (s - &x) * alpha;
            for i in 0..n {
                if passive[i] && x[i] <= tol {
                    passive[i] = false;
                    x[i] = 0.0;
                }
            }
        }
    }
    x
}

/// Unconstrained least squares over the passive columns; zeros elsewhere.
fn solve_passive(a: &DMatrix<f64>, b: &DVector<f64>, passive: &[bool]) -> DVector<f64> {
    let cols: Vec<usize> = (0..a.ncols()).filter(|&j| passive[j]).collect();
    let sub = DMatrix::from_fn(a.nrows(), cols.len(), |i, k| a[(i, cols[k])]);
    let sol = sub
        .svd(true, true)
        .solve(b, 1e-12)
        .unwrap_or_else(|_| DVector::zeros(cols.len()));
    let mut out = DVector::zeros(a.ncols());
    for (k, &j) in cols.iter().enumerate() {
        out[j] = sol[k];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnls_matches_least_squares_when_the_answer_is_positive_and_clamps_otherwise() {
        let a = DMatrix::from_row_slice(4, 2, &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 1.0]);
        let b = DVector::from_vec(vec![1.0, 2.0, 3.0, 4.0]);
        let x = nnls(&a, &b);
        assert!(
            (x[0] - 1.0).abs() < 1e-9 && (x[1] - 2.0).abs() < 1e-9,
            "{x}"
        );
        let b = DVector::from_vec(vec![-1.0, 2.0, 1.0, 0.0]);
        let x = nnls(&a, &b);
        assert_eq!(x[0], 0.0, "{x}");
        assert!(x[1] > 0.0, "{x}");
    }
}
