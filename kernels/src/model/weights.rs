//! Deterministic random weights.
//!
//! Every matrix is drawn uniform with standard deviation 1/sqrt(fan_in), so each projection maps
//! unit-RMS inputs to unit-RMS outputs and activations stay O(1) through the layers; norm gains
//! are 1 ± 0.1. The vocabulary projection gets `LOGIT_STD` so logits spread over a few units:
//! softmax is neither flat nor one-hot, and the top-1 token usually wins by a clear margin.
//! Matrices are row-major `[in, out]` (the product is `x · W`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::{LayerKind, ModelConfig};
use crate::error::KernelError;

const LOGIT_STD: f32 = 4.0;

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// `[d_model, q_heads*head_dim]`
    pub wq: Vec<f32>,
    /// `[d_model, kv_heads*head_dim]`
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    /// `[q_heads*head_dim, d_model]`
    pub wo: Vec<f32>,
    pub mlp_norm: Vec<f32>,
    /// `[d_model, ffn_dim]`
    pub w_gate: Vec<f32>,
    pub w_up: Vec<f32>,
    /// `[ffn_dim, d_model]`
    pub w_down: Vec<f32>,
    /// An MLA layer's projections (`wq`, `wk`, `wv` are then empty; `wo` is shared: the
    /// heads' values are `head_dim` wide as in a full layer).
    pub mla: Option<MlaWeights>,
    /// A recurrent layer's projections (`wq`, `wk`, `wv`, `wo` are then empty).
    pub recurrent: Option<RecurrentWeights>,
}

/// A gated linear recurrence's projections, row-major `[in, out]`
/// ([`LayerKind::Recurrent`]).
#[derive(Debug, Clone)]
pub struct RecurrentWeights {
    pub state_dim: usize,
    /// `[d_model, state_dim]` each: the decay gate, the input, the output gate.
    pub w_a: Vec<f32>,
    pub w_u: Vec<f32>,
    pub w_g: Vec<f32>,
    /// `[state_dim, d_model]`
    pub w_out: Vec<f32>,
}

/// Multi-head latent attention's projections, each row-major `[in, out]`.
#[derive(Debug, Clone)]
pub struct MlaWeights {
    pub latent_dim: usize,
    pub rope_dim: usize,
    /// `[d_model, q_heads × (head_dim + rope_dim)]`: per head its no-RoPE part, then its RoPE part.
    pub wq: Vec<f32>,
    /// `[d_model, latent_dim + rope_dim]`: the latent, then the shared RoPE key (what is cached).
    pub w_dkv: Vec<f32>,
    /// `[latent_dim, q_heads × head_dim]`: the latent to each head's no-RoPE key.
    pub w_uk: Vec<f32>,
    /// `[latent_dim, q_heads × head_dim]`: the latent to each head's value.
    pub w_uv: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// `[vocab, d_model]`
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// `[d_model, vocab]`
    pub lm_head: Vec<f32>,
}

fn uniform(rng: &mut ChaCha20Rng, n: usize, std: f32) -> Vec<f32> {
    let a = std * 3f32.sqrt();
    (0..n).map(|_| rng.gen_range(-a..a)).collect()
}

fn gains(rng: &mut ChaCha20Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 1.0 + rng.gen_range(-0.1f32..0.1)).collect()
}

impl ModelWeights {
    /// Number of f32 values held (all matrices, embeddings and norm gains).
    pub fn parameter_count(&self) -> usize {
        let layer = |l: &LayerWeights| {
            [
                &l.attn_norm,
                &l.wq,
                &l.wk,
                &l.wv,
                &l.wo,
                &l.mlp_norm,
                &l.w_gate,
                &l.w_up,
                &l.w_down,
            ]
            .iter()
            .map(|v| v.len())
            .sum::<usize>()
                + l.mla.as_ref().map_or(0, |m| {
                    m.wq.len() + m.w_dkv.len() + m.w_uk.len() + m.w_uv.len()
                })
                + l.recurrent.as_ref().map_or(0, |r| {
                    r.w_a.len() + r.w_u.len() + r.w_g.len() + r.w_out.len()
                })
        };
        self.embed.len()
            + self.layers.iter().map(layer).sum::<usize>()
            + self.final_norm.len()
            + self.lm_head.len()
    }

