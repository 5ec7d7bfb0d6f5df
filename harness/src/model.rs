//! Model shapes and the one formula everything else prices memory with.
//!
//! The KV cache holds keys and values for every layer and KV head, so its size per token is
//! `2 × layers × kv_heads × head_dim × bytes_per_element`. Query heads do not enter: grouped-query
//! attention shares each KV head among several query heads. Tensor parallelism splits KV heads
//! across devices, so the per-device figure divides `kv_heads` by the TP degree.

use serde::{Deserialize, Serialize};

/// Element type of a tensor (weights or KV cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    Fp8,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::Fp8 => 1,
        }
    }

    pub fn parse(s: &str) -> Option<Dtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Some(Dtype::F32),
            "f16" | "fp16" | "float16" => Some(Dtype::F16),
            "bf16" | "bfloat16" => Some(Dtype::Bf16),
            "fp8" | "f8" | "e4m3" => Some(Dtype::Fp8),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp8 => "fp8",
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
        }
    }

    pub fn preset(name: &str) -> Option<ModelShape> {
        match name {
            "llama3-8b" => Some(Self::llama3_8b()),
            "llama3-70b" => Some(Self::llama3_70b()),
            "llama3-405b" => Some(Self::llama3_405b()),
            "llama2-7b" => Some(Self::llama2_7b()),
            "tiny" => Some(Self::tiny()),
            _ => None,
        }
    }

    pub const PRESETS: &'static [&'static str] = &[
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "llama2-7b",
        "tiny",
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

    /// [`ModelShape::kv_bytes_per_token`], `None` when it does not fit in 64 bits.
    pub fn checked_kv_bytes_per_token(&self) -> Option<u64> {
        2u64.checked_mul(self.layers as u64)?
            .checked_mul(self.kv_heads_per_device() as u64)?
            .checked_mul(self.head_dim as u64)?
            .checked_mul(self.kv_dtype.bytes())
    }

    /// Parameter count of the dense decoder (embedding, attention, gated MLP, norms, LM head);
    /// saturating.
    pub fn parameter_count(&self) -> u64 {
        self.checked_parameter_count().unwrap_or(u64::MAX)
    }

    /// [`ModelShape::parameter_count`], `None` when it does not fit in 64 bits.
    pub fn checked_parameter_count(&self) -> Option<u64> {
        let d = self.d_model as u64;
        let q = (self.q_heads as u64).checked_mul(self.head_dim as u64)?;
        let kv = (self.kv_heads as u64).checked_mul(self.head_dim as u64)?;
        let attn = d
            .checked_mul(q)?
            .checked_add(d.checked_mul(kv)?.checked_mul(2)?)?
            .checked_add(q.checked_mul(d)?)?;
        let mlp = d.checked_mul(self.ffn_dim as u64)?.checked_mul(3)?;
        let per_layer = attn.checked_add(mlp)?.checked_add(d.checked_mul(2)?)?;
        let embed = (self.vocab as u64).checked_mul(d)?;
        (self.layers as u64)
            .checked_mul(per_layer)?
            .checked_add(embed.checked_mul(2)?)?
            .checked_add(d)
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
