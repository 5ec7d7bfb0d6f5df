//! `kvbench run SCENARIO...`: run each scenario with the paged cache and the contiguous baseline
//! on the same request list, print the side-by-side table, write the results folder. Exit 1 when
//! a check fails (invariants, reclamation, numerics, paged-vs-contiguous tokens, a planted fault
//! caught), 2 on bad input.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use kvbench_cache_api::Fault;

use crate::backend::BackendKind;
use crate::cli::progress::Progress;
use crate::cli::ExitStatus;
use crate::experiment::{self, Experiment, RunOptions};
use crate::results;
use crate::scenario::{self, Scenario};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceLevel {
    /// Lifecycle events and first tokens only (for very large runs).
    Requests,
    /// Every output token and prefill chunk too.
    Tokens,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario files.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Output folder (default results/latest/<scenario-name>, or results/fault-<KIND>/<name> with
    /// --inject-fault; with several scenarios, DIR/<name>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace an existing results folder at --out (folders under the default results/latest are
    /// replaced without it). Only a results folder (one holding summary.json) or an empty folder
    /// is ever replaced: never a file or other data.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub flags: RunFlags,
    #[command(flatten)]
    pub trace: crate::cli::trace_cmd::TraceFlags,
    #[command(flatten)]
    pub endpoint: crate::cli::endpoint::EndpointFlags,
}

/// How each scenario runs; shared by `run` and `suite`.
#[derive(clap::Args, Debug)]
pub struct RunFlags {
    /// Where steps run: auto = cuda where it is built and usable on this machine, else cpu (saying
    /// why on stderr); sim = the cost model.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendKind,
    /// On cuda-emu: seed of the emulated device's completion delays (printed; replays a run).
    #[arg(long, value_name = "SEED")]
    pub emu_seed: Option<u64>,
    /// On cuda-emu: make `cuMemGetInfo` move as a driver's does (a reserve growing at each
    /// kernel's first launch, cuBLAS's workspace, another process allocating mid-run), seeded.
    #[arg(long, value_name = "SEED")]
    pub emu_driver_noise: Option<u64>,
    /// On cuda-emu: the driver version the device reports; entry points it lacks are hidden
    /// (12.4 times events with cuEventElapsedTime instead of cuEventElapsedTime_v2).
    #[arg(long, value_name = "VERSION", value_parser = ["12.4", "12.8", "13.0"])]
    pub emu_driver: Option<String>,
    /// Seed of the workload (and model weights), overriding the scenario's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override a scenario key, e.g. `--set traffic.requests=100` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Plant a bug in the paged manager to prove the checks catch it:
    /// skip-cow | early-reuse | leak | bad-block-table; or device-leak (cuda, cuda-emu: one KV
    /// block of device memory allocated and never freed).
    #[arg(long, value_name = "KIND")]
    pub inject_fault: Option<String>,
    /// What trace.jsonl records: `run` defaults to tokens, `suite` to requests (a whole suite
    /// at token level writes about a gigabyte).
    #[arg(long, value_enum)]
    pub trace_level: Option<TraceLevel>,
    /// Check cache invariants every N steps (0: only after the run).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub check_every: u32,
    /// On sim: do not carry the shadow KV payload that checks every read (summary.json says so).
    #[arg(long)]
    pub no_shadow: bool,
    /// On cpu: advance the clock by each step's measured time, or by the device profile's cost
    /// model (real, checked math; the same schedule on every machine and under any load).
    #[arg(long, value_enum, default_value = "measured")]
    pub clock: crate::backend::Clock,
    /// Time resolution of memory.csv and Perfetto's steps track, ms (0: every step). Default:
    /// every step up to 100,000 rows a mode, then the power-of-two multiple of 1 ms that keeps
    /// them under it; each row holds its interval's maxima, summary.json states the resolution.
    #[arg(long, value_name = "MS")]
    pub memory_resolution_ms: Option<f64>,
}

impl RunFlags {
    /// `run`'s options: every token traced unless `--trace-level requests`.
    pub fn options(&self) -> anyhow::Result<RunOptions> {
        self.options_at(TraceLevel::Tokens)
    }

    /// The options with `level` as the trace level when `--trace-level` is not given.
    pub fn options_at(&self, level: TraceLevel) -> anyhow::Result<RunOptions> {
        if let Some(seed) = self.emu_seed {
            crate::backend::cuda::set_emu_seed(seed);
        }
        crate::backend::cuda::set_emu_driver(crate::backend::cuda::EmuDriver {
            version: self
                .emu_driver
                .as_deref()
                .map_or(Some(13000), kvbench_cuda::runtime::entry::parse_version)
                .ok_or_else(|| anyhow::anyhow!("--emu-driver: expected MAJOR.MINOR"))?,
            noise_seed: self.emu_driver_noise,
        });
        let device_leak = self.inject_fault.as_deref() == Some(DEVICE_LEAK);
        if device_leak
            && !matches!(
                self.backend.resolve(),
                BackendKind::Cuda | BackendKind::CudaEmu
            )
        {
            anyhow::bail!(
                "--inject-fault {DEVICE_LEAK} plants a leak in the cuda backend's device memory: \
                 use it with --backend cuda or cuda-emu"
            );
        }
        crate::backend::cuda::set_device_leak(device_leak);
        Ok(RunOptions {
            backend: self.backend,
            seed: self.seed,
            fault: if device_leak {
                None
            } else {
                parse_fault(self.inject_fault.as_deref())?
            },
            trace_tokens: self.trace_level.unwrap_or(level) == TraceLevel::Tokens,
            invariant_check_every: self.check_every,
            shadow: !self.no_shadow,
            clock: self.clock,
            profile: None,
            memory_resolution: match self.memory_resolution_ms {
                None => crate::metrics::timeline::Resolution::default(),
                Some(ms) => crate::metrics::timeline::Resolution::from_ms(ms).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--memory-resolution-ms: {ms} is not a duration (0 or a positive number of ms)"
                    )
                })?,
            },
        })
    }
}

