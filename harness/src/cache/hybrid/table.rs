//! One sequence's block table for one table of the layout: plain data, the pages of its
//! logical blocks `first_block ..`, the earlier ones released (sliding) or never there.

pub use kvbench_cache_api::GroupTable;

/// Everything the manager holds for one sequence.
///
/// Three lengths, `trimmed ≤ written ≤ tokens`: `tokens` positions are mapped (a started
/// prompt maps every token's pages before any is written), `written` of them hold K/V, and the
/// sliding tables hold the blocks the window of the first `trimmed` tokens reaches
/// ([`super::TableSpec::held_blocks`]). A sliding table trims by what is written, never by what
/// is mapped: a prefill chunk's first queries read the window before the chunk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SeqEntry {
    pub(crate) tokens: u64,
    pub(crate) written: u64,
    pub(crate) trimmed: u64,
    /// One table per [`super::TableSpec`] of the layout, in its order.
    pub(crate) tables: Vec<GroupTable>,
    /// The pages of its recurrent state (empty without a recurrent group): its own, in no
    /// table, never shared.
    pub(crate) state: Vec<u32>,
    /// Pages of recurrent-state checkpoints it holds until the next step begins (one
    /// reference each, in no table): those that step saves, and the one a prefix hit resumes
    /// from, which that step restores.
    pub(crate) checkpoint: Vec<u32>,
}
