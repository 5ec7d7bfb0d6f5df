//! Small layer-group shapes for the grouped managers' tests: the tiny model's dimensions with the
//! groups given, so per-token bytes are small enough to count by hand (2 KV heads × head dim 4,
//! bf16: 32 bytes a token a full or sliding layer).

use kvbench::model::{Dtype, LayerGroup, ModelShape};

/// One named mix of groups for a hybrid manager: its shape, block size and pages in the pool
/// (recurrent states come out of them).
pub struct Mix {
    pub name: &'static str,
    pub shape: ModelShape,
    pub block_size: u32,
    pub pages: u64,
}

/// The tiny model with `groups` as its layers, named `name`.
pub fn shape(name: &str, groups: Vec<LayerGroup>) -> ModelShape {
    let layers = groups.iter().map(|g| g.layers()).sum();
    ModelShape {
        name: name.into(),
        layers,
        kv_dtype: Dtype::Bf16,
        layer_groups: groups,
        ..ModelShape::tiny()
    }
}

/// [`shape`] named "mix".
pub fn mix(groups: Vec<LayerGroup>) -> ModelShape {
    shape("mix", groups)
}

pub fn full(layers: u32) -> LayerGroup {
    LayerGroup::Full {
        layers,
        kv_heads: 2,
        head_dim: 4,
    }
}

pub fn sliding(layers: u32, window: u32) -> LayerGroup {
    LayerGroup::Sliding {
        layers,
        window,
        kv_heads: 2,
        head_dim: 4,
    }
}
