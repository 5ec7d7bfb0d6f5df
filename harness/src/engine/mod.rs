//! The engine: one continuous-batching loop that drives a cache manager and a backend with a
//! request list, on a virtual clock, and records what happened.
//!
//! Each turn: arrivals and due cancellations → the policy builds a step (decodes, prefill chunks,
//! swap-ins, admissions gated by the admission controller, preemptions when a sequence cannot
//! grow) → the backend runs it (copies first) → the clock advances by its duration → tokens are
//! stamped → finishes → releases, which the cache manager defers past in-flight steps.
//!
//! **Architecture invariant:** the engine knows nothing of where tokens live (the cache manager)
//! or how a step is computed (the backend). Admission (memory feasibility) and policy (what to
//! run) are separate pieces. Both cache modes run the same `Workload` through the same loop.
//!
//! A live run (`live.rs`) drives the same loop with requests taken while it runs, on the wall
//! clock.
//!
//! Time is integer nanoseconds of virtual time: arrivals, step durations and every timestamp are
//! exact, so results are byte-identical for one seed and percentiles recompute exactly from the
//! written files.

pub mod admission;
mod clock;
mod core;
mod lifecycle;
pub mod live;
pub mod onload;
pub mod policy;
pub mod record;
mod recorder;
pub mod sink;
mod start;
mod step;
mod steps;
mod streams;
mod table;
mod timers;

pub use core::{run, run_with, BLOCK_TABLE_ENTRY_BYTES, SEQ_METADATA_BYTES};
pub use live::{run_live, LiveInput, LiveSource, LiveStats};
pub use record::{
    tier_capacity_blocks, tier_used_blocks, RunEnd, RunRecord, RunStart, StepSample, StreamRecord,
    StreamStatus, TokenEvent, TraceEvent, TraceKind,
};
pub use sink::RunSink;

use kvbench_cache_api::{CacheMode, Fault};

use crate::scenario::{Reservation, SchedulerSpec};

/// Everything the loop needs besides the workload, the cache manager and the backend.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub mode: CacheMode,
    pub block_size: u32,
    pub kv_bytes_per_token: u64,
    /// Bytes one of the cache manager's slots stands for (`kv_bytes_per_token` unless the
    /// manager accounts in other units, as the grouped ones do): carried into the run's record.
    pub slot_bytes: u64,
    pub max_seq_len: u32,
    pub reservation: Reservation,
    pub scheduler: SchedulerSpec,
    /// Model identity for prefix-cache keys.
    pub model_name: String,
    /// Keep per-token trace events (false: `--trace-level requests`; token times are kept anyway
    /// for the metrics).
    pub trace_tokens: bool,
    /// Run `check_invariants` after every `n`th step (1 = every step, 0 = only at the end).
    pub invariant_check_every: u32,
    /// A planted bug to arm on the cache manager before the first request.
    pub fault: Option<Fault>,
}

/// Tokenizer identity in prefix-cache keys: workloads are synthetic token ids.
pub const TOKENIZER_ID: &str = "kvbench-synthetic-ids";

/// Contiguous reservation for a stream of `prompt + output` tokens.
pub fn reservation_tokens(cfg: &EngineConfig, prompt_tokens: u32, output_tokens: u32) -> u32 {
    match cfg.reservation {
        Reservation::MaxSeqLen => cfg.max_seq_len,
        Reservation::PromptPlusOutput => prompt_tokens
            .saturating_add(output_tokens)
            .min(cfg.max_seq_len),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    /// The loop can make no progress although work remains (an engine bug, reported not hung).
    #[error("engine stalled at t={t_ms} ms: {detail}")]
    Stalled { t_ms: f64, detail: String },
}
