//! The seam between the engine and the KV cache managers.
//!
//! Both managers — the paged one (`kvbench::cache`) and the contiguous baseline
//! (`kvbench-baselines`) — implement [`KvCacheManager`]. The engine drives them through this trait
//! only, so both cache modes see the same calls for the same request list.
//!
//! **Architecture invariant:** managers know nothing of time, devices or scheduling. They decide
//! where tokens live, return the copies a backend must perform, and account for every slot.
//! Steps are opaque, increasing [`StepId`]s; see [`fence`] for the deferred-release rule.

pub mod fence;
pub mod grouped;
pub mod pages;
pub mod sync;
pub mod tier;

use serde::{Deserialize, Serialize};

pub use grouped::{GroupTable, GroupedPool, GroupedState, TableShape};
pub use pages::Pages;
pub use tier::{BlockLoc, OffloadMode, OnloadMode, Tier, TierHits, TierOp, TierStats};

/// Engine-assigned sequence id (a request's continuations each get their own).
pub type SeqId = u64;
/// Increasing id of a device step; see [`fence`].
pub type StepId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    Paged,
    Contiguous,
}

impl CacheMode {
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Paged => "paged",
            CacheMode::Contiguous => "contiguous",
        }
    }
}

/// Who may reuse a cached prefix block. A key identifies the exact computation: model identity,
/// tokenizer identity and reuse scope. `reuse == None` disables lookups and publishing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScopeKey {
    pub model: String,
    pub tokenizer: String,
    pub reuse: ReuseScope,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReuseScope {
    Tenant(u32),
    Global,
    None,
}

/// A copy the backend must perform before the step that needs it (copy-on-write, fork of a
/// contiguous region). Addresses are token slots: slot = block × block_size + offset for paged
/// caches, an arena offset for contiguous ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyOp {
    pub src_slot: u64,
    pub dst_slot: u64,
    pub len_tokens: u32,
}

/// Where one sequence's tokens live, for the backend's address translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqLayout<'a> {
    /// Logical block i lives in physical block `blocks[i]`.
    Paged { block_size: u32, blocks: &'a Pages },
    /// Token i lives in slot `base_slot + i`; `capacity_tokens` are reserved.
    Contiguous {
        base_slot: u64,
        capacity_tokens: u32,
    },
    /// One block table per table of a grouped layout (see [`grouped`]): table `t`'s position
    /// `p` lives in `tables[t]` as [`grouped::cell`] finds it. A page is `page_slots` slots.
    Grouped {
        page_slots: u32,
        shapes: &'a [TableShape],
        tables: &'a [GroupTable],
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// Not enough free (or evictable) space; nothing was changed.
    NoSpace {
        needed_slots: u64,
        available_slots: u64,
    },
    /// A request larger than the whole cache could ever hold.
    TooLarge {
        needed_slots: u64,
        total_slots: u64,
    },
    UnknownSeq(SeqId),
    DuplicateSeq(SeqId),
    /// A call out of protocol order (e.g. `fill` past the started tokens, `append` before the
    /// prompt is filled); nothing was changed.
    InvalidOp {
        seq: SeqId,
        reason: &'static str,
    },
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllocError::NoSpace {
                needed_slots,
                available_slots,
            } => {
                write!(
                    f,
                    "no space: need {needed_slots} slots, {available_slots} available"
                )
            }
            AllocError::TooLarge {
                needed_slots,
                total_slots,
            } => {
                write!(
                    f,
                    "too large: need {needed_slots} slots, cache holds {total_slots}"
                )
            }
            AllocError::UnknownSeq(s) => write!(f, "unknown sequence {s}"),
            AllocError::DuplicateSeq(s) => write!(f, "sequence {s} already exists"),
            AllocError::InvalidOp { seq, reason } => write!(f, "sequence {seq}: {reason}"),
        }
    }
}

impl std::error::Error for AllocError {}

/// Why a sequence lets go of its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseReason {
    Finish,
    Cancel,
    Preempt,
}

/// What the engine asks for when a sequence (re)starts.
#[derive(Debug, Clone, Copy)]
pub struct StartRequest<'a> {
    pub seq: SeqId,
    /// Token ids whose K/V the sequence will hold after prefill (the prompt; on a recompute
    /// restart, the prompt followed by the tokens generated before preemption).
    pub tokens: &'a [u32],
    /// Prefix-reuse scope; `None` disables prefix lookups for this sequence.
    pub scope: Option<&'a ScopeKey>,
    /// Tokens this sequence may reach in total (prompt + max new tokens, capped at max_seq_len).
    /// The contiguous baseline reserves from this; the paged manager ignores it.
    pub reserve_tokens: u32,
}

