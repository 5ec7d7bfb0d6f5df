//! FP8 quantisation of the KV store: every K/V value written is divided by its scale, rounded
//! to the FP8 format ([`crate::fp8`]) and multiplied back, so what attention reads is exactly
//! what an FP8 cache with f32 scales dequantises to.
//!
//! **Storage.** The cache's f32 arrays hold the dequantised values (code × scale, computed once
//! at write instead of at every read: the same f32 either way, since both are one f32 product
//! of the same code and scale) and each layer keeps one f32 scale per slot and KV head
//! ([`LayerKv::k_scale`](crate::LayerKv)), which copies and swaps move with the slot. A slot's
//! scale is its block's: storing it per slot is this store's layout, not what the budget
//! prices (one scale per block per layer per KV head).
//!
//! **Scales, and why they do not depend on how a sequence was scheduled.** Paged and
//! contiguous runs chunk prefills differently, so a scale may not depend on which values one
//! write happened to carry:
//! - `per_tensor` / `per_head`: static scales, calibrated once per model (the amax of K and V
//!   per layer — per KV head for `per_head` — over a fixed calibration prompt, ×
//!   [`HEADROOM`]), as serving engines load calibrated KV scales; a value beyond saturates.
//! - `per_block`: dynamic, from the values written — the amax of the block's first token (the
//!   only values every write order has in hand when the block is opened) × [`HEADROOM`]; later
//!   tokens of the block reuse it and saturate beyond it.

use crate::elem::KvElem;
use crate::error::KernelError;
use crate::fp8::Fp8Format;

/// Scale = amax × HEADROOM / max_finite: the calibrated or first-seen amax lands at half the
/// format's range, so values up to twice it still fit. Costs one binade at the bottom (e4m3
/// keeps 2^15 of range above its smallest normal, e5m2 2^30).
pub const HEADROOM: f32 = 2.0;

/// How many values share one scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleGranularity {
    /// One scale per layer for K and one for V.
    PerTensor,
    /// One per layer per KV head, for K and for V.
    PerHead,
    /// One per block of `block_tokens` logical positions per layer per KV head, K and V.
    PerBlock { block_tokens: usize },
}

/// The FP8 configuration of a cache.
#[derive(Debug, Clone, PartialEq)]
pub struct KvQuant {
    pub format: Fp8Format,
    pub granularity: ScaleGranularity,
    /// Static scales, `[layer][k=0, v=1][kv_head]` flattened (per tensor: one value repeated
    /// over heads); empty for `PerBlock`.
    pub static_scales: Vec<f32>,
}

impl KvQuant {
    /// The scale for a group of values whose amax is `amax`.
    pub fn scale_for(format: Fp8Format, amax: f32) -> f32 {
        if amax.is_finite() && amax > 0.0 {
            amax * HEADROOM / format.max_finite()
        } else {
            1.0
        }
    }

    /// Static scales from per-layer, per-head amax figures (`amax[layer][kv][head]`,
    /// flattened as [`static_scales`](Self::static_scales)).
    pub fn calibrated(
        format: Fp8Format,
        granularity: ScaleGranularity,
        amax: &[f32],
        kv_heads: usize,
    ) -> KvQuant {
        let static_scales = match granularity {
            ScaleGranularity::PerBlock { .. } => Vec::new(),
            ScaleGranularity::PerHead => amax.iter().map(|&a| Self::scale_for(format, a)).collect(),
            ScaleGranularity::PerTensor => amax
                .chunks(kv_heads.max(1))
                .flat_map(|heads| {
                    let a = heads.iter().copied().fold(0f32, f32::max);
                    std::iter::repeat_n(Self::scale_for(format, a), heads.len())
                })
                .collect(),
        };
        KvQuant {
            format,
            granularity,
            static_scales,
        }
    }

