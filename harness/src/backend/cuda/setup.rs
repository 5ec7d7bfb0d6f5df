//! From the harness's model shape to what the cuda backend computes with: the CPU model's
//! config (the weights come from the same seeded generator, so logits are comparable with the
//! oracle), the device dims, weight and KV storage types, and how the oracle check samples.
//! What the kernels cannot run is refused here, naming its key: a mixture of experts
//! (`moe_key`), an MLA or recurrent layer group (`unsupported_group_key`: the kernels attend
//! over K/V heads only, and keep no per-sequence state), a group whose heads differ from the
//! model's, and an FP8 KV dtype (`model.kv_dtype`). Full and sliding groups run: a sliding
//! layer is a full layer's weights attending its window only (`CudaConfig::windows`).

use std::sync::{Arc, Mutex};

use kvbench_cuda::model::{HostLayer, HostWeights, ModelDims, WeightDtype};
use kvbench_cuda::KvDtype;
use kvbench_kernels::{LayerKind, ModelConfig, Transformer};

use crate::backend::cpu::{shape_config, MAX_PARAMETERS};
use crate::backend::BackendError;
use crate::model::{Dtype, LayerGroup, ModelShape};

/// f32 weights and f32 KV against the f64 oracle: ‖out − ref‖/‖ref‖ ≤ 1e-4 (as on `cpu`; f32
/// accumulation in another order moves logits by ~1e-6).
pub const F32_TOLERANCE: f64 = 1e-4;
/// bf16 KV (f32 weights): every stored K/V element rounded to 8 significant bits, as on `cpu`.
pub const BF16_KV_TOLERANCE: f64 = 1e-2;
/// bf16 weights: the reference computes with the same bf16-rounded weights, but every GEMM
/// input (activations) is also rounded to bf16 on the device; 5e-2 is stated, not yet measured.
pub const BF16_WEIGHTS_TOLERANCE: f64 = 5e-2;

/// At shapes above [`MAX_PARAMETERS`] (the 8B shape) the f64 oracle would need 8 bytes per
/// parameter and minutes per sequence, so the reference is the CPU f32 model (itself checked
/// against the oracle on small shapes), and only a sample is checked: the first
/// [`SAMPLE_SEQS`] registered sequences whose prompt is at most [`SAMPLE_MAX_PROMPT_TOKENS`]
/// (each check recomputes the history on the CPU: seconds per 100 tokens at 8B) and the
/// first [`SAMPLE_FORKS`] forks, each at its first [`SAMPLE_STEPS`] sampled positions (a preempted
/// one's recomputed positions replace its own).
pub const SAMPLE_SEQS: u64 = 3;
pub const SAMPLE_MAX_PROMPT_TOKENS: usize = 256;
pub const SAMPLE_FORKS: u64 = 1;
pub const SAMPLE_STEPS: usize = 2;

/// How the oracle check covers a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckPolicy {
    /// Every sequence at every sampled position, against the f64 oracle.
    Every,
    /// The stated sample, against the CPU f32 model.
    Sample,
}

/// What one run computes with.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaConfig {
    pub cfg: ModelConfig,
    /// Each layer's kind, in the cpu model's layer order (`backend::cpu::layer_kinds`): full or
    /// sliding only. The reference draws and computes the same layers.
    pub kinds: Vec<LayerKind>,
    /// Per layer, the window the device attends (0: full attention).
    pub windows: Vec<usize>,
    pub dims: ModelDims,
    pub weights: WeightDtype,
    pub kv: KvDtype,
    pub policy: CheckPolicy,
    pub tolerance: f64,
}

