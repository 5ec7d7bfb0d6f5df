//! The scenario's `[model]` table: a preset or explicit shape, and its `[[model.layer_groups]]`.

use serde::{Deserialize, Serialize};

use crate::model::{Dtype, KvScale, LayerGroup};

/// A preset name plus optional field overrides, or every field given explicitly.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub preset: Option<String>,
    pub name: Option<String>,
    pub layers: Option<u32>,
    pub q_heads: Option<u32>,
    pub kv_heads: Option<u32>,
    pub head_dim: Option<u32>,
    pub d_model: Option<u32>,
    pub ffn_dim: Option<u32>,
    pub vocab: Option<u32>,
    pub weight_dtype: Option<Dtype>,
    pub kv_dtype: Option<Dtype>,
    /// FP8 scale granularity: `per_tensor` (the default for an FP8 `kv_dtype`), `per_head`
    /// or `per_block` (priced per token over `cache.block_size`); refused for other dtypes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_scale: Option<KvScale>,
    pub tp: Option<u32>,
    /// Mixture of experts (all four absent = dense): routed experts per layer, the experts
    /// each token is routed to, each expert's MLP width (default `ffn_dim`) and the experts
    /// every token passes through (default 0). Left out of a rendered scenario when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_experts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_ffn_dim: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_experts: Option<u32>,
    /// A mixture of experts' first layers with a dense MLP of `ffn_dim` (default: the preset's,
    /// else 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense_layers: Option<u32>,
    /// The layers by KV layout (`[[model.layer_groups]]`, replacing the preset's when given);
    /// absent is one full group of every layer. Left out of a rendered scenario when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_groups: Option<Vec<LayerGroupSpec>>,
}

/// The kind of a layer group, `attention = "..."`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKind {
    Full,
    Sliding,
    Mla,
    Recurrent,
}

/// One `[[model.layer_groups]]` table, flat so every key keeps its position: `layers` and
/// `attention`, then the kind's own keys — `kv_heads` and `head_dim` (full, sliding; default
/// the model's), `window` (sliding), `latent_dim`, `rope_dim` and `q_lora_rank` (mla),
/// `state_bytes` (recurrent). A key of another kind is refused by the check, naming it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerGroupSpec {
    pub attention: AttentionKind,
    pub layers: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latent_dim: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_dim: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_lora_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_bytes: Option<u64>,
}

impl LayerGroupSpec {
    /// The keys this kind takes besides `attention` and `layers`, and the ones it requires.
    pub fn keys_of(kind: AttentionKind) -> (&'static [&'static str], &'static [&'static str]) {
        match kind {
            AttentionKind::Full => (&["kv_heads", "head_dim"], &[]),
            AttentionKind::Sliding => (&["kv_heads", "head_dim", "window"], &["window"]),
            AttentionKind::Mla => (
                &["latent_dim", "rope_dim", "q_lora_rank"],
                &["latent_dim", "rope_dim"],
            ),
            AttentionKind::Recurrent => (&["state_bytes"], &["state_bytes"]),
        }
    }

    /// The optional keys this table gives, by name.
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("kv_heads", self.kv_heads.is_some()),
            ("head_dim", self.head_dim.is_some()),
            ("window", self.window.is_some()),
            ("latent_dim", self.latent_dim.is_some()),
            ("rope_dim", self.rope_dim.is_some()),
            ("q_lora_rank", self.q_lora_rank.is_some()),
            ("state_bytes", self.state_bytes.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, g)| g.then_some(k))
        .collect()
    }

    /// The group, a missing key as 0 (refused by the check, naming it) and KV heads and head
    /// dim defaulting to the model's.
    pub fn group(&self, kv_heads: u32, head_dim: u32) -> LayerGroup {
        let layers = self.layers;
        let kv_heads = self.kv_heads.unwrap_or(kv_heads);
        let head_dim = self.head_dim.unwrap_or(head_dim);
        match self.attention {
            AttentionKind::Full => LayerGroup::Full {
                layers,
                kv_heads,
                head_dim,
            },
            AttentionKind::Sliding => LayerGroup::Sliding {
                layers,
                window: self.window.unwrap_or(0),
                kv_heads,
                head_dim,
            },
            AttentionKind::Mla => LayerGroup::Mla {
                layers,
                latent_dim: self.latent_dim.unwrap_or(0),
                rope_dim: self.rope_dim.unwrap_or(0),
                q_lora_rank: self.q_lora_rank.unwrap_or(0),
            },
            AttentionKind::Recurrent => LayerGroup::Recurrent {
                layers,
                state_bytes: self.state_bytes.unwrap_or(0),
            },
        }
    }
}

impl ModelSpec {
    /// Whether the file gives any mixture-of-experts key.
    pub fn gives_moe(&self) -> bool {
        self.experts.is_some()
            || self.active_experts.is_some()
            || self.expert_ffn_dim.is_some()
            || self.shared_experts.is_some()
    }
}