    /// The slot whose scale position `pos` uses, for `PerBlock`: its block's first position.
    pub fn block_first(&self, pos: usize) -> Option<usize> {
        match self.granularity {
            ScaleGranularity::PerBlock { block_tokens } => Some(pos - pos % block_tokens.max(1)),
            _ => None,
        }
    }

    /// Quantises the rows just written to `slots` in one layer's K (`kv = 0`) or V (`kv = 1`)
    /// array. `first_slots[i]` is the slot of token `i`'s block's first position (`PerBlock`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply<E: KvElem>(
        &self,
        layer: usize,
        kv: usize,
        values: &mut [E],
        scales: &mut [f32],
        kv_heads: usize,
        head_dim: usize,
        slots: &[i64],
        first_slots: &[i64],
    ) -> Result<(), KernelError> {
        let row = kv_heads * head_dim;
        for (i, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let slot = slot as usize;
            for h in 0..kv_heads {
                let at = slot * row + h * head_dim;
                let vals = values
                    .get_mut(at..at + head_dim)
                    .ok_or(KernelError::Shape {
                        what: "quantised row",
                        expected: at + head_dim,
                        got: 0,
                    })?;
                let scale = match self.granularity {
                    ScaleGranularity::PerBlock { .. } => {
                        let first = first_slots.get(i).copied().unwrap_or(-1);
                        let s = if first == slot as i64 {
                            let amax = vals.iter().fold(0f32, |m, x| m.max(x.to_f32().abs()));
                            Self::scale_for(self.format, amax)
                        } else if first >= 0 {
                            // Unwritten storage is NaN, which poisons the values: a missing
                            // first token is caught by the oracle, not hidden.
                            scales
                                .get(first as usize * kv_heads + h)
                                .copied()
                                .unwrap_or(f32::NAN)
                        } else {
                            f32::NAN
                        };
                        if let Some(d) = scales.get_mut(slot * kv_heads + h) {
                            *d = s;
                        }
                        s
                    }
                    _ => self
                        .static_scales
                        .get((layer * 2 + kv) * kv_heads + h)
                        .copied()
                        .unwrap_or(f32::NAN),
                };
                for x in vals.iter_mut() {
                    *x = E::from_f32(self.format.round(x.to_f32() / scale) * scale);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_tensor_takes_the_largest_head_and_per_head_each() {
        let amax = [1.0, 4.0, 2.0, 8.0]; // layer 0: K heads (1, 4), V heads (2, 8)
        let t = KvQuant::calibrated(Fp8Format::E4m3, ScaleGranularity::PerTensor, &amax, 2);
        let h = KvQuant::calibrated(Fp8Format::E4m3, ScaleGranularity::PerHead, &amax, 2);
        let s = |a: f32| a * HEADROOM / 448.0;
        assert_eq!(t.static_scales, vec![s(4.0), s(4.0), s(8.0), s(8.0)]);
        assert_eq!(h.static_scales, vec![s(1.0), s(4.0), s(2.0), s(8.0)]);
    }

    #[test]
    fn a_block_reuses_its_first_tokens_scale_and_saturates_beyond_it() {
        let q = KvQuant {
            format: Fp8Format::E4m3,
            granularity: ScaleGranularity::PerBlock { block_tokens: 4 },
            static_scales: Vec::new(),
        };
        // One head of dim 2; slots 0 and 1 are positions 0 and 1 of one block.
        let mut vals = vec![1.0, -0.5, 100.0, 0.25];
        let mut scales = vec![f32::NAN; 2];
        q.apply(0, 0, &mut vals, &mut scales, 1, 2, &[0, 1], &[0, 0])
            .unwrap();
        let s = 1.0 * HEADROOM / 448.0;
        assert_eq!(scales, vec![s, s]);
        assert_eq!(vals[0], Fp8Format::E4m3.round(1.0 / s) * s);
        // 100 is beyond 2 × the first token's amax: saturates at 448 × s = 2.
        assert_eq!(vals[2], 448.0 * s);
        assert!((vals[3] - 0.25).abs() <= 0.25 / 16.0);
    }
}
