//! `summary.json`: the contract's field names, in a fixed order, from an [`Experiment`].

use serde::Serialize;

use super::experiment::{Experiment, ModeRun};
use crate::backend::NumericsReport;
use crate::metrics::ledger::LedgerSummary;
use crate::metrics::{Counts, Dist};
use crate::shadow::ShadowReport;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub scenario: String,
    pub backend: String,
    /// The cache managers both modes ran: `hybrid` (grouped page pool) or `summed` (one slot a
    /// token of every layer); absent where the model's layers all keep every token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_manager: Option<&'static str>,
    pub seed: u64,
    pub workload_hash: String,
    /// The replayed trace (path, format, rows, blake3, what was skipped), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::workload::TraceInfo>,
    /// Multi-turn sessions planned (turns issued per mode are that run's `requests.total`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionsSummary>,
    pub fault: Option<String>,
    /// Times the planted fault took effect over both runs (null without a fault); 0 fails the
    /// checks: a fault that never fired proves nothing.
    pub fault_fired: Option<u64>,
    /// Whether `sim` carried the shadow KV payload (false with `--no-shadow` and off `sim`).
    pub shadow: bool,
    /// Present on a served run (`kvbench serve`): where it listened, what it refused, how
    /// clients cancelled, how it stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served: Option<super::experiment::Served>,
    /// The scenario's latency target: goodput counts the requests whose own TTFT and TPOT meet
    /// `ttft_p99_ms` and `itl_p99_ms`; the report's verdict compares each mode's share of them
    /// with `attainment`.
    pub slo: crate::scenario::SloSpec,
    /// All checks of the run: invariants, reclamation, numerics, cross-mode tokens, shadow reads,
    /// a planted fault that never fired.
    pub checks: Checks,
    pub runs: Vec<RunSummary>,
}

#[derive(Debug, Serialize)]
pub struct SessionsSummary {
    pub sessions: u64,
    pub turns_planned: u64,
}

impl SessionsSummary {
    /// The sessions of a request list and the turns it plans; `None` without sessions.
    pub fn of(workload: &crate::workload::Workload) -> Option<SessionsSummary> {
        let (mut sessions, mut turns_planned) = (0, 0);
        for t in workload.requests.iter().filter_map(|r| r.session) {
            turns_planned += 1;
            sessions += u64::from(t.turn == 0);
        }
        (turns_planned > 0).then_some(SessionsSummary {
            sessions,
            turns_planned,
        })
    }
}

