//! The run's event sink: the engine hands over what happens as it happens, so whoever listens
//! (metrics accumulators, streaming file writers, the collecting sink behind [`super::run`])
//! holds only what it needs, and resident memory follows the requests in flight.
//!
//! Order of calls, one run: `begin`, then in engine order `event`, `token` and `step` (times
//! never decrease: an event or token carries the virtual time it happened at, a step its end),
//! and `stream_done` once per stream when its *request* resolved (all streams of a request
//! consecutively, rank order), or at the end of the run for streams a violation left open (in
//! stream order). Stream indices are dense from 0 and every one is handed over exactly once.

use super::record::{
    RunEnd, RunRecord, RunStart, StepSample, StreamRecord, TokenEvent, TraceEvent,
};

pub trait RunSink {
    fn begin(&mut self, _start: &RunStart) {}
    fn event(&mut self, _e: &TraceEvent) {}
    fn token(&mut self, _t: &TokenEvent) {}
    fn step(&mut self, _s: &StepSample) {}
    /// Stream `index` is done and its request resolved: its final record (the engine drops its
    /// state right after; a sink that keeps the record clones what it keeps).
    fn stream_done(&mut self, index: u32, record: &StreamRecord);
}

/// Two sinks fed the same calls (the first sees each call first).
pub struct Tee<'a>(pub &'a mut dyn RunSink, pub &'a mut dyn RunSink);

impl RunSink for Tee<'_> {
    fn begin(&mut self, start: &RunStart) {
        self.0.begin(start);
        self.1.begin(start);
    }
    fn event(&mut self, e: &TraceEvent) {
        self.0.event(e);
        self.1.event(e);
    }
    fn token(&mut self, t: &TokenEvent) {
        self.0.token(t);
        self.1.token(t);
    }
    fn step(&mut self, s: &StepSample) {
        self.0.step(s);
        self.1.step(s);
    }
    fn stream_done(&mut self, index: u32, record: &StreamRecord) {
        self.0.stream_done(index, record);
        self.1.stream_done(index, record);
    }
}

/// Keeps everything: the collect-then-compute path (tests, the oracle's paged-vs-contiguous
/// comparison, small runs).
#[derive(Debug, Default)]
pub struct Collect {
    streams: Vec<Option<StreamRecord>>,
    events: Vec<TraceEvent>,
    steps: Vec<StepSample>,
}

impl Collect {
    /// The whole record: streams in stream order.
    pub fn into_record(self, end: RunEnd) -> RunRecord {
        RunRecord {
            streams: self.streams.into_iter().flatten().collect(),
            events: self.events,
            steps: self.steps,
            end,
        }
    }
}

impl RunSink for Collect {
    fn event(&mut self, e: &TraceEvent) {
        self.events.push(e.clone());
    }
    fn step(&mut self, s: &StepSample) {
        self.steps.push(*s);
    }
    fn stream_done(&mut self, index: u32, record: &StreamRecord) {
        let i = index as usize;
        if self.streams.len() <= i {
            self.streams.resize(i + 1, None);
        }
        self.streams[i] = Some(record.clone());
    }
}

/// Feed a collected record to `sink` as the run would have: `begin`, the steps, events and
/// tokens merged in time order (a step at its end, before the events of that instant are
/// irrelevant: writers order within an instant themselves), then every stream in stream order.
/// The collect path writes its files through this, so both paths share one writer.
pub fn replay(r: &RunRecord, sink: &mut dyn RunSink) {
    sink.begin(&r.start());
    for s in &r.steps {
        sink.step(s);
    }
    // (t_ns, stream, class, index) as trace.jsonl orders them: class 0 an event, 1 a token.
    let mut keys: Vec<(u64, u32, u8, u32)> = Vec::with_capacity(r.events.len());
    for (i, e) in r.events.iter().enumerate() {
        // Tier events keep their relative order (writers order them by arrival alone).
        let stream = if e.kind.is_tier() { 0 } else { e.stream };
        keys.push((e.t_ns, stream, 0, i as u32));
    }
    for (s, st) in r.streams.iter().enumerate() {
        for (i, &t) in st.token_ns.iter().enumerate() {
            keys.push((t, s as u32, 1, i as u32));
        }
    }
    keys.sort_unstable();
    for (t, s, class, i) in keys {
        if class == 0 {
            sink.event(&r.events[i as usize]);
        } else {
            let st = &r.streams[s as usize];
            sink.token(&TokenEvent {
                t_ns: t,
                stream: s,
                request: st.request,
                rank: st.rank,
                index: i,
                token: st.token_ids.get(i as usize).copied().unwrap_or(0),
            });
        }
    }
    for (i, st) in r.streams.iter().enumerate() {
        sink.stream_done(i as u32, st);
    }
}
