//! Layer groups: a model is a list of runs of layers, each with one KV layout.
//!
//! A dense GQA transformer is one `full` group; today's models are not. Gemma 3 and gpt-oss
//! interleave `sliding` layers, which attend to (and so need to keep) only the last `window`
//! tokens; DeepSeek-V3 caches one compressed latent per token per layer (`mla`), which every
//! tensor-parallel device holds whole; Qwen3-Next and Jamba mix attention with `recurrent` layers
//! whose state is a fixed size per sequence, whatever its length. Where the layers of a group sit
//! among the others does not change what they hold or read, so a group is a count, not a list of
//! positions.

use serde::{Deserialize, Serialize};

use super::Dtype;

/// Latent values an FP8 MLA cache shares one f32 scale over (FlashMLA's layout: 512 latent
/// values in 4 tiles of 128, each with its scale).
pub const MLA_FP8_TILE: u64 = 128;

/// Bytes of an MLA cache's RoPE part per value: it stays in bf16 when the latent is FP8
/// (FlashMLA's layout), and follows `kv_dtype` otherwise.
const MLA_FP8_ROPE_BYTES: u64 = 2;

/// One run of `layers` layers sharing a KV layout. Serialized with its kind under `attention`,
/// the way a scenario's `[[model.layer_groups]]` table names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "attention", rename_all = "snake_case", deny_unknown_fields)]
pub enum LayerGroup {
    /// Every layer attends to the whole context: K and V for each of `kv_heads` heads of
    /// `head_dim` (MHA, GQA or MQA by the head count).
    Full {
        layers: u32,
        kv_heads: u32,
        head_dim: u32,
    },
    /// Attends to the last `window` tokens only (the token itself included): its K/V per token
    /// is a full layer's, but a sequence never needs more than `window` of them.
    Sliding {
        layers: u32,
        window: u32,
        kv_heads: u32,
        head_dim: u32,
    },
    /// Multi-head latent attention: one vector of `latent_dim` compressed values plus
    /// `rope_dim` positional values per token per layer, no KV heads; attention runs in the
    /// absorbed form over the latent. Replicated under tensor parallelism (every device attends
    /// with its share of the query heads over the whole latent). `q_lora_rank` (0: none) is the
    /// query's low-rank projection, which only the parameter count reads.
    Mla {
        layers: u32,
        latent_dim: u32,
        rope_dim: u32,
        #[serde(default)]
        q_lora_rank: u32,
    },
    /// A fixed-size state per sequence per layer (Mamba, gated DeltaNet, linear attention):
    /// `state_bytes` for the whole layer, split across tensor-parallel devices with its heads.
    /// It stores nothing per token.
    Recurrent { layers: u32, state_bytes: u64 },
}

impl LayerGroup {
    pub fn layers(&self) -> u32 {
        match *self {
            LayerGroup::Full { layers, .. }
            | LayerGroup::Sliding { layers, .. }
            | LayerGroup::Mla { layers, .. }
            | LayerGroup::Recurrent { layers, .. } => layers,
        }
    }