/// The answer to "could this start now?" — no side effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Probe {
    /// Prompt tokens that a prefix-cache hit would supply.
    pub cached_tokens: u32,
    /// Slots that starting would newly take from the free (or evictable) pool.
    pub new_slots: u64,
    /// Whether `start` would succeed right now.
    pub fits: bool,
    /// Of `cached_tokens`, those found in a lower tier: they need fresh device blocks (counted
    /// in `new_slots`) and an onload, but no compute.
    pub onload_tokens: u32,
}

/// One reused block, reported so a trace can audit every sharing decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixHit {
    pub block: u32,
    pub tokens: u32,
    pub scope: ScopeKey,
    /// The sequence that first published this block.
    pub publisher: SeqId,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Started {
    /// Leading tokens already in cache (prefill starts after them). For paged caches at most
    /// `tokens.len() - 1`: the last token is always recomputed to produce logits.
    pub cached_tokens: u32,
    pub hits: Vec<PrefixHit>,
    /// Of `cached_tokens`, those onloaded from a lower tier (the rest were on the device).
    pub tier_hits: TierHits,
}

/// A recurrent state saved after the first `tokens` tokens of a sequence, held by the manager
/// as pages of its pool and named by the first of them: what a backend that holds state beside
/// the KV pages keys its copy by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateCheckpoint {
    pub tokens: u64,
    pub page: u32,
}

/// What a step does with a sequence's recurrent-state checkpoints. `resume`: the checkpoint a
/// prefix hit resumes from: a step starting the sequence at `resume.tokens` restores the state
/// from it instead of from zeros. `save`: where the step must save the state once it has
/// computed each one's `tokens` positions (the manager publishes them after that step began).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateCheckpoints {
    pub resume: Option<StateCheckpoint>,
    pub save: Vec<StateCheckpoint>,
}

/// Slot accounting at one moment, in token slots. For a paged cache a whole block counts as
/// allocated once mapped; `live` counts only written token slots. A grouped manager's slot is a
/// page's share (see [`grouped`]); the run states the bytes one slot stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Accounting {
    pub total_slots: u64,
    /// Slots holding a token some live sequence can read.
    pub live_slots: u64,
    /// Slots reserved or mapped by live sequences but not (yet) holding a token: tail waste,
    /// over-reservation.
    pub allocated_unfilled_slots: u64,
    /// Slots of released prefix blocks kept for reuse; evictable on demand.
    pub cached_free_slots: u64,
    /// Slots released while a step that may touch them is in flight.
    pub pending_free_slots: u64,
    /// Slots that can be handed out right now without eviction.
    pub free_slots: u64,
}

impl Accounting {
    /// Every slot is in exactly one bucket.
    pub fn is_conserved(&self) -> bool {
        self.live_slots
            + self.allocated_unfilled_slots
            + self.cached_free_slots
            + self.pending_free_slots
            + self.free_slots
            == self.total_slots
    }
}

/// The token ids a manager keyed a sequence's blocks by ([`KvCacheManager::keyed_tokens`]), lent
/// in the two pieces a manager may keep them in (a prompt, then the tokens it was told), so the
/// engine's check of every running sequence copies nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyedTokens<'a> {
    pub head: &'a [u32],
    pub tail: &'a [u32],
}

