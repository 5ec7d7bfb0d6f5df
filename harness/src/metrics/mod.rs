//! Metrics: pure functions over a [`RunRecord`]. Nothing here feeds back into a run.
//!
//! Definitions (all over *streams*: a request, or each continuation of a parallel-sampling
//! request; rejected streams are excluded from latencies):
//! - **TTFT**: first output token time − arrival time (queueing and prefill included).
//! - **ITL** (inter-token latency): every gap between consecutive output tokens of a stream,
//!   pooled over all streams (vLLM's ITL).
//! - **TPOT** per stream: (last token − first token) ÷ (tokens − 1), streams with ≥ 2 tokens.
//! - **E2E**: finish − arrival, completed streams only.
//! - **Queueing**: first admission − arrival.
//! - **Throughput**: output tokens (all emitted, cancelled streams' included) ÷ duration, where
//!   duration is virtual time from 0 to the end of the last step.
//! - **Goodput**: completed streams meeting every stated SLO (TTFT ≤ `slo.ttft_p99_ms`, TPOT ≤
//!   `slo.itl_p99_ms`) ÷ duration; with no SLO stated, every completed stream counts.
//!
//! Percentiles come from an hdrhistogram of integer nanoseconds at 3 significant digits (the
//! reported value is the histogram's equivalent value, within 0.1% of the exact one); `mean` and
//! `max` are exact.

pub mod ledger;

use hdrhistogram::Histogram;
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

/// Significant digits of every latency histogram.
pub const HDR_SIGFIGS: u8 = 3;
/// Largest latency a histogram tracks exactly (2^46 ns ≈ 19.5 hours); longer ones saturate.
pub const HDR_MAX_NS: u64 = 1 << 46;

impl Dist {
    /// The distribution of `values_ns` (empty → all zeros).
    pub fn of_ns(values_ns: &[u64]) -> Dist {
        if values_ns.is_empty() {
            return Dist::default();
        }
        let mut h =
            Histogram::<u64>::new(HDR_SIGFIGS).expect("3 significant digits is a valid histogram");
        let mut sum = 0u128;
        let mut max = 0u64;
        for &v in values_ns {
            // Clamped explicitly: `saturating_record` in hdrhistogram 7.6 mis-records values.
            if h.record(v.min(HDR_MAX_NS)).is_err() {
                h.saturating_record(v);
            }
            sum += v as u128;
            max = max.max(v);
        }
        let ms = |v: u64| v as f64 / 1e6;
        Dist {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(max),
            mean: (sum as f64 / values_ns.len() as f64) / 1e6,
            count: values_ns.len() as u64,
        }
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

/// Headline numbers of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMetrics {
    pub counts: Counts,
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
    pub preemptions: u64,
    pub recomputed_tokens: u64,
    pub swapped_bytes: u64,
    pub cached_prompt_tokens: u64,
    pub ledger: ledger::LedgerSummary,
}

pub fn compute(r: &RunRecord, slo: &SloSpec, kv_bytes_per_token: u64) -> RunMetrics {
    let mut counts = Counts::default();
    let mut output_tokens = 0;
    let mut good = 0u64;
    let (mut preemptions, mut recomputed, mut swapped, mut cached) = (0, 0, 0, 0);
    for st in &r.streams {
        counts.total += 1;
        match st.status {
            StreamStatus::Completed => counts.completed += 1,
            StreamStatus::Cancelled => counts.cancelled += 1,
            StreamStatus::Rejected => counts.rejected += 1,
        }
        output_tokens += st.token_ns.len() as u64;
        preemptions += st.preemptions as u64;
        recomputed += st.recomputed_tokens;
        swapped += st.swapped_bytes;
        cached += st.cached_prompt_tokens as u64;
        if st.status == StreamStatus::Completed && meets_slo(st, slo) {
            good += 1;
        }
    }
    let s = samples(r);
    let duration_s = r.end_ns as f64 / 1e9;
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    RunMetrics {
        counts,
        output_tokens,
        duration_s,
        throughput_tokens_per_s: per_s(output_tokens as f64),
        requests_per_s: per_s(counts.completed as f64),
        goodput_requests_per_s: per_s(good as f64),
        ttft: Dist::of_ns(&s.ttft),
        itl: Dist::of_ns(&s.itl),
        e2e: Dist::of_ns(&s.e2e),
        tpot: Dist::of_ns(&s.tpot),
        queue: Dist::of_ns(&s.queue),
        preemptions,
        recomputed_tokens: recomputed,
        swapped_bytes: swapped,
        cached_prompt_tokens: cached,
        ledger: ledger::summarize(r, kv_bytes_per_token),
    }
}

fn meets_slo(st: &crate::engine::StreamRecord, slo: &SloSpec) -> bool {
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

    #[test]
    fn empty_dist_is_zero() {
        assert_eq!(Dist::of_ns(&[]), Dist::default());
    }
}
