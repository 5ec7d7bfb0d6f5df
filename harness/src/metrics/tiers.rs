//! What lower tiers cost and gave, per request and per tier: the TTFT decomposition (queueing,
//! onload wait, prefill), where each request's prompt hits came from at its first admission,
//! and each tier's occupancy over time. One fold ([`TierAccum`]) serves both paths: `compute`
//! runs it over a collected record, the streaming run over its sink, so the figures agree.
//!
//! **TTFT decomposition** of a stream with a first token (`ttft = first token − arrival`):
//! queue = first admission − arrival; onload = the onload wait credited to the stream before its
//! first token (`StreamRecord::ttft_onload_ns`); prefill = the rest, `ttft − queue − onload`
//! (prefill compute, and waiting behind other work in its steps). Each part is clamped into
//! what is left of `ttft` so the three always sum to it exactly.
//!
//! **Occupancy:** each step sample's used blocks hold from its end until the next step's end
//! (the last holds for no time, as in the ledger); the time-weighted figure is that integral
//! over the run's duration (0 to the end of the last step). Peaks are over the step samples.

use crate::engine::{RunStart, StepSample, StreamRecord, StreamStatus};

use super::{Dist, LatencyHist};

/// One stream's TTFT in three parts, ns; they sum to its TTFT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtftParts {
    pub queue_ns: u64,
    pub onload_ns: u64,
    pub prefill_ns: u64,
}

/// The stream's TTFT decomposition, when it has a first token.
pub fn ttft_parts(st: &StreamRecord) -> Option<TtftParts> {
    let ttft = st.first_token_ns()?.saturating_sub(st.arrival_ns);
    let queue = st
        .admitted_ns
        .map_or(0, |a| a.saturating_sub(st.arrival_ns))
        .min(ttft);
    let onload = st.ttft_onload_ns.min(ttft - queue);
    Some(TtftParts {
        queue_ns: queue,
        onload_ns: onload,
        prefill_ns: ttft - queue - onload,
    })
}

/// Prompt tokens the stream found on the device at first admission (its hits less those
/// onloaded from the host and the disk tier).
pub fn hit_device_tokens(st: &StreamRecord) -> u32 {
    st.cached_prompt_tokens
        .saturating_sub(st.admission_tier_hits.onload_tokens())
}

/// Where requests' prompt tokens came from at their first admission (rank 0 streams: a
/// continuation shares its parent's blocks), tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct AdmissionHits {
    pub device_tokens: u64,
    pub host_tokens: u64,
    pub disk_tokens: u64,
    /// Prompt tokens prefilled at first admission (prompt − hits) of the admitted requests.
    pub computed_tokens: u64,
}

/// One lower tier's occupancy over the step samples.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TierUse {
    pub capacity_blocks: u64,
    pub peak_used_blocks: u64,
    /// ∫ used blocks dt, block·ns.
    pub used_block_ns: u128,
}

impl TierUse {
    /// Mean blocks held over `duration_ns` (0 for an empty run).
    pub fn time_weighted_used_blocks(&self, duration_ns: u64) -> f64 {
        if duration_ns == 0 {
            0.0
        } else {
            self.used_block_ns as f64 / duration_ns as f64
        }
    }
}

/// What the run's tiers cost and gave (all zero without tiers; `used` empty then).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TierMetrics {
    pub ttft_queue: Dist,
    pub ttft_onload: Dist,
    pub ttft_prefill: Dist,
    pub admission_hits: AdmissionHits,
    /// Over every stream.
    pub onload_bytes: u64,
    pub onload_wait_ns: u64,
    /// Host, then disk, for the tiers the run had.
    pub used: Vec<(kvbench_cache_api::Tier, TierUse)>,
}

/// The fold behind [`TierMetrics`]: streams in any order, steps in step order.
#[derive(Debug, Clone, Default)]
pub struct TierAccum {
    queue: LatencyHist,
    onload: LatencyHist,
    prefill: LatencyHist,
    hits: AdmissionHits,
    onload_bytes: u64,
    onload_wait_ns: u64,
    capacity: [u64; 2],
    peak: [u64; 2],
    used_block_ns: [u128; 2],
    /// The previous step's end and used blocks.
    prev: Option<(u64, [u64; 2])>,
}

impl TierAccum {
    pub fn begin(&mut self, start: &RunStart) {
        *self = TierAccum {
            capacity: start.tier_capacity_blocks,
            ..TierAccum::default()
        };
    }

    pub fn step(&mut self, s: &StepSample) {
        if let Some((end_ns, used)) = self.prev {
            let dt = u128::from(s.end_ns.saturating_sub(end_ns));
            for (acc, u) in self.used_block_ns.iter_mut().zip(used) {
                *acc += u128::from(u) * dt;
            }
        }
        for (p, &u) in self.peak.iter_mut().zip(&s.tier_used_blocks) {
            *p = (*p).max(u);
        }
        self.prev = Some((s.end_ns, s.tier_used_blocks));
    }

