//! The run's metrics folded over its sink as it goes: [`MetricsAccum`] gives exactly the
//! [`RunMetrics`] that [`super::compute`] gives over the collected [`RunRecord`] (a property test
//! holds them equal), holding one latency histogram per figure, a few counters and the previous
//! step — never a stream once its record went by.
//!
//! Order independence: counts and sums are integers, histograms count values, and the ledger's
//! time integral folds steps in step order, as `compute` does. Goodput's per-request "every
//! stream good" relies on the sink's promise that a request's streams come consecutively.
//!
//! [`RunRecord`]: crate::engine::RunRecord

use super::ledger::{self, LedgerSummary};
use super::tiers::TierAccum;
use super::{meets_slo, Counts, LatencyHist, RunMetrics};
use crate::engine::{RunEnd, RunSink, RunStart, StepSample, StreamRecord, StreamStatus};
use crate::scenario::SloSpec;

pub struct MetricsAccum {
    slo: SloSpec,
    counts: Counts,
    streams: Counts,
    output_tokens: u64,
    /// The request whose streams are arriving, and whether all so far were good.
    open_request: Option<(u64, bool)>,
    good_requests: u64,
    preemptions: u64,
    recomputed_tokens: u64,
    swapped_bytes: u64,
    cached_prompt_tokens: u64,
    request_prefix_hit_tokens: u64,
    ttft: LatencyHist,
    itl: LatencyHist,
    e2e: LatencyHist,
    tpot: LatencyHist,
    queue: LatencyHist,
    ledger: LedgerAccum,
    tiers: TierAccum,
}

impl MetricsAccum {
    pub fn new(slo: &SloSpec) -> MetricsAccum {
        MetricsAccum {
            slo: slo.clone(),
            counts: Counts::default(),
            streams: Counts::default(),
            output_tokens: 0,
            open_request: None,
            good_requests: 0,
            preemptions: 0,
            recomputed_tokens: 0,
            swapped_bytes: 0,
            cached_prompt_tokens: 0,
            request_prefix_hit_tokens: 0,
            ttft: LatencyHist::new(),
            itl: LatencyHist::new(),
            e2e: LatencyHist::new(),
            tpot: LatencyHist::new(),
            queue: LatencyHist::new(),
            ledger: LedgerAccum::new(),
            tiers: TierAccum::default(),
        }
    }

    /// The run's figures, once `end` came back from the engine.
    pub fn finish(mut self, end: &RunEnd) -> RunMetrics {
        self.close_request();
        let duration_s = end.end_ns as f64 / 1e9;
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        RunMetrics {
            counts: self.counts,
            streams: self.streams,
            output_tokens: self.output_tokens,
            duration_s,
            throughput_tokens_per_s: per_s(self.output_tokens as f64),
            requests_per_s: per_s(self.counts.completed as f64),
            goodput_requests_per_s: per_s(self.good_requests as f64),
            ttft: self.ttft.dist(),
            itl: self.itl.dist(),
            e2e: self.e2e.dist(),
            tpot: self.tpot.dist(),
            queue: self.queue.dist(),
            ttft_hist: self.ttft,
            itl_hist: self.itl,
            good_requests: self.good_requests,
            preemptions: self.preemptions,
            recomputed_tokens: self.recomputed_tokens,
            swapped_bytes: self.swapped_bytes,
            cached_prompt_tokens: self.cached_prompt_tokens,
            request_prefix_hit_tokens: self.request_prefix_hit_tokens,
            ledger: self.ledger.finish(),
            tiers: self.tiers.finish(),
        }
    }

    fn close_request(&mut self) {
        if let Some((_, true)) = self.open_request.take() {
            self.good_requests += 1;
        }
    }
}

impl RunSink for MetricsAccum {
    fn begin(&mut self, start: &RunStart) {
        self.ledger.begin(start);
        self.tiers.begin(start);
    }

    fn step(&mut self, s: &StepSample) {
        self.ledger.step(s);
        self.tiers.step(s);
    }

    fn stream_done(&mut self, _index: u32, st: &StreamRecord) {
        self.streams.add(st.status);
        if st.rank == 0 {
            self.counts.add(st.status);
        }
        let ok = st.status == StreamStatus::Completed && meets_slo(st, &self.slo);
        match &mut self.open_request {
            Some((r, good)) if *r == st.request => *good &= ok,
            _ => {
                self.close_request();
                self.open_request = Some((st.request, ok));
            }
        }
        self.tiers.stream(st);
        self.output_tokens += st.token_ns.len() as u64;
        self.preemptions += st.preemptions as u64;
        self.recomputed_tokens += st.recomputed_tokens;
        self.swapped_bytes += st.swapped_bytes;
        self.cached_prompt_tokens += st.cached_prompt_tokens as u64;
        if st.rank == 0 {
            self.request_prefix_hit_tokens += u64::from(st.cached_prompt_tokens);
        }
        if st.status == StreamStatus::Rejected {
            return;
        }
        if let Some(first) = st.first_token_ns() {
            self.ttft.record_ns(first - st.arrival_ns);
        }
        for w in st.token_ns.windows(2) {
            self.itl.record_ns(w[1] - w[0]);
        }
        if st.status == StreamStatus::Completed {
            self.e2e.record_ns(st.finish_ns - st.arrival_ns);
        }
        if st.token_ns.len() >= 2 {
            let span = st.token_ns[st.token_ns.len() - 1] - st.token_ns[0];
            self.tpot.record_ns(span / (st.token_ns.len() as u64 - 1));
        }
        if let Some(a) = st.admitted_ns {
            self.queue.record_ns(a.saturating_sub(st.arrival_ns));
        }
    }
}

