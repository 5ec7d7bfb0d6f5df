//! Per-stream scheduling state. Counts advance when a step is *planned* (so step N+1 can be
//! planned while step N is in flight); emission times are stamped when the step *completes*.

use kvbench_cache_api::SeqId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A continuation not forked yet, or a request not arrived yet.
    Pending,
    /// In the wait queue (new, or preempted by recompute).
    Waiting,
    /// Holds cache; prompt (or recompute) tokens still to prefill.
    Prefill,
    /// Holds cache; generating.
    Decode,
    /// K/V copied to the host tier; holds no device cache.
    Swapped,
    Done,
}

#[derive(Debug, Clone)]
pub struct Stream {
    pub request: u32,
    pub rank: u32,
    pub phase: Phase,
    /// Holds blocks in the cache manager (must be released exactly once).
    pub cached: bool,
    /// Registered with the backend (must be forgotten exactly once).
    pub registered: bool,
    /// Tokens this stream emits before it is done.
    pub limit: u32,
    /// Reaching `limit` means the client cancelled (after-tokens cancellation).
    pub cancel_at_limit: bool,
    /// Samples planned so far (optimistic).
    pub generated: u32,
    /// Tokens whose K/V are in the cache (optimistic: counted when planned).
    pub in_cache: u32,
    /// Tokens this incarnation must prefill up to (prompt, or prompt + generated on restart).
    pub target: u32,
    /// Tokens copied to the host tier by the last swap-out.
    pub swapped_tokens: u32,
    /// The step this stream was last scheduled in (u64::MAX: never).
    pub scheduled_step: u64,
    pub first_admission_done: bool,
    pub restart: bool,
    pub forked_children: bool,
    pub record: super::record::StreamRecord,
}

impl Stream {
    pub fn seq(index: u32) -> SeqId {
        index as SeqId
    }

    pub fn in_cache_at_swap(&self) -> u32 {
        self.swapped_tokens
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }
}
