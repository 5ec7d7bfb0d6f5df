//! What a hybrid manager operation can refuse; a refused operation changes nothing.

use kvbench_cache_api::SeqId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HybridError {
    #[error("sequence {0} is not held")]
    UnknownSeq(SeqId),
    #[error("sequence {0} is already held")]
    DuplicateSeq(SeqId),
    #[error("{needed} pages needed, {free} free")]
    OutOfPages { needed: u64, free: u32 },
    #[error("{0} does not fit in its integer type")]
    Overflow(&'static str),
    /// A state the manager's own bookkeeping should make impossible.
    #[error("inconsistent pool: {0}")]
    Corrupt(&'static str),
}
