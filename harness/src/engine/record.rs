//! What one run of the engine leaves behind: raw, per-stream facts and per-step samples. Metrics
//! and reports are pure functions over this; nothing here is aggregated. A run hands these to a
//! [`super::sink::RunSink`] as they happen; [`RunRecord`] is what the collecting sink keeps.

use kvbench_cache_api::{Accounting, CacheMode, PrefixStats, Tier, TierHits, TierOp, TierStats};

use crate::backend::{MemoryParts, NumericsReport};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamStatus {
    Completed,
    Cancelled,
    Rejected,
}

impl StreamStatus {
    pub fn name(self) -> &'static str {
        match self {
            StreamStatus::Completed => "completed",
            StreamStatus::Cancelled => "cancelled",
            StreamStatus::Rejected => "rejected",
        }
    }
}

/// One output stream: a request, or one continuation of a parallel-sampling request (rank > 0).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRecord {
    pub request: u64,
    /// 0 for the request itself; k for its k-th forked continuation.
    pub rank: u32,
    pub tenant: u32,
    /// When the workload meant the request to arrive (open loop) or the client issued it (closed).
    pub intended_arrival_ns: u64,
    /// When the engine took it in. Equal to intended on a virtual clock; both are logged so that
    /// open-loop load is verifiable (no coordinated omission).
    pub arrival_ns: u64,
    pub admitted_ns: Option<u64>,
    pub finish_ns: u64,
    pub prompt_tokens: u32,
    /// Prompt tokens supplied by the prefix cache at first admission.
    pub cached_prompt_tokens: u32,
    pub status: StreamStatus,
    pub preemptions: u32,
    /// Tokens prefilled again after preemptions (prefix-cache hits excluded).
    pub recomputed_tokens: u64,
    pub swapped_bytes: u64,
    /// Of `cached_prompt_tokens`, those found in the host and the disk tier at first admission
    /// (the rest were on the device). A continuation inherits its parent's.
    pub admission_tier_hits: TierHits,
    /// K/V bytes onloaded from lower tiers for this stream, every admission counted (a restart
    /// after preemption may onload again); counted when the onload is handed to a step.
    pub onload_bytes: u64,
    /// This stream's share of its steps' onload waits (see `engine::onload`), in ns.
    pub onload_wait_ns: u64,
    /// The part of `onload_wait_ns` credited before the first token was stamped (a
    /// continuation inherits its parent's: they share the step that emits the first token).
    pub ttft_onload_ns: u64,
    /// Emission time of every output token, in order.
    pub token_ns: Vec<u64>,
    /// Token ids, kept only on compute backends (paged vs contiguous comparison).
    pub token_ids: Vec<u32>,
}

impl StreamRecord {
    pub fn first_token_ns(&self) -> Option<u64> {
        self.token_ns.first().copied()
    }

    pub fn request_label(&self) -> String {
        if self.rank == 0 {
            self.request.to_string()
        } else {
            format!("{}.{}", self.request, self.rank)
        }
    }
}

/// The cache and backend state sampled after every step's completion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    pub step: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub batch_seqs: u32,
    pub batch_tokens: u32,
    /// Streams holding KV cache when the step was planned.
    pub running: u32,
    pub accounting: Accounting,
    /// Blocks held by the host and the disk tier after the step (0 without tiers).
    pub tier_used_blocks: [u64; 2],
}

#[derive(Debug, Clone, PartialEq)]
pub enum TraceKind {
    Arrive,
    Admit,
    PrefillChunk {
        tokens: u32,
        context: u32,
    },
    Preempt {
        swap: bool,
    },
    Resume,
    SwapOut {
        bytes: u64,
        tokens: u32,
    },
    SwapIn {
        bytes: u64,
        tokens: u32,
    },
    PrefixHit {
        tokens: u32,
        blocks: u32,
        scope: String,
        publishers: Vec<u64>,
    },
    /// `during`: where the stream was — queued, prefill, decode, preempted (waiting to
    /// recompute), swapped, or pending (a continuation not forked yet).
    Cancel {
        during: &'static str,
    },
    Finish,
    Reject {
        reason: String,
    },
    /// A device block's content written to a lower tier, or a host slot's passed to disk
    /// (`step`: the step it was handed to). Belongs to no stream.
    Offload {
        step: u64,
        op: TierOp,
    },
    /// A lower-tier block read into a fresh device block for the event's stream.
    Onload {
        step: u64,
        op: TierOp,
    },
    /// The completed step `step`, which carried onloads, waited `wait_ns` of its duration for
    /// them (shared among their streams by `engine::onload::split_wait_ns`). Belongs to no
    /// stream.
    OnloadWait {
        step: u64,
        wait_ns: u64,
    },
}

impl TraceKind {
    pub fn name(&self) -> &'static str {
        match self {
            TraceKind::Arrive => "arrive",
            TraceKind::Admit => "admit",
            TraceKind::PrefillChunk { .. } => "prefill_chunk",
            TraceKind::Preempt { .. } => "preempt",
            TraceKind::Resume => "resume",
            TraceKind::SwapOut { .. } => "swap_out",
            TraceKind::SwapIn { .. } => "swap_in",
            TraceKind::PrefixHit { .. } => "prefix_hit",
            TraceKind::Cancel { .. } => "cancel",
            TraceKind::Finish => "finish",
            TraceKind::Reject { .. } => "reject",
            TraceKind::Offload { .. } => "offload",
            TraceKind::Onload { .. } => "onload",
            TraceKind::OnloadWait { .. } => "onload_wait",
        }
    }

    /// A lower-tier event: written before an instant's stream lines, in the order it happened
    /// (a step's tier ops in the order they execute).
    pub fn is_tier(&self) -> bool {
        matches!(
            self,
            TraceKind::Offload { .. } | TraceKind::Onload { .. } | TraceKind::OnloadWait { .. }
        )
    }
}