    /// Weights for `cfg` drawn from ChaCha20 seeded with `seed`: same seed, same bits.
    pub fn random(cfg: &ModelConfig, seed: u64) -> Result<ModelWeights, KernelError> {
        Self::random_with_kinds(cfg, &vec![LayerKind::Full; cfg.layers], seed)
    }

    /// Weights for `cfg` whose layers are `kinds`: full and sliding layers draw exactly what
    /// [`random`](Self::random) draws, an MLA layer its own projections in their place.
    pub fn random_with_kinds(
        cfg: &ModelConfig,
        kinds: &[LayerKind],
        seed: u64,
    ) -> Result<ModelWeights, KernelError> {
        cfg.validate()?;
        crate::error::check_len("layer kinds", cfg.layers, kinds.len())?;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let d = cfg.d_model;
        let inv = |n: usize| 1.0 / (n as f32).sqrt();
        let embed = uniform(&mut rng, cfg.vocab * d, 1.0);
        let (qh, hd) = (cfg.q_heads, cfg.head_dim);
        let layers = kinds
            .iter()
            .map(|kind| {
                let attn_norm = gains(&mut rng, d);
                if let LayerKind::Recurrent { state_dim } = *kind {
                    let r = RecurrentWeights {
                        state_dim,
                        w_a: uniform(&mut rng, d * state_dim, inv(d)),
                        w_u: uniform(&mut rng, d * state_dim, inv(d)),
                        w_g: uniform(&mut rng, d * state_dim, inv(d)),
                        w_out: uniform(&mut rng, state_dim * d, inv(state_dim)),
                    };
                    return LayerWeights {
                        attn_norm,
                        wq: Vec::new(),
                        wk: Vec::new(),
                        wv: Vec::new(),
                        wo: Vec::new(),
                        mlp_norm: gains(&mut rng, d),
                        w_gate: uniform(&mut rng, d * cfg.ffn_dim, inv(d)),
                        w_up: uniform(&mut rng, d * cfg.ffn_dim, inv(d)),
                        w_down: uniform(&mut rng, cfg.ffn_dim * d, inv(cfg.ffn_dim)),
                        mla: None,
                        recurrent: Some(r),
                    };
                }
                let (wq, wk, wv, mla) = match *kind {
                    LayerKind::Mla {
                        latent_dim,
                        rope_dim,
                    } => {
                        let m = MlaWeights {
                            latent_dim,
                            rope_dim,
                            wq: uniform(&mut rng, d * qh * (hd + rope_dim), inv(d)),
                            w_dkv: uniform(&mut rng, d * (latent_dim + rope_dim), inv(d)),
                            w_uk: uniform(&mut rng, latent_dim * qh * hd, inv(latent_dim)),
                            w_uv: uniform(&mut rng, latent_dim * qh * hd, inv(latent_dim)),
                        };
                        (Vec::new(), Vec::new(), Vec::new(), Some(m))
                    }
                    _ => (
                        uniform(&mut rng, d * cfg.q_dim(), inv(d)),
                        uniform(&mut rng, d * cfg.kv_dim(), inv(d)),
                        uniform(&mut rng, d * cfg.kv_dim(), inv(d)),
                        None,
                    ),
                };
                LayerWeights {
                    attn_norm,
                    wq,
                    wk,
                    wv,
                    wo: uniform(&mut rng, cfg.q_dim() * d, inv(cfg.q_dim())),
                    mlp_norm: gains(&mut rng, d),
                    w_gate: uniform(&mut rng, d * cfg.ffn_dim, inv(d)),
                    w_up: uniform(&mut rng, d * cfg.ffn_dim, inv(d)),
                    w_down: uniform(&mut rng, cfg.ffn_dim * d, inv(cfg.ffn_dim)),
                    mla,
                    recurrent: None,
                }
            })
            .collect();
        let final_norm = gains(&mut rng, d);
        let lm_head = uniform(&mut rng, d * cfg.vocab, LOGIT_STD * inv(d));
        Ok(ModelWeights {
            embed,
            layers,
            final_norm,
            lm_head,
        })
    }
}