/// [`ledger::summarize`] folded step by step: peaks are maxima over every step, the waste
/// fraction a ratio of time integrals where each step holds until the next one ends.
pub struct LedgerAccum {
    /// The run's `slot_bytes`, from its start.
    kv_bytes_per_token: u64,
    block_size: u32,
    paged: bool,
    out: LedgerSummary,
    memory_other_bytes: u64,
    /// The previous step's end and its (allocated-unfilled, live + allocated-unfilled) slots.
    prev: Option<(u64, u64, u64)>,
    unfilled_dt: f64,
    held_dt: f64,
}

impl Default for LedgerAccum {
    fn default() -> Self {
        LedgerAccum::new()
    }
}

impl LedgerAccum {
    pub fn new() -> LedgerAccum {
        LedgerAccum {
            kv_bytes_per_token: 0,
            block_size: 1,
            paged: false,
            out: LedgerSummary::default(),
            memory_other_bytes: 0,
            prev: None,
            unfilled_dt: 0.0,
            held_dt: 0.0,
        }
    }

    pub fn begin(&mut self, start: &RunStart) {
        self.kv_bytes_per_token = start.slot_bytes;
        let kvb = self.kv_bytes_per_token;
        self.block_size = start.block_size;
        self.paged = start.mode == kvbench_cache_api::CacheMode::Paged;
        self.memory_other_bytes = start.memory.other_bytes;
        self.out = LedgerSummary {
            kv_budget_bytes: start.total_slots * kvb,
            weights_bytes: start.memory.weights_bytes,
            workspace_peak_bytes: start.memory.workspace_bytes,
            ..LedgerSummary::default()
        };
        ledger::host_tier_start(&mut self.out, start, kvb);
    }

    pub fn step(&mut self, s: &StepSample) {
        let (a, kvb, out) = (&s.accounting, self.kv_bytes_per_token, &mut self.out);
        ledger::host_tier_step(out, s, self.block_size, kvb);
        out.kv_peak_live_bytes = out.kv_peak_live_bytes.max(a.live_slots * kvb);
        out.kv_peak_allocated_bytes = out
            .kv_peak_allocated_bytes
            .max((a.live_slots + a.allocated_unfilled_slots) * kvb);
        out.kv_peak_cached_free_bytes =
            out.kv_peak_cached_free_bytes.max(a.cached_free_slots * kvb);
        out.other_bytes = out
            .other_bytes
            .max(ledger::other_bytes(s, self.block_size, self.paged) + self.memory_other_bytes);
        if let Some((end_ns, unfilled, held)) = self.prev {
            let dt = (s.end_ns - end_ns) as f64;
            self.unfilled_dt += unfilled as f64 * dt;
            self.held_dt += held as f64 * dt;
        }
        self.prev = Some((
            s.end_ns,
            a.allocated_unfilled_slots,
            a.live_slots + a.allocated_unfilled_slots,
        ));
    }

    /// The last step holds for no time, as in `summarize`.
    pub fn finish(mut self) -> LedgerSummary {
        self.out.kv_waste_fraction = if self.held_dt > 0.0 {
            self.unfilled_dt / self.held_dt
        } else {
            0.0
        };
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sink::replay;

    #[test]
    fn accumulated_equals_computed_on_the_hand_built_run() {
        // The hand-built record of `metrics::tests` has continuations, a cancellation and a
        // rejection; `compute` over it and the accumulator over its replay must agree.
        let mut r = crate::metrics::tests_support::empty_record();
        let ms = 1_000_000;
        let mk = |request, rank, status, arrival: u64, toks: &[u64]| StreamRecord {
            request,
            rank,
            tenant: 0,
            intended_arrival_ns: arrival * ms,
            arrival_ns: arrival * ms,
            admitted_ns: Some(arrival * ms + 1),
            finish_ns: toks.last().map_or(arrival * ms, |t| t * ms),
            prompt_tokens: 4,
            cached_prompt_tokens: 1,
            status,
            preemptions: 1,
            recomputed_tokens: 2,
            swapped_bytes: 3,
            admission_tier_hits: Default::default(),
            onload_bytes: 0,
            onload_wait_ns: 0,
            ttft_onload_ns: 0,
            token_ns: toks.iter().map(|t| t * ms).collect(),
            token_ids: vec![],
        };
        r.streams = vec![
            mk(0, 0, StreamStatus::Completed, 0, &[10, 15, 20]),
            mk(0, 1, StreamStatus::Completed, 0, &[10, 60, 110]),
            mk(1, 0, StreamStatus::Cancelled, 100, &[130, 137]),
            mk(2, 0, StreamStatus::Rejected, 200, &[]),
            mk(3, 0, StreamStatus::Completed, 200, &[500, 510]),
        ];
        r.end.end_ns = 1000 * ms;
        r.end.slot_bytes = 2;
        let slo = SloSpec {
            ttft_p99_ms: Some(1000.0),
            itl_p99_ms: Some(100.0),
            attainment: 0.9,
        };
        let mut acc = MetricsAccum::new(&slo);
        replay(&r, &mut acc);
        let got = acc.finish(&r.end);
        assert_eq!(got, super::super::compute(&r, &slo));
        assert_eq!(got.good_requests, 2);
    }
}
