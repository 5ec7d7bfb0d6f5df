//! One sequence's block table for one table of the layout: plain data, the pages of its
//! logical blocks `first_block ..`, the earlier ones released (sliding) or never there.

use super::pool::PageId;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupTable {
    /// Logical index of `pages[0]`.
    pub first_block: u64,
    /// The pages of logical blocks `first_block, first_block + 1, …`.
    pub pages: Vec<PageId>,
}

impl GroupTable {
    /// One past the last logical block held.
    pub fn end_block(&self) -> u64 {
        self.first_block + self.pages.len() as u64
    }

    /// The page of the last logical block, if any is held.
    pub fn last_page(&self) -> Option<PageId> {
        self.pages.last().copied()
    }
}

/// Everything the manager holds for one sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SeqEntry {
    pub(crate) tokens: u64,
    /// One table per [`super::TableSpec`] of the layout, in its order.
    pub(crate) tables: Vec<GroupTable>,
}
