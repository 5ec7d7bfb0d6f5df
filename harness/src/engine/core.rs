//! The loop: plan and submit steps (up to two in flight in async mode), complete the oldest,
//! advance the virtual clock, jump to the next arrival or cancellation when idle.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use kvbench_cache_api::{CopyOp, KvCacheManager, PrefixStats, StepId};

use super::admission::AdmissionConfig;
use super::policy::{self, queue::WaitQueue, Policy};
use super::record::{
    Reclamation, RunEnd, RunRecord, RunStart, StepSample, StreamStatus, TraceEvent, TraceKind,
};
use super::sink::{Collect, RunSink};
use super::state::Phase;
use super::table::StreamTable;
use super::timers::CancelTimers;
use super::{EngineConfig, EngineError};
use crate::backend::{Backend, StepPlan};
use crate::workload::Workload;

/// A submitted step awaiting completion.
pub(super) struct InFlight {
    pub index: u64,
    pub cache_step: StepId,
    pub planned_ns: u64,
    /// Streams whose sample this step produces, in plan order.
    pub samplers: Vec<u32>,
    /// Forked continuations whose first token this step produces, with that token.
    pub forks: Vec<(u32, u32)>,
    pub batch_seqs: u32,
    pub batch_tokens: u32,
    pub running: u32,
}

pub(super) struct Engine<'a> {
    pub cfg: &'a EngineConfig,
    pub workload: &'a Workload,
    pub cache: &'a mut dyn KvCacheManager,
    pub backend: &'a mut dyn Backend,
    pub policy: Option<Box<dyn Policy>>,
    pub admission: AdmissionConfig,
    /// Where what happens goes, as it happens.
    pub sink: &'a mut dyn RunSink,
    pub streams: StreamTable,
    /// First stream index of each request (u32::MAX until it arrives).
    pub req_first: Vec<u32>,
    /// Streams of each request not yet done.
    pub req_open: Vec<u32>,
    pub running: Vec<u32>,
    pub running_dirty: bool,
    pub waiting: WaitQueue,
    pub swapped: VecDeque<u32>,
    pub arrivals: BinaryHeap<Reverse<(u64, u32)>>,
    pub timers: CancelTimers,
    pub next_closed_loop: u32,
    pub unresolved: usize,
    pub now_ns: u64,
    pub device_free_ns: u64,
    pub steps_submitted: u64,
    pub in_flight: VecDeque<InFlight>,
    pub plan: StepPlan,
    pub samplers: Vec<u32>,
    pub forks_pending: Vec<u32>,
    pub release_after_submit: Vec<u32>,
    /// Copies a fork asked for, performed at the start of the next step, with the child they
    /// serve (dropped if the child is gone by then: its slots may already be someone else's).
    pub pending_copies: Vec<(u32, CopyOp)>,
    pub token_budget: u32,
    pub seq_budget: u32,
    pub preempted_flag: bool,
    pub decode_reserve: Option<u64>,
    pub admit_counter: u64,
    /// End of the last completed step, and steps completed.
    pub last_step_end_ns: Option<u64>,
    pub steps_done: u64,
    pub violation: Option<String>,
    pub peak_running: u32,
    pub metadata_peak_bytes: u64,
    pub host_s: f64,
    /// Time inside backend lifecycle hooks (register/fork/forget) within the timed regions:
    /// backend work (a compute backend's oracle check runs in `forget`), not host overhead.
    pub backend_hook_s: f64,
    pub seq_steps: u64,
    /// The prompts made for live requests, by request (`lifecycle.rs`): a trace row's recipe
    /// made when it arrives, a later session turn's conversation built when it is issued; each
    /// dropped when its request resolves. Explicit prompts are read from the workload.
    pub prompts: std::collections::BTreeMap<u32, Vec<u32>>,
}

