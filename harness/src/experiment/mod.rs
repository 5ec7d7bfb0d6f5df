//! Running an experiment: a scenario's workload through the paged cache and the contiguous
//! baseline on one backend, with metrics and the cross-mode checks — collected whole
//! ([`run_scenario`]) or streamed into a results folder as it runs ([`run_streaming`]). The
//! CLI, `suite`, `sweep`, `calibrate --check`, `fuzz` and the tests all come through here.
//!
//! This module sits above `engine` (which it drives) and `results` (whose writers it feeds);
//! `results` only writes and reads files, and [`Experiment`] is what its writers read.

pub mod fuzz;
pub mod host;
pub mod manager;
pub mod tiers;
pub mod tokens;

use kvbench_cache_api::{CacheMode, Fault};

use crate::backend::sim::profile::DeviceProfile;
use crate::backend::sim::SimBackend;
use crate::backend::{self, Backend, BackendKind, Clock, RunSetup};
use crate::engine::sink::{Collect, Tee};
use crate::engine::{self, EngineConfig, RunEnd, RunRecord, RunSink};
use crate::metrics;
use crate::metrics::accum::MetricsAccum;
use crate::metrics::timeline::Resolution;
use crate::results::sink::FileSink;
use crate::results::{ResultsError, Staging};
use crate::scenario::Scenario;
use crate::workload::{self, Workload};
use tokens::TokenCheck;

pub use crate::results::experiment::{Experiment, ModeRun};

