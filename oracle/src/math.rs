//! Plain f64 building blocks, written for clarity; only the matrix product is arranged for speed
//! (row-parallel, unit-stride inner loop), since the oracle runs over whole histories.

use rayon::prelude::*;

/// `x[rows×k] · w[k×n]` → `[rows×n]`.
pub(crate) fn matmul(x: &[f64], w: &[f64], rows: usize, k: usize, n: usize) -> Vec<f64> {
    let mut y = vec![0f64; rows * n];
    y.par_chunks_mut(n)
        .zip(x.par_chunks(k))
        .with_min_len(4)
        .for_each(|(yr, xr)| {
            for (p, &xv) in xr.iter().enumerate() {
                let wr = &w[p * n..(p + 1) * n];
                for (yv, wv) in yr.iter_mut().zip(wr) {
                    *yv += xv * wv;
                }
            }
        });
    y
}

/// Row-wise `x / sqrt(mean(x²) + eps) ⊙ gain`.
pub(crate) fn rms_norm(x: &[f64], gain: &[f64], eps: f64) -> Vec<f64> {
    let d = gain.len();
    let mut y = vec![0f64; x.len()];
    for (xr, yr) in x.chunks(d).zip(y.chunks_mut(d)) {
        let mean_sq = xr.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for i in 0..d {
            yr[i] = xr[i] * inv * gain[i];
        }
    }
    y
}

/// Rotates every head of row `pos` (rows are positions 0, 1, ...) in place.
pub(crate) fn rope(x: &mut [f64], heads: usize, head_dim: usize, theta: f64) {
    let half = head_dim / 2;
    let row = heads * head_dim;
    for (pos, xr) in x.chunks_mut(row).enumerate() {
        for h in 0..heads {
            let base = h * head_dim;
            for i in 0..half {
                let angle = pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
                let (s, c) = angle.sin_cos();
                let a = xr[base + i];
                let b = xr[base + i + half];
                xr[base + i] = a * c - b * s;
                xr[base + i + half] = a * s + b * c;
            }
        }
    }
}

/// In-place softmax.
pub(crate) fn softmax(x: &mut [f64]) {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

pub(crate) fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}