/// A lifecycle event (token events are derived from `StreamRecord::token_ns`).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEvent {
    pub t_ns: u64,
    /// Index into `RunRecord::streams`.
    pub stream: u32,
    /// The stream's request and rank, so that a writer fed as the run goes needs no look-up.
    pub request: u64,
    pub rank: u32,
    pub kind: TraceKind,
}

impl TraceEvent {
    /// `stream` of an event that belongs to no stream (an offload, a step's onload wait);
    /// its `request` is `u64::MAX` and is written as `null`.
    pub const NO_STREAM: u32 = u32::MAX;
}

/// One output token as it is stamped (what a streaming trace writer sees instead of
/// `StreamRecord::token_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenEvent {
    pub t_ns: u64,
    pub stream: u32,
    pub request: u64,
    pub rank: u32,
    /// The token's ordinal in its stream (0: the first token).
    pub index: u32,
    /// The token's id (what a live run streams to its client).
    pub token: u32,
}

/// The verdict of the after-run checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Reclamation {
    pub ok: bool,
    pub leaked_slots: u64,
    pub detail: String,
}

/// What a run knows when it starts, handed to its sink before the first event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunStart {
    pub mode: CacheMode,
    pub block_size: u32,
    pub total_slots: u64,
    /// Bytes one slot stands for: what turns the run's slot counts into bytes.
    pub slot_bytes: u64,
    /// The backend's memory parts (constant over a run on every backend so far).
    pub memory: MemoryParts,
    /// The backend computes real tokens (token ids are comparable across cache modes).
    pub computes: bool,
    /// Capacity of the host and the disk tier in blocks (0: no such tier).
    pub tier_capacity_blocks: [u64; 2],
}

/// Everything a run returns besides what it handed its sink: the scalar outcome. A streaming
/// run keeps only this; [`RunRecord`] is the collected streams, events and steps plus this.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEnd {
    pub mode: CacheMode,
    pub block_size: u32,
    pub total_slots: u64,
    /// Bytes one slot stands for (as in [`RunStart`]).
    pub slot_bytes: u64,
    pub prefix: PrefixStats,
    pub memory: MemoryParts,
    /// Block tables and per-sequence metadata at peak (the ledger's "other").
    pub metadata_peak_bytes: u64,
    pub peak_running: u32,
    /// First invariant violation or unexpected cache error, which stopped the run.
    pub violation: Option<String>,
    pub reclamation: Reclamation,
    /// The device's free memory reconciled with kvbench's allocations at the run's end, term by
    /// term, where the backend has a device.
    pub device: Option<crate::backend::cuda::ledger::DeviceLedger>,
    pub numerics: Option<NumericsReport>,
    /// The backend computed real tokens (token ids are comparable across cache modes).
    pub computes: bool,
    /// Virtual time at the end of the last step.
    pub end_ns: u64,
    /// Wall-clock seconds spent in scheduling + admission + cache calls (not in the backend).
    pub host_overhead_s: f64,
    /// Σ over steps of sequences in the step (for per-sequence-step overhead figures).
    pub seq_steps: u64,
    /// Steps completed and streams handed to the sink.
    pub steps: u64,
    pub streams: u64,
    /// Most stream states held at once (the stream table's high-water mark).
    pub peak_live_streams: u64,
    /// Each lower tier's counters at the end, host first (empty without tiers).
    pub tiers: Vec<TierStats>,
}

impl RunEnd {
    /// Capacity of the host and the disk tier in blocks, from `tiers`.
    pub fn tier_capacity_blocks(&self) -> [u64; 2] {
        tier_capacity_blocks(&self.tiers)
    }
}

/// Capacity of the host and the disk tier in blocks (0 where there is none).
pub fn tier_capacity_blocks(tiers: &[TierStats]) -> [u64; 2] {
    let mut out = [0; 2];
    for t in tiers {
        match t.tier {
            Some(Tier::Host) => out[0] = t.capacity_blocks,
            Some(Tier::Disk) => out[1] = t.capacity_blocks,
            _ => {}
        }
    }
    out
}

/// Blocks in use in the host and the disk tier (0 where there is none).
pub fn tier_used_blocks(tiers: &[TierStats]) -> [u64; 2] {
    let mut out = [0; 2];
    for t in tiers {
        match t.tier {
            Some(Tier::Host) => out[0] = t.used_blocks,
            Some(Tier::Disk) => out[1] = t.used_blocks,
            _ => {}
        }
    }
    out
}

impl RunRecord {
    /// What the run told its sink at the start.
    pub fn start(&self) -> RunStart {
        RunStart {
            mode: self.end.mode,
            block_size: self.end.block_size,
            total_slots: self.end.total_slots,
            slot_bytes: self.end.slot_bytes,
            memory: self.end.memory,
            computes: self.end.computes,
            tier_capacity_blocks: self.end.tier_capacity_blocks(),
        }
    }
}

/// A run collected whole: what it handed its sink, in stream order, and its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub streams: Vec<StreamRecord>,
    pub events: Vec<TraceEvent>,
    pub steps: Vec<StepSample>,
    pub end: RunEnd,
}