    /// The scenario's word for the kind (`attention = "..."`).
    pub fn kind(&self) -> &'static str {
        match self {
            LayerGroup::Full { .. } => "full",
            LayerGroup::Sliding { .. } => "sliding",
            LayerGroup::Mla { .. } => "mla",
            LayerGroup::Recurrent { .. } => "recurrent",
        }
    }

    /// KV heads and head dim of a full or sliding group.
    pub fn heads(&self) -> Option<(u32, u32)> {
        match *self {
            LayerGroup::Full {
                kv_heads, head_dim, ..
            }
            | LayerGroup::Sliding {
                kv_heads, head_dim, ..
            } => Some((kv_heads, head_dim)),
            _ => None,
        }
    }

    /// The window of a sliding group.
    pub fn window(&self) -> Option<u32> {
        match *self {
            LayerGroup::Sliding { window, .. } => Some(window),
            _ => None,
        }
    }

    /// KV heads one device holds: a full or sliding group's split by `tp`; 0 for the others
    /// (an MLA latent has no heads, a recurrent state no per-token K/V).
    pub fn kv_heads_per_device(&self, tp: u32) -> u32 {
        self.heads().map_or(0, |(h, _)| h.div_ceil(tp.max(1)))
    }

    /// Bytes one token adds to one layer of this group on one device, FP8 per-block scales
    /// apart (they are the model's, [`super::ModelShape::kv_scale_bytes_per_block`]):
    /// - full, sliding: `2 × kv_heads/tp × head_dim × dtype` (K and V);
    /// - MLA: `(latent_dim + rope_dim) × dtype`, whole on every device; in FP8 the latent is one
    ///   byte a value plus an f32 scale per [`MLA_FP8_TILE`] values and the RoPE part stays
    ///   bf16 — 512 + 4 × 4 + 64 × 2 = 656 bytes for DeepSeek-V3;
    /// - recurrent: 0 (its state is per sequence, [`LayerGroup::state_bytes_per_layer`]).
    pub fn bytes_per_token_per_layer(&self, tp: u32, dtype: Dtype) -> Option<u64> {
        match *self {
            LayerGroup::Full { head_dim, .. } | LayerGroup::Sliding { head_dim, .. } => 2u64
                .checked_mul(self.kv_heads_per_device(tp) as u64)?
                .checked_mul(head_dim as u64)?
                .checked_mul(dtype.bytes()),
            LayerGroup::Mla {
                latent_dim,
                rope_dim,
                ..
            } => {
                let (latent, rope) = (latent_dim as u64, rope_dim as u64);
                if dtype.is_fp8() {
                    let scales = latent.div_ceil(MLA_FP8_TILE).checked_mul(4)?;
                    latent
                        .checked_add(scales)?
                        .checked_add(rope.checked_mul(MLA_FP8_ROPE_BYTES)?)
                } else {
                    latent.checked_add(rope)?.checked_mul(dtype.bytes())
                }
            }
            LayerGroup::Recurrent { .. } => Some(0),
        }
    }

    /// Bytes one token adds to the whole group on one device.
    pub fn bytes_per_token(&self, tp: u32, dtype: Dtype) -> Option<u64> {
        self.bytes_per_token_per_layer(tp, dtype)?
            .checked_mul(self.layers() as u64)
    }

    /// A recurrent layer's state on one device (`state_bytes ÷ tp`, rounded up); 0 otherwise.
    pub fn state_bytes_per_layer(&self, tp: u32) -> u64 {
        match *self {
            LayerGroup::Recurrent { state_bytes, .. } => state_bytes.div_ceil(tp.max(1) as u64),
            _ => 0,
        }
    }

    /// The state one sequence holds in the whole group on one device (recurrent only).
    pub fn state_bytes_per_sequence(&self, tp: u32) -> Option<u64> {
        self.state_bytes_per_layer(tp)
            .checked_mul(self.layers() as u64)
    }

    /// Tokens of a `tokens`-long sequence this group keeps (and a step reads): all of them,
    /// the last `window` for a sliding group, none for a recurrent one.
    pub fn resident_tokens(&self, tokens: u64) -> u64 {
        match *self {
            LayerGroup::Sliding { window, .. } => tokens.min(window as u64),
            LayerGroup::Recurrent { .. } => 0,
            _ => tokens,
        }
    }

    /// Query-key pairs one query token at position `ctx` (with `ctx` tokens before it) attends
    /// to in this group: `ctx + 1`, at most `window`; none for a recurrent group.
    pub fn attended(&self, ctx: u64) -> u64 {
        self.resident_tokens(ctx + 1)
    }

    /// Attention FLOPs per (query token × attended token) in one layer on one device, with
    /// `q_per_device` query heads there: QKᵀ and PV at 2 FLOPs a multiply-add. Full and
    /// sliding: `4 × q × head_dim`; MLA in the absorbed form: scores over the latent and the
    /// RoPE part, values over the latent, `2 × q × (2 × latent_dim + rope_dim)`; recurrent: 0
    /// (its state update is not modelled; see docs/layer-groups.md).
    pub fn attn_flops_per_pair_per_layer(&self, q_per_device: f64) -> f64 {
        match *self {
            LayerGroup::Full { head_dim, .. } | LayerGroup::Sliding { head_dim, .. } => {
                4.0 * q_per_device * head_dim as f64
            }
            LayerGroup::Mla {
                latent_dim,
                rope_dim,
                ..
            } => 2.0 * q_per_device * (2.0 * latent_dim as f64 + rope_dim as f64),
            LayerGroup::Recurrent { .. } => 0.0,
        }
    }

    /// Attention weights of one layer (projections in and out). Full and sliding: Q and O of
    /// `q_heads × head_dim`, K and V of `kv_heads × head_dim`. MLA (DeepSeek-V2/V3, with the
    /// model's `head_dim` as both the no-RoPE query/key dim and the value dim): the query's
    /// down and up projections (or one projection without `q_lora_rank`), the joint KV down
    /// projection to `latent_dim + rope_dim`, its up projection to keys and values, the output.
    /// Recurrent: priced as a full layer with the model's heads (its own projections differ by
    /// a few million parameters a layer, said beside each preset).
    pub fn attention_params(
        &self,
        d_model: u64,
        q_heads: u64,
        head_dim: u64,
        model_kv_heads: u64,
    ) -> Option<u64> {
        let gqa = |kv_heads: u64, hd: u64| -> Option<u64> {
            let q = q_heads.checked_mul(hd)?;
            let kv = kv_heads.checked_mul(hd)?;
            d_model
                .checked_mul(q)?
                .checked_mul(2)?
                .checked_add(d_model.checked_mul(kv)?.checked_mul(2)?)
        };
        match *self {
            LayerGroup::Full {
                kv_heads, head_dim, ..
            }
            | LayerGroup::Sliding {
                kv_heads, head_dim, ..
            } => gqa(kv_heads as u64, head_dim as u64),
            LayerGroup::Recurrent { .. } => gqa(model_kv_heads, head_dim),
            LayerGroup::Mla {
                latent_dim,
                rope_dim,
                q_lora_rank,
                ..
            } => {
                let (c, r, ql) = (latent_dim as u64, rope_dim as u64, q_lora_rank as u64);
                let q_out = q_heads.checked_mul(head_dim.checked_add(r)?)?;
                let q = if ql == 0 {
                    d_model.checked_mul(q_out)?
                } else {
                    d_model
                        .checked_mul(ql)?
                        .checked_add(ql.checked_mul(q_out)?)?
                };
                let kv_down = d_model.checked_mul(c.checked_add(r)?)?;
                let kv_up = c.checked_mul(q_heads.checked_mul(head_dim.checked_mul(2)?)?)?;
                let out = q_heads.checked_mul(head_dim)?.checked_mul(d_model)?;
                q.checked_add(kv_down)?.checked_add(kv_up)?.checked_add(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flashmla_fp8_layout_is_656_bytes() {
        let g = LayerGroup::Mla {
            layers: 1,
            latent_dim: 512,
            rope_dim: 64,
            q_lora_rank: 0,
        };
        assert_eq!(g.bytes_per_token_per_layer(8, Dtype::Fp8E4m3), Some(656));
        assert_eq!(g.bytes_per_token_per_layer(8, Dtype::Bf16), Some(1152));
    }

    #[test]
    fn a_sliding_layer_keeps_its_window() {
        let g = LayerGroup::Sliding {
            layers: 2,
            window: 128,
            kv_heads: 8,
            head_dim: 64,
        };
        assert_eq!(g.resident_tokens(100), 100);
        assert_eq!(g.resident_tokens(5000), 128);
        assert_eq!(g.attended(127), 128);
        assert_eq!(g.attended(128), 128);
    }
}
