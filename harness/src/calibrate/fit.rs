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

#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub profile: DeviceProfile,
    /// Per [`PARAMS`] entry.
    pub origins: [Origin; 9],
    pub points: usize,
    /// Of the medians, unweighted: 1 − SS_res / SS_tot.
    pub r2: f64,
    pub median_abs_rel_err: f64,
    pub max_abs_rel_err: f64,
    /// (measured median, model) per point, grid order.
    pub predictions: Vec<(f64, f64)>,
}

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

/// A neutral profile whose cost model's loads are what the design matrix needs.
fn load_model(grid: &Grid, base: &DeviceProfile) -> CostModel {
    CostModel::new(&grid.model, base, None)
}

/// The design row of a point: the cost model's features folded into [`PARAMS`] columns.
fn row(f: &[f64; 10]) -> [f64; 9] {
    // features: step, seqs, weight, kv_write, kv_read_contiguous, kv_read_paged, dense, attn,
    // copy, swap.
    [f[0], f[1], f[2], f[3] + f[4], f[5], f[6], f[7], f[8], f[9]]
}

/// Fits `grid`; constants it cannot see keep `base`'s values, and `name` names the result.
pub fn fit(grid: &Grid, base: &DeviceProfile, name: &str) -> Result<Fit, FitError> {
    let model = load_model(grid, base);
    let mut rows = Vec::new();
    let mut ys = Vec::new();
    for p in &grid.points {
        let Some(y) = p.median_s() else { continue };
        if y <= 0.0 {
            continue;
        }
        let load = model.load(&p.seq_work(), &p.copies(grid.block_size), &p.swaps());
        rows.push(row(
            &load.features(p.cache == kvbench_cache_api::CacheMode::Paged)
        ));
        ys.push(y);
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
    let mut weight_by: Vec<f64> = ys.clone();
    let mut coef = [0.0f64; 9];
    for _ in 0..4 {
        coef = solve(&rows, &ys, &weight_by, &used);
        for (w, r) in weight_by.iter_mut().zip(&rows) {
            let t: f64 = r.iter().zip(&coef).map(|(x, c)| x * c).sum();
            if t > 0.0 {
                *w = t;
            }
        }
    }
    let mut seen = [false; 9];
    for &j in &used {
        seen[j] = true;
    }
    let (profile, origins) = to_profile(&coef, &seen, base, name);
    let fitted = CostModel::new(&grid.model, &profile, None);
    let mut predictions = Vec::new();
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
    }
    let mean = ys.iter().sum::<f64>() / ys.len() as f64;
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
        points: predictions.len(),
        r2: if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            0.0
        },
        median_abs_rel_err: super::grid::quantile(&rel, 0.5).unwrap_or(0.0),
        max_abs_rel_err: rel.last().copied().unwrap_or(0.0),
        predictions,
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
