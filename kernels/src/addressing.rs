//! Address translation: where logical token position `p` of a sequence lives.
//!
//! Attention never walks a block table in its inner loop. Each caller first turns its layout into
//! a list of [`Run`]s (maximal stretches of consecutive slots, in logical order), checked against
//! the cache size; the attention core then streams runs. A paged layout yields one run per block,
//! a contiguous one a single run, so the two kernels differ only in how runs are built.

use crate::error::KernelError;

/// `len` consecutive slots starting at `first_slot`, holding consecutive logical positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub first_slot: usize,
    pub len: usize,
}

/// A sequence's mapping from logical positions to cache slots.
pub trait TokenAddressing: Sync {
    /// Tokens the layout can address (positions `0..mapped_tokens()`).
    fn mapped_tokens(&self) -> usize;

    /// The slot holding logical position `pos` (unchecked against the cache size).
    fn slot_of(&self, pos: usize) -> Result<usize, KernelError>;

    /// Appends runs covering positions `[0, len)` in order, each checked against `num_slots`.
    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError>;
}

pub(crate) fn check_run(run: Run, num_slots: usize) -> Result<Run, KernelError> {
    match run.first_slot.checked_add(run.len) {
        Some(end) if end <= num_slots => Ok(run),
        _ => Err(KernelError::SlotOutOfRange {
            slot: run.first_slot as u64,
            len_tokens: run.len as u64,
            num_slots: num_slots as u64,
        }),
    }
}

/// A paged layout: logical block `i` lives in physical block `blocks[i]`; slot = block ×
/// block_size + offset.
#[derive(Debug, Clone, Copy)]
pub struct PagedTable<'a> {
    pub block_size: usize,
    pub blocks: &'a [u32],
}

impl TokenAddressing for PagedTable<'_> {
    fn mapped_tokens(&self) -> usize {
        self.blocks.len() * self.block_size
    }

    fn slot_of(&self, pos: usize) -> Result<usize, KernelError> {
        let bs = self.block_size.max(1);
        match self.blocks.get(pos / bs) {
            Some(&b) => Ok(b as usize * bs + pos % bs),
            None => Err(KernelError::Unmapped {
                pos,
                mapped_tokens: self.mapped_tokens(),
            }),
        }
    }

    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError> {
        if len > self.mapped_tokens() || self.block_size == 0 {
            return Err(KernelError::Unmapped {
                pos: len.saturating_sub(1),
                mapped_tokens: self.mapped_tokens(),
            });
        }
        let bs = self.block_size;
        for (i, &b) in self.blocks.iter().take(len.div_ceil(bs)).enumerate() {
            let run = Run {
                first_slot: b as usize * bs,
                len: bs.min(len - i * bs),
            };
            out.push(check_run(run, num_slots)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_runs_cover_in_logical_order_with_partial_last_block() {
        let t = PagedTable {
            block_size: 4,
            blocks: &[7, 2, 5],
        };
        let mut runs = Vec::new();
        t.runs(10, 32, &mut runs).expect("in range");
        assert_eq!(
            runs,
            vec![
                Run {
                    first_slot: 28,
                    len: 4
                },
                Run {
                    first_slot: 8,
                    len: 4
                },
                Run {
                    first_slot: 20,
                    len: 2
                }
            ]
        );
        assert_eq!(t.slot_of(9), Ok(21));
        assert!(t.slot_of(12).is_err());
    }

    #[test]
    fn paged_runs_reject_out_of_range_blocks_and_unmapped_lengths() {
        let t = PagedTable {
            block_size: 4,
            blocks: &[1, 9],
        };
        let mut runs = Vec::new();
        assert!(matches!(
            t.runs(8, 32, &mut runs),
            Err(KernelError::SlotOutOfRange { slot: 36, .. })
        ));
        runs.clear();
        assert!(matches!(
            t.runs(9, 64, &mut runs),
            Err(KernelError::Unmapped { .. })
        ));
    }
}
