//! Presets of the models served today whose layers are not all full attention: a latent cache
//! (`deepseek-v3`), sliding windows (`gemma3-27b`, `gpt-oss-120b`) and recurrent layers
//! (`qwen3-next-80b`). Every figure is from the model's published `config.json` on Hugging
//! Face, named beside it; where kvbench's shape cannot say what the checkpoint does, the
//! comment says what it does instead. Beside them, the cpu model's tiny variants with one group
//! of each kind (`tiny-sliding`, `tiny-mla`, `tiny-hybrid`), which the oracle checks.

use super::{Dtype, LayerGroup, ModelShape, Moe};

impl ModelShape {
    /// DeepSeek-V3 (deepseek-ai/DeepSeek-V3 `config.json`): `num_hidden_layers` 61,
    /// `hidden_size` 7168, `num_attention_heads` 128 (`num_key_value_heads` 128),
    /// `qk_nope_head_dim` 128 = `v_head_dim` 128 (the shape's `head_dim`), multi-head latent
    /// attention with `kv_lora_rank` 512 (the cached latent), `qk_rope_head_dim` 64 (the cached
    /// RoPE part) and `q_lora_rank` 1536; `first_k_dense_replace` 3 dense layers with
    /// `intermediate_size` 18432, then 58 MoE layers of `n_routed_experts` 256 routed experts,
    /// `num_experts_per_tok` 8, `n_shared_experts` 1, each `moe_intermediate_size` 2048;
    /// `vocab_size` 129280. Weights FP8 (e4m3, `quantization_config` with 128 × 128 block scales,
    /// whose bytes are not counted); KV FP8 in FlashMLA's layout (656 bytes per token per layer).
    /// This shape gives ≈ 671.0 B parameters in all and ≈ 37.5 B active, the published 671 B and
    /// 37 B (the multi-token-prediction module, 14 B more in the checkpoint, is not served here).
    pub fn deepseek_v3() -> ModelShape {
        ModelShape {
            name: "deepseek-v3".into(),
            layers: 61,
            q_heads: 128,
            kv_heads: 128,
            head_dim: 128,
            d_model: 7168,
            ffn_dim: 18432,
            vocab: 129280,
            weight_dtype: Dtype::Fp8E4m3,
            kv_dtype: Dtype::Fp8E4m3,
            tp: 1,
            moe: Some(Moe {
                experts: 256,
                active_experts: 8,
                expert_ffn_dim: 2048,
                shared_experts: 1,
            }),
            kv_scale: None,
            layer_groups: vec![LayerGroup::Mla {
                layers: 61,
                latent_dim: 512,
                rope_dim: 64,
                q_lora_rank: 1536,
            }],
            dense_layers: 3,
        }
    }

    /// Gemma 3 27B (google/gemma-3-27b-it `config.json`, `text_config`): `num_hidden_layers` 62,
    /// `hidden_size` 5376, `num_attention_heads` 32, `num_key_value_heads` 16, `head_dim` 128,
    /// `intermediate_size` 21504, `vocab_size` 262208; `sliding_window` 1024 with
    /// `sliding_window_pattern` 6 (five local layers, then one global: 52 sliding and 10 full
    /// of 62). bf16. This shape gives ≈ 28.4 B parameters: the untied count of the published
    /// 27 B (the checkpoint ties its embedding and LM head, 1.4 B fewer; the 0.4 B vision
    /// tower is not modelled).
    pub fn gemma3_27b() -> ModelShape {
        ModelShape {
            name: "gemma3-27b".into(),
            layers: 62,
            q_heads: 32,
            kv_heads: 16,
            head_dim: 128,
            d_model: 5376,
            ffn_dim: 21504,
            vocab: 262208,
            weight_dtype: Dtype::Bf16,
            kv_dtype: Dtype::Bf16,
            tp: 1,
            moe: None,
            kv_scale: None,
            layer_groups: vec![
                LayerGroup::Sliding {
                    layers: 52,
                    window: 1024,
                    kv_heads: 16,
                    head_dim: 128,
                },
                LayerGroup::Full {
                    layers: 10,
                    kv_heads: 16,
                    head_dim: 128,
                },
            ],
            dense_layers: 0,
        }
    }

    /// gpt-oss-120b (openai/gpt-oss-120b `config.json`): `num_hidden_layers` 36 whose
    /// `layer_types` alternate `sliding_attention` (`sliding_window` 128) and
    /// `full_attention` (18 each), `hidden_size` 2880, `num_attention_heads` 64,
    /// `num_key_value_heads` 8, `head_dim` 64, `num_local_experts` 128,
    /// `num_experts_per_tok` 4, `intermediate_size` 2880 (each expert's width), no shared
    /// expert, `vocab_size` 201088. This shape gives ≈ 116.8 B parameters in all, the published
    /// 116.8 B, and ≈ 5.7 B active (the published 5.1 B leaves out the 0.6 B embedding table,
    /// which a token looks up rather than computes with). The checkpoint stores the experts in MXFP4
    /// (4.25 bits a weight) and the rest in bf16 (≈ 61 GiB); kvbench's weight types are whole
    /// bytes, so the preset holds FP8 weights (≈ 117 GB), which overstates the weight bytes —
    /// and so understates the KV budget left on one device — by about 56 GB.
    pub fn gpt_oss_120b() -> ModelShape {
        ModelShape {
            name: "gpt-oss-120b".into(),
            layers: 36,
            q_heads: 64,
            kv_heads: 8,
            head_dim: 64,
            d_model: 2880,
            ffn_dim: 2880,
            vocab: 201088,
            weight_dtype: Dtype::Fp8E4m3,
            kv_dtype: Dtype::Bf16,
            tp: 1,
            moe: Some(Moe {
                experts: 128,
                active_experts: 4,
                expert_ffn_dim: 2880,
                shared_experts: 0,
            }),
            kv_scale: None,
            layer_groups: vec![
                LayerGroup::Sliding {
                    layers: 18,
                    window: 128,
                    kv_heads: 8,
                    head_dim: 64,
                },
                LayerGroup::Full {
                    layers: 18,
                    kv_heads: 8,
                    head_dim: 64,
                },
            ],
            dense_layers: 0,
        }
    }