#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    pub backend: BackendKind,
    /// Overrides the scenario's seed.
    pub seed: Option<u64>,
    /// Planted bug, armed on the paged manager.
    pub fault: Option<Fault>,
    pub trace_tokens: bool,
    /// `check_invariants` every n steps (1 = every step; 0 = only at the end).
    pub invariant_check_every: u32,
    /// Carry the shadow KV payload on `sim` (`--no-shadow` turns it off).
    pub shadow: bool,
    /// Measured or modelled step times on a computing backend (`--clock`).
    pub clock: Clock,
    /// A device profile that replaces the scenario's `device` (`calibrate --check`).
    pub profile: Option<DeviceProfile>,
    /// Time resolution of `memory.csv` and Perfetto's steps track (`--memory-resolution-ms`).
    pub memory_resolution: Resolution,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            backend: BackendKind::Sim,
            seed: None,
            fault: None,
            trace_tokens: true,
            invariant_check_every: 1,
            shadow: true,
            clock: Clock::Measured,
            profile: None,
            memory_resolution: Resolution::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("{0}")]
    Scenario(String),
    #[error(transparent)]
    Workload(#[from] workload::WorkloadError),
    #[error(transparent)]
    Backend(#[from] backend::BackendError),
    #[error("{mode} run: {source}")]
    Engine {
        mode: &'static str,
        source: engine::EngineError,
    },
    /// Writing a streaming run's files failed.
    #[error(transparent)]
    Results(Box<ResultsError>),
}

/// What both cache modes of one experiment share: sizes derived from the scenario and backend.
#[derive(Debug, Clone)]
pub struct Setup {
    pub kind: BackendKind,
    pub model: crate::model::ModelShape,
    pub seed: u64,
    pub scenario_dir: Option<std::path::PathBuf>,
    pub kv_bytes_per_token: u64,
    pub kv_budget_bytes: u64,
    /// Slots the managers account over, in units of `slot_bytes`.
    pub total_slots: u64,
    pub workspace_bytes: Option<u64>,
    /// The managers both modes run (`cache.manager` resolved).
    pub cache_manager: crate::scenario::CacheManager,
    /// Bytes one accounting slot stands for: `kv_bytes_per_token` for summed runs, a page's
    /// bytes ÷ the block size for hybrid ones.
    pub slot_bytes: u64,
    /// The grouped layout both modes of a hybrid run are built from.
    pub layout: Option<crate::cache::hybrid::HybridLayout>,
    /// The most tokens one step can hold (`engine::policy::max_step_tokens`).
    pub max_step_tokens: u32,
}

/// Resolve the model shape, the KV budget and the slot count of `scenario` on `opts.backend`.
pub fn setup(scenario: &Scenario, opts: &RunOptions) -> Result<Setup, ExperimentError> {
    let kind = opts.backend.resolve();
    let model = scenario.model_shape().ok_or_else(|| {
        ExperimentError::Scenario("model: unknown preset or incomplete shape".into())
    })?;
    if kind == BackendKind::Cpu {
        let hybrid = scenario.cache_manager(&model, crate::scenario::HybridSupport::Explicit)
            == crate::scenario::CacheManager::Hybrid;
        if let Some(why) = crate::backend::cpu::prefix_cache_refusal(
            &model,
            scenario.scheduler.prefix_cache,
            hybrid,
        ) {
            let key = "scheduler.prefix_cache";
            let at = crate::scenario::locate_in_source(scenario.source.as_deref(), key, why);
            return Err(ExperimentError::Scenario(at.to_string()));
        }
    }
    let seed = opts.seed.unwrap_or(scenario.seed);
    let scenario_dir = scenario
        .source
        .as_deref()
        .and_then(|p| p.parent())
        .map(|p| p.to_path_buf());
    let device_memory = match (kind, &opts.profile) {
        (BackendKind::Sim, Some(p)) => Some(p.memory_bytes),
        (BackendKind::Sim, None) => {
            Some(DeviceProfile::load(&scenario.device, scenario_dir.as_deref())?.memory_bytes)
        }
        (_, _) => crate::scenario::device_memory_bytes(kind.name()),
    };
    let kv_budget_bytes = scenario
        .kv_budget_bytes(device_memory)
        .map_err(|e| ExperimentError::Scenario(e.to_string()))?;
    let kv_bytes_per_token = model.kv_bytes_per_token();
    // FP8 scales per tensor or per head do not grow with tokens: they come off the budget before
    // it is divided into slots (per-block scales are inside the per-token figure).
    let scale_fixed_bytes = model.kv_scale_fixed_bytes().unwrap_or(0);
    let managers = manager::resolve(
        scenario,
        &model,
        kind,
        kv_budget_bytes.saturating_sub(scale_fixed_bytes),
    )?;
    let max_step_tokens = crate::engine::policy::max_step_tokens(
        scenario.scheduler.policy,
        scenario.scheduler.max_tokens_per_step,
        scenario.cache.max_seq_len,
    );
    if let Some(layout) = &managers.layout {
        let ring_tokens = manager::ring_tokens(max_step_tokens, scenario.scheduler.async_steps);
        let pool_bytes = kv_budget_bytes.saturating_sub(scale_fixed_bytes);
        scenario
            .check_grouped_budget(&model, layout, pool_bytes, ring_tokens)
            .map_err(|d| ExperimentError::Scenario(d.to_string()))?;
    }
    // A GPU this machine lacks is said before any estimate of what the run would need.
    if kind == BackendKind::Cuda {
        crate::backend::cuda::check_available()?;
    }
    // Before any backend allocates: what it holds in host memory, with the engine's share.
    host::check(
        scenario,
        kind,
        &model,
        managers.total_slots,
        max_step_tokens,
    )
    .map_err(|d| ExperimentError::Scenario(d.to_string()))?;
    let workspace_bytes = match &scenario.memory.workspace {
        Some(w) => Some(
            crate::units::parse_bytes(w)
                .map_err(|e| ExperimentError::Scenario(format!("memory.workspace: {e}")))?,
        ),
        None => None,
    };
    Ok(Setup {
        kind,
        model,
        seed,
        scenario_dir,
        kv_bytes_per_token,
        kv_budget_bytes,
        total_slots: managers.total_slots,
        workspace_bytes,
        cache_manager: managers.manager,
        slot_bytes: managers.slot_bytes,
        layout: managers.layout,
        max_step_tokens,
    })
}

/// A backend's refusal of the scenario's configuration placed in the scenario's file, as the
/// scenario's own errors are: `FILE:LINE:COL: KEY: message`, the key the message names (a
/// message that starts with `model.kv_dtype: ...`) or the one it is about (tier sizes, KV
/// storage, the model's shape). Other backend errors pass through.
fn located_backend_error(scenario: &Scenario, e: backend::BackendError) -> ExperimentError {
    let backend::BackendError::Config(message) = e else {
        return ExperimentError::Backend(e);
    };
    let (key, message) = backend_config_key(&message);
    let d = crate::scenario::locate_in_source(scenario.source.as_deref(), &key, message);
    ExperimentError::Scenario(d.to_string())
}

/// The scenario key a backend's configuration message is about, and the message without a
/// key it already starts with.
fn backend_config_key(message: &str) -> (String, String) {
    let keyed = ["model.", "cache.", "memory.", "scheduler.", "device:"];
    if keyed.iter().any(|k| message.starts_with(k)) {
        // `model.layer_groups.0 (attention = "mla"): ...` or `model.kv_dtype: ...`.
        let end = message
            .find([':', ' '])
            .unwrap_or(message.len())
            .min(message.len());
        let key = message[..end].trim_end_matches(':').to_string();
        let rest = message[end..]
            .trim_start_matches(':')
            .trim_start()
            .to_string();
        let rest = if rest.starts_with('(') {
            message.to_string()
        } else {
            rest
        };
        return (key, rest);
    }
    let lower = message.to_lowercase();
    let key = if lower.contains("disk tier") {
        "cache.disk_tier.capacity"
    } else if lower.contains("tier") {
        "cache.host_tier.capacity"
    } else if lower.contains("kv storage") || lower.contains("cache slots") {
        "memory.kv_budget"
    } else if lower.contains("tp =") {
        "model.tp"
    } else if lower.contains("stores kv") {
        "model.kv_dtype"
    } else if lower.contains("stores weights") {
        "model.weight_dtype"
    } else {
        "model"
    };
    (key.to_string(), message.to_string())
}

/// What one mode's run returns besides what it handed its sink.
struct ModeParts {
    end: RunEnd,
    fault_fired: u64,
    shadow: Option<crate::shadow::ShadowReport>,
    measured_step_s: Option<f64>,
    backend_name: &'static str,
}

/// Run `workload` through one cache mode, collecting everything (the collect path); returns the
/// run and the backend's name.
pub fn run_mode(
    scenario: &Scenario,
    setup: &Setup,
    workload: &Workload,
    opts: &RunOptions,
    mode: CacheMode,
) -> Result<(ModeRun, &'static str), ExperimentError> {
    let mut collect = Collect::default();
    let p = run_mode_with(scenario, setup, workload, opts, mode, &mut collect)?;
    let record = collect.into_record(p.end.clone());
    let metrics = metrics::compute(&record, &scenario.slo);
    let files = crate::results::sink::mode_files(&record, opts.memory_resolution);
    let run = ModeRun {
        end: p.end,
        record: Some(record),
        metrics,
        fault_fired: p.fault_fired,
        shadow: p.shadow,
        measured_step_s: p.measured_step_s,
        files,
    };
    Ok((run, p.backend_name))
}

/// Run `workload` through one cache mode, handing what happens to `sink`.
fn run_mode_with(
    scenario: &Scenario,
    setup: &Setup,
    workload: &Workload,
    opts: &RunOptions,
    mode: CacheMode,
    sink: &mut dyn RunSink,
) -> Result<ModeParts, ExperimentError> {
    let block_size = scenario.block_size();
    let tier_plan = tiers::plan(scenario, setup, mode)?;
    let run_setup = RunSetup {
        model: setup.model.clone(),
        device: scenario.device.clone(),
        scenario_dir: setup.scenario_dir.clone(),
        cache_slots: setup.total_slots,
        block_size,
        seed: setup.seed,
        max_step_tokens: setup.max_step_tokens,
        swap_gbytes_per_s: scenario.scheduler.swap_gbytes_per_s,
        workspace_bytes: setup.workspace_bytes,
        profile: opts.profile.clone(),
        clock: opts.clock,
        tiers: tier_plan.setup,
    };
    // `sim` is kept concrete so its shadow report can be read after the run.
    let mut sim: Option<SimBackend> = None;
    let mut other: Option<Box<dyn Backend>> = None;
    let located = |e| located_backend_error(scenario, e);
    let be: &mut dyn Backend = if setup.kind == BackendKind::Sim {
        let b = SimBackend::new(&run_setup).map_err(located)?;
        sim.insert(if opts.shadow {
            b.with_shadow().map_err(located)?
        } else {
            b
        })
    } else {
        other
            .insert(backend::create(setup.kind, &run_setup).map_err(located)?)
            .as_mut()
    };
    let backend_name = be.name();
    let mut scheduler = scenario.scheduler.clone();
    // Early reuse only shows while a step is in flight at release time: pipeline the steps.
    if opts.fault == Some(Fault::EarlyReuse) {
        scheduler.async_steps = true;
    }
    let spec = manager::spec(scenario, setup, mode, &tier_plan, scheduler.async_steps);
    let mut cache = crate::cache::build(&spec);
    let fault = if mode == CacheMode::Paged {
        opts.fault
    } else {
        None
    };
    let cfg = engine_config(
        scenario,
        setup,
        opts,
        mode,
        cache.block_size(),
        scheduler,
        fault,
    );
    let end = engine::run_with(&cfg, workload, cache.as_mut(), be, sink).map_err(|source| {
        ExperimentError::Engine {
            mode: mode.name(),
            source,
        }
    })?;
    let measured_step_s = be.measured_step_s();
    Ok(ModeParts {
        end,
        fault_fired: cache.fault_fired(),
        shadow: sim.as_ref().and_then(SimBackend::shadow_report),
        measured_step_s,
        backend_name,
    })
}

/// Run `scenario` in both cache modes.
pub fn run_scenario(scenario: &Scenario, opts: &RunOptions) -> Result<Experiment, ExperimentError> {
    let setup = setup(scenario, opts)?;
    let workload = workload::generate(scenario, setup.seed)?;
    let mut runs = Vec::new();
    let mut backend_name = setup.kind.name();
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let (run, name) = run_mode(scenario, &setup, &workload, opts, mode)?;
        backend_name = name;
        runs.push(run);
    }
    let token_mismatch = match (&runs[0].record, &runs[1].record) {
        (Some(a), Some(b)) if a.end.computes && b.end.computes => compare_tokens(a, b),
        _ => None,
    };
    Ok(assemble(
        scenario,
        &setup,
        opts,
        workload,
        backend_name,
        runs,
        token_mismatch,
    ))
}

