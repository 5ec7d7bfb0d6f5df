//! Model shapes and the one formula everything else prices memory with.
//!
//! The KV cache holds keys and values for every layer and KV head, so its size per token is
//! `2 × layers × kv_heads × head_dim × bytes_per_element`. Query heads do not enter: grouped-query
//! attention shares each KV head among several query heads. Tensor parallelism splits KV heads
//! across devices, so the per-device figure divides `kv_heads` by the TP degree.
//!
//! An FP8 KV cache ([`Dtype::Fp8E4m3`], [`Dtype::Fp8E5m2`]) also stores f32 scales
//! ([`KvScale`]): per block they are a per-token term of the same formula (the block's scale
//! bytes ÷ block size, rounded up); per tensor or per head they are a fixed handful of bytes
//! ([`ModelShape::kv_scale_fixed_bytes`]) that `plan` shows.
//!
//! A mixture-of-experts model ([`Moe`]) holds every expert's weights (what the memory budget
//! pays for) but computes with only the experts its router picks for each token (what a step's
//! FLOPs pay for). Which experts a batch of tokens touches decides how many expert weights a
//! step reads: [`Moe::expected_touched_experts`] states the model. Its KV cache is the
//! attention's, the same formula as a dense model's.

use serde::{Deserialize, Serialize};

mod groups;
mod presets;
pub use groups::{LayerGroup, MLA_FP8_TILE};
pub use presets::{QWEN3_NEXT_STATE_BYTES, TINY_SLIDING_WINDOW};

/// Element type of a tensor (weights or KV cache). `fp8` is an alias of `fp8_e4m3`, the
/// format serving engines store KV in by default (more precision; e5m2 trades a mantissa bit
/// for range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    #[serde(rename = "fp8_e4m3", alias = "fp8")]
    Fp8E4m3,
    #[serde(rename = "fp8_e5m2")]
    Fp8E5m2,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::Fp8E4m3 | Dtype::Fp8E5m2 => 1,
        }
    }

    pub fn parse(s: &str) -> Option<Dtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Some(Dtype::F32),
            "f16" | "fp16" | "float16" => Some(Dtype::F16),
            "bf16" | "bfloat16" => Some(Dtype::Bf16),
            "fp8" | "f8" | "e4m3" | "fp8_e4m3" => Some(Dtype::Fp8E4m3),
            "e5m2" | "fp8_e5m2" => Some(Dtype::Fp8E5m2),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp8E4m3 => "fp8_e4m3",
            Dtype::Fp8E5m2 => "fp8_e5m2",
        }
    }

    /// An 8-bit float, which carries scales ([`KvScale`]).
    pub fn is_fp8(self) -> bool {
        matches!(self, Dtype::Fp8E4m3 | Dtype::Fp8E5m2)
    }
}

/// Bytes of one FP8 scale (f32).
pub const KV_SCALE_BYTES: u64 = 4;

/// How many FP8 KV values share one f32 scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvScale {
    /// One scale per layer for K and one for V.
    PerTensor,
    /// One per layer per KV head, K and V.
    PerHead,
    /// One per cache block per layer per KV head, K and V.
    PerBlock,
}

impl KvScale {
    pub fn name(self) -> &'static str {
        match self {
            KvScale::PerTensor => "per_tensor",
            KvScale::PerHead => "per_head",
            KvScale::PerBlock => "per_block",
        }
    }
}

/// A decoder-only transformer's shape: all that memory accounting and the cost model need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Identity of the computation (part of every prefix-cache key).
    pub name: String,
    pub layers: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub d_model: u32,
    pub ffn_dim: u32,
    pub vocab: u32,
    pub weight_dtype: Dtype,
    pub kv_dtype: Dtype,
    /// Tensor-parallel degree: KV heads (and weights) are split across this many devices.
    pub tp: u32,
    /// The feed-forward blocks' experts; `None` is a dense model (every layer's MLP is one gated
    /// MLP of width `ffn_dim`). Left out of a serialized shape when dense, so dense shapes
    /// render as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
    /// FP8 scale granularity (`None`: per tensor for an FP8 cache, nothing otherwise) and, per
    /// block, the block size in tokens the scales are priced over. Left out when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_scale: Option<(KvScale, u32)>,
    /// The layers by KV layout ([`LayerGroup`]), their counts summing to `layers`; empty is one
    /// full group of `kv_heads × head_dim` (every dense preset), left out when empty so those
    /// shapes render as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_groups: Vec<LayerGroup>,
    /// In a mixture of experts, the first layers whose MLP is one dense gated MLP of width
    /// `ffn_dim` instead of experts (DeepSeek-V3's `first_k_dense_replace`); 0 otherwise.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub dense_layers: u32,
}