impl<'a> KeyedTokens<'a> {
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn iter(&self) -> impl Iterator<Item = &'a u32> + 'a {
        self.head.iter().chain(self.tail)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PrefixStats {
    pub lookups: u64,
    pub lookup_tokens: u64,
    pub hit_tokens: u64,
    pub hit_blocks: u64,
    pub evictions: u64,
    /// A recurrent model's state checkpoints (the hybrid paged manager's; 0 everywhere else, and
    /// left out when serialized): tokens between two, checkpoints saved, prefix hits that
    /// resumed from one, and the pool bytes checkpoints held at most and on average, sampled as
    /// each step began.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoint_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoints_saved: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoint_resumes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoint_bytes_peak: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoint_bytes_mean: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Deliberate bugs that prove the checks can fail (`kvbench run --inject-fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Write into a shared block without copying it first.
    SkipCow,
    /// Release blocks at once instead of waiting for the in-flight step's fence.
    EarlyReuse,
    /// Never release one sequence's blocks.
    Leak,
    /// Map one logical block to a wrong physical block in the layout handed to the backend.
    BadBlockTable,
    /// Hand out a lower-tier slot again while an onload that reads it may not have run yet, so
    /// the onload copies whatever was written there since (needs a host tier).
    StaleOnload,
    /// Resume a prefix hit from the recurrent-state checkpoint one interval (a block, at one
    /// block an interval) before the hit's, so the recurrent layers miss those tokens (needs
    /// the hybrid paged manager with checkpoints and a hit past two of them).
    CheckpointOffByOne,
}

impl Fault {
    pub const ALL: [Fault; 4] = [
        Fault::SkipCow,
        Fault::EarlyReuse,
        Fault::Leak,
        Fault::BadBlockTable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::SkipCow => "skip-cow",
            Fault::EarlyReuse => "early-reuse",
            Fault::Leak => "leak",
            Fault::BadBlockTable => "bad-block-table",
            Fault::StaleOnload => "stale-onload",
            Fault::CheckpointOffByOne => "checkpoint-off-by-one",
        }
    }

    pub fn parse(s: &str) -> Option<Fault> {
        Fault::ALL
            .into_iter()
            .chain([Fault::StaleOnload, Fault::CheckpointOffByOne])
            .find(|f| f.name() == s)
    }

    /// What the fault needs in order to fire: why a run where it never fired proved nothing.
    pub fn precondition(self) -> &'static str {
        match self {
            Fault::SkipCow => "no write into a shared partially filled block",
            Fault::EarlyReuse => "no block was released while a step was in flight",
            Fault::Leak => "no sequence released its blocks",
            Fault::BadBlockTable => "no block table was handed to the backend",
            Fault::StaleOnload => {
                "no lower-tier slot was reused while an onload from it was pending"
            }
            Fault::CheckpointOffByOne => {
                "no prefix hit resumed past two recurrent-state checkpoints"
            }
        }
    }
}

/// A KV cache manager: the paged one or the contiguous baseline.
///
/// Call order for one sequence: `start` → (`fill` per prefill chunk) → `append` per decoded token
/// (→ `fork` for continuations) → `release`. Steps: `begin_step` when a step is submitted to the
/// device, `retire_step` when it has completed; releases are deferred past in-flight steps.
/// A failed call (`Err`) changes nothing.
pub trait KvCacheManager: Send {
    fn mode(&self) -> CacheMode;
    /// Tokens per block (paged) or 1 (contiguous).
    fn block_size(&self) -> u32;

