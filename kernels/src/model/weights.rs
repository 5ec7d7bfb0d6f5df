//! Deterministic random weights.
//!
//! Every matrix is drawn uniform with standard deviation 1/sqrt(fan_in), so each projection maps
//! unit-RMS inputs to unit-RMS outputs and activations stay O(1) through the layers; norm gains
//! are 1 ± 0.1. The vocabulary projection gets `LOGIT_STD` so logits spread over a few units:
//! softmax is neither flat nor one-hot, and the top-1 token usually wins by a clear margin.
//! Matrices are row-major `[in, out]` (the product is `x · W`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::ModelConfig;
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
        };
        self.embed.len()
            + self.layers.iter().map(layer).sum::<usize>()
            + self.final_norm.len()
            + self.lm_head.len()
    }

    /// Weights for `cfg` drawn from ChaCha20 seeded with `seed`: same seed, same bits.
    pub fn random(cfg: &ModelConfig, seed: u64) -> Result<ModelWeights, KernelError> {
        cfg.validate()?;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let d = cfg.d_model;
        let inv = |n: usize| 1.0 / (n as f32).sqrt();
        let embed = uniform(&mut rng, cfg.vocab * d, 1.0);
        let layers = (0..cfg.layers)
            .map(|_| LayerWeights {
                attn_norm: gains(&mut rng, d),
                wq: uniform(&mut rng, d * cfg.q_dim(), inv(d)),
                wk: uniform(&mut rng, d * cfg.kv_dim(), inv(d)),
                wv: uniform(&mut rng, d * cfg.kv_dim(), inv(d)),
                wo: uniform(&mut rng, cfg.q_dim() * d, inv(cfg.q_dim())),
                mlp_norm: gains(&mut rng, d),
                w_gate: uniform(&mut rng, d * cfg.ffn_dim, inv(d)),
                w_up: uniform(&mut rng, d * cfg.ffn_dim, inv(d)),
                w_down: uniform(&mut rng, cfg.ffn_dim * d, inv(cfg.ffn_dim)),
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
