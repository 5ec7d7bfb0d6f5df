//! The log-sum-exp merge of a query token's partitions.

use crate::attention::AttnDims;

/// Combines a query token's partitions (in logical order) into its output row.
pub(super) fn merge(parts: &[f32], dims: AttnDims, out: &mut [f32]) {
    let hd = dims.head_dim;
    let stride = hd + 2;
    let row = dims.q_heads * stride;
    let n_parts = parts.len() / row;
    for j in 0..dims.q_heads {
        let o = &mut out[j * hd..(j + 1) * hd];
        let m = (0..n_parts)
            .map(|p| parts[p * row + j * stride])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut denom = 0f32;
        o.fill(0.0);
        for p in 0..n_parts {
            let part = &parts[p * row + j * stride..p * row + (j + 1) * stride];
            let w = if n_parts == 1 {
                1.0
            } else {
                (part[0] - m).exp()
            };
            denom += w * part[1];
            for (x, a) in o.iter_mut().zip(&part[2..]) {
                *x += w * a;
            }
        }
        let inv = 1.0 / denom;
        for x in o.iter_mut() {
            *x *= inv;
        }
    }
}