/// The planted fault that lives in the cuda backend, not in a cache manager.
pub const DEVICE_LEAK: &str = "device-leak";

pub fn parse_fault(s: Option<&str>) -> anyhow::Result<Option<Fault>> {
    s.map(|k| {
        Fault::parse(k).ok_or_else(|| {
            // `stale-onload` needs a scenario with a lower tier, so it is not in `Fault::ALL`
            // (the faults every scenario must catch), but it is a known fault.
            let known: Vec<_> = Fault::ALL
                .iter()
                .chain(&[Fault::StaleOnload, Fault::CheckpointOffByOne])
                .map(|f| f.name())
                .collect();
            anyhow::anyhow!(
                "--inject-fault: unknown fault {k:?} (known: {}, {DEVICE_LEAK})",
                known.join(", ")
            )
        })
    })
    .transpose()
}

pub fn load_all(paths: &[PathBuf], overrides: &[String]) -> anyhow::Result<Vec<Scenario>> {
    paths
        .iter()
        .map(|p| scenario::load(p, overrides).map_err(|e| anyhow::anyhow!("{e}")))
        .collect()
}

/// A planted fault that a scenario cannot exercise is refused before any work: the run could
/// only end in "the fault never fired" (exit 1), which reads as a verifier that missed it.
/// `stale-onload` reuses a host-tier slot under a pending onload, so it needs a host tier.
pub fn check_fault_applies(scenarios: &[Scenario], fault: Option<Fault>) -> anyhow::Result<()> {
    if fault != Some(Fault::StaleOnload) {
        return Ok(());
    }
    if let Some(s) = scenarios.iter().find(|s| s.cache.host_tier.is_none()) {
        anyhow::bail!(
            "{}: cache.host_tier: --inject-fault stale-onload plants a bug in the host tier's \
             slot reuse, and this scenario has no [cache.host_tier], so it could never fire; \
             use a scenario with a lower tier (e.g. scenarios/conversation-tiered-8b-h200.toml)",
            s.source
                .as_ref()
                .map_or_else(|| s.name.clone(), |p| p.display().to_string())
        );
    }
    Ok(())
}

/// Where a scenario's results go by default: `results/latest/<name>`, or with a planted fault
/// `results/fault-<kind>/<name>`, so a self-test never replaces the latest real results. Both are
/// kvbench's own folders: results there are replaced by the next run.
pub fn default_root(fault: Option<Fault>) -> PathBuf {
    match fault {
        None => PathBuf::from("results/latest"),
        Some(f) => PathBuf::from(format!("results/fault-{}", f.name())),
    }
}

/// The folder each scenario writes, checked before any scenario runs: a bad name, a target that
/// is a file or not a results folder, or two scenarios sharing one folder are refused up front.
pub fn plan_targets(
    scenarios: &[Scenario],
    folder: impl Fn(&Scenario) -> Result<PathBuf, results::ResultsError>,
    replace: bool,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut seen = std::collections::BTreeMap::new();
    let mut out = Vec::with_capacity(scenarios.len());
    for s in scenarios {
        let dir = folder(s).with_context(|| scenario_origin(s))?;
        if let Some(other) = seen.insert(dir.clone(), s.name.clone()) {
            anyhow::bail!(
                "{}: scenarios {other:?} and {:?} would both write this folder",
                dir.display(),
                s.name
            );
        }
        results::check_target(&dir, results::marker::Kind::Run, replace)?;
        out.push(dir);
    }
    Ok(out)
}

fn scenario_origin(s: &Scenario) -> String {
    match &s.source {
        Some(p) => format!("{}: name", p.display()),
        None => "name".into(),
    }
}

