//! Grouped layouts: a sequence held in several block tables over one pool of pages, one table
//! per group of layers that keep tokens alike (full, sliding window, latent). The hybrid paged
//! manager (`kvbench::cache::hybrid`) and the grouped contiguous baseline hand these to the
//! backends as [`crate::SeqLayout::Grouped`].
//!
//! **Addressing.** Every table shares one page size in bytes, but a table whose layers hold fewer
//! bytes a token fits more tokens a page (`block_tokens`). Position `p` of table `t` lives at
//! offset `p % block_tokens` of page `pages[p / block_tokens − first_block]`. Two tables never
//! share a page at the same moment, so `(page, offset)` names one cell of the device.
//!
//! **Accounting unit.** A grouped manager counts [`crate::Accounting`] in slots of `page_bytes /
//! page_slots` bytes: one page is `page_slots` slots (the scenario's block size), whatever its
//! table. A page's tokens count as live by their share of the page (rounded down), the rest of
//! the page as allocated-unfilled. Recurrent state counts live in whole slots rounded up
//! ([`GroupedState`] says where it is held).
//!
//! **Copies.** A grouped manager's [`crate::CopyOp`] copies whole pages: `src_slot = src_page ×
//! page_slots`, `dst_slot = dst_page × page_slots`, `len_tokens = page_slots` — a page copy,
//! every cell of the page whatever its table's `block_tokens` (several consecutive pages may be
//! one op with `len_tokens = k × page_slots`). A backend performs them as page copies.

use crate::Pages;
use serde::{Deserialize, Serialize};

/// What one table keeps and how many tokens a page of it holds: plain data, the same for every
/// sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableShape {
    /// Tokens one page of this table holds.
    pub block_tokens: u32,
    /// `Some(w)`: a sliding-window table; a step reads only the last `w` positions, and blocks
    /// wholly before them may be gone. `None`: every position is kept (full, latent).
    pub window: Option<u32>,
}

/// A grouped pool as plain data: what the hybrid paged manager and the grouped contiguous
/// baseline are both built from, so the two modes of one run share their tables, their page
/// size and their accounting unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupedPool {
    /// One entry per block table a sequence holds, in the layout's order.
    pub shapes: Vec<TableShape>,
    /// Slots one page counts for (the scenario's block size).
    pub page_slots: u32,
    /// Bytes one slot stands for: a page's bytes ÷ `page_slots`.
    pub slot_bytes: u64,
    /// Pages in the pool.
    pub pages: u32,
    /// Where a sequence's recurrent state is held.
    pub state: GroupedState,
}

/// Where a grouped manager holds each sequence's recurrent state (a fixed size per sequence,
/// however long it grows).
///
/// The two modes of a run differ on purpose. A simple server (vLLM v0's Mamba cache) reserves
/// the state of as many sequences as a step may schedule before the budget is cut into pages:
/// the grouped contiguous baseline does that (`Reserved`), and pays for the states whether or
/// not that many sequences ever run. vLLM v1's hybrid allocator takes a request's state from
/// the pool the attention blocks come from when it is admitted: the hybrid paged manager does
/// that (`Paged`), so the budget holds states only for the sequences that run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupedState {
    /// No recurrent group: nothing held.
    None,
    /// `sequences` states reserved off the budget up front; a sequence takes one at start and
    /// gives it back at release (fenced like pages), and a start finds none when all are taken.
    Reserved {
        sequences: u32,
        /// Slots one state counts for, rounded up.
        slots_per_sequence: u64,
    },
    /// Taken as `pages_per_sequence` pages of the shared pool at start (or fork), fenced like
    /// pages at release; no reservation.
    Paged {
        pages_per_sequence: u32,
        /// Slots one state counts for, rounded up (live); the rest of its pages are
        /// allocated-unfilled.
        slots_per_sequence: u64,
    },
}

