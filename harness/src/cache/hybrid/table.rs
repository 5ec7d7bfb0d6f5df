//! One sequence's block table for one table of the layout: plain data, the pages of its
//! logical blocks `first_block ..`, the earlier ones released (sliding) or never there.

pub use kvbench_cache_api::GroupTable;

/// Everything the manager holds for one sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SeqEntry {
    pub(crate) tokens: u64,
    /// One table per [`super::TableSpec`] of the layout, in its order.
    pub(crate) tables: Vec<GroupTable>,
}
