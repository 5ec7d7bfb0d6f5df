//! A tiny decoder-only transformer with seeded random weights, computing over the paged (or
//! contiguous) KV cache.
//!
//! Embedding → per layer [RMSNorm → Q/K/V (GQA) → RoPE → KV write by slot mapping →
//! attention over the cache → output projection → residual → RMSNorm → gated SiLU MLP →
//! residual] → final RMSNorm → vocabulary projection. Greedy decoding picks the top logit.
//!
//! Each layer has a [`LayerKind`]: full, sliding, MLA or recurrent. A sliding layer has a full
//! layer's weights and reads only its window; [`Transformer::seeded_with_kinds`] draws each MLA
//! or recurrent layer's own weights in place of its Q/K/V, and full and sliding layers exactly
//! what `seeded` draws, so a model without other kinds keeps its bits. A recurrent layer keeps no
//! per-token cache: its per-sequence state is the caller's, passed to
//! [`Transformer::forward_with_states`] and advanced token by token (`forward` is the same call
//! with no states).

mod forward;
mod mla;
mod ops;
mod weights;

pub use forward::{StepSeq, Transformer};
pub use mla::MLA_FP8_TILE;

/// What one layer's attention attends to. Every kind shares the layer's weights and KV layout;
/// only the keys a query sees differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerKind {
    /// Every earlier position and the token itself.
    #[default]
    Full,
    /// The last `window` positions, the token itself included (Gemma 3's and gpt-oss's local
    /// layers). The cache still holds every position; the layer just never reads older ones.
    Sliding { window: usize },
    /// Multi-head latent attention (DeepSeek-V2/V3): the cache holds one `latent_dim` vector
    /// and `rope_dim` RoPE'd key values per token, shared by every head; each head's no-RoPE
    /// key and value are up-projections of the latent (`head_dim` each), computed in the
    /// absorbed form (see [`crate::attention_mla`]). Its own weights ([`MlaWeights`]).
    Mla { latent_dim: usize, rope_dim: usize },
    /// A gated linear recurrence with a `state_dim` state per sequence, no per-token cache
    /// ([`RecurrentWeights`]): `a = σ(h·W_a)`, `s ← a ⊙ s + (1 − a) ⊙ (h·W_u)`, output
    /// `(s ⊙ silu(h·W_g))·W_out`, token by token from a zero state at position 0.
    Recurrent { state_dim: usize },
}

impl LayerKind {
    /// The window a query's keys are cut to (`None`: the whole context).
    pub fn window(self) -> Option<usize> {
        match self {
            LayerKind::Sliding { window } => Some(window),
            _ => None,
        }
    }

    /// (K, V) elements one token stores in this layer, for a model of `kv_dim` K/V elements.
    pub fn kv_rows(self, kv_dim: usize) -> (usize, usize) {
        match self {
            LayerKind::Mla {
                latent_dim,
                rope_dim,
            } => (latent_dim + rope_dim, 0),
            LayerKind::Recurrent { .. } => (0, 0),
            _ => (kv_dim, kv_dim),
        }
    }
}
pub use ops::{rank_token, rope_inv_freq};
pub use weights::{LayerWeights, MlaWeights, ModelWeights, RecurrentWeights};

use crate::error::KernelError;

/// The model's shape and constants; plain data so the harness can build it from its own shape type.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub d_model: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    pub rope_theta: f64,
    pub norm_eps: f32,
}

impl ModelConfig {
    pub fn validate(&self) -> Result<(), KernelError> {
        let positive = [
            ("layers", self.layers),
            ("q_heads", self.q_heads),
            ("kv_heads", self.kv_heads),
            ("d_model", self.d_model),
            ("ffn_dim", self.ffn_dim),
            ("vocab", self.vocab),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(KernelError::Config(format!("{name} must be positive")));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(KernelError::Config(format!(
                "head_dim {} must be even and positive (RoPE pairs)",
                self.head_dim
            )));
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(KernelError::Config(format!(
                "q_heads {} must be a multiple of kv_heads {}",
                self.q_heads, self.kv_heads
            )));
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.q_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}
