//! One operation model for the cache managers, shared by the property tests, byte-driven
//! fuzzing ([`run_bytes`]) and `kvbench fuzz` ([`run_seed`]), with either placement.
//!
//! Operations name sequences by an index modulo the live count (tokio's trick), so every byte
//! string and every seed decodes to a valid operation sequence. After every operation the harness
//! compares the manager with a reference model that stores token ids as the payload of each slot
//! (a missing copy-on-write or an early reuse shows up as a wrong token read back), re-applies each
//! step's writes when the step retires (a late device write into a reused block corrupts its new
//! owner), and checks that no slot fenced behind an in-flight step is handed to new content.
//!
//! [`FuzzConfig::tiered`] puts lower tiers under the paged manager: the model then keeps each
//! tier slot's payload too and performs every drained tier op on it (tier ops before copies, as
//! a step runs them), so an onloaded prefix must read back the prompt's tokens of its scope.

mod harness;
mod verify;

use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use kvbench_cache_api::{CacheMode, Fault};

use super::{EvictionPolicy, Placement};

pub use harness::Harness;

use super::PlantedBug;

/// One operation against a cache manager. Fields are raw choices; the harness maps them onto
/// the current state (a sequence index modulo the live count, a length modulo a bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Start a sequence whose prompt is `shared_len` tokens of prompt family `family` followed by
    /// `tail_len` unique tokens, in scope number `scope` (several tenants, a global scope, another
    /// model, and no reuse).
    Start {
        family: u8,
        shared_len: u8,
        tail_len: u8,
        scope: u8,
    },
    /// Fill up to `n` more prompt tokens of a sequence.
    Fill {
        pick: u8,
        n: u8,
    },
    /// Append one decoded token (id derived from `token`).
    Append {
        pick: u8,
        token: u16,
    },
    Fork {
        pick: u8,
    },
    /// Finish (0), cancel (1) or preempt (2) a sequence.
    Release {
        pick: u8,
        why: u8,
    },
    BeginStep,
    /// Retire one in-flight step (any of them: out-of-order retirement is exercised).
    RetireStep {
        pick: u8,
    },
    Flush,
}

/// What to run the operations against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuzzConfig {
    pub mode: CacheMode,
    pub total_slots: u64,
    pub block_size: u32,
    pub fault: Option<Fault>,
    pub bug: Option<PlantedBug>,
    /// The paged manager's placement policy.
    pub placement: Placement,
    /// The paged prefix cache's eviction policy (`run_seed` and `run_bytes` use `lru`; the
    /// eviction tests drive the others).
    pub eviction: EvictionPolicy,
    /// Lower tiers below the paged cache (none by default). With tiers the model also keeps
    /// each lower-tier slot's payload and performs every drained tier op on it, so an onloaded
    /// block must read back the prompt's tokens of the right scope.
    pub tiers: super::TierConfig,
}

impl FuzzConfig {
    /// A small cache, so evictions, failed allocations and fence waits happen often.
    pub fn small(mode: CacheMode) -> Self {
        FuzzConfig {
            mode,
            total_slots: 48,
            block_size: 4,
            fault: None,
            bug: None,
            placement: Placement::Lifo,
            eviction: EvictionPolicy::Lru,
            tiers: super::TierConfig::default(),
        }
    }

    /// The small paged cache with a host tier of 8 blocks and, if `disk`, a disk tier of 8.
    pub fn tiered(offload: kvbench_cache_api::OffloadMode, disk: bool) -> Self {
        FuzzConfig {
            tiers: super::TierConfig {
                host_blocks: 8,
                disk_blocks: if disk { 8 } else { 0 },
                offload,
                ..super::TierConfig::default()
            },
            ..FuzzConfig::small(CacheMode::Paged)
        }
    }

    /// The small paged cache with address-ordered extents, at block size 1 so its 150 blocks
    /// span three extents (the last one partial) and sequences outgrow an extent.
    pub fn extents() -> Self {
        FuzzConfig {
            total_slots: 150,
            block_size: 1,
            placement: Placement::Extents,
            ..FuzzConfig::small(CacheMode::Paged)
        }
    }

    /// The configurations `run_bytes` and `run_seed` run: the paged cache (both placements) and
    /// the contiguous baseline.
    pub fn all_small() -> [FuzzConfig; 3] {
        [
            FuzzConfig::small(CacheMode::Paged),
            FuzzConfig::extents(),
            FuzzConfig::small(CacheMode::Contiguous),
        ]
    }
}

/// A failed check, with what is needed to replay and read it.
#[derive(Debug, Clone)]
pub struct FuzzFailure {
    pub seed: Option<u64>,
    /// Index of the operation after which the check failed (`None`: the final drain).
    pub op_index: Option<usize>,
    pub message: String,
    /// One line per operation applied, the failing one last.
    pub trace: Vec<String>,
}