fn is_zero_u32(x: &u32) -> bool {
    *x == 0
}

/// A mixture-of-experts feed-forward block, the same in every layer: a router (`d_model ×
/// experts` weights) picks `active_experts` of the `experts` routed experts for each token, and
/// every token also passes through the `shared_experts`; each expert is a gated MLP (gate, up,
/// down) of width `expert_ffn_dim`. Under tensor parallelism every expert is split across the
/// devices like a dense MLP (expert parallelism — whole experts on different devices — is not
/// modelled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moe {
    pub experts: u32,
    pub active_experts: u32,
    pub expert_ffn_dim: u32,
    #[serde(default)]
    pub shared_experts: u32,
}

impl Moe {
    /// Expected number of distinct routed experts that `tokens` tokens touch in one layer, under
    /// uniform routing: each token picks `k = active_experts` distinct experts of `E = experts`,
    /// every `k`-subset equally likely and tokens independent. One token misses a given expert
    /// with probability `1 − k/E`, so all `tokens` miss it with probability `(1 − k/E)^tokens`,
    /// and by linearity of expectation the batch touches `E · (1 − (1 − k/E)^tokens)` experts:
    /// `k` for one token, approaching `E` as the batch grows. Real routers are skewed (hot
    /// experts), which touches fewer experts than this for the same batch; the uniform figure is
    /// the upper end of the weight traffic.
    pub fn expected_touched_experts(&self, tokens: u64) -> f64 {
        if tokens == 0 || self.experts == 0 {
            return 0.0;
        }
        let e = self.experts as f64;
        let miss = 1.0 - (self.active_experts.min(self.experts) as f64) / e;
        // A batch is far below 2^31 tokens; the clamp only keeps `powi`'s argument in range.
        let n = tokens.min(i32::MAX as u64) as i32;
        e * (1.0 - miss.powi(n))
    }

    /// The keys a scenario's `[model]` table names them by, with their values.
    pub fn keys(&self) -> [(&'static str, u32); 4] {
        [
            ("experts", self.experts),
            ("active_experts", self.active_experts),
            ("expert_ffn_dim", self.expert_ffn_dim),
            ("shared_experts", self.shared_experts),
        ]
    }
}

impl ModelShape {
    /// Llama 3 8B: 32 layers, 32 query heads, 8 KV heads, head dim 128, bf16. Figures from Meta's
    /// published `config.json` (meta-llama/Meta-Llama-3-8B): `hidden_size` 4096,
    /// `intermediate_size` 14336, `vocab_size` 128256.
    pub fn llama3_8b() -> ModelShape {
        ModelShape {
            name: "llama3-8b".into(),
            layers: 32,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            d_model: 4096,
            ffn_dim: 14336,
            vocab: 128256,
            weight_dtype: Dtype::Bf16,
            kv_dtype: Dtype::Bf16,
            tp: 1,
            moe: None,
            kv_scale: None,
            layer_groups: Vec::new(),
            dense_layers: 0,
        }
    }

    /// Llama 3 70B, for multi-GPU planning. Figures from Meta's published `config.json`
    /// (meta-llama/Meta-Llama-3-70B): 80 layers, 64 query heads, 8 KV heads, `hidden_size` 8192,
    /// `intermediate_size` 28672, `vocab_size` 128256.
    pub fn llama3_70b() -> ModelShape {
        ModelShape {
            name: "llama3-70b".into(),
            layers: 80,
            q_heads: 64,
            kv_heads: 8,
            head_dim: 128,
            d_model: 8192,
            ffn_dim: 28672,
            vocab: 128256,
            weight_dtype: Dtype::Bf16,
            kv_dtype: Dtype::Bf16,
            tp: 1,
            moe: None,
            kv_scale: None,
            layer_groups: Vec::new(),
            dense_layers: 0,
        }
    }

