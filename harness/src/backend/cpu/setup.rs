//! From the harness's model shape to the kernels' config and the oracle's plain data.
//!
//! **Invariant:** the cpu model's layer order is the groups' order (`layer_kinds`: each group's
//! layers one group after another, as listed); the oracle receives the same per-layer kinds and
//! weights as plain data and computes them with its own code.

use kvbench_kernels::{Fp8Format, KvQuant, LayerKind, ModelConfig, ScaleGranularity, Transformer};
use kvbench_oracle::{
    OracleAttention, OracleConfig, OracleLayer, OracleMla, OracleRecurrent, OracleWeights,
};

use crate::backend::BackendError;
use crate::model::{Dtype, KvScale, LayerGroup, ModelShape};

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
    layer_kinds(shape)?;
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

/// Why `cpu` cannot run `shape` with the prefix cache on under the summed managers, naming
/// the first recurrent group: its layers keep one state per sequence and nothing per token, and
/// only the hybrid manager keeps checkpoints of it, so under the summed pair a prefix hit would
/// skip a prefill those layers need and the step would fail at the first hit. Refused at
/// set-up, once the backend is known, so no request runs. `sim` holds no state and prices the
/// hit as taken; `cuda` refuses the recurrent group itself.
pub fn prefix_cache_refusal(
    shape: &ModelShape,
    prefix_cache: bool,
    hybrid: bool,
) -> Option<String> {
    if !prefix_cache || hybrid {
        return None;
    }
    let (i, g) = shape
        .layer_groups
        .iter()
        .enumerate()
        .find(|(_, g)| matches!(g, LayerGroup::Recurrent { .. }))?;
    Some(format!(
        "model.layer_groups.{i} (attention = \"{}\") keeps one state per sequence and nothing per token, and the summed managers keep no checkpoint of it, so a prefix-cache hit cannot skip its prefill on cpu: run model {} with cache.manager = \"hybrid\" (its state checkpoints) or scheduler.prefix_cache = false",
        g.kind(),
        shape.name
    ))
}

/// Each layer's attention kind, in layer order: the groups' layers one group after another,
/// in the order the groups are listed (a group is a count, so this is the cpu model's choice of
/// where its layers sit). Full, sliding and MLA groups run; a full or sliding group must have
/// the model's KV heads and head dim (the cpu model has one head layout), an MLA group an even
/// `rope_dim` (RoPE pairs), a recurrent group `state_bytes` a whole number of f32 values (its
/// state is kept in f32 whatever the KV dtype).
pub fn layer_kinds(shape: &ModelShape) -> Result<Vec<LayerKind>, BackendError> {
    let mut kinds = Vec::with_capacity(shape.layers as usize);
    for (i, g) in shape.layer_groups.iter().enumerate() {
        let key = format!("model.layer_groups.{i} (attention = \"{}\")", g.kind());
        let kind = match *g {
            LayerGroup::Full { .. } => LayerKind::Full,
            LayerGroup::Sliding { window, .. } => LayerKind::Sliding {
                window: window as usize,
            },
            LayerGroup::Mla {
                latent_dim,
                rope_dim,
                ..
            } => {
                if latent_dim == 0 || rope_dim == 0 || !rope_dim.is_multiple_of(2) {
                    return Err(BackendError::Config(format!(
                        "{key}: the cpu model needs a positive latent_dim and an even, positive rope_dim (RoPE pairs); got {latent_dim} and {rope_dim}"
                    )));
                }
                LayerKind::Mla {
                    latent_dim: latent_dim as usize,
                    rope_dim: rope_dim as usize,
                }
            }
            LayerGroup::Recurrent { state_bytes, .. } => {
                let state_dim = usize::try_from(state_bytes / 4).unwrap_or(0);
                if state_dim == 0 || !state_bytes.is_multiple_of(4) || state_dim > 1 << 20 {
                    return Err(BackendError::Config(format!(
                        "{key}: the cpu model keeps a recurrent state in f32: state_bytes must be a positive multiple of 4, at most 4 MiB (got {state_bytes})"
                    )));
                }
                LayerKind::Recurrent { state_dim }
            }
        };
        if g.heads()
            .is_some_and(|h| h != (shape.kv_heads, shape.head_dim))
        {
            return Err(BackendError::Config(format!(
                "{key}: the cpu model has one KV layout ({} KV heads of dim {}); this group's differs",
                shape.kv_heads, shape.head_dim
            )));
        }
        kinds.extend(std::iter::repeat_n(kind, g.layers() as usize));
    }
    if shape.layer_groups.is_empty() {
        kinds.resize(shape.layers as usize, LayerKind::Full);
    }
    if kinds.len() != shape.layers as usize {
        return Err(BackendError::Config(format!(
            "model.layer_groups: the groups hold {} layers, model {} has {}",
            kinds.len(),
            shape.name,
            shape.layers
        )));
    }
    Ok(kinds)
}

