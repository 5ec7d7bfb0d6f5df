//! One MLA layer's attention ([`LayerKind::Mla`](super::LayerKind)): project, rotate, cache the
//! latent row, absorb the queries into latent space, attend ([`crate::attention_mla`]) and
//! up-project the attended latents to the heads' values.

use super::ops::{rope_inv_freq, rope_tables};
use super::{MlaWeights, ModelConfig};
use crate::addressing::TokenAddressing;
use crate::attention::QuerySpan;
use crate::attention_mla::{attention_mla, MlaDims};
use crate::elem::KvElem;
use crate::error::{check_len, KernelError};
use crate::gemm::matmul;
use crate::kv::LayerKv;
use crate::kv_quant::KvQuant;

/// Latent values sharing one FP8 scale (FlashMLA's tile).
pub const MLA_FP8_TILE: usize = 128;

/// Rotates `x` (one RoPE part, NeoX pairing `i` with `i + len/2`) by one position's tables.
fn rope_part(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (a, b) = x.split_at_mut(half);
    for i in 0..half {
        let (x0, x1) = (a[i], b[i]);
        a[i] = x0 * cos[i] - x1 * sin[i];
        b[i] = x0 * sin[i] + x1 * cos[i];
    }
}

/// FlashMLA's FP8 row: the latent in FP8 with one scale per [`MLA_FP8_TILE`] values (from the
/// tile's own amax, so a token's stored row depends on nothing else), the RoPE part in bf16.
fn quantise_row(q: &KvQuant, row: &mut [f32], latent_dim: usize) {
    let (latent, rope) = row.split_at_mut(latent_dim);
    for tile in latent.chunks_mut(MLA_FP8_TILE) {
        let amax = tile.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = KvQuant::scale_for(q.format, amax);
        for x in tile.iter_mut() {
            *x = q.format.round(*x / scale) * scale;
        }
    }
    for x in rope.iter_mut() {
        *x = half::bf16::from_f32(*x).to_f32();
    }
}

/// What one MLA layer's attention reads besides its weights.
pub(super) struct MlaStep<'a, 'b, A> {
    pub cfg: &'a ModelConfig,
    pub positions: &'a [usize],
    pub slots: &'a [i64],
    pub spans: &'a [QuerySpan<'b, A>],
    pub quant: Option<&'a KvQuant>,
    pub num_slots: usize,
}

/// Writes the new tokens' latent rows into `layer.k` and leaves in `att` (`[n, q_heads ×
/// head_dim]`) each head's attended value, as a full layer's attention does.
pub(super) fn mla_attention<E: KvElem, A: TokenAddressing>(
    st: &MlaStep<'_, '_, A>,
    m: &MlaWeights,
    h: &[f32],
    layer: &mut LayerKv<E>,
    att: &mut [f32],
) -> Result<(), KernelError> {
    let c = st.cfg;
    let (d, qh, hd) = (c.d_model, c.q_heads, c.head_dim);
    let (lat, rd) = (m.latent_dim, m.rope_dim);
    let (row, qw) = (lat + rd, hd + rd);
    let n = st.positions.len();
    check_len("mla cache", st.num_slots * row, layer.k.len())?;
    check_len("mla att", n * qh * hd, att.len())?;
    let mut q = vec![0f32; n * qh * qw];
    let mut ckv = vec![0f32; n * row];
    matmul(h, &m.wq, &mut q, n, d, qh * qw)?;
    matmul(h, &m.w_dkv, &mut ckv, n, d, row)?;
    let (cos, sin) = rope_tables(st.positions, &rope_inv_freq(rd, c.rope_theta));
    let hr = rd / 2;
    for t in 0..n {
        let (ct, s) = (&cos[t * hr..(t + 1) * hr], &sin[t * hr..(t + 1) * hr]);
        for head in q[t * qh * qw..(t + 1) * qh * qw].chunks_exact_mut(qw) {
            rope_part(&mut head[hd..], ct, s);
        }
        let r = &mut ckv[t * row..(t + 1) * row];
        rope_part(&mut r[lat..], ct, s);
        if let Some(quant) = st.quant {
            quantise_row(quant, r, lat);
        }
    }
    if let Some(&bad) = st.slots.iter().find(|&&s| s >= st.num_slots as i64) {
        return Err(KernelError::SlotOutOfRange {
            slot: bad as u64,
            len_tokens: 1,
            num_slots: st.num_slots as u64,
        });
    }
    for (t, &slot) in st.slots.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let dst = &mut layer.k[slot as usize * row..(slot as usize + 1) * row];
        for (dv, sv) in dst.iter_mut().zip(&ckv[t * row..(t + 1) * row]) {
            *dv = E::from_f32(*sv);
        }
    }
    // Absorb: q_lat_h[l] = Σ_j W_uk[l, h·hd + j] · q_nope_h[j]; the RoPE part is kept.
    let mut qa = vec![0f32; n * qh * row];
    for t in 0..n {
        for hh in 0..qh {
            let qv = &q[(t * qh + hh) * qw..(t * qh + hh + 1) * qw];
            let dst = &mut qa[(t * qh + hh) * row..(t * qh + hh + 1) * row];
            for (l, dv) in dst[..lat].iter_mut().enumerate() {
                let w = &m.w_uk[l * qh * hd + hh * hd..l * qh * hd + (hh + 1) * hd];
                *dv = w.iter().zip(&qv[..hd]).map(|(a, b)| a * b).sum();
            }
            dst[lat..].copy_from_slice(&qv[hd..]);
        }
    }
    let mut o = vec![0f32; n * qh * lat];
    let dims = MlaDims {
        q_heads: qh,
        latent_dim: lat,
        rope_dim: rd,
    };
    let scale = 1.0 / (qw as f32).sqrt();
    attention_mla(&layer.k, st.num_slots, dims, st.spans, &qa, &mut o, scale)?;
    // Up-project: value_h[j] = Σ_l o_h[l] · W_uv[l, h·hd + j].
    att.fill(0.0);
    for t in 0..n {
        for hh in 0..qh {
            let oh = &o[(t * qh + hh) * lat..(t * qh + hh + 1) * lat];
            let dst = &mut att[(t * qh + hh) * hd..(t * qh + hh + 1) * hd];
            for (l, &ov) in oh.iter().enumerate() {
                let w = &m.w_uv[l * qh * hd + hh * hd..l * qh * hd + (hh + 1) * hd];
                for (dv, wv) in dst.iter_mut().zip(w) {
                    *dv += ov * wv;
                }
            }
        }
    }
    Ok(())
}
