//! The activation workspace `sim` puts in the ledger when the scenario states none: the buffers
//! one step of `tokens` tokens holds at its peak, as a serving engine allocates them for its
//! largest step (`cuda` sizes its own the same way).
//!
//! Per token: four hidden-size vectors (the residual stream, the normed input, the attention
//! output and the layer's output), the MLP's widest intermediate (gate and up, two vectors of
//! its width), in the activation dtype (`activation_dtype_bytes`), and f32 logits over the
//! vocabulary. A dense MLP's
//! intermediate is `2 × ffn_dim`. An MoE layer's is what its tokens are routed to: each token's
//! `active_experts` routed experts and the `shared_experts`, each a gated MLP of
//! `expert_ffn_dim`, so `2 × expert_ffn_dim × (active_experts + shared_experts)`, plus the
//! router's f32 logits over `experts`; the buffers are reused layer after layer, so a model with
//! dense layers before its MoE ones (DeepSeek-V3) holds the wider of the two. Everything is split
//! over `tp` devices like the weights.

use crate::model::{Dtype, ModelShape};

/// The bytes of one activation value. Activations are not held in the weights' storage type:
/// serving stacks keep them in bf16 (or fp16) and feed FP8 weights to their GEMMs with bf16
/// activations (DeepSeek-V3's FP8 checkpoint is served with bf16 activations, as is any model
/// whose weights are quantized for storage), so an FP8 model's workspace is counted at 2 bytes a
/// value, not the weights' 1. A model stored wider than 2 bytes (the cpu backend's f32 `tiny`)
/// computes in its own dtype, so a value takes its weights' bytes.
pub fn activation_dtype_bytes(m: &ModelShape) -> u64 {
    m.weight_dtype.bytes().max(Dtype::Bf16.bytes())
}

/// The bytes of activation workspace one token of a step holds, on all devices together.
pub fn bytes_per_token(m: &ModelShape) -> u64 {
    let dense_mlp = 2 * m.ffn_dim as u64;
    let (mlp, router_bytes) = match m.moe {
        None => (dense_mlp, 0),
        Some(moe) => {
            let routed = (moe.active_experts as u64 + moe.shared_experts as u64)
                .saturating_mul(2 * moe.expert_ffn_dim as u64);
            let dense = if m.dense_layers > 0 { dense_mlp } else { 0 };
            (routed.max(dense), 4 * moe.experts as u64)
        }
    };
    (4 * m.d_model as u64 + mlp)
        .saturating_mul(activation_dtype_bytes(m))
        .saturating_add(router_bytes)
        .saturating_add(4 * m.vocab as u64)
}

/// The workspace of a step of `tokens` tokens on one of the model's `tp` devices.
pub fn bytes(m: &ModelShape, tokens: u32) -> u64 {
    bytes_per_token(m).saturating_mul(tokens as u64) / m.tp.max(1) as u64
}