    /// Llama 3.1 405B, dense GQA. Every figure from Meta's published `config.json`
    /// (meta-llama/Llama-3.1-405B): `num_hidden_layers` 126, `num_attention_heads` 128,
    /// `num_key_value_heads` 8, `hidden_size` 16384 (head dim 16384 / 128 = 128),
    /// `intermediate_size` 53248, `vocab_size` 128256, `torch_dtype` bfloat16. The parameter
    /// count this shape gives (≈ 405.9 B) matches the published 405 B.
    pub fn llama3_405b() -> ModelShape {
        ModelShape {
            name: "llama3-405b".into(),
            layers: 126,
            q_heads: 128,
            kv_heads: 8,
            head_dim: 128,
            d_model: 16384,
            ffn_dim: 53248,
            vocab: 128256,
            weight_dtype: Dtype::Bf16,
            kv_dtype: Dtype::Bf16,
            tp: 1,
            moe: None,
            kv_scale: None,
            layer_groups: Vec::new(),
            dense_layers: 0,
        }
    }

    /// Llama 2 7B, dense MHA (one KV head per query head, so no GQA saving). Every figure from
    /// Meta's published `config.json` (meta-llama/Llama-2-7b-hf): `num_hidden_layers` 32,
    /// `num_attention_heads` 32, `num_key_value_heads` 32, `hidden_size` 4096 (head dim 128),
    /// `intermediate_size` 11008, `vocab_size` 32000; bf16 as served (the file says float16, the
    /// same 2 bytes). The parameter count this shape gives (≈ 6.74 B) matches the published 6.7 B.
    pub fn llama2_7b() -> ModelShape {
        ModelShape {
            name: "llama2-7b".into(),
            layers: 32,
            q_heads: 32,
            kv_heads: 32,
            head_dim: 128,
            d_model: 4096,
            ffn_dim: 11008,
            vocab: 32000,
            weight_dtype: Dtype::Bf16,
            kv_dtype: Dtype::Bf16,
            tp: 1,
            moe: None,
            kv_scale: None,
            layer_groups: Vec::new(),
            dense_layers: 0,
        }
    }

    /// Mixtral 8x7B, a sparse mixture of experts. Every figure from Mistral AI's published
    /// `config.json` (mistralai/Mixtral-8x7B-v0.1): `num_hidden_layers` 32,
    /// `num_attention_heads` 32, `num_key_value_heads` 8, `hidden_size` 4096 (head dim 128),
    /// `intermediate_size` 14336 (each expert's MLP width), `num_local_experts` 8,
    /// `num_experts_per_tok` 2, no shared expert, `vocab_size` 32000, `torch_dtype` bfloat16.
    /// The parameter counts this shape gives (≈ 46.7 B in all, ≈ 12.9 B active per token) match
    /// the published 46.7 B and 12.9 B.
    pub fn mixtral_8x7b() -> ModelShape {
        ModelShape {
            name: "mixtral-8x7b".into(),
            layers: 32,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            d_model: 4096,
            ffn_dim: 14336,
            vocab: 32000,
            weight_dtype: Dtype::Bf16,
            kv_dtype: Dtype::Bf16,
            tp: 1,
            moe: Some(Moe {
                experts: 8,
                active_experts: 2,
                expert_ffn_dim: 14336,
                shared_experts: 0,
            }),
            kv_scale: None,
            layer_groups: Vec::new(),
            dense_layers: 0,
        }
    }

    /// A CPU-sized shape with real compute in seconds: GQA ratio 4, f32.
    pub fn tiny() -> ModelShape {
        ModelShape {
            name: "tiny".into(),
            layers: 2,
            q_heads: 8,
            kv_heads: 2,
            head_dim: 32,
            d_model: 256,
            ffn_dim: 512,
            vocab: 512,
            weight_dtype: Dtype::F32,
            kv_dtype: Dtype::F32,
            tp: 1,
            moe: None,
            kv_scale: None,
            layer_groups: Vec::new(),
            dense_layers: 0,
        }
    }

