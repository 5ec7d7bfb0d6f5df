//! Contiguous attention: the same attention core as the paged kernel (`kvbench_kernels::attention`),
//! fed by a contiguous address translation. Token `i` of a sequence lives in slot `base_slot + i`,
//! so the whole context is one [`Run`]; the paged layout yields one run per block. Anything the
//! kernel benchmark measures between the two is therefore the cost of address translation alone.

use kvbench_kernels::{KernelError, Run, TokenAddressing};

/// One sequence's reserved region in the contiguous arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContiguousRegion {
    pub base_slot: usize,
    pub capacity_tokens: usize,
}

impl TokenAddressing for ContiguousRegion {
    fn mapped_tokens(&self) -> usize {
        self.capacity_tokens
    }

    fn slot_of(&self, pos: usize) -> Result<usize, KernelError> {
        if pos < self.capacity_tokens {
            Ok(self.base_slot + pos)
        } else {
            Err(KernelError::Unmapped {
                pos,
                mapped_tokens: self.capacity_tokens,
            })
        }
    }

    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError> {
        if len > self.capacity_tokens {
            return Err(KernelError::Unmapped {
                pos: len - 1,
                mapped_tokens: self.capacity_tokens,
            });
        }
        if len == 0 {
            return Ok(());
        }
        match self.base_slot.checked_add(len) {
            Some(end) if end <= num_slots => {
                out.push(Run {
                    first_slot: self.base_slot,
                    len,
                });
                Ok(())
            }
            _ => Err(KernelError::SlotOutOfRange {
                slot: self.base_slot as u64,
                len_tokens: len as u64,
                num_slots: num_slots as u64,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_run_checked_against_capacity_and_cache() {
        let r = ContiguousRegion {
            base_slot: 10,
            capacity_tokens: 8,
        };
        let mut runs = Vec::new();
        r.runs(5, 64, &mut runs).expect("fits");
        assert_eq!(
            runs,
            vec![Run {
                first_slot: 10,
                len: 5
            }]
        );
        assert_eq!(r.slot_of(7), Ok(17));
        assert!(r.slot_of(8).is_err());
        assert!(r.runs(9, 64, &mut runs).is_err());
        assert!(matches!(
            r.runs(8, 16, &mut runs),
            Err(KernelError::SlotOutOfRange { .. })
        ));
    }
}