    /// Could `req` start now? No side effects.
    fn probe_start(&self, req: &StartRequest<'_>) -> Probe;
    /// Map cached prefix blocks and allocate slots for all of `req.tokens` (contiguous: reserve
    /// `req.reserve_tokens`). The tokens count as allocated-unfilled until `fill`.
    fn start(&mut self, req: &StartRequest<'_>) -> Result<Started, AllocError>;
    /// `n_tokens` more of the started tokens have been written (a prefill chunk was scheduled).
    /// Full prompt blocks become publishable in the prefix cache.
    fn fill(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError>;
    /// All `n_tokens` started tokens of a just-started `seq` are back at once, copied in by a
    /// swap-in rather than computed: the step after it reads only what each table keeps of
    /// them (a sliding table its window). A manager whose fill reads a chunk's window before
    /// the chunk (the grouped baseline's rings, sized for one step's writes) restores without
    /// that bound; by default a restore is a fill.
    fn restore(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        self.fill(seq, n_tokens)
    }
    /// Slots a swap of `seq` at `tokens` tokens moves between device and host (its bytes are
    /// these times the run's slot bytes): by default one a token, every layer's bytes summed.
    /// A grouped manager counts what its tables keep of them
    /// ([`grouped::swap_pages`]) and the recurrent state.
    fn swap_slots(&self, _seq: SeqId, tokens: u32) -> u64 {
        u64::from(tokens)
    }
    /// Grow by one decoded token. Returns the copies (copy-on-write) to perform before writing.
    fn append(&mut self, seq: SeqId) -> Result<Vec<CopyOp>, AllocError>;
    /// `append` where the new position holds `token`. A manager with a prefix cache publishes
    /// the block this token completes, so a later prompt that continues the sequence — the next
    /// turn of a conversation, whose prompt is this one's prompt and output — hits it instead of
    /// prefilling the output again (vLLM's automatic prefix caching keeps generated blocks too).
    fn append_token(&mut self, seq: SeqId, token: u32) -> Result<Vec<CopyOp>, AllocError> {
        let _ = token;
        self.append(seq)
    }
    /// The token ids `seq`'s prefix-cache keys are built from, in position order (prompt, then
    /// the generated tokens it was told), where this manager keys blocks by content; `None`
    /// where it keys nothing for `seq`. The engine checks it against the tokens the sequence
    /// really holds: a key built on a wrong token names a block another prompt will hit, and
    /// that read is wrong long before any check of the data could see it.
    fn keyed_tokens(&self, seq: SeqId) -> Option<KeyedTokens<'_>> {
        let _ = seq;
        None
    }
    /// Slots that one more `append` on `seq` would take from the pool: paged, 0 or `block_size`
    /// (a new block, or a copy-on-write of a shared partial block); contiguous, 0 inside the
    /// reservation and 1 past it (where `append` fails with `NoSpace`: the reservation is the cap).
    fn append_cost(&self, seq: SeqId) -> u64;
    /// Slots one unshared sequence holds at most when it reaches `tokens` tokens, having started
    /// with a reservation of `reserve_tokens` (what the engine compares with `total_slots` to
    /// reject a request that could never fit). Paged: whole blocks of `tokens`; contiguous: the
    /// reservation. Grouped managers count every table and the recurrent state.
    fn sequence_slots(&self, tokens: u64, reserve_tokens: u32) -> u64 {
        match self.mode() {
            CacheMode::Contiguous => u64::from(reserve_tokens),
            CacheMode::Paged => {
                let bs = u64::from(self.block_size().max(1));
                tokens.div_ceil(bs).saturating_mul(bs)
            }
        }
    }
    /// A new sequence `child` that starts as a copy of `parent` (shares blocks when paged). The
    /// parent's prompt must be filled (`InvalidOp` otherwise).
    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<Vec<CopyOp>, AllocError>;
    /// Let go of everything `seq` holds; slots return to the pool once in-flight steps retire.
    fn release(&mut self, seq: SeqId, why: ReleaseReason) -> Result<(), AllocError>;

    /// A step was submitted to the device; it may read or write any block mapped now.
    fn begin_step(&mut self) -> StepId;
    /// A step completed; releases fenced on it (and on nothing newer) become allocatable once
    /// every older step has retired too (steps may retire out of order; see [`fence`]).
    /// Retiring a step that is not in flight is a protocol error that `check_invariants` reports.
    fn retire_step(&mut self, step: StepId);

    fn layout(&self, seq: SeqId) -> Option<SeqLayout<'_>>;
    /// The recurrent-state checkpoints `seq`'s next step touches (see [`StateCheckpoints`]);
    /// none from a manager that keeps no state.
    fn state_checkpoints(&self, seq: SeqId) -> StateCheckpoints {
        let _ = seq;
        StateCheckpoints::default()
    }
    /// Tokens currently held (written) for `seq`.
    fn seq_tokens(&self, seq: SeqId) -> Option<u32>;
    fn accounting(&self) -> Accounting;
    fn prefix_stats(&self) -> PrefixStats;
    /// Largest run of contiguous free slots (external fragmentation; paged: free slots).
    fn largest_free_extent(&self) -> u64;
    /// Drop every cached-free prefix block back to the free pool (and empty every lower tier).
    fn flush_prefix_cache(&mut self);

    /// Move the tier transfers decided since the last call into `out`, in the order a backend
    /// must perform them (see [`tier`]). The engine drains after planning a step and before
    /// submitting it; the ops belong to that step. Managers without tiers have none.
    fn drain_tier_ops(&mut self, out: &mut Vec<TierOp>) {
        let _ = out;
    }
    /// Counters of each lower tier, host first; empty without tiers.
    fn tier_stats(&self) -> Vec<TierStats> {
        Vec::new()
    }

    /// Structural invariants (conservation, ref counts, no block both free and mapped...).
    fn check_invariants(&self) -> Result<(), String>;
    /// After a run: no live sequences, nothing pending, every slot free or cached-free.
    fn assert_quiescent(&self) -> Result<(), String>;
    /// Arm a planted bug.
    fn inject_fault(&mut self, fault: Fault);
    /// Times the armed fault took effect (a copy skipped, a fence ignored, a release dropped, a
    /// corrupted layout handed out). A planted fault that never fired proves nothing, so a run
    /// reports it as a failed check. Managers without planted faults report 0.
    fn fault_fired(&self) -> u64 {
        0
    }
}