    pub fn stream(&mut self, st: &StreamRecord) {
        self.onload_bytes = self.onload_bytes.saturating_add(st.onload_bytes);
        self.onload_wait_ns = self.onload_wait_ns.saturating_add(st.onload_wait_ns);
        if st.rank == 0 {
            let h = &mut self.hits;
            h.device_tokens += u64::from(hit_device_tokens(st));
            h.host_tokens += u64::from(st.admission_tier_hits.host_tokens);
            h.disk_tokens += u64::from(st.admission_tier_hits.disk_tokens);
            if st.admitted_ns.is_some() {
                h.computed_tokens += u64::from(prefill_computed_tokens(st));
            }
        }
        if st.status == StreamStatus::Rejected {
            return;
        }
        if let Some(p) = ttft_parts(st) {
            self.queue.record_ns(p.queue_ns);
            self.onload.record_ns(p.onload_ns);
            self.prefill.record_ns(p.prefill_ns);
        }
    }

    pub fn finish(self) -> TierMetrics {
        let tiers = [kvbench_cache_api::Tier::Host, kvbench_cache_api::Tier::Disk];
        let used = (0..2)
            .filter(|&k| self.capacity[k] > 0)
            .map(|k| {
                (
                    tiers[k],
                    TierUse {
                        capacity_blocks: self.capacity[k],
                        peak_used_blocks: self.peak[k],
                        used_block_ns: self.used_block_ns[k],
                    },
                )
            })
            .collect();
        TierMetrics {
            ttft_queue: self.queue.dist(),
            ttft_onload: self.onload.dist(),
            ttft_prefill: self.prefill.dist(),
            admission_hits: self.hits,
            onload_bytes: self.onload_bytes,
            onload_wait_ns: self.onload_wait_ns,
            used,
        }
    }
}

/// Prompt tokens the first admission had to compute: the prompt less its hits.
pub fn prefill_computed_tokens(st: &StreamRecord) -> u32 {
    st.prompt_tokens.saturating_sub(st.cached_prompt_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StreamStatus;
    use kvbench_cache_api::{Accounting, CacheMode, TierHits};

    fn stream(
        arrival: u64,
        admitted: Option<u64>,
        first: Option<u64>,
        onload: u64,
    ) -> StreamRecord {
        StreamRecord {
            request: 0,
            rank: 0,
            tenant: 0,
            intended_arrival_ns: arrival,
            arrival_ns: arrival,
            admitted_ns: admitted,
            finish_ns: first.unwrap_or(arrival),
            prompt_tokens: 100,
            cached_prompt_tokens: 48,
            status: StreamStatus::Completed,
            preemptions: 0,
            recomputed_tokens: 0,
            swapped_bytes: 0,
            admission_tier_hits: TierHits {
                host_tokens: 16,
                disk_tokens: 16,
            },
            onload_bytes: 64,
            onload_wait_ns: onload,
            ttft_onload_ns: onload,
            token_ns: first.into_iter().collect(),
            token_ids: vec![],
        }
    }

    #[test]
    fn the_three_parts_sum_to_the_ttft() {
        let p = ttft_parts(&stream(100, Some(150), Some(400), 30)).expect("first token");
        assert_eq!(
            p,
            TtftParts {
                queue_ns: 50,
                onload_ns: 30,
                prefill_ns: 220
            }
        );
        // An onload wait past what is left of the TTFT is clamped (the parts still sum).
        let p = ttft_parts(&stream(0, Some(10), Some(20), 50)).expect("first token");
        assert_eq!((p.queue_ns, p.onload_ns, p.prefill_ns), (10, 10, 0));
        assert_eq!(ttft_parts(&stream(0, Some(10), None, 5)), None);
        let st = stream(0, Some(0), Some(1), 0);
        assert_eq!(hit_device_tokens(&st), 16);
        assert_eq!(prefill_computed_tokens(&st), 52);
    }

    fn sample(end_ns: u64, host: u64, disk: u64) -> StepSample {
        StepSample {
            step: 0,
            start_ns: 0,
            end_ns,
            batch_seqs: 1,
            batch_tokens: 1,
            running: 1,
            accounting: Accounting::default(),
            tier_used_blocks: [host, disk],
        }
    }

    #[test]
    fn occupancy_holds_each_sample_until_the_next_step_ends() {
        let mut a = TierAccum::default();
        a.begin(&RunStart {
            mode: CacheMode::Paged,
            block_size: 16,
            total_slots: 64,
            slot_bytes: 1,
            memory: Default::default(),
            computes: false,
            tier_capacity_blocks: [8, 0],
        });
        // 4 blocks for 10 ns, 8 for 30 ns, then the last sample (2) holds for no time.
        for s in [sample(10, 4, 0), sample(20, 8, 0), sample(50, 2, 0)] {
            a.step(&s);
        }
        a.stream(&stream(0, Some(5), Some(40), 7));
        let m = a.finish();
        assert_eq!(m.used.len(), 1, "no disk tier");
        let (tier, u) = m.used[0];
        assert_eq!(tier, kvbench_cache_api::Tier::Host);
        assert_eq!(u.used_block_ns, 4 * 10 + 8 * 30);
        assert_eq!(u.peak_used_blocks, 8);
        assert_eq!(u.time_weighted_used_blocks(50), 280.0 / 50.0);
        assert_eq!(m.admission_hits.host_tokens, 16);
        assert_eq!(m.admission_hits.device_tokens, 16);
        assert_eq!(m.admission_hits.computed_tokens, 52);
        assert_eq!(m.onload_wait_ns, 7);
        assert_eq!(m.ttft_onload.count, 1);
    }
}
