//! The hybrid layout: which block tables a sequence gets, how many tokens a block of each holds,
//! and how many pages of one size the budget buys.
//!
//! **Grouping rule.** Every layer group that caches per token (full, sliding, MLA) is split into
//! tables of `g` layers, `g` the greatest common divisor of those groups' layer counts; a page
//! is one block of one table: `g` layers × `block_tokens` tokens. So no table has a padding
//! layer — vLLM's rule (`g` = the smallest group's count, or the largest when all are within
//! 1.5×) pads the last table of a group whose count `g` does not divide (Gemma 3 27B: 52
//! sliding layers become 6 tables of 10, 8 of 60 layer slots empty in every sliding block). The
//! price is tables, not bytes: Gemma 3 27B has 31 tables of 2 layers where vLLM has 7 of 10, so
//! five times the block-table entries for its full layers (4 bytes each against a 256 KiB page).
//!
//! **Page size.** One page size serves every table: `g × block_size × b_max`, with `b_max` the
//! largest per-layer per-token bytes among the groups. A group whose layers hold fewer bytes a
//! token gets more tokens a block: `block_tokens = ⌊page / (g × b)⌋`, and the page's last
//! `page − g × b × block_tokens` bytes (less than one token of its `g` layers) are unused —
//! `TableSpec::tail_bytes_per_page`, 0 when every group stores the same bytes a token (Gemma 3,
//! gpt-oss). vLLM instead needs the page sizes to divide each other and refuses otherwise.
//!
//! **Recurrent state** comes out of the same pool, on demand: a sequence takes
//! `⌈state_bytes ÷ page_bytes⌉` pages for its state when it starts (or forks) and gives them
//! back at release, fenced like any page, so the budget holds states only for the sequences
//! that run. vLLM's hybrid allocator (v1) does the same, but pads the attention page until one
//! page holds a whole state (hundreds of tokens a block for Mamba models); here the page stays
//! the attention block's and a state spans whole pages, its last one's tail unused. The grouped
//! contiguous baseline instead reserves `state_sequences` states off the budget up front (what
//! vLLM v0's Mamba cache does): its pool is the budget less that reservation
//! (`contiguous_pages`), the paged pool the whole budget (`pages`).
//!
//! **Per-block FP8 scales** (`kv_scale = "per_block"`) live in each page beside its values: a
//! table's block of `block_tokens` tokens carries one f32 scale per layer and K/V
//! (`scale_bytes_per_block`), so a token of it costs its values plus that block's scales shared
//! by its tokens, as the summed layout prices them (`kv_bytes_per_token`). The page is the
//! largest group's `block_size` tokens of values and scales; a group of fewer bytes a token
//! gets the most tokens whose values and scales fit the page. Per-tensor and per-head scales
//! are fixed bytes that the caller takes off the budget, as `plan` does.

use kvbench_cache_api::GroupedState;

use crate::model::{KvScale, LayerGroup, ModelShape, KV_SCALE_BYTES};

/// What a table's blocks hold, and so when they can go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableKind {
    /// Every token, for as long as the sequence lives.
    Full,
    /// The last `window` tokens: a block wholly before them is released.
    Sliding { window: u32 },
    /// Every token (one latent a token a layer), like `Full`.
    Mla,
}

/// One block table of every sequence: `layers` layers of the model group `group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSpec {
    pub kind: TableKind,
    /// Index of the layer group in [`ModelShape::groups`] these layers belong to.
    pub group: usize,
    pub layers: u32,
    /// Tokens one page of this table holds.
    pub block_tokens: u32,
    /// Bytes one token takes in this table (its `layers` layers), scales apart.
    pub bytes_per_token: u64,
    /// Per-block FP8 scale bytes one page of this table holds beside its tokens (its `layers`
    /// layers × KV heads, K and V, an f32 each); 0 without per-block scales.
    pub scale_bytes_per_block: u64,
    /// Bytes at the end of each page this table cannot use.
    pub tail_bytes_per_page: u64,
}

impl TableSpec {
    /// Logical blocks `[first, end)` this table holds for a sequence of `tokens` tokens: every
    /// block up to the one holding the last token; for a sliding table, from the block holding
    /// position `tokens − window` (the last token's window: positions `tokens − window ..
    /// tokens`), so no held block lies wholly before the window.
    pub fn held_blocks(&self, tokens: u64) -> (u64, u64) {
        let bt = self.block_tokens as u64;
        let end = tokens.div_ceil(bt);
        let first = match self.kind {
            TableKind::Sliding { window } => tokens.saturating_sub(window as u64) / bt,
            TableKind::Full | TableKind::Mla => 0,
        };
        (first.min(end), end)
    }