#[derive(Debug, Serialize)]
pub struct Checks {
    pub ok: bool,
    pub failures: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct RunSummary {
    pub cache: String,
    pub block_size: u32,
    /// Where the paged manager put a sequence's next block (`cache.placement`); absent for
    /// contiguous, which has one region per sequence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<&'static str>,
    pub requests: Counts,
    /// Every output stream (a parallel-sampling request has several).
    pub streams: Counts,
    pub output_tokens: u64,
    pub duration_s: f64,
    pub throughput_tokens_per_s: f64,
    pub requests_per_s: f64,
    pub goodput_requests_per_s: f64,
    pub ttft_ms: Dist,
    pub itl_ms: Dist,
    pub e2e_ms: Dist,
    pub tpot_ms: Dist,
    pub queue_ms: Dist,
    pub peak_running_sequences: u32,
    pub preemptions: u64,
    pub recomputed_tokens: u64,
    pub swapped_bytes: u64,
    pub cached_prompt_tokens: u64,
    pub prefix_cache: PrefixSummary,
    pub memory: MemorySummary,
    pub reclamation: ReclamationSummary,
    pub invariants: InvariantSummary,
    pub numerics: Option<NumericsReport>,
    pub steps: u64,
    /// `memory.csv`'s interval (each row the maximum over its steps); absent: a row per step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_resolution_ms: Option<f64>,
    /// `memory.csv`'s rows of this mode, when sampled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_rows: Option<u64>,
    /// Streams with a request track in `trace.perfetto.json`, when not all have one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perfetto_request_tracks: Option<u64>,
    /// Times the planted fault took effect in this run.
    pub fault_fired: u64,
    /// The shadow payload's findings (null when it was not carried).
    pub shadow: Option<ShadowReport>,
    /// Wall seconds of step execution on a backend that measures it; under `--clock model` the
    /// timeline above is modelled and this is what the steps really took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_step_s: Option<f64>,
    /// Each lower tier, host first (absent without tiers: contiguous, or no `cache.host_tier`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierSummary>,
    /// Where requests' hits came from at first admission, what onloads cost them, and TTFT in
    /// three parts (present with tiers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier_costs: Option<TierCosts>,
}

/// One lower tier over a run. Counts are blocks (a block is `block_size` tokens, all layers'
/// K and V: a device block's bytes); `lookups` are blocks looked up here after a miss in every
/// tier above; `evictions` blocks dropped (or passed down to disk) to make room.
#[derive(Debug, Serialize)]
pub struct TierSummary {
    pub tier: &'static str,
    pub capacity_bytes: u64,
    pub capacity_blocks: u64,
    pub lookups: u64,
    pub hit_blocks: u64,
    pub hit_tokens: u64,
    pub offloads: u64,
    pub onloads: u64,
    pub offload_bytes: u64,
    pub onload_bytes: u64,
    pub evictions: u64,
    /// The most bytes held at a step's end, and the mean over the run (each step sample holds
    /// until the next step ends).
    pub peak_used_bytes: u64,
    pub time_weighted_used_bytes: f64,
}

#[derive(Debug, Serialize)]
pub struct TierCosts {
    /// Requests' prompt tokens at first admission by where they came from.
    pub admission_hits: crate::metrics::tiers::AdmissionHits,
    /// Over every stream: bytes onloaded, and the steps' onload waits they were charged.
    pub onload_bytes: u64,
    pub onload_wait_ms: f64,
    /// TTFT = queue + onload + prefill, per stream with a first token.
    pub ttft_queue_ms: Dist,
    pub ttft_onload_ms: Dist,
    pub ttft_prefill_ms: Dist,
}

/// A recurrent model's state checkpoints over a run (`cache.checkpoint_every_blocks`).
#[derive(Debug, Serialize)]
pub struct CheckpointSummary {
    /// Tokens between two checkpoints.
    pub every_tokens: u64,
    pub saved: u64,
    /// Prefix hits that resumed from one.
    pub resumes: u64,
    /// Pool bytes checkpoints held, at most and on average (as each step began), and the
    /// average's share of the KV budget.
    pub bytes_peak: u64,
    pub bytes_mean: u64,
    pub pool_share_mean: f64,
}

#[derive(Debug, Serialize)]
pub struct PrefixSummary {
    pub hit_tokens: u64,
    pub lookup_tokens: u64,
    pub hit_rate: f64,
    pub hit_blocks: u64,
    pub evictions: u64,
    /// A recurrent model's state checkpoints (hybrid paged runs that keep them; absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointSummary>,
    /// The paged run's eviction policy (`cache.eviction`); absent for contiguous (no prefix
    /// cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction: Option<&'static str>,
    /// `to_grow` where the scenario keeps protected blocks from starts
    /// (`cache.evict_protected`; hybrid runs only); absent at the default, `always`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evict_protected: Option<&'static str>,
    /// Each request's prefix hit at its first admission (`requests.csv`'s `cached_prompt_tokens`
    /// of the rows without a parent) over `bounds.lookup_tokens`: the share read against the
    /// bounds (`hit_rate` above counts every lookup, restarts after preemption included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub achieved_hit_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_hit_tokens: Option<u64>,
    /// The request list's infinite-cache ceiling and offline optimum at this pool's capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bounds: Option<crate::metrics::prefix_bounds::PrefixBounds>,
    /// Why there are no bounds for this paged run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bounds_unavailable: Option<String>,
    /// A hybrid run's infinite-cache ceiling (its `achieved_hit_rate` is over the ceiling's
    /// `lookup_tokens`); the summed managers' is in `bounds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<crate::metrics::prefix_bounds::PrefixCeiling>,
}

#[derive(Debug, Serialize)]
pub struct MemorySummary {
    #[serde(flatten)]
    pub ledger: LedgerSummary,
    /// Device-reported bytes in use (`cuMemGetInfo`'s drop since before the backend's
    /// allocations) minus kvbench's own live device allocations, where a device reports (else
    /// null): `device.unaccounted_bytes`, the figure the run prints.
    pub device_unaccounted_bytes: Option<i64>,
    /// That reconciliation term by term: kvbench's allocations, the driver's measured warm-up,
    /// the residue and its tolerance with the derivation, the driver version and timing call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<crate::backend::cuda::ledger::DeviceLedger>,
}

#[derive(Debug, Serialize)]
pub struct ReclamationSummary {
    pub ok: bool,
    pub leaked_blocks: u64,
    pub leaked_bytes: u64,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct InvariantSummary {
    pub ok: bool,
    pub violation: Option<String>,
}

pub fn build(exp: &Experiment) -> Summary {
    let failures = exp.failures();
    Summary {
        scenario: exp.scenario.name.clone(),
        backend: exp.backend.to_string(),
        cache_manager: exp.recorded_manager().map(|m| m.name()),
        seed: exp.seed,
        workload_hash: exp.workload.workload_hash.clone(),
        trace: exp.workload.trace.clone(),
        sessions: SessionsSummary::of(&exp.workload),
        fault: exp.fault.map(|f| f.name().to_string()),
        fault_fired: exp.fault.map(|_| exp.fault_fired()),
        shadow: exp.shadow,
        served: exp.served.clone(),
        slo: exp.scenario.slo.clone(),
        checks: Checks {
            ok: failures.is_empty(),
            failures,
        },
        runs: exp.runs.iter().map(|r| run_summary(r, exp)).collect(),
    }
}

fn run_summary(r: &ModeRun, exp: &Experiment) -> RunSummary {
    let (rec, m) = (&r.end, &r.metrics);
    let l = &m.ledger;
    let device_unaccounted_bytes = rec.device.as_ref().map(|d| d.unaccounted_bytes);
    let p = &rec.prefix;
    RunSummary {
        cache: rec.mode.name().into(),
        block_size: rec.block_size,
        placement: (rec.mode == kvbench_cache_api::CacheMode::Paged)
            .then(|| exp.scenario.cache.placement.name()),
        requests: m.counts,
        streams: m.streams,
        output_tokens: m.output_tokens,
        duration_s: m.duration_s,
        throughput_tokens_per_s: m.throughput_tokens_per_s,
        requests_per_s: m.requests_per_s,
        goodput_requests_per_s: m.goodput_requests_per_s,
        ttft_ms: m.ttft,
        itl_ms: m.itl,
        e2e_ms: m.e2e,
        tpot_ms: m.tpot,
        queue_ms: m.queue,
        peak_running_sequences: rec.peak_running,
        preemptions: m.preemptions,
        recomputed_tokens: m.recomputed_tokens,
        swapped_bytes: m.swapped_bytes,
        cached_prompt_tokens: m.cached_prompt_tokens,
        prefix_cache: PrefixSummary {
            hit_tokens: p.hit_tokens,
            lookup_tokens: p.lookup_tokens,
            hit_rate: if p.lookup_tokens > 0 {
                p.hit_tokens as f64 / p.lookup_tokens as f64
            } else {
                0.0
            },
            hit_blocks: p.hit_blocks,
            evictions: p.evictions,
            checkpoints: (p.checkpoint_tokens > 0).then(|| CheckpointSummary {
                every_tokens: p.checkpoint_tokens,
                saved: p.checkpoints_saved,
                resumes: p.checkpoint_resumes,
                bytes_peak: p.checkpoint_bytes_peak,
                bytes_mean: p.checkpoint_bytes_mean,
                pool_share_mean: p.checkpoint_bytes_mean as f64 / exp.kv_budget_bytes.max(1) as f64,
            }),
            ..prefix_against_bounds(r, exp)
        },
        memory: MemorySummary {
            ledger: *l,
            device_unaccounted_bytes,
            device: rec.device.clone(),
        },
        reclamation: ReclamationSummary {
            ok: rec.reclamation.ok,
            leaked_blocks: rec
                .reclamation
                .leaked_slots
                .div_ceil(rec.block_size.max(1) as u64),
            leaked_bytes: rec.reclamation.leaked_slots * rec.slot_bytes,
            detail: rec.reclamation.detail.clone(),
        },
        invariants: InvariantSummary {
            ok: rec.violation.is_none(),
            violation: rec.violation.clone(),
        },
        numerics: rec.numerics,
        steps: rec.steps,
        memory_resolution_ms: r.files.memory_resolution_ns.map(|ns| ns as f64 / 1e6),
        memory_rows: r.files.memory_resolution_ns.map(|_| r.files.memory_rows),
        perfetto_request_tracks: (r.files.request_tracks < r.files.streams)
            .then_some(r.files.request_tracks),
        fault_fired: r.fault_fired,
        shadow: r.shadow.clone(),
        measured_step_s: r.measured_step_s,
        tiers: tier_summaries(r),
        tier_costs: run_tier_costs(r),
    }
}

/// A run's tier costs, when it had tiers.
pub fn run_tier_costs(r: &ModeRun) -> Option<TierCosts> {
    if r.end.tiers.is_empty() {
        return None;
    }
    let t = &r.metrics.tiers;
    Some(TierCosts {
        admission_hits: t.admission_hits,
        onload_bytes: t.onload_bytes,
        onload_wait_ms: t.onload_wait_ns as f64 / 1e6,
        ttft_queue_ms: t.ttft_queue,
        ttft_onload_ms: t.ttft_onload,
        ttft_prefill_ms: t.ttft_prefill,
    })
}

/// The manager's counters per tier beside the occupancy the step samples give.
pub fn tier_summaries(r: &ModeRun) -> Vec<TierSummary> {
    let block = crate::metrics::ledger::block_bytes(r.end.block_size, r.end.slot_bytes);
    let bs = u64::from(r.end.block_size);
    r.end
        .tiers
        .iter()
        .map(|t| {
            let tier = t.tier.unwrap_or(kvbench_cache_api::Tier::Host);
            let used = r
                .metrics
                .tiers
                .used
                .iter()
                .find(|(k, _)| *k == tier)
                .map(|(_, u)| *u)
                .unwrap_or_default();
            let duration_ns = r.end.end_ns;
            TierSummary {
                tier: tier.name(),
                capacity_bytes: t.capacity_blocks.saturating_mul(block),
                capacity_blocks: t.capacity_blocks,
                lookups: t.lookup_blocks,
                hit_blocks: t.hit_blocks,
                hit_tokens: t.hit_blocks.saturating_mul(bs),
                offloads: t.offloaded_blocks,
                onloads: t.onloaded_blocks,
                offload_bytes: t.offloaded_blocks.saturating_mul(block),
                onload_bytes: t.onloaded_blocks.saturating_mul(block),
                evictions: t.evicted_blocks,
                peak_used_bytes: used.peak_used_blocks.saturating_mul(block),
                time_weighted_used_bytes: if duration_ns == 0 {
                    0.0
                } else {
                    (used.used_block_ns * u128::from(block)) as f64 / duration_ns as f64
                },
            }
        })
        .collect()
}

/// The paged run's policy, achieved share and bounds (all absent for contiguous).
fn prefix_against_bounds(r: &ModeRun, exp: &Experiment) -> PrefixSummary {
    let mut out = PrefixSummary {
        hit_tokens: 0,
        lookup_tokens: 0,
        hit_rate: 0.0,
        hit_blocks: 0,
        evictions: 0,
        checkpoints: None,
        eviction: None,
        evict_protected: None,
        achieved_hit_rate: None,
        request_hit_tokens: None,
        bounds: None,
        bounds_unavailable: None,
        ceiling: None,
    };
    if r.end.mode != kvbench_cache_api::CacheMode::Paged {
        return out;
    }
    out.eviction = Some(exp.scenario.cache.eviction.name());
    let evict = exp.scenario.cache.evict_protected;
    if evict != crate::cache::hybrid::EvictProtected::Always {
        out.evict_protected = Some(evict.name());
    }
    match &exp.prefix_bounds {
        Ok(b) => {
            let hits = r.metrics.request_prefix_hit_tokens;
            out.request_hit_tokens = Some(hits);
            out.achieved_hit_rate = Some(if b.lookup_tokens > 0 {
                hits as f64 / b.lookup_tokens as f64
            } else {
                0.0
            });
            out.bounds = Some(b.clone());
        }
        Err(why) => out.bounds_unavailable = Some(why.clone()),
    }
    if let Some(c) = &exp.prefix_ceiling {
        let hits = r.metrics.request_prefix_hit_tokens;
        out.request_hit_tokens = Some(hits);
        out.achieved_hit_rate = Some(if c.lookup_tokens > 0 {
            hits as f64 / c.lookup_tokens as f64
        } else {
            0.0
        });
        out.ceiling = Some(c.clone());
    }
    out
}
