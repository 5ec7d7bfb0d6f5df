//! Metrics: pure functions over a [`RunRecord`] ([`compute`]), and the same figures folded over a
//! streaming run's sink ([`accum::MetricsAccum`]). Nothing here feeds back into a run.
//!
//! Latencies are over *streams* (a request, or each continuation of a parallel-sampling request;
//! rejected streams are excluded); counts and goodput are over *requests* (a request's status is
//! its first stream's; `streams` counts every stream):
//! - **TTFT**: first output token time − arrival time (queueing and prefill included).
//! - **ITL** (inter-token latency): every gap between consecutive output tokens of a stream,
//!   pooled over all streams (vLLM's ITL).
//! - **TPOT** per stream: (last token − first token) ÷ (tokens − 1), streams with ≥ 2 tokens.
//! - **E2E**: finish − arrival, completed streams only.
//! - **Queueing**: first admission − arrival.
//! - **Throughput**: output tokens (all emitted, cancelled streams' included) ÷ duration, where
//!   duration is virtual time from 0 to the end of the last step.
//! - **Goodput**: requests whose every stream completed and met every stated per-request target
//!   (TTFT ≤ `slo.ttft_p99_ms`, TPOT ≤ `slo.itl_p99_ms`) ÷ duration; with no SLO stated, every
//!   completed request counts.
//!
//! Percentiles come from a [`LatencyHist`] (an auto-resizing hdrhistogram of integer nanoseconds
//! at 3 significant digits, never clipped: the reported value is the histogram's equivalent
//! value, within 0.1% of the exact one); `mean` and `max` are exact.

pub mod accum;
pub mod hist;
pub mod ledger;
pub mod prefix_bounds;
pub mod tiers;
pub mod timeline;

pub use hist::{LatencyHist, HDR_SIGFIGS};
use serde::Serialize;

use crate::engine::{RunRecord, StreamStatus};
use crate::scenario::SloSpec;

/// A latency distribution in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Dist {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    pub count: u64,
}

impl Dist {
    /// The distribution of `values_ns` (empty → all zeros).
    pub fn of_ns(values_ns: &[u64]) -> Dist {
        LatencyHist::of_ns(values_ns).dist()
    }
}

/// Latency samples of one run, in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    pub ttft: Vec<u64>,
    pub itl: Vec<u64>,
    pub e2e: Vec<u64>,
    pub tpot: Vec<u64>,
    pub queue: Vec<u64>,
}

pub fn samples(r: &RunRecord) -> Samples {
    let mut s = Samples::default();
    for st in r
        .streams
        .iter()
        .filter(|st| st.status != StreamStatus::Rejected)
    {
        if let Some(first) = st.first_token_ns() {
            s.ttft.push(first - st.arrival_ns);
        }
        s.itl.extend(st.token_ns.windows(2).map(|w| w[1] - w[0]));
        if st.status == StreamStatus::Completed {
            s.e2e.push(st.finish_ns - st.arrival_ns);
        }
        if st.token_ns.len() >= 2 {
            let span = st.token_ns[st.token_ns.len() - 1] - st.token_ns[0];
            s.tpot.push(span / (st.token_ns.len() as u64 - 1));
        }
        if let Some(a) = st.admitted_ns {
            s.queue.push(a.saturating_sub(st.arrival_ns));
        }
    }
    s
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Counts {
    pub total: u64,
    pub completed: u64,
    pub cancelled: u64,
    pub rejected: u64,
}

impl Counts {
    fn add(&mut self, status: StreamStatus) {
        self.total += 1;
        match status {
            StreamStatus::Completed => self.completed += 1,
            StreamStatus::Cancelled => self.cancelled += 1,
            StreamStatus::Rejected => self.rejected += 1,
        }
    }
}

/// Headline numbers of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMetrics {
    /// Requests, by the status of their first stream.
    pub counts: Counts,
    /// Every stream (continuations included).
    pub streams: Counts,
    pub output_tokens: u64,
    pub duration_s: f64,
    pub throughput_tokens_per_s: f64,
    pub requests_per_s: f64,
    pub goodput_requests_per_s: f64,
    pub ttft: Dist,
    pub itl: Dist,
    pub e2e: Dist,
    pub tpot: Dist,
    pub queue: Dist,
    /// The samples behind `ttft` and `itl`, for consumers that need ranks (the sweep's
    /// order-statistic intervals) or to fold several runs together.
    pub ttft_hist: LatencyHist,
    pub itl_hist: LatencyHist,
    /// Requests whose every stream completed and met every stated per-request target: the
    /// goodput numerator; SLO attainment is `good_requests / counts.total`.
    pub good_requests: u64,
    pub preemptions: u64,
    pub recomputed_tokens: u64,
    pub swapped_bytes: u64,
    pub cached_prompt_tokens: u64,
    /// Prompt tokens the prefix cache supplied to each request at its first admission (rank 0
    /// streams only: continuations share their parent's blocks without a lookup). The achieved
    /// side of [`prefix_bounds`].
    pub request_prefix_hit_tokens: u64,
    pub ledger: ledger::LedgerSummary,
    /// Lower tiers: the TTFT decomposition, where first admissions' hits came from, onloads
    /// and each tier's occupancy.
    pub tiers: tiers::TierMetrics,
}