    pub fn preset(name: &str) -> Option<ModelShape> {
        match name {
            "llama3-8b" => Some(Self::llama3_8b()),
            "llama3-70b" => Some(Self::llama3_70b()),
            "llama3-405b" => Some(Self::llama3_405b()),
            "llama2-7b" => Some(Self::llama2_7b()),
            "mixtral-8x7b" => Some(Self::mixtral_8x7b()),
            "deepseek-v3" => Some(Self::deepseek_v3()),
            "gemma3-27b" => Some(Self::gemma3_27b()),
            "gpt-oss-120b" => Some(Self::gpt_oss_120b()),
            "qwen3-next-80b" => Some(Self::qwen3_next_80b()),
            "tiny" => Some(Self::tiny()),
            "tiny-sliding" => Some(Self::tiny_sliding()),
            "tiny-mla" => Some(Self::tiny_mla()),
            "tiny-hybrid" => Some(Self::tiny_hybrid()),
            _ => None,
        }
    }

    pub const PRESETS: &'static [&'static str] = &[
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "llama2-7b",
        "mixtral-8x7b",
        "deepseek-v3",
        "gemma3-27b",
        "gpt-oss-120b",
        "qwen3-next-80b",
        "tiny",
        "tiny-sliding",
        "tiny-mla",
        "tiny-hybrid",
    ];

    /// KV heads held by one device under tensor parallelism.
    pub fn kv_heads_per_device(&self) -> u32 {
        self.kv_heads.div_ceil(self.tp.max(1))
    }

