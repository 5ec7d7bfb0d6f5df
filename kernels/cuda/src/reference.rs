//! The f64 attention reference the CUDA kernels are checked against: softmax(q·Kᵀ·scale)·V per
//! query head over logical token positions, with no partitions, no address translation and no
//! f32 anywhere. Shares no code with the kernels.

/// Storage rounding as the device stores: f32 as is, bf16 round-to-nearest-even.
pub fn round_to(dtype: crate::KvDtype, x: f32) -> f32 {
    match dtype {
        crate::KvDtype::F32 => x,
        crate::KvDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
    }
}

/// Attention of one query row (`q`: `[q_heads, head_dim]`) over `len` logical positions of K/V
/// given as `[len, kv_heads, head_dim]`; returns `[q_heads, head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_row(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    len: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f64,
) -> Vec<f64> {
    let g = q_heads / kv_heads;
    let row = kv_heads * head_dim;
    let mut out = vec![0f64; q_heads * head_dim];
    if len == 0 {
        return out;
    }
    let mut s = vec![0f64; len];
    for h in 0..q_heads {
        let kvh = h / g;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        for (t, st) in s.iter_mut().enumerate() {
            let kt = &k[t * row + kvh * head_dim..t * row + (kvh + 1) * head_dim];
            *st = qh
                .iter()
                .zip(kt)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale;
        }
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mut z = 0f64;
        for st in s.iter_mut() {
            *st = (*st - m).exp();
            z += *st;
        }
        let o = &mut out[h * head_dim..(h + 1) * head_dim];
        for (t, &p) in s.iter().enumerate() {
            let vt = &v[t * row + kvh * head_dim..t * row + (kvh + 1) * head_dim];
            for (od, &vd) in o.iter_mut().zip(vt) {
                *od += p / z * vd as f64;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_returns_its_value_and_equal_scores_average() {
        // len 1: the output is V whatever the scores.
        let (q, k, v) = (vec![0.3f32, -0.2], vec![1.0f32, 2.0], vec![0.5f32, -0.25]);
        assert_eq!(attention_row(&q, &k, &v, 1, 1, 1, 2, 1.0), vec![0.5, -0.25]);
        // Zero query: uniform weights, the mean of V; GQA maps both heads to the one KV head.
        let q = vec![0f32; 4];
        let k = vec![1.0f32, 0.0, 0.0, 1.0];
        let v = vec![1.0f32, 3.0, 3.0, 5.0];
        let o = attention_row(&q, &k, &v, 2, 2, 1, 2, 1.0);
        assert_eq!(o, vec![2.0, 4.0, 2.0, 4.0]);
        assert_eq!(round_to(crate::KvDtype::Bf16, 1.0 + 1.0 / 512.0), 1.0);
    }
}
