//! The recorder: hands what happens to the run's sink as it happens, and keeps the run's peaks,
//! totals and first violation — every figure [`super::RunEnd`] states that no stream or step
//! record holds.

use std::time::Instant;

use super::record::{RunStart, StepSample, StreamRecord, TokenEvent, TraceEvent};
use super::sink::RunSink;

pub(super) struct Recorder<'a> {
    sink: &'a mut dyn RunSink,
    peak_running: u32,
    metadata_peak_bytes: u64,
    /// Wall seconds in the engine's own work (scheduling, admission, cache calls).
    host_s: f64,
    /// Time inside backend lifecycle hooks (register/fork/forget) within the timed regions:
    /// backend work (a compute backend's oracle check runs in `forget`), not host overhead.
    backend_hook_s: f64,
    seq_steps: u64,
    steps_done: u64,
    violation: Option<String>,
}

/// What the recorder knows at the end of a run.
pub(super) struct Totals {
    pub peak_running: u32,
    pub metadata_peak_bytes: u64,
    pub host_overhead_s: f64,
    pub seq_steps: u64,
    pub steps: u64,
}

impl<'a> Recorder<'a> {
    pub fn new(sink: &'a mut dyn RunSink) -> Recorder<'a> {
        Recorder {
            sink,
            peak_running: 0,
            metadata_peak_bytes: 0,
            host_s: 0.0,
            backend_hook_s: 0.0,
            seq_steps: 0,
            steps_done: 0,
            violation: None,
        }
    }

    pub fn begin(&mut self, start: &RunStart) {
        self.sink.begin(start);
    }

    pub fn event(&mut self, e: &TraceEvent) {
        self.sink.event(e);
    }

    pub fn token(&mut self, t: &TokenEvent) {
        self.sink.token(t);
    }

    pub fn stream_done(&mut self, id: u32, record: &StreamRecord) {
        self.sink.stream_done(id, record);
    }

    /// A step completed; `metadata_bytes` is what the ledger counts as "other" at it.
    pub fn step(&mut self, sample: &StepSample, metadata_bytes: u64) {
        self.metadata_peak_bytes = self.metadata_peak_bytes.max(metadata_bytes);
        self.sink.step(sample);
        self.steps_done += 1;
    }

    /// `n` streams are running after a step was planned.
    pub fn running(&mut self, n: u32) {
        self.peak_running = self.peak_running.max(n);
    }

    /// A step of `seqs` sequences was submitted.
    pub fn submitted(&mut self, seqs: u64) {
        self.seq_steps += seqs;
    }

    /// The engine's own work since `t0`.
    pub fn host(&mut self, t0: Instant) {
        self.host_s += t0.elapsed().as_secs_f64();
    }

    /// Run a backend lifecycle hook, timing it apart from the engine's own work.
    pub fn hook<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let out = f();
        self.backend_hook_s += t0.elapsed().as_secs_f64();
        out
    }

    /// Record the first violation (it stops the run); `step` is the step being planned.
    pub fn fail(&mut self, step: u64, msg: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("step {step}: {msg}"));
        }
    }

    pub fn failed(&self) -> bool {
        self.violation.is_some()
    }

    pub fn take_violation(&mut self) -> Option<String> {
        self.violation.take()
    }

    pub fn totals(&self) -> Totals {
        Totals {
            peak_running: self.peak_running,
            metadata_peak_bytes: self.metadata_peak_bytes,
            host_overhead_s: (self.host_s - self.backend_hook_s).max(0.0),
            seq_steps: self.seq_steps,
            steps: self.steps_done,
        }
    }
}
