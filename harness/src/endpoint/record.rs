//! The answers as the engine's records, so the results files and every figure come from the
//! same writers and metrics code as an in-process run: each choice of a request is a stream
//! (rank = choice index), its tokens stamped with their arrival times, its arrival the moment
//! the request was sent. What a client cannot see (admission, preemptions, swaps, the memory
//! ledger) stays empty or zero in the record and is left out of `summary.json`.
//!
//! Outcomes map to the engine's statuses: completed; cancelled (the client closed the stream as
//! scheduled, or the server finished a choice with `abort`); rejected (a 4xx answer: the
//! server refused the request, as the engine rejects a prompt too long). A request that failed
//! otherwise (timeout, transport, a cut stream) is *cancelled* if tokens had come, else
//! *rejected*, and carries its flags in `endpoint.csv` — the figures never count it as
//! completed.
//!
//! Inter-token gaps are gaps between *arrivals*: a chunk carrying k tokens is one arrival, so it
//! adds one gap (from the previous arrival), not k − 1 gaps of zero. TPOT stays (last token −
//! first token) ÷ (tokens − 1) over every token, so a chunk's tokens do count there.

use kvbench_cache_api::{CacheMode, PrefixStats};

use super::client::Outcome;
use super::drive::Done;
use crate::engine::record::Reclamation;
use crate::engine::{RunEnd, RunRecord, StreamRecord, StreamStatus, TraceEvent, TraceKind};
use crate::metrics::{LatencyHist, RunMetrics};

/// The `cache` column of an endpoint's files: the server's cache, whatever it is.
pub const CACHE: &str = "endpoint";

fn status(d: &Done, tokens: usize) -> StreamStatus {
    match d.answer.outcome {
        Outcome::Completed => StreamStatus::Completed,
        Outcome::Cancelled { .. } => StreamStatus::Cancelled,
        Outcome::Rejected => StreamStatus::Rejected,
        Outcome::Failed if tokens > 0 => StreamStatus::Cancelled,
        Outcome::Failed => StreamStatus::Rejected,
    }
}

/// The run as a collected record (streams in request order, ranks consecutive).
pub fn record(done: &[Done], end_ns: u64) -> RunRecord {
    let mut streams = Vec::new();
    let mut events = Vec::new();
    for d in done {
        let a = &d.answer;
        let first = streams.len() as u32;
        events.push(TraceEvent {
            t_ns: a.arrival_ns,
            stream: first,
            request: d.id,
            rank: 0,
            kind: TraceKind::Arrive,
        });
        for (rank, c) in a.choices.iter().enumerate() {
            let st = status(d, c.token_ns.len());
            let index = streams.len() as u32;
            let finish = a.finish_ns.max(c.token_ns.last().copied().unwrap_or(0));
            let kind = match (st, a.outcome) {
                (StreamStatus::Completed, _) => TraceKind::Finish,
                (StreamStatus::Cancelled, Outcome::Cancelled { during }) => {
                    TraceKind::Cancel { during }
                }
                (StreamStatus::Cancelled, _) => TraceKind::Cancel { during: "decode" },
                (StreamStatus::Rejected, _) => TraceKind::Reject {
                    reason: a.reject_reason.clone().unwrap_or_else(|| {
                        a.flags
                            .first()
                            .map_or_else(String::new, |f| format!("{}: {}", f.kind, f.detail))
                    }),
                },
            };
            events.push(TraceEvent {
                t_ns: finish,
                stream: index,
                request: d.id,
                rank: rank as u32,
                kind,
            });
            streams.push(StreamRecord {
                request: d.id,
                rank: rank as u32,
                tenant: d.tenant,
                intended_arrival_ns: d.intended_ns,
                arrival_ns: a.arrival_ns,
                admitted_ns: None,
                finish_ns: finish,
                prompt_tokens: d.prompt_tokens,
                cached_prompt_tokens: if rank == 0 {
                    a.cached_prompt_tokens.map_or(0, |c| {
                        u32::try_from(c).unwrap_or(u32::MAX).min(d.prompt_tokens)
                    })
                } else {
                    0
                },
                status: st,
                preemptions: 0,
                recomputed_tokens: 0,
                swapped_bytes: 0,
                admission_tier_hits: Default::default(),
                onload_bytes: 0,
                onload_wait_ns: 0,
                ttft_onload_ns: 0,
                token_ns: c.token_ns.clone(),
                token_ids: c.token_ids.clone(),
            });
        }
    }
    events.sort_by_key(|e| e.t_ns);
    RunRecord {
        streams,
        events,
        steps: Vec::new(),
        end: run_end(end_ns),
    }
}

/// A run end with only what a client knows: the duration. The mode is a placeholder the
/// writers do not read for an endpoint (its files say `endpoint`).
pub fn run_end(end_ns: u64) -> RunEnd {
    RunEnd {
        mode: CacheMode::Paged,
        block_size: 1,
        total_slots: 0,
        slot_bytes: 0,
        prefix: PrefixStats::default(),
        memory: Default::default(),
        metadata_peak_bytes: 0,
        peak_running: 0,
        violation: None,
        reclamation: Reclamation {
            ok: true,
            leaked_slots: 0,
            detail: String::new(),
        },
        device: None,
        numerics: None,
        computes: false,
        end_ns,
        host_overhead_s: 0.0,
        seq_steps: 0,
        steps: 0,
        streams: 0,
        peak_live_streams: 0,
        tiers: Vec::new(),
    }
}

/// Replace the metrics' inter-token gaps by gaps between arrivals (module doc): one gap per
/// chunk after a stream's first, rejected streams left out as everywhere.
pub fn chunk_gaps(done: &[Done], m: &mut RunMetrics) {
    let mut itl = LatencyHist::new();
    for d in done {
        for c in &d.answer.choices {
            if status(d, c.token_ns.len()) == StreamStatus::Rejected {
                continue;
            }
            let mut at = 0usize;
            let mut prev = None;
            for &k in &c.chunk_tokens {
                let t = c.token_ns[at];
                if let Some(p) = prev {
                    itl.record_ns(t - p);
                }
                prev = Some(t);
                at += k as usize;
            }
        }
    }
    m.itl = itl.dist();
    m.itl_hist = itl;
}