    /// Bytes of K and V for one token on one device; saturates at `u64::MAX` for shapes that
    /// validation refuses ([`ModelShape::checked_kv_bytes_per_token`]).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.checked_kv_bytes_per_token().unwrap_or(u64::MAX)
    }

    /// The layer groups: those given, or one full group of every layer with the model's KV heads
    /// and head dim.
    pub fn groups(&self) -> Vec<LayerGroup> {
        if self.layer_groups.is_empty() {
            vec![LayerGroup::Full {
                layers: self.layers,
                kv_heads: self.kv_heads,
                head_dim: self.head_dim,
            }]
        } else {
            self.layer_groups.clone()
        }
    }

    /// [`ModelShape::kv_bytes_per_token`], `None` when it does not fit in 64 bits: every
    /// group's per-token bytes ([`LayerGroup::bytes_per_token`]: a sliding layer's token costs
    /// a full layer's, however few of them it keeps) plus, for per-block FP8 scales, the block's
    /// scale bytes priced per token. This is the slot a cache manager hands out per token.
    pub fn checked_kv_bytes_per_token(&self) -> Option<u64> {
        let mut sum = 0u64;
        for g in self.groups() {
            sum = sum.checked_add(g.bytes_per_token(self.tp, self.kv_dtype)?)?;
        }
        sum.checked_add(self.kv_scale_bytes_per_token()?)
    }

    /// Layers and (layer × KV head) pairs that carry `kv_scale` scales: the full and sliding
    /// groups' (an MLA latent carries its own per-token scales, a recurrent state none).
    fn scaled_layers_and_heads(&self) -> Option<(u64, u64)> {
        let (mut layers, mut heads) = (0u64, 0u64);
        for g in self.groups() {
            if g.heads().is_some() {
                layers = layers.checked_add(g.layers() as u64)?;
                heads = heads.checked_add(
                    (g.layers() as u64).checked_mul(g.kv_heads_per_device(self.tp) as u64)?,
                )?;
            }
        }
        Some((layers, heads))
    }

    /// State bytes one sequence holds on one device whatever its length: the recurrent
    /// groups' ([`LayerGroup::state_bytes_per_sequence`]); 0 without one.
    pub fn checked_state_bytes_per_sequence(&self) -> Option<u64> {
        let mut sum = 0u64;
        for g in self.groups() {
            sum = sum.checked_add(g.state_bytes_per_sequence(self.tp)?)?;
        }
        Some(sum)
    }

    /// The FP8 scale granularity in effect: the one given, per tensor by default for an FP8
    /// cache, `None` for any other dtype.
    pub fn kv_scale_granularity(&self) -> Option<KvScale> {
        self.kv_dtype
            .is_fp8()
            .then(|| self.kv_scale.map_or(KvScale::PerTensor, |(g, _)| g))
    }

    /// Scale bytes one cache block holds on one device (per block per layer per KV head, K and
    /// V, over the full and sliding groups); 0 unless scales are per block.
    pub fn kv_scale_bytes_per_block(&self) -> Option<u64> {
        if self.kv_scale_granularity() != Some(KvScale::PerBlock) {
            return Some(0);
        }
        2u64.checked_mul(self.scaled_layers_and_heads()?.1)?
            .checked_mul(KV_SCALE_BYTES)
    }

    /// Per-block scale bytes priced per token: a block's scale bytes ÷ its tokens, rounded up
    /// (a partial byte per token is charged whole, so the budget never undercounts).
    pub fn kv_scale_bytes_per_token(&self) -> Option<u64> {
        let per_block = self.kv_scale_bytes_per_block()?;
        let block_tokens = self.kv_scale.map_or(1, |(_, b)| b).max(1) as u64;
        Some(per_block.div_ceil(block_tokens))
    }

    /// Scale bytes that do not grow with tokens: per tensor `2 × layers × 4`, per head
    /// `2 × layers × kv_heads/tp × 4` (over the full and sliding groups); 0 per block (priced
    /// per token) or without FP8.
    pub fn kv_scale_fixed_bytes(&self) -> Option<u64> {
        let (layers, heads) = self.scaled_layers_and_heads()?;
        let pairs = match self.kv_scale_granularity() {
            Some(KvScale::PerTensor) => layers,
            Some(KvScale::PerHead) => heads,
            _ => return Some(0),
        };
        2u64.checked_mul(pairs)?.checked_mul(KV_SCALE_BYTES)
    }

    /// Parameter count of the decoder (embedding, attention, MLP or every expert with its
    /// router, norms, LM head): what the weights in memory hold; saturating.
    pub fn parameter_count(&self) -> u64 {
        self.checked_parameter_count().unwrap_or(u64::MAX)
    }

    /// [`ModelShape::parameter_count`], `None` when it does not fit in 64 bits.
    pub fn checked_parameter_count(&self) -> Option<u64> {
        self.checked_counts().map(|(total, _)| total)
    }

    /// Parameters one token computes with: a dense model's all; an MoE model's with only its
    /// `active_experts` routed experts (plus the shared ones and the router); saturating.
    pub fn active_parameter_count(&self) -> u64 {
        self.checked_active_parameter_count().unwrap_or(u64::MAX)
    }

    /// [`ModelShape::active_parameter_count`], `None` when it does not fit in 64 bits.
    pub fn checked_active_parameter_count(&self) -> Option<u64> {
        self.checked_counts().map(|(_, active)| active)
    }

    /// Parameters of one expert (gate, up and down projections of width `expert_ffn_dim`);
    /// `None` for a dense model or on overflow.
    pub fn expert_parameter_count(&self) -> Option<u64> {
        let moe = self.moe?;
        (self.d_model as u64)
            .checked_mul(moe.expert_ffn_dim as u64)?
            .checked_mul(3)
    }

    /// (total, active) parameters, in 64 bits or `None`.
    fn checked_counts(&self) -> Option<(u64, u64)> {
        let d = self.d_model as u64;
        let mut attn_total = 0u64;
        for g in self.groups() {
            let per_layer = g.attention_params(
                d,
                self.q_heads as u64,
                self.head_dim as u64,
                self.kv_heads as u64,
            )?;
            attn_total = attn_total.checked_add(per_layer.checked_mul(g.layers() as u64)?)?;
        }
        let norms = d.checked_mul(2)?;
        let dense_mlp = d.checked_mul(self.ffn_dim as u64)?.checked_mul(3)?;
        let layers = self.layers as u64;
        let (mlp_total, mlp_active) = match self.moe {
            None => {
                let all = layers.checked_mul(dense_mlp)?;
                (all, all)
            }
            Some(moe) => {
                let dense = (self.dense_layers.min(self.layers)) as u64;
                let moe_layers = layers - dense;
                let expert = self.expert_parameter_count()?;
                let router = d.checked_mul(moe.experts as u64)?;
                let held = (moe.experts as u64).checked_add(moe.shared_experts as u64)?;
                let used = (moe.active_experts as u64).checked_add(moe.shared_experts as u64)?;
                let dense_part = dense.checked_mul(dense_mlp)?;
                let per = |n: u64| -> Option<u64> {
                    moe_layers
                        .checked_mul(router.checked_add(n.checked_mul(expert)?)?)?
                        .checked_add(dense_part)
                };
                (per(held)?, per(used)?)
            }
        };
        let embed = (self.vocab as u64).checked_mul(d)?;
        let outside = embed
            .checked_mul(2)?
            .checked_add(d)?
            .checked_add(attn_total)?
            .checked_add(layers.checked_mul(norms)?)?;
        Some((
            outside.checked_add(mlp_total)?,
            outside.checked_add(mlp_active)?,
        ))
    }

    /// Layers whose MLP is experts (all but `dense_layers`); 0 for a dense model.
    pub fn moe_layers(&self) -> u32 {
        match self.moe {
            Some(_) => self.layers.saturating_sub(self.dense_layers),
            None => 0,
        }
    }

    /// Weight bytes resident on one device; saturating.
    pub fn weight_bytes_per_device(&self) -> u64 {
        self.checked_weight_bytes_per_device().unwrap_or(u64::MAX)
    }

    /// [`ModelShape::weight_bytes_per_device`], `None` when it does not fit in 64 bits.
    pub fn checked_weight_bytes_per_device(&self) -> Option<u64> {
        Some(
            self.checked_parameter_count()?
                .checked_mul(self.weight_dtype.bytes())?
                / self.tp.max(1) as u64,
        )
    }

    /// Weight bytes of the routed experts, all layers, on one device (0 for a dense model): the
    /// part of the weights a step reads only for the experts its tokens touch.
    pub fn routed_expert_weight_bytes_per_device(&self) -> u64 {
        let Some(moe) = self.moe else { return 0 };
        self.expert_parameter_count()
            .and_then(|e| e.checked_mul(moe.experts as u64))
            .and_then(|e| e.checked_mul(self.moe_layers() as u64))
            .and_then(|e| e.checked_mul(self.weight_dtype.bytes()))
            .map_or(u64::MAX, |b| b / self.tp.max(1) as u64)
    }

    /// The key of the first MoE field a dense-only backend cannot run (`model.experts`), or
    /// `None` for a dense model.
    pub fn moe_key(&self) -> Option<&'static str> {
        self.moe.map(|_| "model.experts")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn essay_bytes_per_token() {
        let m = ModelShape::llama3_8b();
        assert_eq!(m.kv_bytes_per_token(), 131_072);
        assert_eq!(m.kv_bytes_per_token() * 4096, 512 * 1024 * 1024);
    }

    #[test]
    fn tensor_parallel_splits_kv_heads() {
        let mut m = ModelShape::llama3_8b();
        m.tp = 2;
        assert_eq!(m.kv_bytes_per_token(), 65_536);
    }

    #[test]
    fn huge_shapes_overflow_to_none_not_zero() {
        let mut m = ModelShape::llama3_8b();
        m.layers = 1 << 31;
        m.head_dim = 1 << 31;
        m.kv_heads = 1 << 31;
        assert_eq!(m.checked_kv_bytes_per_token(), None);
        assert_eq!(m.kv_bytes_per_token(), u64::MAX);
        assert_eq!(m.checked_weight_bytes_per_device(), None);
    }

    #[test]
    fn llama3_8b_parameter_count_is_about_8b() {
        let p = ModelShape::llama3_8b().parameter_count();
        assert!((7_900_000_000..8_100_000_000).contains(&p), "{p}");
    }
}
