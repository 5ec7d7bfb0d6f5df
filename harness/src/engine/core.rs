//! The loop, as the essay says it: admit what arrived, choose work by policy, submit it (up to
//! two steps in flight in async mode), complete the oldest step — the clock advances, its
//! tokens are stamped, finished streams let go — and retire its fence; when there is nothing to
//! do, jump to the next arrival or cancellation.
//!
//! The engine's state has four owners, each with its own file: [`VirtualClock`] (time,
//! arrivals, cancellation timers), [`Streams`] (every stream's state and queue, with the
//! lifecycle's transitions), [`Steps`] (the step being planned and the steps in flight) and
//! [`Recorder`] (the sink, the run's peaks and totals, the first violation). The engine itself
//! holds only what it drives: the cache manager, the backend and the policy.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Instant;

use kvbench_cache_api::{KvCacheManager, PrefixStats};

use super::admission::AdmissionConfig;
use super::clock::VirtualClock;
use super::policy::{self, queue::WaitQueue, Policy};
use super::record::{
    Reclamation, RunEnd, RunRecord, RunStart, StepSample, StreamStatus, TraceEvent, TraceKind,
};
use super::recorder::Recorder;
use super::sink::{Collect, RunSink};
use super::steps::Steps;
use super::streams::Phase;
use super::streams::Streams;
use super::{EngineConfig, EngineError};
use crate::backend::Backend;
use crate::workload::Workload;

pub(super) struct Engine<'a> {
    pub cfg: &'a EngineConfig,
    /// Borrowed on a batch run; owned and growing on a live one (`live.rs`).
    pub workload: Cow<'a, Workload>,
    pub cache: &'a mut dyn KvCacheManager,
    pub backend: &'a mut dyn Backend,
    pub policy: Option<Box<dyn Policy>>,
    pub admission: AdmissionConfig,
    pub clock: VirtualClock,
    pub streams: Streams,
    pub steps: Steps,
    pub rec: Recorder<'a>,
    /// The next closed-loop request to issue when one resolves.
    pub next_closed_loop: u32,
    /// The prompts made for live requests, by request (`lifecycle.rs`): a trace row's recipe
    /// made at its first start attempt, a later session turn's conversation built when it is
    /// issued; each dropped when its request resolves. Explicit prompts are read from the
    /// workload.
    pub prompts: BTreeMap<u32, Vec<u32>>,
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
    let mut clock = VirtualClock::new(n);
    let mut next_closed_loop = 0u32;
    match workload.closed_loop {
        Some(cl) => {
            let first = (cl.clients as usize).min(n) as u32;
            for id in 0..first {
                clock.schedule_arrival(0, id);
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
                clock.schedule_arrival(ms_to_ns(r.arrival_ms), r.id as u32);
            }
        }
    }
    let (mut e, device_start) = Engine::start(
        cfg,
        Cow::Borrowed(workload),
        cache,
        backend,
        sink,
        clock,
        next_closed_loop,
        tenants,
    );
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

impl<'a> Engine<'a> {
    /// Arm the fault, tell the sink the run began, and build the engine: what a batch and a
    /// live run share. Returns the engine and the device memory kvbench held before the run.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        cfg: &'a EngineConfig,
        workload: Cow<'a, Workload>,
        cache: &'a mut dyn KvCacheManager,
        backend: &'a mut dyn Backend,
        sink: &'a mut dyn RunSink,
        clock: VirtualClock,
        next_closed_loop: u32,
        tenants: u32,
    ) -> (Engine<'a>, Option<(u64, u64)>) {
        let n = workload.requests.len();
        let device_start = backend.owned_device();
        if let Some(f) = cfg.fault {
            cache.inject_fault(f);
        }
        let mut rec = Recorder::new(sink);
        rec.begin(&RunStart {
            mode: cache.mode(),
            block_size: cfg.block_size,
            total_slots: cache.accounting().total_slots,
            slot_bytes: cfg.slot_bytes,
            memory: backend.memory(),
            computes: backend.computes(),
            tier_capacity_blocks: super::record::tier_capacity_blocks(&cache.tier_stats()),
        });
        let e = Engine {
            cfg,
            workload,
            cache,
            backend,
            policy: Some(policy::create(cfg.scheduler.policy)),
            admission: AdmissionConfig {
                watermark: cfg.scheduler.watermark,
            },
            clock,
            streams: Streams::new(n, WaitQueue::new(cfg.scheduler.tenant_fairness, tenants)),
            steps: Steps::new(),
            rec,
            next_closed_loop,
            prompts: BTreeMap::new(),
        };
        (e, device_start)
    }
}