impl GroupedState {
    /// Slots one sequence's state counts for live (0: no recurrent group).
    pub fn slots_per_sequence(&self) -> u64 {
        match *self {
            GroupedState::None => 0,
            GroupedState::Reserved {
                slots_per_sequence, ..
            }
            | GroupedState::Paged {
                slots_per_sequence, ..
            } => slots_per_sequence,
        }
    }

    /// The states reserved up front, where they are (`Reserved`).
    pub fn reserved_sequences(&self) -> Option<u32> {
        match *self {
            GroupedState::Reserved { sequences, .. } => Some(sequences),
            GroupedState::None | GroupedState::Paged { .. } => None,
        }
    }

    /// Pages of the pool one sequence's state takes (0 unless `Paged`).
    pub fn pages_per_sequence(&self) -> u32 {
        match *self {
            GroupedState::Paged {
                pages_per_sequence, ..
            } => pages_per_sequence,
            GroupedState::None | GroupedState::Reserved { .. } => 0,
        }
    }
}

/// One sequence's block table for one table of the layout: the pages of its logical blocks
/// `first_block ..`, the earlier ones released (sliding) or never held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupTable {
    /// Logical index of `pages[0]`.
    pub first_block: u64,
    /// The pages of logical blocks `first_block, first_block + 1, …`, renumbered at every
    /// change (a verifier that compared them skips the comparison while the number holds).
    pub pages: Pages,
}

impl GroupTable {
    /// One past the last logical block held.
    pub fn end_block(&self) -> u64 {
        self.first_block + self.pages.len() as u64
    }

    /// The page of the last logical block, if any is held.
    pub fn last_page(&self) -> Option<u32> {
        self.pages.last().copied()
    }
}

/// The cell `(page, offset in page)` holding position `pos` of a table, or `None` where the
/// table does not hold it (released out of the window, or not yet mapped).
pub fn cell(shape: &TableShape, table: &GroupTable, pos: u64) -> Option<(u32, u32)> {
    let bt = u64::from(shape.block_tokens.max(1));
    let block = pos / bt;
    let i = usize::try_from(block.checked_sub(table.first_block)?).ok()?;
    let page = *table.pages.get(i)?;
    Some((page, (pos % bt) as u32))
}

/// The positions of a sequence of `tokens` tokens that a step still reads in a table: all of
/// them, or the last `window`.
pub fn readable_from(shape: &TableShape, tokens: u64) -> u64 {
    match shape.window {
        Some(w) => tokens.saturating_sub(u64::from(w)),
        None => 0,
    }
}

/// Pages a swap of a sequence of `tokens` tokens moves over `shapes`: in each table the blocks
/// holding a position a step still reads (`readable_from .. tokens`): every block of a full or
/// latent table, a sliding table's blocks touching its window. What a swap-out keeps and a
/// swap-in writes back, whichever manager holds the tables.
pub fn swap_pages(shapes: &[TableShape], tokens: u64) -> u64 {
    shapes
        .iter()
        .map(|s| {
            let bt = u64::from(s.block_tokens.max(1));
            tokens.div_ceil(bt) - (readable_from(s, tokens) / bt).min(tokens.div_ceil(bt))
        })
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_lives_in_the_page_of_its_block_at_its_offset() {
        let shape = TableShape {
            block_tokens: 4,
            window: Some(6),
        };
        let table = GroupTable {
            first_block: 1,
            pages: vec![7, 3].into(),
        };
        assert_eq!(cell(&shape, &table, 3), None, "block 0 released");
        assert_eq!(cell(&shape, &table, 4), Some((7, 0)));
        assert_eq!(cell(&shape, &table, 11), Some((3, 3)));
        assert_eq!(cell(&shape, &table, 12), None, "block 3 not mapped");
        assert_eq!(readable_from(&shape, 12), 6);
        let full = TableShape {
            window: None,
            ..shape
        };
        assert_eq!(readable_from(&full, 12), 0);
        // 13 tokens: the full table's 4 blocks; the window 7..13 touches blocks 1..4, 3 of them.
        assert_eq!(swap_pages(&[full, shape], 13), 4 + 3);
        assert_eq!(swap_pages(&[full, shape], 0), 0);
    }
}