/// Run `scenario` in both cache modes, streaming: each mode's events go to `files` and to the
/// metrics accumulators as they happen, and nothing per stream outlives its request (the
/// returned runs have no `record`). Token streams are compared across modes on computing
/// backends (holding the paged run's token ids until the contiguous run's streams match them).
pub fn run_scenario_streaming(
    scenario: &Scenario,
    opts: &RunOptions,
    files: &mut FileSink,
) -> Result<Experiment, ExperimentError> {
    let setup = setup(scenario, opts)?;
    let workload = workload::generate(scenario, setup.seed)?;
    let mut runs = Vec::new();
    let mut backend_name = setup.kind.name();
    let mut tokens = TokenCheck::default();
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let mut acc = MetricsAccum::new(&scenario.slo);
        let p = {
            let mut rest = Tee(files, &mut tokens);
            let mut sink = Tee(&mut acc, &mut rest);
            run_mode_with(scenario, &setup, &workload, opts, mode, &mut sink)?
        };
        let metrics = acc.finish(&p.end);
        let mode_files = files
            .end_mode()
            .map_err(|e| ExperimentError::Results(Box::new(e)))?;
        backend_name = p.backend_name;
        runs.push(ModeRun {
            end: p.end,
            record: None,
            metrics,
            fault_fired: p.fault_fired,
            shadow: p.shadow,
            measured_step_s: p.measured_step_s,
            files: mode_files,
        });
    }
    let token_mismatch = tokens.mismatch();
    Ok(assemble(
        scenario,
        &setup,
        opts,
        workload,
        backend_name,
        runs,
        token_mismatch,
    ))
}