impl Engine<'_> {
    fn main_loop(&mut self) -> Result<(), EngineError> {
        let depth = if self.cfg.scheduler.async_steps { 2 } else { 1 };
        loop {
            let t0 = Instant::now();
            self.ingest();
            self.rec.host(t0);
            if self.rec.failed() {
                break;
            }
            if self.steps.in_flight() < depth && self.plan_and_submit()? {
                continue;
            }
            if self.steps.in_flight() > 0 {
                self.complete_step()?;
                continue;
            }
            // Nothing in flight and nothing to plan: done, or jump to the next live event. Arrivals
            // belong to unresolved requests only, and dead timers are dropped, so the clock never
            // advances past the last real event.
            if self.streams.unresolved() == 0 {
                break;
            }
            if !self.clock.jump_to_next_event() {
                return Err(EngineError::Stalled {
                    t_ms: self.clock.now_ns() as f64 / 1e6,
                    detail: format!(
                        "{} requests unresolved, {} running, {} swapped, nothing schedulable",
                        self.streams.unresolved(),
                        self.streams.running().len(),
                        self.streams.swapped_len()
                    ),
                });
            }
        }
        // A violation stops planning; let in-flight steps finish so fences retire.
        while self.steps.in_flight() > 0 {
            self.complete_step()?;
        }
        Ok(())
    }

    /// Take the oldest in-flight step's output: advance the clock, retire its fence, stamp its
    /// tokens, finish streams that reached their limit, sample the ledger.
    pub(super) fn complete_step(&mut self) -> Result<(), EngineError> {
        let out = self.backend.complete()?;
        let t0 = Instant::now();
        let Some(inf) = self.steps.pop_oldest() else {
            return Err(EngineError::Stalled {
                t_ms: self.clock.now_ns() as f64 / 1e6,
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
        let (start, end) = self
            .clock
            .place_step(inf.planned_ns, duration_ns, inf.index)?;
        self.cache.retire_step(inf.cache_step);
        if !inf.onloads.is_empty() {
            // Before the stamps: the step that emits a first token counts in its TTFT's onload.
            let wait_ns = step_ns(out.onload_wait_s, inf.index)?.min(duration_ns);
            self.credit_onload_wait(inf.index, end, wait_ns, &inf.onloads);
        }
        for (i, &s) in inf.samplers.iter().enumerate() {
            self.stamp(s, out.sampled[i].token, end);
        }
        for &(child, token) in &inf.forks {
            self.inherit_ttft_onload(child);
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
        self.rec.step(
            &StepSample {
                step: inf.index,
                start_ns: start,
                end_ns: end,
                batch_seqs: inf.batch_seqs,
                batch_tokens: inf.batch_tokens,
                running: inf.running,
                accounting,
                tier_used_blocks: super::record::tier_used_blocks(&self.cache.tier_stats()),
            },
            metadata,
        );
        self.rec.host(t0);
        Ok(())
    }

    pub(super) fn finish(&mut self, device_start: Option<(u64, u64)>) -> RunEnd {
        let end_ns = self.clock.end_ns();
        let cache = &mut *self.cache;
        let mut violation = self.rec.take_violation();
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
        // kvbench's own device allocations are exact: any byte held beyond the start fails.
        // The driver's figure is reconciled apart, and fails only on a residue beyond its
        // stated tolerance (driver noise alone never fails a run).
        if let (Some((n0, b0)), Some((n1, b1))) = (device_start, self.backend.owned_device()) {
            if (n0, b0) != (n1, b1) {
                details.push(format!(
                    "kvbench holds {b1} bytes of device memory in {n1} allocations after the run, {b0} bytes in {n0} before"
                ));
            }
        }
        let device = match self.backend.device_ledger() {
            Some(Ok(l)) => {
                if !l.residue_ok {
                    details.push(format!(
                        "device memory residue {} B beyond the tolerance of {} B ({})",
                        l.residue_bytes, l.tolerance_bytes, l.tolerance
                    ));
                }
                Some(l)
            }
            Some(Err(e)) => {
                details.push(format!("device memory not reconciled: {e}"));
                None
            }
            None => None,
        };
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
        for id in self.streams.live_ids() {
            let st = &mut self.streams[id as usize];
            if st.phase() != Phase::Done && st.phase() != Phase::Pending {
                st.record.status = StreamStatus::Cancelled;
                st.record.finish_ns = end_ns;
            }
            if let Some(rec) = self.streams.release(id) {
                self.rec.stream_done(id, &rec);
            }
        }
        let prefix: PrefixStats = cache.prefix_stats();
        let totals = self.rec.totals();
        RunEnd {
            mode: cache.mode(),
            block_size: self.cfg.block_size,
            total_slots: acc.total_slots,
            slot_bytes: self.cfg.slot_bytes,
            prefix,
            memory: self.backend.memory(),
            metadata_peak_bytes: totals.metadata_peak_bytes,
            peak_running: totals.peak_running,
            violation,
            reclamation,
            device,
            numerics: self.backend.numerics(),
            computes: self.backend.computes(),
            end_ns,
            host_overhead_s: totals.host_overhead_s,
            seq_steps: totals.seq_steps,
            steps: totals.steps,
            streams: self.streams.len() as u64,
            peak_live_streams: self.streams.peak_live() as u64,
            tiers: cache.tier_stats(),
        }
    }

    /// Share step `step`'s onload wait among the streams whose onloads it carried
    /// ([`super::onload`]) and trace the wait at the step's end.
    fn credit_onload_wait(&mut self, step: u64, end_ns: u64, wait_ns: u64, onloads: &[(u32, u64)]) {
        self.rec.event(&TraceEvent {
            t_ns: end_ns,
            stream: TraceEvent::NO_STREAM,
            request: u64::MAX,
            rank: 0,
            kind: TraceKind::OnloadWait { step, wait_ns },
        });
        let tokens: Vec<u64> = onloads.iter().map(|&(_, t)| t).collect();
        let shares = super::onload::split_wait_ns(wait_ns, &tokens);
        for (&(s, _), share) in onloads.iter().zip(shares) {
            let st = &mut self.streams[s as usize];
            if st.is_done() {
                continue; // cancelled while the step was in flight: its record went out
            }
            st.record.onload_wait_ns = st.record.onload_wait_ns.saturating_add(share);
            if st.record.token_ns.is_empty() {
                st.record.ttft_onload_ns = st.record.ttft_onload_ns.saturating_add(share);
            }
        }
    }

    /// A continuation's first token comes out of its parent's first-token step: its TTFT's
    /// onload part is its parent's.
    fn inherit_ttft_onload(&mut self, child: u32) {
        let st = &self.streams[child as usize];
        if st.is_done() || !st.record.token_ns.is_empty() {
            return; // cancelled while the step was in flight (perhaps released already)
        }
        let Some(parent) = self.streams.first_of(st.request) else {
            return;
        };
        let wait = self.streams[parent as usize].record.ttft_onload_ns;
        self.streams[child as usize].record.ttft_onload_ns = wait;
    }

    pub(super) fn trace(&mut self, stream: u32, kind: TraceKind) {
        let rec = &self.streams[stream as usize].record;
        let (request, rank) = (rec.request, rec.rank);
        self.rec.event(&TraceEvent {
            t_ns: self.clock.now_ns(),
            stream,
            request,
            rank,
            kind,
        });
    }

    /// Record the first violation (it stops the run).
    pub(super) fn fail(&mut self, msg: String) {
        self.rec.fail(self.steps.index(), msg);
    }
}