    /// Qwen3-Next 80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct `config.json`): `num_hidden_layers`
    /// 48 with `full_attention_interval` 4 (three gated-DeltaNet linear-attention layers, then
    /// one full: 36 recurrent and 12 full), `hidden_size` 2048, `num_attention_heads` 16,
    /// `num_key_value_heads` 2, `head_dim` 256, `num_experts` 512, `num_experts_per_tok` 10,
    /// `moe_intermediate_size` 512 and one shared expert of `shared_expert_intermediate_size`
    /// 512, `vocab_size` 151936. A DeltaNet layer's state: `linear_num_value_heads` 32 ×
    /// `linear_key_head_dim` 128 × `linear_value_head_dim` 128 = 524,288 values, plus its
    /// causal convolution's last `linear_conv_kernel_dim` − 1 = 3 inputs of the
    /// 2 × 16 × 128 + 32 × 128 = 8192 q/k/v channels (24,576 values), in bf16: 1,097,728 bytes.
    /// Its projections are priced as a full layer's (≈ 19 M parameters a layer instead of
    /// ≈ 34 M), so this shape gives ≈ 79.0 B parameters in all and ≈ 3.2 B active against the
    /// published 80 B and 3 B.
    pub fn qwen3_next_80b() -> ModelShape {
        ModelShape {
            name: "qwen3-next-80b".into(),
            layers: 48,
            q_heads: 16,
            kv_heads: 2,
            head_dim: 256,
            d_model: 2048,
            ffn_dim: 5120,
            vocab: 151936,
            weight_dtype: Dtype::Bf16,
            kv_dtype: Dtype::Bf16,
            tp: 1,
            moe: Some(Moe {
                experts: 512,
                active_experts: 10,
                expert_ffn_dim: 512,
                shared_experts: 1,
            }),
            kv_scale: None,
            layer_groups: vec![
                LayerGroup::Recurrent {
                    layers: 36,
                    state_bytes: QWEN3_NEXT_STATE_BYTES,
                },
                LayerGroup::Full {
                    layers: 12,
                    kv_heads: 2,
                    head_dim: 256,
                },
            ],
            dense_layers: 0,
        }
    }
}

/// One Qwen3-Next gated-DeltaNet layer's state per sequence (doc of
/// [`ModelShape::qwen3_next_80b`]): (32 × 128 × 128 + 3 × 8192) bf16 values.
pub const QWEN3_NEXT_STATE_BYTES: u64 = (32 * 128 * 128 + 3 * 8192) * 2;

/// The window of `tiny-sliding`'s sliding layers, in tokens.
pub const TINY_SLIDING_WINDOW: u32 = 12;

/// The cpu model with one layer group of each kind beside full attention, so the oracle checks
/// every group type.
impl ModelShape {
    /// `tiny` with two sliding-window layers of window 12 before its two full ones: windows
    /// shorter than a 16-token block and than the quick scenarios' prompts, so every run
    /// attends past them, and off the block boundary, so an off-by-one shows.
    pub fn tiny_sliding() -> ModelShape {
        let t = ModelShape::tiny();
        ModelShape {
            name: "tiny-sliding".into(),
            layers: 4,
            layer_groups: vec![
                LayerGroup::Sliding {
                    layers: 2,
                    window: TINY_SLIDING_WINDOW,
                    kv_heads: t.kv_heads,
                    head_dim: t.head_dim,
                },
                LayerGroup::Full {
                    layers: 2,
                    kv_heads: t.kv_heads,
                    head_dim: t.head_dim,
                },
            ],
            ..t
        }
    }

    /// `tiny` with two MLA layers (DeepSeek-V3's layout scaled down): a 64-value latent and 16
    /// RoPE values cached per token per layer, the 8 query heads' keys and values (head dim 32)
    /// up-projected from it; no query low-rank projection.
    pub fn tiny_mla() -> ModelShape {
        let t = ModelShape::tiny();
        ModelShape {
            name: "tiny-mla".into(),
            layer_groups: vec![LayerGroup::Mla {
                layers: t.layers,
                latent_dim: 64,
                rope_dim: 16,
                q_lora_rank: 0,
            }],
            ..t
        }
    }

    /// `tiny` with two full layers and then two recurrent ones (a gated linear recurrence of
    /// 64 f32 values per sequence per layer, Qwen3-Next's and Jamba's mix scaled down).
    pub fn tiny_hybrid() -> ModelShape {
        let t = ModelShape::tiny();
        ModelShape {
            name: "tiny-hybrid".into(),
            layers: 4,
            layer_groups: vec![
                LayerGroup::Full {
                    layers: 2,
                    kv_heads: t.kv_heads,
                    head_dim: t.head_dim,
                },
                LayerGroup::Recurrent {
                    layers: 2,
                    state_bytes: 64 * 4,
                },
            ],
            ..t
        }
    }
}
