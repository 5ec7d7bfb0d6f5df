//! From the harness's model shape to the kernels' config and the oracle's plain data.

use kvbench_kernels::{ModelConfig, Transformer};
use kvbench_oracle::{OracleConfig, OracleLayer, OracleWeights};

use crate::backend::BackendError;
use crate::model::ModelShape;

/// RoPE base and RMSNorm epsilon of the CPU model (Llama's values).
pub const ROPE_THETA: f64 = 10_000.0;
pub const NORM_EPS: f32 = 1e-5;

/// Above this many parameters the CPU backend refuses: f32 weights of a real 8B model would need
/// 32 GB and hours per run. Use the `tiny` shape (or `sim`) instead.
pub const MAX_PARAMETERS: u64 = 256 * 1024 * 1024;

pub fn model_config(shape: &ModelShape) -> Result<ModelConfig, BackendError> {
    if let Some(key) = shape.moe_key() {
        return Err(BackendError::Config(format!(
            "{key}: the cpu backend runs dense models only; model {} is a mixture of experts (use --backend sim)",
            shape.name
        )));
    }
    if shape.tp > 1 {
        return Err(BackendError::Config(format!(
            "cpu backend runs tp = 1 only (model {} has tp = {})",
            shape.name, shape.tp
        )));
    }
    let params = shape.parameter_count();
    if params > MAX_PARAMETERS {
        return Err(BackendError::Config(format!(
            "model {} has {params} parameters; the cpu backend takes at most {MAX_PARAMETERS} (use the tiny shape, or --backend sim)",
            shape.name
        )));
    }
    shape_config(shape)
}

/// The kernels' config of `shape` with the CPU model's RoPE and norm constants, validated; the
/// `cuda` backend builds the same model from it.
pub fn shape_config(shape: &ModelShape) -> Result<ModelConfig, BackendError> {
    let cfg = ModelConfig {
        layers: shape.layers as usize,
        q_heads: shape.q_heads as usize,
        kv_heads: shape.kv_heads as usize,
        head_dim: shape.head_dim as usize,
        d_model: shape.d_model as usize,
        ffn_dim: shape.ffn_dim as usize,
        vocab: shape.vocab as usize,
        rope_theta: ROPE_THETA,
        norm_eps: NORM_EPS,
    };
    cfg.validate()
        .map_err(|e| BackendError::Config(format!("model {}: {e}", shape.name)))?;
    Ok(cfg)
}

/// The same model handed to the oracle as plain data (weights copied, not shared).
pub fn oracle_for(model: &Transformer) -> Result<kvbench_oracle::Model, BackendError> {
    let c = &model.cfg;
    let w = &model.weights;
    let cfg = OracleConfig {
        layers: c.layers,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        d_model: c.d_model,
        ffn_dim: c.ffn_dim,
        vocab: c.vocab,
        rope_theta: c.rope_theta,
        norm_eps: c.norm_eps as f64,
    };
    let weights = OracleWeights {
        embed: w.embed.clone(),
        layers: w
            .layers
            .iter()
            .map(|l| OracleLayer {
                attn_norm: l.attn_norm.clone(),
                wq: l.wq.clone(),
                wk: l.wk.clone(),
                wv: l.wv.clone(),
                wo: l.wo.clone(),
                mlp_norm: l.mlp_norm.clone(),
                w_gate: l.w_gate.clone(),
                w_up: l.w_up.clone(),
                w_down: l.w_down.clone(),
            })
            .collect(),
        final_norm: w.final_norm.clone(),
        lm_head: w.lm_head.clone(),
    };
    kvbench_oracle::Model::new(cfg, &weights)
        .map_err(|e| BackendError::Config(format!("oracle: {e}")))
}