pub fn config(shape: &ModelShape) -> Result<CudaConfig, BackendError> {
    if let Some(key) = shape.moe_key() {
        return Err(BackendError::Config(format!(
            "{key}: the cuda backend runs dense models only; model {} is a mixture of experts (use --backend sim)",
            shape.name
        )));
    }
    if let Some(key) = unsupported_group_key(shape) {
        return Err(BackendError::Config(format!(
            "{key}: the cuda backend runs full and sliding-window attention layers only; model {} has an MLA or recurrent layer group (use --backend cpu or sim)",
            shape.name
        )));
    }
    for (i, g) in shape.layer_groups.iter().enumerate() {
        if g.heads()
            .is_some_and(|h| h != (shape.kv_heads, shape.head_dim))
        {
            return Err(BackendError::Config(format!(
                "model.layer_groups.{i} (attention = \"{}\"): the cuda model has one KV layout ({} KV heads of dim {}); this group's differs",
                g.kind(),
                shape.kv_heads,
                shape.head_dim
            )));
        }
    }
    if shape.tp > 1 {
        return Err(BackendError::Config(format!(
            "cuda backend runs tp = 1 only (model {} has tp = {})",
            shape.name, shape.tp
        )));
    }
    if shape.kv_dtype.is_fp8() {
        return Err(BackendError::Config(format!(
            "model.kv_dtype: the cuda kernels store KV as f32 or bf16; {} KV runs on --backend cpu or sim",
            shape.kv_dtype.name()
        )));
    }
    let dtype = |d: Dtype, what: &str| match d {
        Dtype::F32 => Ok(0),
        Dtype::Bf16 => Ok(1),
        other => Err(BackendError::Config(format!(
            "cuda backend stores {what} as f32 or bf16, not {}",
            other.name()
        ))),
    };
    let weights = match dtype(shape.weight_dtype, "weights")? {
        0 => WeightDtype::F32,
        _ => WeightDtype::Bf16,
    };
    let kv = match dtype(shape.kv_dtype, "KV")? {
        0 => KvDtype::F32,
        _ => KvDtype::Bf16,
    };
    let cfg = shape_config(shape)?;
    let kinds = crate::backend::cpu::layer_kinds(shape)?;
    let windows: Vec<usize> = kinds
        .iter()
        .map(|k| match *k {
            LayerKind::Sliding { window } => window,
            _ => 0,
        })
        .collect();
    if let Some(&w) = windows.iter().find(|&&w| i32::try_from(w).is_err()) {
        return Err(BackendError::Config(format!(
            "model {}: a sliding window of {w} tokens is past what the cuda kernels take",
            shape.name
        )));
    }
    let dims = ModelDims {
        layers: cfg.layers,
        q_heads: cfg.q_heads,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
        d_model: cfg.d_model,
        ffn_dim: cfg.ffn_dim,
        vocab: cfg.vocab,
        norm_eps: cfg.norm_eps,
    };
    dims.attn_shape()
        .check()
        .map_err(|e| BackendError::Config(format!("model {}: {e}", shape.name)))?;
    let policy = if shape.parameter_count() <= MAX_PARAMETERS {
        CheckPolicy::Every
    } else {
        CheckPolicy::Sample
    };
    let tolerance = match (weights, kv) {
        (WeightDtype::Bf16, _) => BF16_WEIGHTS_TOLERANCE,
        (WeightDtype::F32, KvDtype::Bf16) => BF16_KV_TOLERANCE,
        (WeightDtype::F32, KvDtype::F32) => F32_TOLERANCE,
    };
    Ok(CudaConfig {
        cfg,
        kinds,
        windows,
        dims,
        weights,
        kv,
        policy,
        tolerance,
    })
}

/// The key of the first layer group the cuda kernels cannot run, with its kind:
/// `model.layer_groups.0 (attention = "mla")`; `None` when every group is full or sliding.
pub fn unsupported_group_key(shape: &ModelShape) -> Option<String> {
    shape
        .layer_groups
        .iter()
        .enumerate()
        .find(|(_, g)| !matches!(g, LayerGroup::Full { .. } | LayerGroup::Sliding { .. }))
        .map(|(i, g)| format!("model.layer_groups.{i} (attention = \"{}\")", g.kind()))
}

fn round_bf16(v: &mut [f32]) {
    for x in v {
        *x = kvbench_kernels::bf16::from_f32(*x).to_f32();
    }
}

/// The seeded model (the `cpu` backend's weights, same generator and seed), with its matrices
/// rounded to bf16 when the device stores them so: the reference then computes with exactly
/// the weights the GPU holds. Drawing the 8B shape takes most of a minute, so the last model
/// is kept for the process (the paged and contiguous runs share it).
pub fn host_model(cc: &CudaConfig, seed: u64) -> Result<Arc<Transformer>, BackendError> {
    type Key = (String, Vec<LayerKind>, u64, WeightDtype);
    static LAST: Mutex<Option<(Key, Arc<Transformer>)>> = Mutex::new(None);
    let key: Key = (format!("{:?}", cc.cfg), cc.kinds.clone(), seed, cc.weights);
    let mut last = LAST
        .lock()
        .map_err(|_| BackendError::Config("host model cache poisoned".into()))?;
    if let Some((k, m)) = last.as_ref() {
        if *k == key {
            return Ok(m.clone());
        }
    }
    *last = None; // free the previous model before drawing the next
    let mut model = Transformer::seeded_with_kinds(cc.cfg.clone(), cc.kinds.clone(), seed)
        .map_err(|e| BackendError::Config(e.to_string()))?;
    if cc.weights == WeightDtype::Bf16 {
        let w = &mut model.weights;
        for l in &mut w.layers {
            for m in [
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.w_gate,
                &mut l.w_up,
                &mut l.w_down,
            ] {
                round_bf16(m);
            }
        }
        round_bf16(&mut w.lm_head);
    }
    let m = Arc::new(model);
    *last = Some((key, m.clone()));
    Ok(m)
}

