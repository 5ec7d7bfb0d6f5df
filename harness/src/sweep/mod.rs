//! `kvbench sweep`: throughput at a stated latency target. For each cache mode and seed, a
//! search ([`search`]) finds the highest load at which the scenario's `[slo]` holds, each probe
//! judged with an interval ([`verdict`], [`stats`]) over a trimmed window ([`window`]); the
//! searches run in parallel (rayon). [`aggregate`] turns them into `sweep.json` and `sweep.md`
//! ([`write`]). A scenario listing several host-tier capacities is searched once per capacity
//! for the paged cache (the contiguous baseline has no tier: one search serves them all).

pub mod aggregate;
pub mod load;
pub mod probe;
pub mod search;
pub mod verdict;
pub mod window;
pub mod write;

use std::path::Path;

use kvbench_cache_api::CacheMode;
use rayon::prelude::*;

pub use load::By;
pub use search::{SearchConfig, SeedSearch};

use crate::experiment::{ExperimentError, RunOptions};
use crate::scenario::Scenario;
use crate::scenario::SourceMap;
use crate::stats;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// Bad input, already formatted `FILE:LINE:COL: KEY: message` (exit 2).
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Experiment(ExperimentError),
}

impl SweepError {
    /// An input error at `key` of `s`, located in its file where it has one.
    pub fn input(s: &Scenario, key: &str, message: &str) -> SweepError {
        let place = s.source.as_deref().and_then(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            let map = SourceMap::parse(&text).ok()?;
            let (line, col) = map.position_of(key);
            Some(format!("{}:{line}:{col}: ", p.display()))
        });
        SweepError::Input(format!("{}{key}: {message}", place.unwrap_or_default()))
    }

    pub fn experiment(e: ExperimentError) -> SweepError {
        SweepError::Experiment(e)
    }

    /// 1 when a run itself failed (the engine stopped), 2 for bad input.
    pub fn exit_code(&self) -> u8 {
        match self {
            SweepError::Experiment(ExperimentError::Engine { .. }) => 1,
            _ => 2,
        }
    }
}

/// What one sweep does besides the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    pub search: SearchConfig,
    /// Seeds searched (each a separate workload draw).
    pub seeds: Vec<u64>,
    /// Backend, invariant-check cadence and so on; the seed is set per search.
    pub opts: RunOptions,
}

/// Every search of one scenario: both cache modes × every seed.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub scenario: Scenario,
    pub backend: &'static str,
    pub config: SweepConfig,
    /// The base load's workload hash on each seed, in `config.seeds` order.
    pub workload_hashes: Vec<String>,
    pub searches: Vec<SeedSearch>,
}

/// Refuse a scenario the sweep cannot judge, before any work: no latency target, an arrival kind
/// the axis cannot scale, or too few requests for any p99 claim even at the longest rerun.
pub fn check(s: &Scenario, by: By, max_extend: u32) -> Result<(), SweepError> {
    if s.slo.ttft_p99_ms.is_none() && s.slo.itl_p99_ms.is_none() {
        return Err(SweepError::input(
            s,
            "slo",
            "a sweep needs a latency target: set slo.ttft_p99_ms and/or slo.itl_p99_ms \
             (slo.attainment then applies to requests meeting them)",
        ));
    }
    load::base_load(s, by)?;
    check_host_memory(s, max_extend)?;
    if let Some(n) = s.traffic.requests {
        let floor = stats::p99_claim_floor(0);
        let longest = u64::from(n) * u64::from(max_extend);
        let kept = longest - 2 * (longest as f64 * window::TRIM_SHARE).floor() as u64;
        if kept < floor {
            return Err(SweepError::input(
                s,
                "traffic.requests",
                &format!(
                    "{n} requests (x{max_extend} at most, --max-extend) keep {kept} in the window \
                     after the {}% trims: a p99 claim needs at least {floor} (MLPerf's floor); \
                     raise traffic.requests or --max-extend",
                    window::TRIM_SHARE * 100.0
                ),
            ));
        }
    }
    Ok(())
}

