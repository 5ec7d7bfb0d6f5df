//! A plan's layer groups: each group priced per token and per sequence, and the totals a model
//! with sliding or recurrent layers really holds — which is less than its per-token bytes times
//! its length, since a sliding layer keeps only its window and a recurrent layer a fixed state.

use serde::Serialize;

use crate::model::{LayerGroup, ModelShape};

/// One layer group at one sequence length, on one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupPlan {
    pub attention: String,
    pub layers: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_heads_per_device: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    /// What one token adds to one layer (0 for a recurrent group).
    pub bytes_per_token_per_layer: u64,
    /// What one token adds to the group.
    pub bytes_per_token: u64,
    /// A recurrent group's state per sequence, whatever its length.
    pub state_bytes_per_sequence: u64,
    /// Tokens of the sequence the group keeps: all, its window, or none.
    pub resident_tokens: u64,
    /// `resident_tokens × bytes_per_token + state_bytes_per_sequence`.
    pub sequence_bytes: u64,
    /// Tokens a contiguous reservation holds for this group: the reservation, at most the
    /// window; none for a recurrent group (its state is the reservation).
    pub contiguous_tokens: u64,
    pub contiguous_bytes: u64,
}

/// The groups' totals: what one sequence holds and what a simple server reserves for it, each
/// layer group by its own rule, and how many fit the budget that way.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupTotals {
    pub bytes_per_token: u64,
    pub state_bytes_per_sequence: u64,
    pub sequence_bytes: u64,
    pub contiguous_bytes: u64,
    /// Sequences of this length that fit the budget (after fixed scale bytes) when each group
    /// holds only what it keeps (what a per-group paged manager would reach, block tails apart).
    pub fits_held: Option<u64>,
    /// Sequences whose per-group contiguous reservations fit the budget.
    pub fits_contiguous: Option<u64>,
}

/// Each group of `shape` at `tokens` tokens with `reserved` tokens of contiguous reservation,
/// and the totals against `budget_left` (the budget less fixed scale bytes); `None` on
/// overflow.
pub fn price(
    shape: &ModelShape,
    tokens: u64,
    reserved: u64,
    budget_left: Option<u64>,
) -> Option<(Vec<GroupPlan>, GroupTotals)> {
    let mut plans = Vec::new();
    let (mut bpt, mut state, mut held, mut contiguous) = (0u64, 0u64, 0u64, 0u64);
    for g in shape.groups() {
        let per_layer = g.bytes_per_token_per_layer(shape.tp, shape.kv_dtype)?;
        let per_token = g.bytes_per_token(shape.tp, shape.kv_dtype)?;
        let st = g.state_bytes_per_sequence(shape.tp)?;
        let resident = g.resident_tokens(tokens);
        let seq = resident.checked_mul(per_token)?.checked_add(st)?;
        let c_tokens = g.resident_tokens(reserved);
        let c_bytes = c_tokens.checked_mul(per_token)?.checked_add(st)?;
        bpt = bpt.checked_add(per_token)?;
        state = state.checked_add(st)?;
        held = held.checked_add(seq)?;
        contiguous = contiguous.checked_add(c_bytes)?;
        plans.push(GroupPlan {
            attention: g.kind().to_string(),
            layers: g.layers(),
            kv_heads_per_device: g.heads().map(|_| g.kv_heads_per_device(shape.tp)),
            window: g.window(),
            bytes_per_token_per_layer: per_layer,
            bytes_per_token: per_token,
            state_bytes_per_sequence: st,
            resident_tokens: resident,
            sequence_bytes: seq,
            contiguous_tokens: c_tokens,
            contiguous_bytes: c_bytes,
        });
    }
    // Per-block FP8 scales are charged per token of every kept token; counted on the totals.
    let scale = shape.kv_scale_bytes_per_token()?;
    let held = held.checked_add(scale.checked_mul(tokens)?)?;
    let contiguous = contiguous.checked_add(scale.checked_mul(reserved)?)?;
    let fits = |per: u64| budget_left.map(|b| b.checked_div(per).unwrap_or(0));
    Some((
        plans,
        GroupTotals {
            bytes_per_token: bpt.checked_add(scale)?,
            state_bytes_per_sequence: state,
            sequence_bytes: held,
            contiguous_bytes: contiguous,
            fits_held: fits(held),
            fits_contiguous: fits(contiguous),
        },
    ))
}

/// Whether a shape's groups hold its layers (a `--layers` flag on a grouped preset would not).
pub fn layers_match(shape: &ModelShape) -> bool {
    shape.layer_groups.is_empty()
        || shape
            .layer_groups
            .iter()
            .map(|g: &LayerGroup| g.layers() as u64)
            .sum::<u64>()
            == shape.layers as u64
}
