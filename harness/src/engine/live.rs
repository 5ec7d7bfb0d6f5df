//! Live runs: the same loop fed by a [`LiveSource`] while it runs (a server's requests, its
//! clients' cancellations, its shutdown) instead of a whole [`Workload`] given up front.
//!
//! Time is the wall clock: before each turn the clock moves to the time since the run began
//! (never back), a request arrives at the turn that takes it in, and the steps are placed as on
//! a batch run (a backend that measures its steps makes them take their wall time). An idle
//! engine blocks on its source instead of jumping to the next event: a live run has no future
//! arrivals to jump to. Everything else — admission, policy, preemption, the fenced releases,
//! the end-of-run reclamation and invariant checks — is the batch loop's, unchanged.
//!
//! Request indices are dense in the order the source hands requests over: the source numbers
//! them itself (the n-th request it hands over is index n) to name one in [`LiveInput::Cancel`].
//! The grown request list comes back with the run's end, so the results folder states the
//! requests that ran, as a batch run's does.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use kvbench_cache_api::{KvCacheManager, PrefixStats};

use super::clock::VirtualClock;
use super::core::Engine;
use super::sink::RunSink;
use super::{EngineConfig, EngineError, RunEnd};
use crate::backend::Backend;
use crate::workload::{Request, Workload};

/// What a live source hands the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveInput {
    /// A new request (its `cancel` is ignored: a live client cancels by going away).
    Request(Request),
    /// The client of request index `r` went away.
    Cancel(u32),
    /// No request follows. `cancel`: cancel every unresolved request now; else let them finish
    /// (a later `Shutdown { cancel: true }` still cancels what is left).
    Shutdown { cancel: bool },
}

/// The engine's state after a turn, for a server's gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LiveStats {
    /// Streams holding cache (running or mid-prefill).
    pub running: u64,
    /// Streams waiting to start (new, or preempted for recompute).
    pub waiting: u64,
    /// Slots held by live sequences (filled or reserved), and the pool's slots.
    pub used_slots: u64,
    pub total_slots: u64,
    /// The cache manager's prefix-cache counters (tokens looked up and hit, every admission).
    pub prefix: PrefixStats,
}

pub trait LiveSource {
    /// What arrived since the last call. `wait: None` returns at once; `Some(d)`: the engine is
    /// idle, so block until something arrives (at most `d`; `Duration::MAX` for no limit).
    fn poll(&mut self, wait: Option<Duration>) -> Vec<LiveInput>;
    /// The engine's state after a turn.
    fn observe(&mut self, _stats: &LiveStats) {}
}

/// Run requests from `source` until it shuts down and every request resolved, then run the
/// reclamation and invariant checks. Returns the run's outcome and the requests that ran.
pub fn run_live(
    cfg: &EngineConfig,
    cache: &mut dyn KvCacheManager,
    backend: &mut dyn Backend,
    source: &mut dyn LiveSource,
    sink: &mut dyn RunSink,
) -> Result<(RunEnd, Workload), EngineError> {
    let workload = Workload {
        requests: Vec::new(),
        closed_loop: None,
        workload_hash: String::new(),
        trace: None,
    };
    let (mut e, device_start) = Engine::start(
        cfg,
        Cow::Owned(workload),
        cache,
        backend,
        sink,
        VirtualClock::new(0),
        0,
        1,
    );
    e.live_loop(source, Instant::now())?;
    let end = e.finish(device_start);
    let mut workload = e.workload.into_owned();
    workload.workload_hash = crate::workload::workload_hash(&workload.requests, None);
    Ok((end, workload))
}

/// Nanoseconds since `t0`, saturating.
fn wall_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Engine<'_> {
    fn live_loop(&mut self, src: &mut dyn LiveSource, t0: Instant) -> Result<(), EngineError> {
        let depth = if self.cfg.scheduler.async_steps { 2 } else { 1 };
        let mut stopping = false;
        let mut cancel_all = false;
        let mut inputs = Vec::new();
        loop {
            self.clock.advance_to(wall_ns(t0));
            inputs.extend(src.poll(None));
            let t1 = Instant::now();
            self.take_live(&mut inputs, &mut stopping, &mut cancel_all);
            self.ingest();
            self.rec.host(t1);
            src.observe(&self.live_stats());
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
            if self.streams.unresolved() > 0 {
                // Every arrival is due at once and a live request has no timer: nothing in
                // flight and nothing to plan with requests open is a stall, reported not hung.
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
            // Idle: the gauges read as they stand while it waits, or as the run ends (streams
            // let go since the turn's first look).
            self.streams.tidy_running();
            src.observe(&self.live_stats());
            if stopping {
                break;
            }
            inputs.extend(src.poll(Some(Duration::MAX)));
        }
        while self.steps.in_flight() > 0 {
            self.complete_step()?;
        }
        Ok(())
    }

    /// Take in the source's inputs: requests join the list and arrive now, cancellations and
    /// shutdowns take effect.
    fn take_live(
        &mut self,
        inputs: &mut Vec<LiveInput>,
        stopping: &mut bool,
        cancel_all: &mut bool,
    ) {
        for input in inputs.drain(..) {
            match input {
                LiveInput::Request(mut req) => {
                    let r = self.workload.requests.len() as u32;
                    req.cancel = None;
                    req.session = None;
                    req.arrival_ms = self.clock.now_ns() as f64 / 1e6;
                    self.workload.to_mut().requests.push(req);
                    self.streams.add_request();
                    self.clock.schedule_arrival(self.clock.now_ns(), r);
                    if *cancel_all {
                        self.ingest();
                        self.cancel_request(r);
                    }
                }
                LiveInput::Cancel(r) => {
                    if (r as usize) < self.workload.requests.len() {
                        self.ingest();
                        self.cancel_request(r);
                    }
                }
                LiveInput::Shutdown { cancel } => {
                    *stopping = true;
                    if cancel && !*cancel_all {
                        *cancel_all = true;
                        self.ingest();
                        for r in 0..self.workload.requests.len() as u32 {
                            self.cancel_request(r);
                        }
                    }
                }
            }
        }
    }

    fn live_stats(&self) -> LiveStats {
        let a = self.cache.accounting();
        LiveStats {
            running: self.streams.running().len() as u64,
            waiting: self.streams.waiting_streams() as u64,
            used_slots: a.live_slots + a.allocated_unfilled_slots,
            total_slots: a.total_slots,
            prefix: self.cache.prefix_stats(),
        }
    }
}