/// A probe collects one cache mode's whole record (its window trim reads every stream), up to
/// `max_extend` times the scenario's requests, one probe per rayon thread at once: refuse a sweep
/// whose probes would not fit where `run` (which streams) would.
fn check_host_memory(s: &Scenario, max_extend: u32) -> Result<(), SweepError> {
    let (Some(shape), Some((available, source))) =
        (s.model_shape(), crate::scenario::host_available_bytes())
    else {
        return Ok(());
    };
    let Some(mut need) = s.host_need(&shape) else {
        return Ok(());
    };
    need.requests = need.requests.saturating_mul(u64::from(max_extend.max(1)));
    let parallel = rayon::current_num_threads().max(1) as u64;
    let bytes = need.collected_bytes().saturating_mul(parallel);
    if bytes <= available {
        return Ok(());
    }
    Err(SweepError::input(
        s,
        "traffic.requests",
        &format!(
            "a sweep's probes keep their whole records: {parallel} at once of up to {} requests \
             need about {} of host memory, and {} is available ({source}); lower \
             traffic.requests or --max-extend",
            need.requests,
            crate::units::format_bytes(bytes),
            crate::units::format_bytes(available)
        ),
    ))
}

/// Sweep `s`: both cache modes on every seed, the searches in parallel.
pub fn run(s: &Scenario, config: &SweepConfig) -> Result<Sweep, SweepError> {
    check(s, config.search.by, config.search.max_extend)?;
    let workload_hashes = config
        .seeds
        .iter()
        .map(|&seed| {
            crate::workload::generate(s, seed)
                .map(|w| w.workload_hash)
                .map_err(|e| SweepError::Experiment(ExperimentError::Workload(e)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Paged once per listed capacity (capacities outer, then seeds), then contiguous.
    let variants = host_tier_variants(s);
    let mut cells: Vec<(CacheMode, Option<String>, &Scenario, u64)> = Vec::new();
    for (cap, v) in &variants {
        for &seed in &config.seeds {
            cells.push((CacheMode::Paged, cap.clone(), v, seed));
        }
    }
    for &seed in &config.seeds {
        cells.push((CacheMode::Contiguous, None, s, seed));
    }
    let searches: Vec<SeedSearch> = cells
        .par_iter()
        .map(|(mode, cap, v, seed)| {
            let opts = RunOptions {
                seed: Some(*seed),
                ..config.opts.clone()
            };
            search::search(v, &config.search, *mode, &opts).map(|mut x| {
                x.host_tier = cap.clone();
                x
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Sweep {
        scenario: s.clone(),
        backend: config.opts.backend.resolve().name(),
        config: config.clone(),
        workload_hashes,
        searches,
    })
}

/// The host-tier capacities `s` lists when it lists several (as written), else empty: a scenario
/// with one capacity or none sweeps as it always did.
pub fn host_tier_capacities(s: &Scenario) -> Vec<String> {
    match s.cache.host_tier.as_ref().map(|h| h.capacity.as_slice()) {
        Some(caps) if caps.len() > 1 => caps.to_vec(),
        _ => Vec::new(),
    }
}

/// The scenario at each capacity it lists (`(Some(capacity), scenario at it)`), or itself alone
/// (`None`) when it lists one or none. Every listed capacity was checked when the scenario
/// loaded.
fn host_tier_variants(s: &Scenario) -> Vec<(Option<String>, Scenario)> {
    let caps = host_tier_capacities(s);
    if caps.is_empty() {
        return vec![(None, s.clone())];
    }
    caps.into_iter()
        .map(|c| {
            let mut v = s.clone();
            if let Some(h) = v.cache.host_tier.as_mut() {
                h.capacity = crate::scenario::Capacities::One(c.clone());
            }
            (Some(c), v)
        })
        .collect()
}

/// Write `sweep.json` and `sweep.md` of `sweep` into `out` (atomically: a temporary folder
/// renamed into place; an existing folder is replaced only with `force`).
pub fn write(sweep: &Sweep, out: &Path, force: bool) -> Result<aggregate::SweepJson, String> {
    let json = aggregate::build(sweep);
    write::write_folder(&json, out, force)?;
    Ok(json)
}
