//! The served run itself, on the engine thread: the scenario's cache mode on the `cpu` backend,
//! set up as a batch run sets up one mode, driven by the handlers' requests
//! ([`crate::engine::run_live`]), its events written into a staged results folder as they
//! happen. When the source shuts down, the end-of-run checks run and the folder — a normal
//! results folder of one mode, `summary.json` marked `served` — is put in place.

use std::sync::Arc;

use kvbench_cache_api::CacheMode;

use super::bridge::{self, ToEngine};
use super::metrics::Metrics;
use crate::backend::{self, BackendKind, Clock, RunSetup};
use crate::engine;
use crate::engine::sink::Tee;
use crate::experiment::{self, manager, tiers, Experiment, ModeRun, RunOptions, Setup};
use crate::metrics::accum::MetricsAccum;
use crate::results::sink::FileSink;
use crate::results::{Served, Staging};
use crate::scenario::Scenario;

/// What the engine thread needs.
pub struct Plan {
    pub scenario: Scenario,
    pub opts: RunOptions,
    pub setup: Setup,
    pub mode: CacheMode,
    pub address: String,
}

/// The engine itself failed (a backend error, a stall): a failed check, not bad input.
#[derive(Debug)]
pub struct EngineFailed(pub String);

impl std::fmt::Display for EngineFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EngineFailed {}

/// The served run's outcome.
pub struct Outcome {
    pub experiment: Experiment,
    pub failures: Vec<String>,
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Resolve the scenario on the `cpu` backend (refusing any other) with the measured clock.
pub fn plan(
    scenario: Scenario,
    mode: CacheMode,
    seed: Option<u64>,
    address: String,
) -> anyhow::Result<Plan> {
    let opts = RunOptions {
        backend: BackendKind::Cpu,
        seed,
        clock: Clock::Measured,
        ..RunOptions::default()
    };
    let setup = experiment::setup(&scenario, &opts).map_err(err)?;
    Ok(Plan {
        scenario,
        opts,
        setup,
        mode,
        address,
    })
}

/// Run the served engine until its source shuts down, then check and write the folder.
pub fn run(
    plan: Plan,
    staging: Staging,
    rx: std::sync::mpsc::Receiver<ToEngine>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<Outcome> {
    let Plan {
        scenario,
        opts,
        setup,
        mode,
        address,
    } = plan;
    let tier_plan = tiers::plan(&scenario, &setup, mode).map_err(err)?;
    let run_setup = RunSetup {
        model: setup.model.clone(),
        device: scenario.device.clone(),
        scenario_dir: setup.scenario_dir.clone(),
        cache_slots: setup.total_slots,
        block_size: scenario.block_size(),
        seed: setup.seed,
        max_step_tokens: setup.max_step_tokens,
        swap_gbytes_per_s: scenario.scheduler.swap_gbytes_per_s,
        workspace_bytes: setup.workspace_bytes,
        profile: None,
        clock: opts.clock,
        tiers: tier_plan.setup,
    };
    let mut be = backend::create(setup.kind, &run_setup).map_err(err)?;
    let spec = manager::spec(
        &scenario,
        &setup,
        mode,
        &tier_plan,
        scenario.scheduler.async_steps,
    );
    let mut cache = crate::cache::build(&spec);
    let cfg = experiment::engine_config(
        &scenario,
        &setup,
        &opts,
        mode,
        cache.block_size(),
        scenario.scheduler.clone(),
        None,
    );
    let results = |e: crate::results::ResultsError| anyhow::Error::new(e);
    let mut files = FileSink::create(staging.dir(), opts.trace_tokens, opts.memory_resolution)
        .map_err(results)?;
    let mut acc = MetricsAccum::new(&scenario.slo);
    let (mut source, mut forward) = bridge::pair(rx, metrics.clone());
    let (end, workload) = {
        let mut rest = Tee(&mut files, &mut forward);
        let mut sink = Tee(&mut acc, &mut rest);
        engine::run_live(&cfg, cache.as_mut(), be.as_mut(), &mut source, &mut sink)
            .map_err(|e| anyhow::Error::new(EngineFailed(format!("{} run: {e}", mode.name()))))?
    };
    let run_metrics = acc.finish(&end);
    let mode_files = files.end_mode().map_err(results)?;
    files.finish().map_err(results)?;
    let served = Served {
        address,
        requests: workload.requests.len() as u64,
        refused: metrics.refused_total(),
        client_cancels: source.client_cancels(),
        shutdown: if source.cut() { "cancelled" } else { "drained" },
    };
    let (prefix_bounds, prefix_ceiling) = experiment::prefix_bounds(&scenario, &setup, &workload);
    let measured_step_s = be.measured_step_s();
    let exp = Experiment {
        scenario,
        backend: be.name(),
        seed: setup.seed,
        workload,
        kv_bytes_per_token: setup.kv_bytes_per_token,
        kv_budget_bytes: setup.kv_budget_bytes,
        cache_manager: setup.cache_manager,
        slot_bytes: setup.slot_bytes,
        fault: None,
        shadow: false,
        runs: vec![ModeRun {
            end,
            record: None,
            metrics: run_metrics,
            fault_fired: 0,
            shadow: None,
            measured_step_s,
            files: mode_files,
        }],
        token_mismatch: None,
        memory_resolution: opts.memory_resolution,
        prefix_bounds,
        prefix_ceiling,
        served: Some(served),
    };
    crate::results::write_rest(&exp, staging.dir()).map_err(results)?;
    staging.commit().map_err(results)?;
    let failures = exp.failures();
    Ok(Outcome {
        experiment: exp,
        failures,
    })
}
