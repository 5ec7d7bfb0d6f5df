//! From searches to the figures of `sweep.json` (schema in docs/sweep-and-gate.md; fields may be added).
//!
//! Per cache mode, each seed's search brackets its capacity between the highest passing load `a`
//! and the lowest non-passing one `b` (`b = a` when the search hit its limit without failing).
//! The figure reported is the mean of the `a`s (a load shown to pass, never an interpolation);
//! its 95% interval is `[mean(a) − t·sd(a)/√n, mean(b) + t·sd(b)/√n]` over the n seeds, so it
//! covers both the spread between workload draws and the search's own resolution (with one seed
//! it is the bracket `[a, b]`). Throughput at target and the paged/contiguous ratio take the
//! same form over their per-seed brackets.
//!
//! A scenario listing several host-tier capacities adds `capacities[]`: per capacity, the paged
//! run searched at it and its ratio to the one contiguous run; `runs` keeps its two entries (the
//! paged one at the first listed capacity, marked with `host_tier`), so a reader of `runs` sees
//! what the scenario as run would give.

use serde::Serialize;

use super::load::By;
use super::probe::Probe;
use super::search::SeedSearch;
use super::verdict::Verdict;
use super::window::TRIM_SHARE;
use super::Sweep;
use crate::metrics::hist::LatencyHist;
use crate::metrics::Dist;
use crate::stats::{self, bracket_interval};

