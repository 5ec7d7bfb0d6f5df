//! The layer groups' checks: each `[[model.layer_groups]]` table gives its kind's keys and no
//! other kind's, each in range, and the groups hold exactly the model's layers. Also: a group's
//! KV heads divide the query heads and are divided by `tp`; at least one group caches per token
//! (not every group recurrent); `dense_layers` only on a mixture of experts with more layers.
//! The tables are read through the flat `LayerGroupSpec` (every kind's keys optional) so an
//! error keeps its position, and `locate.rs` walks arrays of tables as `a.b.0`, `a.b.1`, … so
//! each is named `model.layer_groups.I.KEY` at its line.

use super::error::KeyProblem;
use super::model_spec::{LayerGroupSpec, ModelSpec};
use super::ranges;
use crate::model::{LayerGroup, ModelShape};

/// Largest `state_bytes` of one recurrent layer: 1 GiB, far above any published state (a few
/// MiB) and small enough that a sequence's state times the layers stays in 64 bits.
pub const MAX_STATE_BYTES: u64 = 1 << 30;

/// Problems with the written groups' keys (`model.layer_groups.I.KEY`), then with the
/// resolved groups (`shape`), which may be a preset's.
pub fn check(spec: &ModelSpec, shape: &ModelShape, p: &mut Vec<KeyProblem>) {
    let before = p.len();
    if shape.dense_layers > 0 && (shape.moe.is_none() || shape.dense_layers >= shape.layers) {
        p.push(KeyProblem::new(
            "model.dense_layers",
            format!(
                "{} dense layers need a mixture of experts with more layers than that ({} layers{})",
                shape.dense_layers,
                shape.layers,
                if shape.moe.is_none() { ", no experts" } else { "" }
            ),
        ));
    }
    if let Some(specs) = &spec.layer_groups {
        if specs.is_empty() {
            p.push(KeyProblem::new(
                "model.layer_groups",
                "give at least one group, or leave `layer_groups` out (one full group)",
            ));
        }
        for (i, g) in specs.iter().enumerate() {
            check_written(i, g, p);
        }
    }
    if p.len() > before || shape.layer_groups.is_empty() {
        return;
    }
    let mut sum = 0u64;
    for (i, g) in shape.layer_groups.iter().enumerate() {
        sum += g.layers() as u64;
        check_group(i, g, shape, p);
    }
    if shape
        .layer_groups
        .iter()
        .all(|g| matches!(g, LayerGroup::Recurrent { .. }))
    {
        p.push(KeyProblem::new(
            "model.layer_groups",
            "every group is recurrent: a model needs one full, sliding or mla group to cache K/V per token",
        ));
    }
    if sum != shape.layers as u64 {
        p.push(KeyProblem::new(
            "model.layers",
            format!(
                "the layer groups hold {sum} layers, not the model's {}",
                shape.layers
            ),
        ));
    }
}

fn check_written(i: usize, g: &LayerGroupSpec, p: &mut Vec<KeyProblem>) {
    let key = |k: &str| format!("model.layer_groups.{i}.{k}");
    let kind = format!("{:?}", g.attention).to_ascii_lowercase();
    let (takes, needs) = LayerGroupSpec::keys_of(g.attention);
    for k in g.given() {
        if !takes.contains(&k) {
            p.push(KeyProblem::new(
                key(k),
                format!(
                    "an `attention = \"{kind}\"` group takes {}, not `{k}`",
                    takes
                        .iter()
                        .map(|t| format!("`{t}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let given = g.given();
    for k in needs {
        if !given.contains(k) {
            p.push(KeyProblem::new(
                key(k),
                format!("an `attention = \"{kind}\"` group needs `{k}`"),
            ));
        }
    }
}

fn check_group(i: usize, g: &LayerGroup, shape: &ModelShape, p: &mut Vec<KeyProblem>) {
    let key = |k: &str| format!("model.layer_groups.{i}.{k}");
    let most = |k: &str| {
        ranges::MODEL_MAX
            .iter()
            .find(|(m, _)| *m == k)
            .map_or(u32::MAX, |(_, m)| *m)
    };
    let mut fields: Vec<(&str, u32, u32)> = vec![("layers", g.layers(), most("layers"))];
    match *g {
        LayerGroup::Full {
            kv_heads, head_dim, ..
        }
        | LayerGroup::Sliding {
            kv_heads, head_dim, ..
        } => {
            fields.push(("kv_heads", kv_heads, most("kv_heads")));
            fields.push(("head_dim", head_dim, most("head_dim")));
        }
        LayerGroup::Mla {
            latent_dim,
            rope_dim,
            ..
        } => {
            fields.push(("latent_dim", latent_dim, most("head_dim") * 16));
            fields.push(("rope_dim", rope_dim, most("head_dim")));
        }
        LayerGroup::Recurrent { .. } => {}
    }
    if let Some(w) = g.window() {
        fields.push(("window", w, u32::MAX));
    }
    let mut bad = false;
    for (k, v, hi) in fields {
        if v == 0 || v > hi {
            bad = true;
            p.push(KeyProblem::new(
                key(k),
                format!("must be in 1..={hi} (got {v})"),
            ));
        }
    }
    if let LayerGroup::Recurrent { state_bytes, .. } = *g {
        if state_bytes == 0 || state_bytes > MAX_STATE_BYTES {
            bad = true;
            p.push(KeyProblem::new(
                key("state_bytes"),
                format!("must be in 1..={MAX_STATE_BYTES} (got {state_bytes})"),
            ));
        }
    }
    if bad {
        return;
    }
    if let Some((kv_heads, _)) = g.heads() {
        if !shape.q_heads.is_multiple_of(kv_heads) {
            p.push(KeyProblem::new(
                key("kv_heads"),
                format!(
                    "{} query heads cannot be grouped over {kv_heads} KV heads",
                    shape.q_heads
                ),
            ));
        }
        if shape.tp > 0 && !kv_heads.is_multiple_of(shape.tp) {
            p.push(KeyProblem::new(
                "model.tp",
                format!(
                    "tensor-parallel degree {} does not divide layer group {i}'s {kv_heads} KV heads",
                    shape.tp
                ),
            ));
        }
    }
}