/// The run's figures from its record; slots become bytes at the record's `slot_bytes`.
pub fn compute(r: &RunRecord, slo: &SloSpec) -> RunMetrics {
    let (mut counts, mut streams) = (Counts::default(), Counts::default());
    let mut output_tokens = 0;
    // Per request: (all streams completed and met the SLO).
    let mut good_by_request: std::collections::BTreeMap<u64, bool> =
        std::collections::BTreeMap::new();
    let (mut preemptions, mut recomputed, mut swapped, mut cached) = (0, 0, 0, 0);
    let mut request_hits = 0;
    for st in &r.streams {
        streams.add(st.status);
        if st.rank == 0 {
            counts.add(st.status);
        }
        let ok = st.status == StreamStatus::Completed && meets_slo(st, slo);
        *good_by_request.entry(st.request).or_insert(true) &= ok;
        output_tokens += st.token_ns.len() as u64;
        preemptions += st.preemptions as u64;
        recomputed += st.recomputed_tokens;
        swapped += st.swapped_bytes;
        cached += st.cached_prompt_tokens as u64;
        if st.rank == 0 {
            request_hits += u64::from(st.cached_prompt_tokens);
        }
    }
    let mut tier_acc = tiers::TierAccum::default();
    tier_acc.begin(&r.start());
    for st in &r.streams {
        tier_acc.stream(st);
    }
    for s in &r.steps {
        tier_acc.step(s);
    }
    let good = good_by_request.values().filter(|&&g| g).count() as u64;
    let s = samples(r);
    let (ttft_hist, itl_hist) = (LatencyHist::of_ns(&s.ttft), LatencyHist::of_ns(&s.itl));
    let duration_s = r.end.end_ns as f64 / 1e9;
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    RunMetrics {
        counts,
        streams,
        output_tokens,
        duration_s,
        throughput_tokens_per_s: per_s(output_tokens as f64),
        requests_per_s: per_s(counts.completed as f64),
        goodput_requests_per_s: per_s(good as f64),
        ttft: ttft_hist.dist(),
        itl: itl_hist.dist(),
        e2e: Dist::of_ns(&s.e2e),
        tpot: Dist::of_ns(&s.tpot),
        queue: Dist::of_ns(&s.queue),
        ttft_hist,
        itl_hist,
        good_requests: good,
        preemptions,
        recomputed_tokens: recomputed,
        swapped_bytes: swapped,
        cached_prompt_tokens: cached,
        request_prefix_hit_tokens: request_hits,
        ledger: ledger::summarize(r),
        tiers: tier_acc.finish(),
    }
}