#[derive(Debug, Clone, Serialize)]
pub struct SloJson {
    pub ttft_p99_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub attainment: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProbeJson {
    pub cache: String,
    /// The host-tier capacity the probe ran at, when the scenario lists several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_tier: Option<String>,
    pub seed: u64,
    pub load: f64,
    pub offered_rps: f64,
    pub achieved_rps: f64,
    pub throughput_tokens_per_s: f64,
    pub ttft_p99_ms: f64,
    /// `[low, high]`; `null` when the sample is too small to bound both ends (then
    /// `ttft_p99_ms_ci_ends` holds the end that is bounded).
    pub ttft_p99_ms_ci: Option<[f64; 2]>,
    pub ttft_p99_ms_ci_ends: [Option<f64>; 2],
    pub itl_p99_ms: f64,
    pub itl_p99_ms_ci: Option<[f64; 2]>,
    pub itl_p99_ms_ci_ends: [Option<f64>; 2],
    pub attainment: f64,
    pub attainment_ci: [f64; 2],
    pub samples: u64,
    pub verdict: Verdict,
    pub oversaturated: bool,
    pub requests: u64,
    pub request_factor: u32,
    pub window_s: f64,
    /// Per criterion: pass | fail | unresolved (`null` when the SLO does not state it).
    pub ttft_verdict: Option<Verdict>,
    pub itl_verdict: Option<Verdict>,
    pub attainment_verdict: Verdict,
    /// MLPerf's early-stopping floor for the p99 claims, given the samples over each target.
    pub ttft_samples_floor: Option<u64>,
    pub itl_samples: u64,
    pub itl_samples_floor: Option<u64>,
    pub workload_hash: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct SeedJson {
    pub seed: u64,
    /// Highest passing rate, and the lowest non-passing one above it (`null`: none found).
    pub rate_at_target_rps: Option<f64>,
    /// What the passing probe achieved (completed requests per second) at that offered rate.
    pub achieved_at_target_rps: Option<f64>,
    pub lowest_failing_rps: Option<f64>,
    pub load_at_target: Option<f64>,
    pub throughput_at_target_tokens_per_s: Option<f64>,
    /// This seed's brackets `[a, b]` (module doc): what a paired comparison of two sweeps reads.
    pub rate_bracket_rps: Option<[f64; 2]>,
    pub throughput_bracket_tokens_per_s: Option<[f64; 2]>,
    pub capped: bool,
    pub probes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunJson {
    pub cache: String,
    /// The host-tier capacity of this paged run, when the scenario lists several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_tier: Option<String>,
    pub rate_at_target_rps: Option<f64>,
    pub rate_at_target_rps_ci: [f64; 2],
    /// The passing probes' achieved rate (completed requests per second), mean over seeds:
    /// beside the offered rate, what the system really served there.
    pub achieved_at_target_rps: Option<f64>,
    pub throughput_at_target_tokens_per_s: Option<f64>,
    pub throughput_at_target_tokens_per_s_ci: [f64; 2],
    /// Pooled over the seeds' passing probes.
    pub ttft_ms: Dist,
    pub itl_ms: Dist,
    /// Some search hit its doubling limit without a failure: the figures are lower bounds.
    pub capped: bool,
    pub per_seed: Vec<SeedJson>,
    pub probes: Vec<ProbeJson>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepJson {
    pub scenario: String,
    pub backend: String,
    /// The device profile the figures are priced with
    /// ([`crate::results::env::device_identity`]): two sweeps of different profiles are not
    /// gated against each other.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub by: By,
    pub seeds: Vec<u64>,
    pub precision_pct: f64,
    /// Of the base load (the scenario as written) on the first seed.
    pub workload_hash: String,
    /// Of the base load on every seed, in `seeds` order.
    pub workload_hashes: Vec<String>,
    /// blake3 of the scenario's name, model shape, SLO and axis ([`definition_hash`]): with the
    /// workload hashes, what must match for two sweeps to be comparable (the device, memory,
    /// cache and scheduler are what a comparison varies).
    pub definition_hash: String,
    pub slo: SloJson,
    pub confidence: f64,
    pub trim_share: f64,
    /// An unresolved probe is rerun with up to this many times the scenario's requests.
    pub max_extend: u32,
    pub base_requests: Option<u32>,
    pub runs: Vec<RunJson>,
    pub ratio_paged_over_contiguous: Option<f64>,
    pub ratio_paged_over_contiguous_ci: [f64; 2],
    /// Per listed host-tier capacity (in the scenario's order), when it lists several: the
    /// paged run searched at it. The first is `runs`' paged entry; the ratio above is its.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capacities: Vec<CapacityJson>,
    /// Every run check passed (invariants, reclamation) in every probe.
    pub checks_ok: bool,
    pub check_failures: Vec<String>,
}

/// One host-tier capacity of a sweep over several.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityJson {
    /// As the scenario writes it (`"16 GiB"`).
    pub host_tier: String,
    /// Its bytes (`null` only if it no longer parses).
    pub host_tier_bytes: Option<u64>,
    /// The paged cache searched at this capacity (its `rate_at_target_rps` with its interval).
    pub paged: RunJson,
    /// Over the contiguous run (which has no tier, so is the same for every capacity).
    pub ratio_paged_over_contiguous: Option<f64>,
    pub ratio_paged_over_contiguous_ci: [f64; 2],
}

fn both(ends: [Option<f64>; 2]) -> Option<[f64; 2]> {
    Some([ends[0]?, ends[1]?])
}

fn probe_json(cache: &str, host_tier: Option<&String>, p: &Probe) -> ProbeJson {
    let p99 = |h: &LatencyHist| {
        let r = stats::quantile_rank_interval(h.count(), stats::P99, stats::CONFIDENCE);
        let ms = |k: u64| h.value_at_rank_ns(k) as f64 / 1e6;
        (
            h.quantile_ns(stats::P99) as f64 / 1e6,
            [r.lo_rank.map(ms), r.hi_rank.map(ms)],
        )
    };
    let (ttft_p99_ms, ttft_ci) = p99(&p.ttft_hist);
    let (itl_p99_ms, itl_ci) = p99(&p.itl_hist);
    ProbeJson {
        cache: cache.into(),
        host_tier: host_tier.cloned(),
        seed: p.seed,
        load: p.load,
        offered_rps: p.offered_rps,
        achieved_rps: p.achieved_rps,
        throughput_tokens_per_s: p.throughput_tokens_per_s,
        ttft_p99_ms,
        ttft_p99_ms_ci: both(ttft_ci),
        ttft_p99_ms_ci_ends: ttft_ci,
        itl_p99_ms,
        itl_p99_ms_ci: both(itl_ci),
        itl_p99_ms_ci_ends: itl_ci,
        attainment: p.attainment.attainment,
        attainment_ci: p.attainment.ci,
        samples: p.samples,
        verdict: p.verdict,
        oversaturated: p.oversaturated,
        requests: p.requests,
        request_factor: p.request_factor,
        window_s: p.window_s,
        ttft_verdict: p.ttft.map(|c| c.verdict),
        itl_verdict: p.itl.map(|c| c.verdict),
        attainment_verdict: p.attainment.verdict,
        ttft_samples_floor: p.ttft.map(|c| c.floor),
        itl_samples: p.itl_hist.count(),
        itl_samples_floor: p.itl.map(|c| c.floor),
        workload_hash: p.workload_hash.clone(),
    }
}

/// Per-seed brackets of one mode: (rate a, rate b, throughput a, throughput b) per seed that passed.
struct Brackets {
    rate: (Vec<f64>, Vec<f64>),
    thr: (Vec<f64>, Vec<f64>),
}

fn brackets(by: By, searches: &[&SeedSearch]) -> Option<Brackets> {
    let mut out = Brackets {
        rate: (Vec::new(), Vec::new()),
        thr: (Vec::new(), Vec::new()),
    };
    for s in searches {
        let p = s.pass_probe()?;
        let f = s.fail_probe().unwrap_or(p);
        out.rate.0.push(p.rate_rps(by));
        out.rate.1.push(f.rate_rps(by).max(p.rate_rps(by)));
        let (t0, t1) = (p.throughput_tokens_per_s, f.throughput_tokens_per_s);
        out.thr.0.push(t0.min(t1));
        out.thr.1.push(t0.max(t1));
    }
    Some(out)
}

fn run_json(by: By, cache: &str, host_tier: Option<&String>, searches: &[&SeedSearch]) -> RunJson {
    let per_seed: Vec<SeedJson> = searches
        .iter()
        .map(|s| SeedJson {
            seed: s.seed,
            rate_at_target_rps: s.pass_probe().map(|p| p.rate_rps(by)),
            achieved_at_target_rps: s.pass_probe().map(|p| p.achieved_rps),
            lowest_failing_rps: s.fail_probe().map(|p| p.rate_rps(by)),
            load_at_target: s.pass_probe().map(|p| p.load),
            throughput_at_target_tokens_per_s: s.pass_probe().map(|p| p.throughput_tokens_per_s),
            rate_bracket_rps: s.pass_probe().map(|p| {
                let f = s.fail_probe().unwrap_or(p);
                [p.rate_rps(by), f.rate_rps(by).max(p.rate_rps(by))]
            }),
            throughput_bracket_tokens_per_s: s.pass_probe().map(|p| {
                let f = s.fail_probe().unwrap_or(p);
                let (t0, t1) = (p.throughput_tokens_per_s, f.throughput_tokens_per_s);
                [t0.min(t1), t0.max(t1)]
            }),
            capped: s.capped,
            probes: s.probes.len(),
        })
        .collect();
    let (mut ttft, mut itl) = (LatencyHist::new(), LatencyHist::new());
    for p in searches.iter().filter_map(|s| s.pass_probe()) {
        ttft.add(&p.ttft_hist);
        itl.add(&p.itl_hist);
    }
    let b = brackets(by, searches);
    let lowest_fail = || {
        searches
            .iter()
            .filter_map(|s| s.fail_probe())
            .map(|p| p.rate_rps(by))
            .fold(0.0, f64::max)
    };
    let (rate, rate_ci, thr, thr_ci) = match &b {
        Some(b) => (
            Some(stats::mean_sd(&b.rate.0).0),
            bracket_interval(&b.rate.0, &b.rate.1),
            Some(
                stats::mean_sd(
                    &searches
                        .iter()
                        .filter_map(|s| s.pass_probe())
                        .map(|p| p.throughput_tokens_per_s)
                        .collect::<Vec<_>>(),
                )
                .0,
            ),
            bracket_interval(&b.thr.0, &b.thr.1),
        ),
        // Some seed never passed: the capacity is below the lowest load tried.
        None => (None, [0.0, lowest_fail()], None, [0.0, 0.0]),
    };
    let mut probes: Vec<ProbeJson> = searches
        .iter()
        .flat_map(|s| s.probes.iter().map(|p| probe_json(cache, host_tier, p)))
        .collect();
    probes.sort_by(|x, y| x.seed.cmp(&y.seed).then(x.load.total_cmp(&y.load)));
    let achieved: Vec<f64> = searches
        .iter()
        .filter_map(|s| s.pass_probe())
        .map(|p| p.achieved_rps)
        .collect();
    RunJson {
        cache: cache.into(),
        host_tier: host_tier.cloned(),
        rate_at_target_rps: rate,
        rate_at_target_rps_ci: rate_ci,
        achieved_at_target_rps: (rate.is_some() && !achieved.is_empty())
            .then(|| stats::mean_sd(&achieved).0),
        throughput_at_target_tokens_per_s: thr,
        throughput_at_target_tokens_per_s_ci: thr_ci,
        ttft_ms: ttft.dist(),
        itl_ms: itl.dist(),
        capped: searches.iter().any(|s| s.capped),
        per_seed,
        probes,
    }
}

/// The paged/contiguous ratio of rates at target and its interval over per-seed brackets
/// (`a_paged / b_contiguous`, `b_paged / a_contiguous`).
fn ratio(by: By, paged: &[&SeedSearch], contiguous: &[&SeedSearch]) -> (Option<f64>, [f64; 2]) {
    let (Some(p), Some(c)) = (brackets(by, paged), brackets(by, contiguous)) else {
        return (None, [0.0, 0.0]);
    };
    let lo: Vec<f64> = (0..p.rate.0.len())
        .map(|i| p.rate.0[i] / c.rate.1[i])
        .collect();
    let hi: Vec<f64> = (0..p.rate.0.len())
        .map(|i| p.rate.1[i] / c.rate.0[i])
        .collect();
    let point = stats::mean_sd(&p.rate.0).0 / stats::mean_sd(&c.rate.0).0;
    (Some(point), bracket_interval(&lo, &hi))
}

/// blake3 of what two comparable sweeps must share besides their workloads (whose hashes cover
/// the traffic): the scenario's name, the model shape, the SLO and the swept axis. Built from
/// named fields rather than the scenario's serde form, so a field added to the scenario schema
/// elsewhere does not change it.
pub fn definition_hash(s: &crate::scenario::Scenario, by: By) -> String {
    let m = s.model_shape();
    let model = m.map(|m| {
        // Experts only when the shape has them, so a dense shape's hash is what it was.
        let moe = m.moe.map_or(String::new(), |e| {
            format!(
                " experts={} active_experts={} expert_ffn_dim={} shared_experts={}",
                e.experts, e.active_experts, e.expert_ffn_dim, e.shared_experts
            )
        });
        format!(
            "{} layers={} q_heads={} kv_heads={} head_dim={} d_model={} ffn_dim={} vocab={} weights={:?} kv={:?} tp={}{moe}",
            m.name, m.layers, m.q_heads, m.kv_heads, m.head_dim, m.d_model, m.ffn_dim, m.vocab,
            m.weight_dtype, m.kv_dtype, m.tp
        )
    });
    let text = format!(
        "kvbench sweep definition v1\nname={}\nmodel={}\nslo.ttft_p99_ms={:?}\nslo.itl_p99_ms={:?}\nslo.attainment={:?}\nby={}\n",
        s.name,
        model.unwrap_or_default(),
        s.slo.ttft_p99_ms.map(f64::to_bits),
        s.slo.itl_p99_ms.map(f64::to_bits),
        s.slo.attainment.to_bits(),
        by.name()
    );
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

pub fn build(sweep: &Sweep) -> SweepJson {
    let by = sweep.config.search.by;
    let of =
        |mode| -> Vec<&SeedSearch> { sweep.searches.iter().filter(|s| s.mode == mode).collect() };
    let (all_paged, contiguous) = (
        of(kvbench_cache_api::CacheMode::Paged),
        of(kvbench_cache_api::CacheMode::Contiguous),
    );
    // The listed capacities in search order (empty when the scenario lists one or none).
    let mut caps: Vec<&String> = Vec::new();
    for c in all_paged.iter().filter_map(|s| s.host_tier.as_ref()) {
        if !caps.contains(&c) {
            caps.push(c);
        }
    }
    let at = |cap: Option<&String>| -> Vec<&SeedSearch> {
        all_paged
            .iter()
            .copied()
            .filter(|s| s.host_tier.as_ref() == cap)
            .collect()
    };
    let paged = at(caps.first().copied());
    let capacities: Vec<CapacityJson> = caps
        .iter()
        .map(|&c| {
            let searches = at(Some(c));
            let (r, r_ci) = ratio(by, &searches, &contiguous);
            CapacityJson {
                host_tier: c.clone(),
                host_tier_bytes: crate::units::parse_bytes(c).ok(),
                paged: run_json(by, "paged", Some(c), &searches),
                ratio_paged_over_contiguous: r,
                ratio_paged_over_contiguous_ci: r_ci,
            }
        })
        .collect();
    let workload_hashes = sweep.workload_hashes.clone();
    let (ratio, ratio_ci) = ratio(by, &paged, &contiguous);
    let mut check_failures = Vec::new();
    for s in &sweep.searches {
        for p in &s.probes {
            for f in &p.check_failures {
                let host = s
                    .host_tier
                    .as_ref()
                    .map_or(String::new(), |h| format!(" host {h}"));
                check_failures.push(format!(
                    "{}{host} seed {} load {}: {f}",
                    s.mode.name(),
                    s.seed,
                    p.load
                ));
            }
        }
    }
    let slo = &sweep.scenario.slo;
    SweepJson {
        scenario: sweep.scenario.name.clone(),
        backend: sweep.backend.into(),
        device: crate::results::env::device_identity(&sweep.scenario),
        by,
        seeds: sweep.config.seeds.clone(),
        precision_pct: sweep.config.search.precision * 100.0,
        workload_hash: workload_hashes.first().cloned().unwrap_or_default(),
        workload_hashes,
        definition_hash: definition_hash(&sweep.scenario, by),
        slo: SloJson {
            ttft_p99_ms: slo.ttft_p99_ms,
            itl_p99_ms: slo.itl_p99_ms,
            attainment: Some(slo.attainment),
        },
        confidence: stats::CONFIDENCE,
        trim_share: TRIM_SHARE,
        max_extend: sweep.config.search.max_extend,
        base_requests: sweep.scenario.traffic.requests,
        runs: vec![
            run_json(by, "paged", caps.first().copied(), &paged),
            run_json(by, "contiguous", None, &contiguous),
        ],
        ratio_paged_over_contiguous: ratio,
        ratio_paged_over_contiguous_ci: ratio_ci,
        capacities,
        checks_ok: check_failures.is_empty(),
        check_failures,
    }
}