/// Run `scenario` in both modes, streaming its data files into `staging` as it goes, then write
/// the rest (summary, report, environment, HTML page) and put the folder in place. A failed run
/// drops `staging`, which removes the temporary folder.
pub fn run_streaming(
    scenario: &Scenario,
    opts: &RunOptions,
    staging: Staging,
) -> Result<Experiment, ExperimentError> {
    let results = |e: ResultsError| ExperimentError::Results(Box::new(e));
    // A scenario the set-up refuses (a manager the backend cannot run) creates no file.
    setup(scenario, opts)?;
    let mut files = FileSink::create(staging.dir(), opts.trace_tokens, opts.memory_resolution)
        .map_err(results)?;
    let exp = run_scenario_streaming(scenario, opts, &mut files)?;
    files.finish().map_err(results)?;
    crate::results::write_rest(&exp, staging.dir()).map_err(results)?;
    staging.commit().map_err(results)?;
    Ok(exp)
}

/// The experiment of both modes' runs, collected or streamed alike.
fn assemble(
    scenario: &Scenario,
    setup: &Setup,
    opts: &RunOptions,
    workload: Workload,
    backend: &'static str,
    runs: Vec<ModeRun>,
    token_mismatch: Option<String>,
) -> Experiment {
    let (prefix_bounds, prefix_ceiling) = prefix_bounds(scenario, setup, &workload);
    Experiment {
        scenario: scenario.clone(),
        backend,
        seed: setup.seed,
        workload,
        kv_bytes_per_token: setup.kv_bytes_per_token,
        kv_budget_bytes: setup.kv_budget_bytes,
        cache_manager: setup.cache_manager,
        slot_bytes: setup.slot_bytes,
        fault: opts.fault,
        shadow: setup.kind == BackendKind::Sim && opts.shadow,
        runs,
        token_mismatch,
        memory_resolution: opts.memory_resolution,
        prefix_bounds,
        prefix_ceiling,
        served: None,
    }
}