/// Per-sequence metadata the ledger counts under "other" (ids, lengths, state), bytes.
pub const SEQ_METADATA_BYTES: u64 = 64;
/// One block-table entry (an i32 physical block id), bytes.
pub const BLOCK_TABLE_ENTRY_BYTES: u64 = 4;

/// Drive `workload` through `cache` and `backend` to the end, then run the reclamation check;
/// everything the run produced is collected into one [`RunRecord`] (the collect path).
pub fn run(
    cfg: &EngineConfig,
    workload: &Workload,
    cache: &mut dyn KvCacheManager,
    backend: &mut dyn Backend,
) -> Result<RunRecord, EngineError> {
    let mut collect = Collect::default();
    let end = run_with(cfg, workload, cache, backend, &mut collect)?;
    Ok(collect.into_record(end))
}

/// [`run`], handing streams, events and steps to `sink` as they happen instead of keeping them
/// (the streaming path); returns the run's scalar outcome.
pub fn run_with(
    cfg: &EngineConfig,
    workload: &Workload,
    cache: &mut dyn KvCacheManager,
    backend: &mut dyn Backend,
    sink: &mut dyn RunSink,
) -> Result<RunEnd, EngineError> {
    let n = workload.requests.len();
    let tenants = workload
        .requests
        .iter()
        .map(|r| r.tenant + 1)
        .max()
        .unwrap_or(1);
    let mut arrivals = BinaryHeap::new();
    let mut next_closed_loop = 0u32;
    match workload.closed_loop {
        Some(cl) => {
            let first = (cl.clients as usize).min(n) as u32;
            for id in 0..first {
                arrivals.push(Reverse((0, id)));
            }
            next_closed_loop = first;
        }
        None => {
            // A later session turn is issued when its previous turn resolves.
            for r in workload
                .requests
                .iter()
                .filter(|r| r.session.is_none_or(|s| s.turn == 0))
            {
                arrivals.push(Reverse((ms_to_ns(r.arrival_ms), r.id as u32)));
            }
        }
    }
    let device_start = backend.memory().device_used_bytes;
    if let Some(f) = cfg.fault {
        cache.inject_fault(f);
    }
    sink.begin(&RunStart {
        mode: cache.mode(),
        block_size: cfg.block_size,
        total_slots: cache.accounting().total_slots,
        memory: backend.memory(),
        computes: backend.computes(),
    });
    let mut e = Engine {
        cfg,
        workload,
        cache,
        backend,
        policy: Some(policy::create(cfg.scheduler.policy)),
        admission: AdmissionConfig {
            watermark: cfg.scheduler.watermark,
        },
        sink,
        streams: StreamTable::new(),
        req_first: vec![u32::MAX; n],
        req_open: vec![0; n],
        running: Vec::new(),
        running_dirty: false,
        waiting: WaitQueue::new(cfg.scheduler.tenant_fairness, tenants),
        swapped: VecDeque::new(),
        arrivals,
        timers: CancelTimers::new(n),
        next_closed_loop,
        unresolved: n,
        now_ns: 0,
        device_free_ns: 0,
        steps_submitted: 0,
        in_flight: VecDeque::new(),
        plan: StepPlan::default(),
        samplers: Vec::new(),
        forks_pending: Vec::new(),
        release_after_submit: Vec::new(),
        pending_copies: Vec::new(),
        token_budget: 0,
        seq_budget: 0,
        preempted_flag: false,
        decode_reserve: None,
        admit_counter: 0,
        last_step_end_ns: None,
        steps_done: 0,
        violation: None,
        peak_running: 0,
        metadata_peak_bytes: 0,
        host_s: 0.0,
        backend_hook_s: 0.0,
        seq_steps: 0,
        prompts: std::collections::BTreeMap::new(),
    };
    e.main_loop()?;
    Ok(e.finish(device_start))
}