/// The seeded cpu model of `shape`: its config ([`model_config`]) and each layer's kind.
pub fn seeded_model(shape: &ModelShape, seed: u64) -> Result<Transformer, BackendError> {
    let cfg = model_config(shape)?;
    let kinds = layer_kinds(shape)?;
    Transformer::seeded_with_kinds(cfg, kinds, seed)
        .map_err(|e| BackendError::Config(e.to_string()))
}

/// Tokens of the fixed prompt static FP8 scales are calibrated on (ids `i × 7919 mod vocab`:
/// a spread of the vocabulary, the same for every run of a model).
pub const FP8_CALIBRATION_TOKENS: usize = 64;

/// How the cpu backend stores KV: element type and, for FP8, the quantisation.
pub enum KvStorage {
    F32,
    Bf16,
    Fp8(KvQuant),
}

/// The storage `shape.kv_dtype` asks for; static FP8 scales are calibrated on `model`.
pub fn kv_storage(shape: &ModelShape, model: &Transformer) -> Result<KvStorage, BackendError> {
    let format = match shape.kv_dtype {
        Dtype::F32 => return Ok(KvStorage::F32),
        Dtype::Bf16 => return Ok(KvStorage::Bf16),
        Dtype::Fp8E4m3 => Fp8Format::E4m3,
        Dtype::Fp8E5m2 => Fp8Format::E5m2,
        Dtype::F16 => return Err(BackendError::Config(
            "model.kv_dtype: the cpu backend stores KV as f32, bf16, fp8_e4m3 or fp8_e5m2, not f16"
                .into(),
        )),
    };
    let granularity = match shape.kv_scale_granularity() {
        Some(KvScale::PerHead) => ScaleGranularity::PerHead,
        Some(KvScale::PerBlock) => ScaleGranularity::PerBlock {
            block_tokens: shape.kv_scale.map_or(1, |(_, b)| b.max(1) as usize),
        },
        _ => ScaleGranularity::PerTensor,
    };
    let vocab = model.cfg.vocab.max(1);
    let prompt: Vec<u32> = (0..FP8_CALIBRATION_TOKENS)
        .map(|i| ((i * 7919) % vocab) as u32)
        .collect();
    let amax = match granularity {
        ScaleGranularity::PerBlock { .. } => Vec::new(),
        _ => model
            .kv_amax(&prompt)
            .map_err(|e| BackendError::Config(format!("FP8 scale calibration: {e}")))?,
    };
    Ok(KvStorage::Fp8(KvQuant::calibrated(
        format,
        granularity,
        &amax,
        model.cfg.kv_heads,
    )))
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
        attention: model
            .layer_kinds()
            .iter()
            .map(|k| match *k {
                LayerKind::Full => OracleAttention::Full,
                LayerKind::Sliding { window } => OracleAttention::Sliding { window },
                LayerKind::Mla {
                    latent_dim,
                    rope_dim,
                } => OracleAttention::Mla {
                    latent_dim,
                    rope_dim,
                },
                LayerKind::Recurrent { state_dim } => OracleAttention::Recurrent { state_dim },
            })
            .collect(),
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
                mla: l.mla.as_ref().map(|m| OracleMla {
                    wq: m.wq.clone(),
                    w_dkv: m.w_dkv.clone(),
                    w_uk: m.w_uk.clone(),
                    w_uv: m.w_uv.clone(),
                }),
                recurrent: l.recurrent.as_ref().map(|r| OracleRecurrent {
                    w_a: r.w_a.clone(),
                    w_u: r.w_u.clone(),
                    w_g: r.w_g.clone(),
                    w_out: r.w_out.clone(),
                }),
            })
            .collect(),
        final_norm: w.final_norm.clone(),
        lm_head: w.lm_head.clone(),
    };
    kvbench_oracle::Model::new(cfg, &weights)
        .map_err(|e| BackendError::Config(format!("oracle: {e}")))
}