/// The engine's configuration for one mode of `scenario`: a batch run's and a served run's
/// alike (the scheduler as the caller adjusted it, the fault the caller plants).
pub fn engine_config(
    scenario: &Scenario,
    setup: &Setup,
    opts: &RunOptions,
    mode: CacheMode,
    block_size: u32,
    scheduler: crate::scenario::SchedulerSpec,
    fault: Option<Fault>,
) -> EngineConfig {
    EngineConfig {
        mode,
        block_size,
        kv_bytes_per_token: setup.kv_bytes_per_token,
        slot_bytes: setup.slot_bytes,
        max_seq_len: scenario.cache.max_seq_len,
        reservation: scenario.cache.contiguous_reservation,
        scheduler,
        model_name: setup.model.name.clone(),
        trace_tokens: opts.trace_tokens,
        invariant_check_every: opts.invariant_check_every,
        fault,
    }
}

/// What a run's prefix hit share is read against, for [`Experiment`]'s `prefix_bounds` and
/// `prefix_ceiling`: the bounds at the pool's capacity (device and lower tiers), and on the
/// hybrid manager, which they do not bound, the ceiling alone. Batch and served runs alike.
pub fn prefix_bounds(
    scenario: &Scenario,
    setup: &Setup,
    workload: &Workload,
) -> (
    Result<crate::metrics::prefix_bounds::PrefixBounds, String>,
    Option<crate::metrics::prefix_bounds::PrefixCeiling>,
) {
    let (host_blocks, disk_blocks) = scenario.tier_slots(&setup.model);
    let bounds = crate::metrics::prefix_bounds::compute(
        scenario,
        workload,
        setup.cache_manager,
        setup.total_slots,
        host_blocks.saturating_add(disk_blocks),
    );
    let ceiling = (setup.cache_manager == crate::scenario::CacheManager::Hybrid)
        .then(|| crate::metrics::prefix_bounds::ceiling(scenario, workload).ok())
        .flatten();
    (bounds, ceiling)
}

/// Greedy decoding is deterministic, so every stream's tokens must agree between the modes over
/// the prefix both emitted (cancellation can cut one mode's stream shorter).
pub fn compare_tokens(a: &RunRecord, b: &RunRecord) -> Option<String> {
    let mut by_key = std::collections::BTreeMap::new();
    for s in &b.streams {
        by_key.insert((s.request, s.rank), s);
    }
    for s in &a.streams {
        let Some(o) = by_key.get(&(s.request, s.rank)) else {
            continue;
        };
        let n = s.token_ids.len().min(o.token_ids.len());
        if let Some(i) = (0..n).find(|&i| s.token_ids[i] != o.token_ids[i]) {
            return Some(format!(
                "request {} at output token {i}: {} vs {}",
                s.request_label(),
                s.token_ids[i],
                o.token_ids[i]
            ));
        }
    }
    None
}