/// Run one scenario and write its folder (staged before the run, so an unwritable target costs
/// no work). Returns the experiment and the check failures.
pub fn run_one(
    s: &Scenario,
    opts: &RunOptions,
    out: &Path,
    replace: bool,
) -> anyhow::Result<(Experiment, Vec<String>)> {
    let staging = results::Staging::begin(out, results::marker::Kind::Run, replace)?;
    let exp = experiment::run_streaming(s, opts, staging).map_err(|e| match e {
        experiment::ExperimentError::Engine { .. } => anyhow::Error::new(e).context(ExitStatus(1)),
        other => anyhow::Error::new(other),
    })?;
    let failures = exp.failures();
    Ok((exp, failures))
}

/// One line on a planted fault: whether it fired and which checks caught it (`scripts/gpu-check.sh`
/// attributes a fault step's failure by this line, never by the exit code alone).
pub fn fault_verdict(exp: &Experiment, failures: &[String], asked: Option<&str>) -> Option<String> {
    let name = asked?;
    let fired = if name == DEVICE_LEAK {
        exp.runs
            .iter()
            .filter(|r| {
                r.end
                    .device
                    .as_ref()
                    .is_some_and(|d| d.planted_leak_bytes.is_some())
            })
            .count() as u64
    } else {
        exp.fault_fired()
    };
    // The "never fired" failure is the check that the fault ran; it catches nothing.
    let caught: Vec<&str> = failures
        .iter()
        .map(String::as_str)
        .filter(|f| !f.contains("never fired"))
        .collect();
    Some(if fired == 0 {
        format!("planted fault `{name}` did not fire")
    } else if caught.is_empty() {
        format!("planted fault `{name}` fired {fired} times and was NOT caught")
    } else {
        format!(
            "planted fault `{name}` fired {fired} times, caught: {}",
            caught.join("; ")
        )
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = args.flags.options()?;
    let mut scenarios = load_all(&args.scenarios, &args.flags.overrides)?;
    for s in &mut scenarios {
        args.trace.apply(s)?;
    }
    if args.endpoint.endpoint.is_some() {
        return run_endpoint(&args, &opts, &scenarios);
    }
    check_fault_applies(&scenarios, opts.fault)?;
    let single = scenarios.len() == 1;
    let root = if args.flags.inject_fault.as_deref() == Some(DEVICE_LEAK) {
        PathBuf::from(format!("results/fault-{DEVICE_LEAK}"))
    } else {
        default_root(opts.fault)
    };
    // The default folders are kvbench's own; a folder named with --out is the user's.
    let replace = args.out.is_none() || args.force;
    let targets = plan_targets(
        &scenarios,
        |s| match &args.out {
            Some(d) if single => Ok(d.clone()),
            Some(d) => results::scenario_folder(d, &s.name),
            None => results::scenario_folder(&root, &s.name),
        },
        replace,
    )?;
    let progress = Progress::new(scenarios.len());
    let mut failed = false;
    for (s, out) in scenarios.iter().zip(&targets) {
        progress.start(&format!("{} on {}", s.name, opts.backend.resolve().name()));
        let t0 = Instant::now();
        let (exp, failures) = run_one(s, &opts, out, replace)?;
        let wall = t0.elapsed().as_secs_f64();
        let mut text = format!("{}\n", results::report::markdown(&exp));
        for r in &exp.runs {
            let per_seq_step_us = if r.end.seq_steps > 0 {
                1e6 * r.end.host_overhead_s / r.end.seq_steps as f64
            } else {
                0.0
            };
            text.push_str(&format!(
                "{}: {} steps, {} sequence-steps, scheduler+admission+cache {:.3} us per running sequence per step; {} stream states held at most for {} streams\n",
                r.end.mode.name(),
                r.end.steps,
                r.end.seq_steps,
                per_seq_step_us,
                r.end.peak_live_streams,
                r.end.streams
            ));
        }
        text.push_str(&format!("wrote {} ({wall:.2} s wall)", out.display()));
        progress.println(&text);
        progress.done_one();
        if !failures.is_empty() {
            failed = true;
            for f in &failures {
                progress.eprintln(&format!("check failed: {}: {f}", s.name));
            }
        }
        if let Some(line) = fault_verdict(&exp, &failures, args.flags.inject_fault.as_deref()) {
            progress.eprintln(&format!("{}: {line}", s.name));
        }
    }
    progress.finish();
    if failed {
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}

/// `--endpoint`: one scenario, sent to the server; the engine's own flags do not apply.
fn run_endpoint(
    args: &Args,
    opts: &RunOptions,
    scenarios: &[Scenario],
) -> anyhow::Result<ExitCode> {
    let [s] = scenarios else {
        anyhow::bail!(
            "--endpoint: give one scenario (a run against a server measures one request list)"
        );
    };
    if args.flags.inject_fault.is_some() {
        anyhow::bail!("--inject-fault plants bugs in kvbench's own cache managers: it has no meaning with --endpoint");
    }
    let replace = args.out.is_none() || args.force;
    let out = match &args.out {
        Some(d) => d.clone(),
        None => results::scenario_folder(Path::new("results/latest/endpoint"), &s.name)?,
    };
    crate::cli::endpoint::run(
        &args.endpoint,
        s,
        args.flags.seed,
        opts.trace_tokens,
        out,
        replace,
    )
}
