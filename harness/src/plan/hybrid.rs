//! A plan's hybrid layout: the block tables and the one page size the grouped managers
//! (`cache.manager = "hybrid"`) cut the budget into, and how many sequences of the plan's length
//! fit that way against the summed-bytes slots — the arithmetic of `cache::hybrid::layout` and
//! `cache::hybrid::fit`, shown.

use serde::Serialize;

use crate::cache::hybrid::{compare_fit, HybridLayout, TableKind};
use crate::model::ModelShape;

/// One kind of table in the layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HybridTables {
    /// `full`, `sliding` or `mla`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    /// Tables of this kind a sequence holds.
    pub tables: u32,
    /// Tokens one page of such a table holds.
    pub tokens_per_page: u32,
    /// Per-block FP8 scale bytes each page of such a table holds beside its tokens (left out
    /// without per-block scales).
    #[serde(skip_serializing_if = "is_zero")]
    pub scale_bytes_per_page: u64,
    /// Bytes at the end of each page of such a table that no token fits.
    pub tail_bytes_per_page: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

fn is_zero_u32(x: &u32) -> bool {
    *x == 0
}

/// The hybrid layout of a plan's model over its budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HybridPlan {
    pub layers_per_table: u32,
    pub tables: Vec<HybridTables>,
    pub page_bytes: u64,
    /// The grouped managers' accounting unit: a page ÷ the block size.
    pub slot_bytes: u64,
    /// Pages of the budget (after fixed scale bytes): the paged manager's pool, recurrent
    /// states taken from it.
    pub pages: u32,
    pub state_bytes_per_sequence: u64,
    /// Pages one sequence's recurrent state takes (left out without a recurrent group).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub state_pages_per_sequence: u32,
    /// Pages and state pages one sequence of the plan's length holds.
    pub sequence_bytes: u64,
    /// Sequences of the plan's length that fit: hybrid pages, and summed-bytes blocks.
    pub fits_hybrid: u64,
    pub fits_summed: u64,
    /// A recurrent model's state checkpoints at the default interval (left out without a
    /// recurrent group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointPlan>,
}

/// What a recurrent model's prefix-hit checkpoints cost in the pool, at
/// [`crate::cache::hybrid::DEFAULT_CHECKPOINT_EVERY_BLOCKS`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointPlan {
    pub every_blocks: u32,
    pub every_tokens: u64,
    /// One checkpoint: a state's pages.
    pub pages: u32,
    pub bytes: u64,
    /// Checkpoints a prefix of the plan's length keeps, their bytes and share of the pool.
    pub per_prefix: u64,
    pub prefix_bytes: u64,
    pub pool_share: f64,
}

/// The layout of `shape` at `block_size` over `budget_left` and its fit at `tokens`; `None`
/// where the grouped managers cannot lay the model out (a budget under one page).
pub fn plan(
    shape: &ModelShape,
    block_size: u32,
    budget_left: u64,
    tokens: u64,
) -> Option<HybridPlan> {
    let layout = HybridLayout::new(shape, block_size, budget_left, 0).ok()?;
    let fit = compare_fit(shape, block_size, budget_left, tokens).ok()?;
    let mut tables: Vec<HybridTables> = Vec::new();
    for t in &layout.tables {
        let (kind, window) = match t.kind {
            TableKind::Full => ("full", None),
            TableKind::Sliding { window } => ("sliding", Some(window)),
            TableKind::Mla => ("mla", None),
        };
        match tables
            .iter_mut()
            .find(|x| x.kind == kind && x.window == window && x.tokens_per_page == t.block_tokens)
        {
            Some(x) => x.tables += 1,
            None => tables.push(HybridTables {
                kind,
                window,
                tables: 1,
                tokens_per_page: t.block_tokens,
                scale_bytes_per_page: t.scale_bytes_per_block,
                tail_bytes_per_page: t.tail_bytes_per_page,
            }),
        }
    }
    Some(HybridPlan {
        layers_per_table: layout.layers_per_table,
        tables,
        page_bytes: layout.page_bytes,
        slot_bytes: layout.slot_bytes(),
        pages: layout.pages,
        state_bytes_per_sequence: layout.state_bytes_per_sequence,
        state_pages_per_sequence: layout.state_pages_per_sequence,
        sequence_bytes: fit.hybrid_bytes_per_sequence,
        fits_hybrid: fit.hybrid_sequences,
        fits_summed: fit.summed_sequences,
        checkpoints: checkpoint_plan(&layout, tokens),
    })
}

fn checkpoint_plan(layout: &HybridLayout, tokens: u64) -> Option<CheckpointPlan> {
    if layout.state_pages_per_sequence == 0 {
        return None;
    }
    let every_blocks = crate::cache::hybrid::DEFAULT_CHECKPOINT_EVERY_BLOCKS;
    let every_tokens = crate::cache::hybrid::block_step(layout)
        .saturating_mul(u64::from(every_blocks))
        .max(1);
    let bytes = u64::from(layout.state_pages_per_sequence).saturating_mul(layout.page_bytes);
    let per_prefix = tokens / every_tokens;
    let prefix_bytes = per_prefix.saturating_mul(bytes);
    let pool_bytes = u64::from(layout.pages).saturating_mul(layout.page_bytes);
    Some(CheckpointPlan {
        every_blocks,
        every_tokens,
        pages: layout.state_pages_per_sequence,
        bytes,
        per_prefix,
        prefix_bytes,
        pool_share: prefix_bytes as f64 / pool_bytes.max(1) as f64,
    })
}