    /// Blocks held at `tokens` tokens.
    pub fn held_block_count(&self, tokens: u64) -> u64 {
        let (first, end) = self.held_blocks(tokens);
        end - first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_table_holds_the_blocks_touching_its_window() {
        let spec = TableSpec {
            kind: TableKind::Sliding { window: 10 },
            group: 0,
            layers: 1,
            block_tokens: 4,
            bytes_per_token: 1,
            scale_bytes_per_block: 0,
            tail_bytes_per_page: 0,
        };
        // Window of the last token at 13 tokens: positions 3..13, block 0 holds position 3.
        assert_eq!(spec.held_blocks(13), (0, 4));
        // At 14: positions 4..14; block 0 (0..4) is wholly before it.
        assert_eq!(spec.held_blocks(14), (1, 4));
        assert_eq!(spec.held_blocks(0), (0, 0));
        let full = TableSpec {
            kind: TableKind::Full,
            ..spec
        };
        assert_eq!(full.held_blocks(14), (0, 4));
    }
}

/// Why a layout cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("block size must be at least 1 token")]
    ZeroBlockSize,
    #[error("model `{0}` has no layer group that caches per token; nothing to page")]
    NothingPaged(String),
    #[error("layer group {0} is sliding with a window of 0 tokens")]
    ZeroWindow(usize),
    #[error("the budget of {budget_bytes} bytes holds no page of {page_bytes} bytes after {state_bytes} bytes of recurrent state reserved for the contiguous baseline")]
    BudgetTooSmall {
        budget_bytes: u64,
        page_bytes: u64,
        state_bytes: u64,
    },
    #[error("{0} does not fit in its integer type")]
    Overflow(&'static str),
}

/// The tables, the page size and the pool, derived from a model, a block size and a budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridLayout {
    pub tables: Vec<TableSpec>,
    /// Layers per table (`g`).
    pub layers_per_table: u32,
    /// Tokens a page of the table with the most bytes a token holds (the scenario's block size).
    pub block_size: u32,
    pub page_bytes: u64,
    /// Pages in the shared pool of the hybrid paged manager: the whole budget, states taken
    /// out of it on demand.
    pub pages: u32,
    /// Recurrent state of one sequence (0 without a recurrent group).
    pub state_bytes_per_sequence: u64,
    /// Pages of the pool one sequence's state takes in the paged manager,
    /// `⌈state_bytes_per_sequence ÷ page_bytes⌉` (0 without a recurrent group).
    pub state_pages_per_sequence: u32,
    /// Sequences whose state the grouped contiguous baseline reserves up front; `None` without
    /// a recurrent group.
    pub state_sequences: Option<u32>,
    /// Pages of the contiguous baseline's pool: the budget less its reserved states.
    pub contiguous_pages: u32,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl HybridLayout {
    /// The layout of `shape` with `block_size`-token blocks over `kv_budget_bytes`: the paged
    /// pool is the whole budget; the contiguous baseline's reserves the recurrent state of
    /// `state_sequences` sequences first (ignored without a recurrent group).
    pub fn new(
        shape: &ModelShape,
        block_size: u32,
        kv_budget_bytes: u64,
        state_sequences: u32,
    ) -> Result<HybridLayout, LayoutError> {
        if block_size == 0 {
            return Err(LayoutError::ZeroBlockSize);
        }
        let groups = shape.groups();
        let per_block_scales = shape.kv_scale_granularity() == Some(KvScale::PerBlock);
        let mut paged = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            let b = g
                .bytes_per_token_per_layer(shape.tp, shape.kv_dtype)
                .ok_or(LayoutError::Overflow("bytes per token per layer"))?;
            let kind = match *g {
                LayerGroup::Full { .. } => TableKind::Full,
                LayerGroup::Mla { .. } => TableKind::Mla,
                LayerGroup::Sliding { window: 0, .. } => return Err(LayoutError::ZeroWindow(i)),
                LayerGroup::Sliding { window, .. } => TableKind::Sliding { window },
                LayerGroup::Recurrent { .. } => continue,
            };
            // One f32 scale a block per layer per KV head, K and V (an MLA latent carries its
            // own per-token scales in `b`).
            let s = if per_block_scales {
                2 * KV_SCALE_BYTES * u64::from(g.kv_heads_per_device(shape.tp))
            } else {
                0
            };
            if b > 0 && g.layers() > 0 {
                paged.push((i, kind, g.layers(), b, s));
            }
        }
        let per_table = paged.iter().fold(0, |acc, &(_, _, l, _, _)| gcd(acc, l));
        if paged.is_empty() || per_table == 0 {
            return Err(LayoutError::NothingPaged(shape.name.clone()));
        }
        let g = per_table as u64;
        // The page: the largest of one block of `block_size` tokens of any group, values and
        // scales, so every table holds at least `block_size` tokens a page.
        let mut page_bytes = 0u64;
        for &(_, _, _, b, s) in &paged {
            let block = (block_size as u64)
                .checked_mul(b)
                .and_then(|x| x.checked_add(s))
                .and_then(|x| x.checked_mul(g))
                .ok_or(LayoutError::Overflow("page bytes"))?;
            page_bytes = page_bytes.max(block);
        }
        let mut tables = Vec::new();
        for &(group, kind, layers, b, s) in &paged {
            let per_token = g * b; // ≤ page_bytes, which did not overflow
            let scales = g * s;
            let block_tokens = (page_bytes - scales) / per_token;
            let block_tokens_u32 =
                u32::try_from(block_tokens).map_err(|_| LayoutError::Overflow("block tokens"))?;
            let spec = TableSpec {
                kind,
                group,
                layers: per_table,
                block_tokens: block_tokens_u32,
                bytes_per_token: per_token,
                scale_bytes_per_block: scales,
                tail_bytes_per_page: page_bytes - scales - per_token * block_tokens,
            };
            for _ in 0..layers / per_table {
                tables.push(spec);
            }
        }
        let state_bytes_per_sequence = shape
            .checked_state_bytes_per_sequence()
            .ok_or(LayoutError::Overflow("state bytes per sequence"))?;
        let state_pages_per_sequence = u32::try_from(state_bytes_per_sequence.div_ceil(page_bytes))
            .map_err(|_| LayoutError::Overflow("state pages per sequence"))?;
        let (state_sequences, state_bytes) = if state_bytes_per_sequence == 0 {
            (None, 0)
        } else {
            let reserved = state_bytes_per_sequence
                .checked_mul(state_sequences as u64)
                .ok_or(LayoutError::Overflow("reserved state bytes"))?;
            (Some(state_sequences), reserved)
        };
        let too_small = LayoutError::BudgetTooSmall {
            budget_bytes: kv_budget_bytes,
            page_bytes,
            state_bytes,
        };
        let contiguous_bytes = kv_budget_bytes
            .checked_sub(state_bytes)
            .ok_or(too_small.clone())?;
        let contiguous_pages = contiguous_bytes / page_bytes;
        if contiguous_pages == 0 {
            return Err(too_small);
        }
        let pages = u32::try_from(kv_budget_bytes / page_bytes)
            .map_err(|_| LayoutError::Overflow("pages"))?;
        let contiguous_pages =
            u32::try_from(contiguous_pages).map_err(|_| LayoutError::Overflow("pages"))?;
        Ok(HybridLayout {
            tables,
            layers_per_table: per_table,
            block_size,
            page_bytes,
            pages,
            state_bytes_per_sequence,
            state_pages_per_sequence,
            state_sequences,
            contiguous_pages,
        })
    }