impl fmt::Display for FuzzFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op_index {
            Some(i) => writeln!(f, "check failed after op {i}: {}", self.message)?,
            None => writeln!(f, "check failed while draining: {}", self.message)?,
        }
        let skip = self.trace.len().saturating_sub(30);
        for line in &self.trace[skip..] {
            writeln!(f, "  {line}")?;
        }
        if let Some(seed) = self.seed {
            writeln!(f, "replay with KVBENCH_SEED={seed}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FuzzFailure {}

/// Counts of what a run exercised, to show a run was not vacuous.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuzzSummary {
    pub ops: usize,
    pub starts: usize,
    pub failed_allocations: usize,
    pub prefix_hit_blocks: u64,
    pub copies: usize,
    pub evictions: u64,
    pub fenced_releases: usize,
    /// Tier ops performed on the model, and prompt tokens onloaded from a lower tier.
    pub tier_ops: usize,
    pub onloaded_tokens: u64,
}

impl FuzzSummary {
    pub fn add(&mut self, other: &FuzzSummary) {
        self.ops += other.ops;
        self.starts += other.starts;
        self.failed_allocations += other.failed_allocations;
        self.prefix_hit_blocks += other.prefix_hit_blocks;
        self.copies += other.copies;
        self.evictions += other.evictions;
        self.fenced_releases += other.fenced_releases;
        self.tier_ops += other.tier_ops;
        self.onloaded_tokens += other.onloaded_tokens;
    }
}

/// Apply `ops` to a fresh manager, checking after each, then release everything, retire every
/// step and check quiescence.
pub fn run_ops(config: FuzzConfig, ops: &[Op]) -> Result<FuzzSummary, FuzzFailure> {
    run_with(Harness::new(config), ops)
}

/// Like [`run_ops`] but judged by the reference model alone (the manager's own
/// `check_invariants` and `assert_quiescent` are not consulted).
pub fn run_ops_model_only(config: FuzzConfig, ops: &[Op]) -> Result<FuzzSummary, FuzzFailure> {
    run_with(Harness::new(config).model_only(true), ops)
}

fn run_with(mut h: Harness, ops: &[Op]) -> Result<FuzzSummary, FuzzFailure> {
    for (i, op) in ops.iter().enumerate() {
        h.apply(*op);
        h.check().map_err(|message| h.failure(Some(i), message))?;
    }
    h.drain().map_err(|message| h.failure(None, message))?;
    Ok(h.summary())
}

/// Decode bytes into operations (a fuzzer's input) and run them on small paged caches (both
/// placements) and on the contiguous baseline.
pub fn run_bytes(data: &[u8]) -> Result<(), FuzzFailure> {
    let ops = decode(data);
    for cfg in FuzzConfig::all_small() {
        run_ops(cfg, &ops)?;
    }
    Ok(())
}

/// `n_ops` random operations from `seed` (ChaCha8) on small paged caches (both placements) and
/// on the contiguous baseline: same seed, same run. The summary adds up all three.
pub fn run_seed(seed: u64, n_ops: usize) -> Result<FuzzSummary, FuzzFailure> {
    let mut total = FuzzSummary::default();
    for cfg in FuzzConfig::all_small() {
        total.add(&run_seed_with(seed, n_ops, cfg)?);
    }
    Ok(total)
}

/// [`run_seed`] on one chosen configuration (mode, size, planted fault).
pub fn run_seed_with(
    seed: u64,
    n_ops: usize,
    config: FuzzConfig,
) -> Result<FuzzSummary, FuzzFailure> {
    let ops = random_ops(seed, n_ops);
    run_ops(config, &ops).map_err(|mut f| {
        f.seed = Some(seed);
        f
    })
}

/// The operations `run_seed` would apply.
pub fn random_ops(seed: u64, n_ops: usize) -> Vec<Op> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n_ops).map(|_| random_op(&mut rng)).collect()
}

fn random_op(rng: &mut ChaCha8Rng) -> Op {
    let pick = rng.gen();
    match rng.gen_range(0..100u32) {
        0..=17 => Op::Start {
            family: rng.gen_range(0..3),
            shared_len: rng.gen_range(0..24),
            tail_len: rng.gen_range(0..9),
            scope: rng.gen_range(0..5),
        },
        18..=37 => Op::Fill {
            pick,
            n: rng.gen_range(1..12),
        },
        38..=59 => Op::Append {
            pick,
            token: rng.gen(),
        },
        60..=66 => Op::Fork { pick },
        67..=79 => Op::Release {
            pick,
            why: rng.gen_range(0..3),
        },
        80..=88 => Op::BeginStep,
        89..=96 => Op::RetireStep { pick },
        _ => Op::Flush,
    }
}

/// Bytes to operations: one tag byte, then the fields' bytes (missing bytes read as 0).
pub fn decode(data: &[u8]) -> Vec<Op> {
    let mut it = data.iter().copied();
    let mut next = move || it.next();
    let mut ops = Vec::new();
    while let Some(tag) = next() {
        let mut b = || next().unwrap_or(0);
        let op = match tag % 8 {
            0 => Op::Start {
                family: b() % 3,
                shared_len: b() % 24,
                tail_len: b() % 9,
                scope: b() % 5,
            },
            1 => Op::Fill {
                pick: b(),
                n: b() % 12 + 1,
            },
            2 => Op::Append {
                pick: b(),
                token: u16::from_le_bytes([b(), b()]),
            },
            3 => Op::Fork { pick: b() },
            4 => Op::Release {
                pick: b(),
                why: b() % 3,
            },
            5 => Op::BeginStep,
            6 => Op::RetireStep { pick: b() },
            _ => Op::Flush,
        };
        ops.push(op);
    }
    ops
}
