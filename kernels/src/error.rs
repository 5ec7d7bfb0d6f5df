use thiserror::Error;

/// Why a kernel refused to run. Kernels check every address before touching memory, so a bad
/// block table becomes an error value, never an out-of-bounds access.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelError {
    #[error("slot {slot} (+{len_tokens} tokens) is outside the cache of {num_slots} slots")]
    SlotOutOfRange {
        slot: u64,
        len_tokens: u64,
        num_slots: u64,
    },
    #[error("logical position {pos} is beyond the {mapped_tokens} tokens the layout maps")]
    Unmapped { pos: usize, mapped_tokens: usize },
    #[error("shape mismatch: {what}: expected {expected}, got {got}")]
    Shape {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
}

pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Shape {
            what,
            expected,
            got,
        })
    }
}
