//! The cache manager's layout as a kernel address translation. The paged table comes from
//! `kvbench-kernels`, the contiguous region from `kvbench-baselines`; both feed the same core.
//! A grouped layout is addressed per layer: each layer through its own table
//! ([`GroupedMap`]), a cell `(page, offset)` at slot `page × stride + offset`.

use kvbench_baselines::attention::ContiguousRegion;
use kvbench_cache_api::grouped::cell;
use kvbench_cache_api::{GroupTable, SeqLayout, TableShape};
use kvbench_kernels::{KernelError, PagedTable, Run, TokenAddressing};

use super::grouped::GroupedMap;
use crate::backend::BackendError;

pub(super) enum Addr<'a> {
    Paged(PagedTable<'a>),
    Contiguous(ContiguousRegion),
    Grouped(GroupedAddr<'a>),
}

/// One sequence's tables of a grouped layout, with the run's layer → table map.
pub(super) struct GroupedAddr<'a> {
    pub map: &'a GroupedMap,
    pub shapes: &'a [TableShape],
    pub tables: &'a [GroupTable],
}

impl<'a> Addr<'a> {
    /// The translation of `layout`; a grouped one needs the run's `grouped` map (made at the
    /// first grouped layout the backend sees).
    pub(super) fn from_layout(
        layout: SeqLayout<'a>,
        grouped: Option<&'a GroupedMap>,
    ) -> Result<Addr<'a>, BackendError> {
        Ok(match layout {
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
            SeqLayout::Grouped { shapes, tables, .. } => {
                let map = grouped.ok_or_else(|| {
                    BackendError::Step("a grouped layout before the grouped store was made".into())
                })?;
                if tables.len() != shapes.len() {
                    return Err(BackendError::Step(format!(
                        "a grouped layout of {} tables for {} table shapes",
                        tables.len(),
                        shapes.len()
                    )));
                }
                Addr::Grouped(GroupedAddr {
                    map,
                    shapes,
                    tables,
                })
            }
        })
    }
}

impl GroupedAddr<'_> {
    fn table(&self, layer: usize) -> Result<usize, KernelError> {
        self.map
            .layer_tables
            .get(layer)
            .copied()
            .flatten()
            .filter(|&t| t < self.tables.len())
            .ok_or_else(|| {
                KernelError::Config(format!("layer {layer} reads through no grouped table"))
            })
    }

    fn mapped_tokens(&self) -> usize {
        self.shapes
            .iter()
            .zip(self.tables)
            .map(|(s, t)| t.end_block().saturating_mul(u64::from(s.block_tokens)))
            .max()
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// The slot of position `pos` of table `t`; a position the table does not hold (released
    /// behind its window, or never mapped) is an error, never another cell.
    fn slot(&self, t: usize, pos: usize) -> Result<usize, KernelError> {
        let unmapped = || KernelError::Unmapped {
            pos,
            mapped_tokens: self.mapped_tokens(),
        };
        let (page, off) =
            cell(&self.shapes[t], &self.tables[t], pos as u64).ok_or_else(unmapped)?;
        (page as usize)
            .checked_mul(self.map.stride)
            .and_then(|s| s.checked_add(off as usize))
            .ok_or_else(unmapped)
    }

    /// Runs covering positions `[from, len)` of table `t`, one per block at most.
    fn runs(
        &self,
        t: usize,
        from: usize,
        len: usize,
        num_slots: usize,
        out: &mut Vec<Run>,
    ) -> Result<usize, KernelError> {
        let bt = self.shapes[t].block_tokens.max(1) as usize;
        let mut pos = from;
        while pos < len {
            let n = (bt - pos % bt).min(len - pos);
            let run = Run {
                first_slot: self.slot(t, pos)?,
                len: n,
            };
            if run
                .first_slot
                .checked_add(n)
                .is_none_or(|end| end > num_slots)
            {
                return Err(KernelError::SlotOutOfRange {
                    slot: run.first_slot as u64,
                    len_tokens: n as u64,
                    num_slots: num_slots as u64,
                });
            }
            out.push(run);
            pos += n;
        }
        Ok(from)
    }
}

fn no_layer() -> KernelError {
    KernelError::Config("a grouped layout is addressed per layer".into())
}

impl TokenAddressing for Addr<'_> {
    fn mapped_tokens(&self) -> usize {
        match self {
            Addr::Paged(p) => p.mapped_tokens(),
            Addr::Contiguous(c) => c.mapped_tokens(),
            Addr::Grouped(g) => g.mapped_tokens(),
        }
    }

    fn slot_of(&self, pos: usize) -> Result<usize, KernelError> {
        match self {
            Addr::Paged(p) => p.slot_of(pos),
            Addr::Contiguous(c) => c.slot_of(pos),
            Addr::Grouped(_) => Err(no_layer()),
        }
    }

    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError> {
        match self {
            Addr::Paged(p) => p.runs(len, num_slots, out),
            Addr::Contiguous(c) => c.runs(len, num_slots, out),
            Addr::Grouped(_) => Err(no_layer()),
        }
    }

    fn slot_of_layer(&self, layer: usize, pos: usize) -> Result<usize, KernelError> {
        match self {
            Addr::Grouped(g) => g.slot(g.table(layer)?, pos),
            _ => self.slot_of(pos),
        }
    }

    fn runs_layer_from(
        &self,
        layer: usize,
        from: usize,
        len: usize,
        num_slots: usize,
        out: &mut Vec<Run>,
    ) -> Result<usize, KernelError> {
        match self {
            Addr::Grouped(g) => g.runs(g.table(layer)?, from, len, num_slots, out),
            _ => self.runs_from(from, len, num_slots, out),
        }
    }

    fn table_of_layer(&self, layer: usize) -> usize {
        match self {
            Addr::Grouped(g) => g
                .map
                .layer_tables
                .get(layer)
                .copied()
                .flatten()
                .unwrap_or(0),
            _ => 0,
        }
    }
}
