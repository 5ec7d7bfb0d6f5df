//! The oracle: an f64 forward pass of the decoder over the full token history, with no KV cache.
//!
//! **Architecture invariant:** this crate depends on no other kvbench crate and shares no code
//! with `kvbench-kernels` or `kvbench-baselines`. RMSNorm, RoPE, softmax and the matrix products
//! are written again here, plainly, in f64. It receives the model only as plain data
//! ([`OracleConfig`], [`OracleWeights`]), so a bug in the kernels' math or in any address
//! translation cannot also be present here.
//!
//! Conventions it shares with the model by contract (not by code): matrices are row-major
//! `[in, out]` (`y = x · W`), RoPE pairs element `i` with `i + head_dim/2` at angle
//! `pos × theta^(-2i/head_dim)`, query head `h` reads KV head `h / (q_heads / kv_heads)`,
//! attention scale `1/sqrt(head_dim)`, SiLU-gated MLP `down(silu(gate(x)) ⊙ up(x))`; a sliding
//! layer of window `w` lets the query at `p` read positions `p + 1 − w ..= p` only.
//!
//! Layer kinds come as plain data too ([`OracleConfig::attention`], one [`OracleAttention`] per
//! layer; empty is all full). Each is computed its own way, so nothing is shared with the
//! kernels' choices: the window by its own loop bounds, MLA in the naive form (every head's key
//! and value expanded from the latent, where the kernels absorb the projections), a recurrent
//! layer over the whole history from zeros.

mod forward;
mod math;

pub use forward::Model;

/// What one layer attends to (the model's contract, restated here as plain data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OracleAttention {
    /// Positions `0 ..= p` for the query at `p`.
    #[default]
    Full,
    /// Positions `p + 1 − window ..= p` (those that exist) for the query at `p`.
    Sliding { window: usize },
    /// Multi-head latent attention over positions `0 ..= p`, computed here in the naive form:
    /// every head's key and value expanded from the latent ([`OracleMla`]).
    Mla { latent_dim: usize, rope_dim: usize },
    /// A gated linear recurrence of `state_dim` values, from zeros at position 0
    /// ([`OracleRecurrent`]).
    Recurrent { state_dim: usize },
}

/// A recurrent layer's weights, row-major `[in, out]`: `w_a`, `w_u`, `w_g` `[d, state_dim]`,
/// `w_out` `[state_dim, d]`. Per position, on the normed input h: `a = σ(h·w_a)`,
/// `s = a ⊙ s + (1 − a) ⊙ (h·w_u)`, the layer adds `(s ⊙ silu(h·w_g))·w_out`.
#[derive(Debug, Clone, Default)]
pub struct OracleRecurrent {
    pub w_a: Vec<f32>,
    pub w_u: Vec<f32>,
    pub w_g: Vec<f32>,
    pub w_out: Vec<f32>,
}

/// An MLA layer's weights, row-major `[in, out]`: `wq` `[d, q_heads × (head_dim + rope_dim)]`
/// (per head its no-RoPE part, then its RoPE part), `w_dkv` `[d, latent + rope_dim]` (the
/// latent, then the key's RoPE part shared by the heads), `w_uk` and `w_uv` `[latent, q_heads ×
/// head_dim]` (each head's no-RoPE key and its value from the latent). Scores are scaled by
/// `1/sqrt(head_dim + rope_dim)`; RoPE over `rope_dim` uses `theta^(-2i/rope_dim)`.
#[derive(Debug, Clone, Default)]
pub struct OracleMla {
    pub wq: Vec<f32>,
    pub w_dkv: Vec<f32>,
    pub w_uk: Vec<f32>,
    pub w_uv: Vec<f32>,
}

use thiserror::Error;

/// Model constants, as plain numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct OracleConfig {
    pub layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub d_model: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    pub rope_theta: f64,
    pub norm_eps: f64,
    /// One per layer, in order; empty means every layer is [`OracleAttention::Full`].
    pub attention: Vec<OracleAttention>,
}

/// One layer's weights (the f32 values the backend uses; widened to f64 exactly).
#[derive(Debug, Clone, Default)]
pub struct OracleLayer {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub mlp_norm: Vec<f32>,
    pub w_gate: Vec<f32>,
    pub w_up: Vec<f32>,
    pub w_down: Vec<f32>,
    /// An MLA layer's projections (its `wq`, `wk`, `wv` above are then unused).
    pub mla: Option<OracleMla>,
    /// A recurrent layer's projections (its attention weights above are then unused).
    pub recurrent: Option<OracleRecurrent>,
}

#[derive(Debug, Clone, Default)]
pub struct OracleWeights {
    /// `[vocab, d_model]`
    pub embed: Vec<f32>,
    pub layers: Vec<OracleLayer>,
    pub final_norm: Vec<f32>,
    /// `[d_model, vocab]`
    pub lm_head: Vec<f32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OracleError {
    #[error("weight {name}: expected {expected} values, got {got}")]
    WeightShape {
        name: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("invalid config: {0}")]
    Config(String),
    #[error("token {token} at position {pos} is outside the vocabulary of {vocab}")]
    Token {
        token: u32,
        pos: usize,
        vocab: usize,
    },
    #[error("position {pos} is outside the history of {len} tokens")]
    Position { pos: usize, len: usize },
}

/// ‖out − ref‖₂ / ‖ref‖₂ (NaN in `out` gives NaN: callers must treat "not ≤ tolerance" as a
/// failure). A length mismatch is infinitely wrong.
pub fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let mut diff = 0f64;
    let mut norm = 0f64;
    for (o, r) in out.iter().zip(reference) {
        let d = *o as f64 - r;
        diff += d * d;
        norm += r * r;
    }
    if norm == 0.0 {
        return if diff == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (diff / norm).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_err_is_relative_and_poisoned_by_nan() {
        assert_eq!(rel_err(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        assert!((rel_err(&[3.0, 4.5], &[3.0, 4.0]) - 0.1).abs() < 1e-12);
        assert!(rel_err(&[f32::NAN, 4.0], &[3.0, 4.0]).is_nan());
        assert_eq!(rel_err(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    }
}