    /// Pages one unshared sequence of `tokens` tokens holds, over every table.
    pub fn pages_per_sequence(&self, tokens: u64) -> Option<u64> {
        self.tables
            .iter()
            .try_fold(0u64, |acc, t| acc.checked_add(t.held_block_count(tokens)))
    }

    /// Bytes one unshared sequence of `tokens` tokens holds in the paged manager: its pages
    /// and its state's pages.
    pub fn bytes_per_sequence(&self, tokens: u64) -> Option<u64> {
        self.pages_per_sequence(tokens)?
            .checked_add(u64::from(self.state_pages_per_sequence))?
            .checked_mul(self.page_bytes)
    }
}

impl HybridLayout {
    /// Bytes one accounting slot stands for: a page is `block_size` slots.
    pub fn slot_bytes(&self) -> u64 {
        self.page_bytes / u64::from(self.block_size.max(1))
    }

    /// Slots one sequence's state counts for live, rounded up but never past its pages' slots
    /// (a slot is a page ÷ the block size rounded down; 0 without a recurrent group).
    pub fn state_slots_per_sequence(&self) -> u64 {
        let pages_slots =
            u64::from(self.state_pages_per_sequence).saturating_mul(u64::from(self.block_size));
        self.state_bytes_per_sequence
            .div_ceil(self.slot_bytes().max(1))
            .min(pages_slots)
    }

    /// The layout as the plain data the grouped contiguous baseline is built from: the pool
    /// less the states it reserves up front.
    pub fn grouped_pool(&self) -> kvbench_cache_api::GroupedPool {
        let mut pool = self.paged_pool();
        pool.pages = self.contiguous_pages;
        if let Some(sequences) = self.state_sequences {
            pool.state = GroupedState::Reserved {
                sequences,
                slots_per_sequence: self.state_slots_per_sequence(),
            };
        }
        pool
    }

    /// The layout as the plain data of the hybrid paged manager: the whole budget in pages,
    /// each sequence's state taken from them when it starts.
    pub fn paged_pool(&self) -> kvbench_cache_api::GroupedPool {
        let slot_bytes = self.slot_bytes().max(1);
        kvbench_cache_api::GroupedPool {
            shapes: self
                .tables
                .iter()
                .map(|t| kvbench_cache_api::TableShape {
                    block_tokens: t.block_tokens,
                    window: match t.kind {
                        TableKind::Sliding { window } => Some(window),
                        TableKind::Full | TableKind::Mla => None,
                    },
                })
                .collect(),
            page_slots: self.block_size,
            slot_bytes,
            pages: self.pages,
            state: if self.state_bytes_per_sequence == 0 {
                GroupedState::None
            } else {
                GroupedState::Paged {
                    pages_per_sequence: self.state_pages_per_sequence,
                    slots_per_sequence: self.state_slots_per_sequence(),
                }
            },
        }
    }
}