pub(crate) fn meets_slo(st: &crate::engine::StreamRecord, slo: &SloSpec) -> bool {
    if let (Some(limit), Some(first)) = (slo.ttft_p99_ms, st.first_token_ns()) {
        if (first - st.arrival_ns) as f64 / 1e6 > limit {
            return false;
        }
    }
    if let Some(limit) = slo.itl_p99_ms {
        if st.token_ns.len() >= 2 {
            let span = st.token_ns[st.token_ns.len() - 1] - st.token_ns[0];
            let tpot_ms = span as f64 / (st.token_ns.len() - 1) as f64 / 1e6;
            if tpot_ms > limit {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StreamRecord;

    #[test]
    fn dist_percentiles_are_within_hdr_precision_and_mean_max_exact() {
        let v: Vec<u64> = (1..=1000).map(|i| i * 1_000_000).collect(); // 1..1000 ms
        let d = Dist::of_ns(&v);
        assert!((d.p50 - 500.0).abs() <= 0.5, "{d:?}");
        assert!((d.p99 - 990.0).abs() <= 1.0, "{d:?}");
        assert_eq!(d.max, 1000.0);
        assert_eq!(d.mean, 500.5);
        assert_eq!(d.count, 1000);
    }

    fn stream(
        request: u64,
        rank: u32,
        status: StreamStatus,
        arrival_ms: u64,
        tokens_ms: &[u64],
    ) -> StreamRecord {
        let ms = 1_000_000;
        StreamRecord {
            request,
            rank,
            tenant: 0,
            intended_arrival_ns: arrival_ms * ms,
            arrival_ns: arrival_ms * ms,
            admitted_ns: (status != StreamStatus::Rejected).then_some(arrival_ms * ms),
            finish_ns: tokens_ms.last().map_or(arrival_ms * ms, |t| t * ms),
            prompt_tokens: 10,
            cached_prompt_tokens: 0,
            status,
            preemptions: 0,
            recomputed_tokens: 0,
            swapped_bytes: 0,
            admission_tier_hits: Default::default(),
            onload_bytes: 0,
            onload_wait_ns: 0,
            ttft_onload_ns: 0,
            token_ns: tokens_ms.iter().map(|t| t * ms).collect(),
            token_ids: vec![],
        }
    }

    fn record(streams: Vec<StreamRecord>, end_ms: u64) -> RunRecord {
        let mut r = tests_support::empty_record();
        r.streams = streams;
        r.end.end_ns = end_ms * 1_000_000;
        r
    }

    #[test]
    fn definitions_over_a_hand_built_run() {
        let r = record(
            vec![
                // Request 0 with two continuations: TTFT 10 ms, gaps 5 ms; continuation slow (TPOT 50).
                stream(0, 0, StreamStatus::Completed, 0, &[10, 15, 20]),
                stream(0, 1, StreamStatus::Completed, 0, &[10, 60, 110]),
                // Request 1 cancelled after one gap of 7 ms.
                stream(1, 0, StreamStatus::Cancelled, 100, &[130, 137]),
                stream(2, 0, StreamStatus::Rejected, 200, &[]),
                // Request 3: completed, TTFT 300 ms.
                stream(3, 0, StreamStatus::Completed, 200, &[500, 510]),
            ],
            1000,
        );
        let s = samples(&r);
        assert_eq!(s.ttft, [10, 10, 30, 300].map(|v| v * 1_000_000));
        assert_eq!(s.itl, [5, 5, 50, 50, 7, 10].map(|v| v * 1_000_000));
        assert_eq!(s.e2e, [20, 110, 310].map(|v| v * 1_000_000));
        let slo = SloSpec {
            ttft_p99_ms: Some(100.0),
            itl_p99_ms: Some(20.0),
            attainment: 0.9,
        };
        let m = compute(&r, &slo);
        assert_eq!(
            m.counts,
            Counts {
                total: 4,
                completed: 2,
                cancelled: 1,
                rejected: 1
            }
        );
        assert_eq!(m.streams.total, 5);
        assert_eq!(m.output_tokens, 10);
        assert_eq!(m.duration_s, 1.0);
        // Request 0 fails TPOT through its continuation; request 3 fails TTFT: no goodput.
        assert_eq!(m.goodput_requests_per_s, 0.0);
        let lenient = SloSpec {
            ttft_p99_ms: Some(1000.0),
            itl_p99_ms: Some(100.0),
            attainment: 0.9,
        };
        assert_eq!(compute(&r, &lenient).goodput_requests_per_s, 2.0);
        assert_eq!(m.requests_per_s, 2.0);
        assert_eq!(m.throughput_tokens_per_s, 10.0);
    }

    #[test]
    fn empty_dist_is_zero() {
        assert_eq!(Dist::of_ns(&[]), Dist::default());
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use crate::engine::RunRecord;

    /// A paged run record with nothing in it (block 16, 1024 slots of 1 byte).
    pub fn empty_record() -> RunRecord {
        RunRecord {
            streams: vec![],
            events: vec![],
            steps: vec![],
            end: crate::engine::RunEnd {
                mode: kvbench_cache_api::CacheMode::Paged,
                block_size: 16,
                total_slots: 1024,
                slot_bytes: 1,
                prefix: Default::default(),
                memory: Default::default(),
                metadata_peak_bytes: 0,
                peak_running: 0,
                violation: None,
                reclamation: crate::engine::record::Reclamation {
                    ok: true,
                    leaked_slots: 0,
                    detail: "ok".into(),
                },
                device: None,
                numerics: None,
                computes: false,
                end_ns: 0,
                host_overhead_s: 0.0,
                seq_steps: 0,
                steps: 0,
                streams: 0,
                peak_live_streams: 0,
                tiers: vec![],
            },
        }
    }
}
