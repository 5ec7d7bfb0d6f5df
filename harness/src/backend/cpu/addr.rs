//! The cache manager's layout as a kernel address translation. The paged table comes from
//! `kvbench-kernels`, the contiguous region from `kvbench-baselines`; both feed the same core.

use kvbench_baselines::attention::ContiguousRegion;
use kvbench_cache_api::SeqLayout;
use kvbench_kernels::{KernelError, PagedTable, Run, TokenAddressing};

pub(super) enum Addr<'a> {
    Paged(PagedTable<'a>),
    Contiguous(ContiguousRegion),
}

impl<'a> Addr<'a> {
    pub(super) fn from_layout(layout: SeqLayout<'a>) -> Addr<'a> {
        match layout {
            SeqLayout::Paged { block_size, blocks } => Addr::Paged(PagedTable {
                block_size: block_size as usize,
                blocks,
            }),
            SeqLayout::Contiguous {
                base_slot,
                capacity_tokens,
            } => Addr::Contiguous(ContiguousRegion {
                base_slot: base_slot as usize,
                capacity_tokens: capacity_tokens as usize,
            }),
            // The cpu backend refuses grouped managers at set-up; were one to reach it, its
            // layout maps nothing here, so every read fails instead of reading a wrong slot.
            SeqLayout::Grouped { .. } => Addr::Contiguous(ContiguousRegion {
                base_slot: 0,
                capacity_tokens: 0,
            }),
        }
    }
}

impl TokenAddressing for Addr<'_> {
    fn mapped_tokens(&self) -> usize {
        match self {
            Addr::Paged(p) => p.mapped_tokens(),
            Addr::Contiguous(c) => c.mapped_tokens(),
        }
    }

    fn slot_of(&self, pos: usize) -> Result<usize, KernelError> {
        match self {
            Addr::Paged(p) => p.slot_of(pos),
            Addr::Contiguous(c) => c.slot_of(pos),
        }
    }

    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError> {
        match self {
            Addr::Paged(p) => p.runs(len, num_slots, out),
            Addr::Contiguous(c) => c.runs(len, num_slots, out),
        }
    }
}
