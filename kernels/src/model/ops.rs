//! Element-wise pieces of the forward pass.

/// `out = x / rms(x) * gain` for each row of `x` (`[rows, gain.len()]`).
pub(crate) fn rms_norm(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    let d = gain.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(gain) {
            *o = v * r * g;
        }
    }
}

/// RoPE frequencies `theta^(-2i/head_dim)` for the `head_dim/2` rotated pairs.
pub fn rope_inv_freq(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| theta.powf(-(2.0 * i as f64) / head_dim as f64))
        .collect()
}

/// cos/sin tables `[positions.len(), head_dim/2]`. Angles are formed in f64: at position 4,000
/// an f32 angle would already be off by ~4e-4 rad, more than the oracle tolerance.
pub(crate) fn rope_tables(positions: &[usize], inv_freq: &[f64]) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(positions.len() * inv_freq.len());
    let mut sin = Vec::with_capacity(positions.len() * inv_freq.len());
    for &p in positions {
        for f in inv_freq {
            let (s, c) = (p as f64 * f).sin_cos();
            cos.push(c as f32);
            sin.push(s as f32);
        }
    }
    (cos, sin)
}

/// Rotates each head of each row in place (NeoX pairing: element `i` with `i + head_dim/2`).
pub(crate) fn apply_rope(x: &mut [f32], heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for (t, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for head in row.chunks_exact_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * c[i] - x1 * s[i];
                b[i] = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

/// `gate = silu(gate) * up`, in place.
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// The token of rank `rank` (0 = greedy top-1) by logit, ties broken by lower token id; `None`
/// if `rank >= logits.len()`. NaN logits rank last.
pub fn rank_token(logits: &[f32], rank: usize) -> Option<u32> {
    if rank >= logits.len() {
        return None;
    }
    let key = |i: usize| {
        if logits[i].is_nan() {
            f32::NEG_INFINITY
        } else {
            logits[i]
        }
    };
    if rank == 0 {
        let mut best = 0;
        for i in 1..logits.len() {
            if key(i) > key(best) {
                best = i;
            }
        }
        return Some(best as u32);
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    Some(idx[rank] as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_token_orders_by_logit_then_id() {
        let l = [0.5, 2.0, f32::NAN, 2.0, -1.0];
        assert_eq!(rank_token(&l, 0), Some(1));
        assert_eq!(rank_token(&l, 1), Some(3));
        assert_eq!(rank_token(&l, 2), Some(0));
        assert_eq!(rank_token(&l, 3), Some(4));
        assert_eq!(rank_token(&l, 4), Some(2));
        assert_eq!(rank_token(&l, 5), None);
    }
}