/// Milliseconds to virtual nanoseconds, saturating: negative or NaN is 0, and anything past
/// `u64::MAX` ns (584 years) is `u64::MAX` (Rust's float-to-int cast saturates). Scenario
/// validation refuses non-physical times; this keeps the clock monotone whatever gets through.
pub(super) fn ms_to_ns(ms: f64) -> u64 {
    if ms > 0.0 {
        (ms * 1e6).round() as u64
    } else {
        0
    }
}

/// A step's duration in seconds as virtual nanoseconds; a negative, NaN or infinite duration is
/// a backend error, never silently a free (0 ns) or endless step.
fn step_ns(duration_s: f64, step: u64) -> Result<u64, EngineError> {
    if !(duration_s.is_finite() && duration_s >= 0.0 && duration_s * 1e9 < u64::MAX as f64) {
        return Err(crate::backend::BackendError::Step(format!(
            "step {step} took {duration_s} s: not a finite, representable duration"
        ))
        .into());
    }
    Ok((duration_s * 1e9).round() as u64)
}

impl Engine<'_> {
    fn main_loop(&mut self) -> Result<(), EngineError> {
        let depth = if self.cfg.scheduler.async_steps { 2 } else { 1 };
        loop {
            let t0 = Instant::now();
            self.ingest();
            self.host_s += t0.elapsed().as_secs_f64();
            if self.violation.is_some() {
                break;
            }
            if self.in_flight.len() < depth && self.plan_and_submit()? {
                continue;
            }
            if !self.in_flight.is_empty() {
                self.complete_step()?;
                continue;
            }
            // Nothing in flight and nothing to plan: done, or jump to the next live event. Arrivals
            // belong to unresolved requests only, and dead timers are dropped, so the clock never
            // advances past the last real event.
            if self.unresolved == 0 {
                break;
            }
            let next_arrival = self.arrivals.peek().map(|Reverse((t, _))| *t);
            let next = [next_arrival, self.timers.next_due_ns()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) => self.now_ns = self.now_ns.max(t),
                None => {
                    return Err(EngineError::Stalled {
                        t_ms: self.now_ns as f64 / 1e6,
                        detail: format!(
                            "{} requests unresolved, {} running, {} swapped, nothing schedulable",
                            self.unresolved,
                            self.running.len(),
                            self.swapped.len()
                        ),
                    })
                }
            }
        }
        // A violation stops planning; let in-flight steps finish so fences retire.
        while !self.in_flight.is_empty() {
            self.complete_step()?;
        }
        Ok(())
    }

    /// Take the oldest in-flight step's output: advance the clock, retire its fence, stamp its
    /// tokens, finish streams that reached their limit, sample the ledger.
    fn complete_step(&mut self) -> Result<(), EngineError> {
        let out = self.backend.complete()?;
        let t0 = Instant::now();
        let Some(inf) = self.in_flight.pop_front() else {
            return Err(EngineError::Stalled {
                t_ms: self.now_ns as f64 / 1e6,
                detail: "backend completed a step the engine did not submit".into(),
            });
        };
        if out.sampled.len() != inf.samplers.len() {
            return Err(crate::backend::BackendError::Step(format!(
                "step {} sampled {} sequences, the plan asked for {}",
                inf.index,
                out.sampled.len(),
                inf.samplers.len()
            ))
            .into());
        }
        let duration_ns = step_ns(out.duration_s, inf.index)?;
        let start = self.device_free_ns.max(inf.planned_ns);
        let end = start
            .checked_add(duration_ns)
            .ok_or_else(|| EngineError::Stalled {
                t_ms: start as f64 / 1e6,
                detail: format!(
                    "step {} of {duration_ns} ns overflows the virtual clock",
                    inf.index
                ),
            })?;
        self.device_free_ns = end;
        self.now_ns = self.now_ns.max(end);
        self.cache.retire_step(inf.cache_step);
        for (i, &s) in inf.samplers.iter().enumerate() {
            self.stamp(s, out.sampled[i].token, end);
        }
        for &(child, token) in &inf.forks {
            self.stamp(child, token, end);
        }
        let accounting = self.cache.accounting();
        let mapped_blocks = (accounting.live_slots + accounting.allocated_unfilled_slots)
            .div_ceil(self.cfg.block_size.max(1) as u64);
        let metadata = inf.running as u64 * SEQ_METADATA_BYTES
            + if self.cache.block_size() > 1 {
                mapped_blocks * BLOCK_TABLE_ENTRY_BYTES
            } else {
                0
            };
        self.metadata_peak_bytes = self.metadata_peak_bytes.max(metadata);
        self.sink.step(&StepSample {
            step: inf.index,
            start_ns: start,
            end_ns: end,
            batch_seqs: inf.batch_seqs,
            batch_tokens: inf.batch_tokens,
            running: inf.running,
            accounting,
        });
        self.last_step_end_ns = Some(end);
        self.steps_done += 1;
        self.host_s += t0.elapsed().as_secs_f64();
        Ok(())
    }

    fn finish(self, device_start: Option<u64>) -> RunEnd {
        let Engine {
            cfg,
            cache,
            backend,
            sink,
            mut streams,
            last_step_end_ns,
            steps_done,
            violation,
            now_ns,
            metadata_peak_bytes,
            peak_running,
            host_s,
            backend_hook_s,
            seq_steps,
            ..
        } = self;
        let end_ns = last_step_end_ns.unwrap_or(now_ns).max(now_ns);
        let mut violation = violation;
        if violation.is_none() {
            if let Err(msg) = cache.check_invariants() {
                violation = Some(format!("after the run: {msg}"));
            }
        }
        let acc = cache.accounting();
        let leaked_slots = acc.live_slots + acc.allocated_unfilled_slots + acc.pending_free_slots;
        let mut details = Vec::new();
        if let Err(msg) = cache.assert_quiescent() {
            details.push(msg);
        }
        let device_end = backend.memory().device_used_bytes;
        if let (Some(a), Some(b)) = (device_start, device_end) {
            if a != b {
                details.push(format!(
                    "device memory in use {b} bytes after the run, {a} before"
                ));
            }
        }
        if details.is_empty() && leaked_slots > 0 {
            details.push(format!("{leaked_slots} slots still held"));
        }
        let reclamation = Reclamation {
            ok: details.is_empty(),
            leaked_slots,
            detail: if details.is_empty() {
                "ok".into()
            } else {
                details.join("; ")
            },
        };
        // Streams a violation left unresolved are reported as cancelled at the end, and every
        // stream still held goes to the sink, in stream order.
        for id in streams.live_ids() {
            let st = &mut streams[id as usize];
            if st.phase != Phase::Done && st.phase != Phase::Pending {
                st.record.status = StreamStatus::Cancelled;
                st.record.finish_ns = end_ns;
            }
            if let Some(rec) = streams.release(id) {
                sink.stream_done(id, &rec);
            }
        }
        let prefix: PrefixStats = cache.prefix_stats();
        RunEnd {
            mode: cache.mode(),
            block_size: cfg.block_size,
            total_slots: acc.total_slots,
            prefix,
            memory: backend.memory(),
            metadata_peak_bytes,
            peak_running,
            violation,
            reclamation,
            numerics: backend.numerics(),
            computes: backend.computes(),
            end_ns,
            host_overhead_s: (host_s - backend_hook_s).max(0.0),
            seq_steps,
            steps: steps_done,
            streams: streams.len() as u64,
            peak_live_streams: streams.peak_live() as u64,
        }
    }

    pub(super) fn trace(&mut self, stream: u32, kind: TraceKind) {
        let rec = &self.streams[stream as usize].record;
        let (request, rank) = (rec.request, rec.rank);
        self.sink.event(&TraceEvent {
            t_ns: self.now_ns,
            stream,
            request,
            rank,
            kind,
        });
    }
}
