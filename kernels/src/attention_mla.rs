//! Multi-head latent attention in the absorbed form, over a cache of one row per token:
//! `[c (latent_dim), k_rope (rope_dim)]`, shared by every head.
//!
//! Head `h`'s no-RoPE key is `c · W_uk_h` and its value `c · W_uv_h`, so its score
//! `q_nope_h · (c · W_uk_h) = (W_uk_h · q_nope_h) · c`: the caller projects each head's query
//! into latent space once (`q_lat_h`), and the score is `(q_lat_h · c + q_rope_h · k_rope) ×
//! scale` — the latent is never expanded per head. The output is the attention-weighted latent
//! `Σ p · c` per head, which the caller up-projects by `W_uv_h`.
//!
//! Each query token is one task walking its context in logical order, so a result depends only
//! on the token's position and the cached values, never on the batch or the layout.

use rayon::prelude::*;

use crate::addressing::{Run, TokenAddressing};
use crate::attention::QuerySpan;
use crate::elem::KvElem;
use crate::error::{check_len, KernelError};

/// The shape of one MLA layer's attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub q_heads: usize,
    pub latent_dim: usize,
    pub rope_dim: usize,
}

impl MlaDims {
    /// Elements of one cached row (and of one head's absorbed query).
    pub fn row(&self) -> usize {
        self.latent_dim + self.rope_dim
    }
}

/// `q` is `[Σ q_len, q_heads, latent_dim + rope_dim]` (each head's absorbed query then its RoPE
/// part), `out` `[Σ q_len, q_heads, latent_dim]`; `cache` is `[num_slots, latent_dim +
/// rope_dim]`. Query `i` of a span attends to positions `0 ..= context_len − q_len + i`.
pub fn attention_mla<E: KvElem, A: TokenAddressing>(
    cache: &[E],
    num_slots: usize,
    dims: MlaDims,
    spans: &[QuerySpan<'_, A>],
    q: &[f32],
    out: &mut [f32],
    scale: f32,
) -> Result<(), KernelError> {
    let (row, lat, qh) = (dims.row(), dims.latent_dim, dims.q_heads);
    check_len("mla cache", num_slots * row, cache.len())?;
    let total_q: usize = spans.iter().map(|s| s.q_len).sum();
    check_len("mla q", total_q * qh * row, q.len())?;
    check_len("mla out", total_q * qh * lat, out.len())?;
    // Per query token: the slots of its whole context, in logical order.
    let mut contexts: Vec<Vec<usize>> = Vec::with_capacity(total_q);
    for s in spans {
        if s.q_len == 0 {
            continue;
        }
        if s.q_len > s.context_len {
            return Err(KernelError::Shape {
                what: "q_len <= context_len",
                expected: s.context_len,
                got: s.q_len,
            });
        }
        let mut runs: Vec<Run> = Vec::new();
        s.addr.runs(s.context_len, num_slots, &mut runs)?;
        let slots: Vec<usize> = runs
            .iter()
            .flat_map(|r| r.first_slot..r.first_slot + r.len)
            .collect();
        for i in 0..s.q_len {
            contexts.push(slots[..s.context_len - s.q_len + i + 1].to_vec());
        }
    }
    out.par_chunks_mut(qh * lat)
        .zip(q.par_chunks(qh * row))
        .zip(contexts.par_iter())
        .for_each(|((o, qt), slots)| {
            let mut scores = vec![0f32; slots.len()];
            for h in 0..qh {
                let qv = &qt[h * row..(h + 1) * row];
                for (sc, &slot) in scores.iter_mut().zip(slots) {
                    let kv = &cache[slot * row..(slot + 1) * row];
                    let dot: f32 = qv.iter().zip(kv).map(|(a, b)| a * b.to_f32()).sum();
                    *sc = dot * scale;
                }
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                let mut sum = 0f32;
                for x in scores.iter_mut() {
                    *x = (*x - max).exp();
                    sum += *x;
                }
                let oh = &mut o[h * lat..(h + 1) * lat];
                oh.fill(0.0);
                for (&p, &slot) in scores.iter().zip(slots) {
                    let c = &cache[slot * row..slot * row + lat];
                    for (ov, cv) in oh.iter_mut().zip(c) {
                        *ov += p * cv.to_f32();
                    }
                }
                for ov in oh.iter_mut() {
                    *ov /= sum;
                }
            }
        });
    Ok(())
}