/// The model's weights as the device upload takes them.
pub fn host_weights(m: &Transformer) -> HostWeights<'_> {
    let w = &m.weights;
    HostWeights {
        embed: &w.embed,
        layers: w
            .layers
            .iter()
            .map(|l| HostLayer {
                attn_norm: &l.attn_norm,
                wq: &l.wq,
                wk: &l.wk,
                wv: &l.wv,
                wo: &l.wo,
                mlp_norm: &l.mlp_norm,
                w_gate: &l.w_gate,
                w_up: &l.w_up,
                w_down: &l.w_down,
            })
            .collect(),
        final_norm: &w.final_norm,
        lm_head: &w.lm_head,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_checks_every_sequence_and_8b_a_sample() {
        let t = config(&ModelShape::tiny()).expect("tiny runs on cuda");
        assert_eq!(t.policy, CheckPolicy::Every);
        assert_eq!((t.weights, t.kv), (WeightDtype::F32, KvDtype::F32));
        assert_eq!(t.tolerance, F32_TOLERANCE);
        let b = config(&ModelShape::llama3_8b()).expect("8B runs on cuda");
        assert_eq!(b.policy, CheckPolicy::Sample);
        assert_eq!((b.weights, b.kv), (WeightDtype::Bf16, KvDtype::Bf16));
        assert_eq!(b.tolerance, BF16_WEIGHTS_TOLERANCE);
        assert_eq!(b.dims.attn_shape().group(), 4);
    }

    #[test]
    fn sliding_groups_run_with_their_windows_and_mla_or_recurrent_are_refused_by_name() {
        let c = config(&ModelShape::tiny_sliding()).expect("tiny-sliding runs on cuda");
        let w = crate::model::TINY_SLIDING_WINDOW as usize;
        assert_eq!(
            c.windows,
            vec![w, w, 0, 0],
            "two sliding layers, then two full"
        );
        assert_eq!(c.kinds[0], LayerKind::Sliding { window: w });
        let m = host_model(&c, 5).expect("drawn");
        assert_eq!(
            m.layer_kinds(),
            &c.kinds[..],
            "the reference computes the same windows"
        );
        let full = config(&ModelShape::tiny()).expect("tiny");
        assert!(full.windows.iter().all(|&w| w == 0));
        for (shape, key) in [
            (
                ModelShape::tiny_mla(),
                "model.layer_groups.0 (attention = \"mla\")",
            ),
            (
                ModelShape::tiny_hybrid(),
                "model.layer_groups.1 (attention = \"recurrent\")",
            ),
        ] {
            let e = config(&shape).expect_err("refused").to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn shapes_without_kernels_or_with_tp_are_refused() {
        let mut s = ModelShape::tiny();
        s.head_dim = 48;
        s.d_model = 384;
        let e = config(&s)
            .expect_err("head dim 48 has no kernel")
            .to_string();
        assert!(e.contains("head_dim 48"), "{e}");
        let mut s = ModelShape::tiny();
        s.tp = 2;
        assert!(config(&s).is_err());
    }

    #[test]
    fn bf16_weights_are_rounded_matrices_only_and_the_model_is_reused() {
        let mut s = ModelShape::tiny();
        s.weight_dtype = Dtype::Bf16;
        let cc = config(&s).expect("valid");
        let a = host_model(&cc, 7).expect("drawn");
        let b = host_model(&cc, 7).expect("cached");
        assert!(Arc::ptr_eq(&a, &b), "same key draws once");
        let wq = &a.weights.layers[0].wq;
        assert!(wq
            .iter()
            .all(|&x| kvbench_kernels::bf16::from_f32(x).to_f32() == x));
        let f32_model = Transformer::seeded(cc.cfg.clone(), 7).expect("drawn");
        assert_eq!(a.weights.embed, f32_model.weights.embed, "embed stays f32");
        assert_ne!(wq, &f32_model.weights.layers[0].wq);
        let hw = host_weights(&a);
        assert_eq!(
            kvbench_cuda::model::sizes::plan_slices(&cc.dims, &hw)
                .expect("matches the plan")
                .len(),
            1 + 9 * cc.dims.layers + 2
        );
    }
}
