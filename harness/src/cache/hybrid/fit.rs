//! How many sequences of one length fit a budget with the hybrid layout, against the slot a
//! token of every layer takes in the summed-bytes paged manager (`kv_bytes_per_token`) and
//! against vLLM's grouping rule: arithmetic only, no engine.

use crate::model::ModelShape;

use super::layout::{HybridLayout, LayoutError};

/// One model, one budget, one sequence length, three layouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitComparison {
    pub tokens: u64,
    /// Pages and recurrent state's pages of one sequence, hybrid layout.
    pub hybrid_bytes_per_sequence: u64,
    pub hybrid_sequences: u64,
    /// Blocks of `block_size` slots of the summed per-token bytes (the paged manager today).
    pub summed_bytes_per_sequence: u64,
    pub summed_sequences: u64,
    /// The same tables under vLLM's group size (padding layers included); `None` where vLLM's
    /// rule does not apply as written here (groups storing different bytes a token, per-block
    /// scales, or recurrent state, which vLLM pads into pages).
    pub vllm_bytes_per_sequence: Option<u64>,
    pub vllm_sequences: Option<u64>,
}

fn overflow() -> LayoutError {
    LayoutError::Overflow("sequence bytes")
}

/// vLLM's layers per KV-cache group (`_get_kv_cache_groups_uniform_page_size`): the smallest
/// group's layer count, or the largest when it is under 1.5 × the smallest.
pub fn vllm_layers_per_table(layer_counts: &[u32]) -> Option<u32> {
    let min = *layer_counts.iter().min()?;
    let max = *layer_counts.iter().max()?;
    // max < 1.5 × min, in integers.
    Some(if (max as u64) * 2 < (min as u64) * 3 {
        max
    } else {
        min
    })
}

/// Sequences of `tokens` tokens that fit `kv_budget_bytes` with `shape`'s hybrid layout and
/// with the summed-bytes slots, both at `block_size`.
pub fn compare_fit(
    shape: &ModelShape,
    block_size: u32,
    kv_budget_bytes: u64,
    tokens: u64,
) -> Result<FitComparison, LayoutError> {
    let layout = HybridLayout::new(shape, block_size, kv_budget_bytes, 0)?;
    let hybrid = layout.bytes_per_sequence(tokens).ok_or_else(overflow)?;
    let hybrid_sequences = kv_budget_bytes.checked_div(hybrid).unwrap_or(0);

    let slot_bytes = shape
        .checked_kv_bytes_per_token()
        .ok_or(LayoutError::Overflow("bytes per token"))?;
    let bs = block_size as u64;
    let blocks = kv_budget_bytes.checked_div(slot_bytes).unwrap_or(0) / bs;
    let per_seq_blocks = tokens.div_ceil(bs);
    let summed = per_seq_blocks
        .checked_mul(bs)
        .and_then(|x| x.checked_mul(slot_bytes))
        .ok_or_else(overflow)?;
    let summed_sequences = blocks.checked_div(per_seq_blocks).unwrap_or(0);

    let vllm = vllm_bytes(shape, &layout, tokens);
    Ok(FitComparison {
        tokens,
        hybrid_bytes_per_sequence: hybrid,
        hybrid_sequences,
        summed_bytes_per_sequence: summed,
        summed_sequences,
        vllm_bytes_per_sequence: vllm,
        vllm_sequences: vllm.map(|b| kv_budget_bytes.checked_div(b).unwrap_or(0)),
    })
}

/// One sequence's bytes when each of the layout's model groups is cut into tables of vLLM's
/// size, the last one padded; only when every paged group stores the same bytes a token.
fn vllm_bytes(shape: &ModelShape, layout: &HybridLayout, tokens: u64) -> Option<u64> {
    if layout.state_bytes_per_sequence != 0
        || layout
            .tables
            .iter()
            .any(|t| t.tail_bytes_per_page != 0 || t.scale_bytes_per_block != 0)
    {
        return None;
    }
    let groups = shape.groups();
    let mut paged: Vec<usize> = layout.tables.iter().map(|t| t.group).collect();
    paged.dedup();
    let counts: Vec<u32> = paged.iter().map(|&g| groups[g].layers()).collect();
    let g = vllm_layers_per_table(&counts)? as u64;
    let mut bytes = 0u64;
    for (&group, &layers) in paged.iter().zip(&counts) {
        let spec = layout.tables.iter().find(|t| t.group == group)?;
        let per_layer_token = spec.bytes_per_token / spec.layers as u64;
        let tables = (layers as u64).div_ceil(g);
        let slots = tables
            .checked_mul(g)?
            .checked_mul(spec.held_block_count(tokens))?
            .checked_mul(spec.block_tokens as u64)?;
        bytes = bytes.checked_add(slots.checked_mul(per_layer_token)?)?;
    }
    Some(bytes)
}
