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
use crate::cli::ExitStatus;
use crate::results::{self, Experiment, RunOptions};
use crate::scenario::{self, Scenario};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceLevel {
    /// Lifecycle events and first tokens only (for very large runs).
    Requests,
    /// Every output token too.
    Tokens,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario files.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Output folder (default results/latest/<scenario-name>; with several scenarios, DIR/<name>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace an existing output folder.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub flags: RunFlags,
}

/// How each scenario runs; shared by `run` and `suite`.
#[derive(clap::Args, Debug)]
pub struct RunFlags {
    /// Where steps run: auto = cuda if a device is found, else cpu; sim = the cost model.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendKind,
    /// Seed of the workload (and model weights), overriding the scenario's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override a scenario key, e.g. `--set traffic.requests=100` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Plant a bug in the paged manager to prove the checks catch it:
    /// skip-cow | early-reuse | leak | bad-block-table.
    #[arg(long, value_name = "KIND")]
    pub inject_fault: Option<String>,
    #[arg(long, value_enum, default_value = "tokens")]
    pub trace_level: TraceLevel,
    /// Check cache invariants every N steps (0: only after the run).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub check_every: u32,
    /// On cpu: advance the clock by each step's measured time, or by the device profile's cost
    /// model (real, checked math; the same schedule on every machine and under any load).
    #[arg(long, value_enum, default_value = "measured")]
    pub clock: crate::backend::Clock,
}

impl RunFlags {
    pub fn options(&self) -> anyhow::Result<RunOptions> {
        Ok(RunOptions {
            backend: self.backend,
            seed: self.seed,
            fault: parse_fault(self.inject_fault.as_deref())?,
            trace_tokens: self.trace_level == TraceLevel::Tokens,
            invariant_check_every: self.check_every,
            clock: self.clock,
            profile: None,
        })
    }
}

pub fn parse_fault(s: Option<&str>) -> anyhow::Result<Option<Fault>> {
    s.map(|k| {
        Fault::parse(k).ok_or_else(|| {
            let known: Vec<_> = Fault::ALL.iter().map(|f| f.name()).collect();
            anyhow::anyhow!(
                "--inject-fault: unknown fault {k:?} (known: {})",
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

/// Run one scenario and write its folder. Returns the experiment and the check failures.
pub fn run_one(
    s: &Scenario,
    opts: &RunOptions,
    out: &Path,
    force: bool,
) -> anyhow::Result<(Experiment, Vec<String>)> {
    if out.exists() && !force {
        anyhow::bail!(
            "{}: output folder exists (use --force to replace it)",
            out.display()
        );
    }
    let exp = results::run_scenario(s, opts).map_err(|e| match e {
        results::ExperimentError::Engine { .. } => anyhow::Error::new(e).context(ExitStatus(1)),
        other => anyhow::Error::new(other),
    })?;
    results::write(&exp, out, force, opts.trace_tokens)
        .with_context(|| format!("writing {}", out.display()))?;
    let failures = exp.failures();
    Ok((exp, failures))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = args.flags.options()?;
    let scenarios = load_all(&args.scenarios, &args.flags.overrides)?;
    let mut failed = false;
    for s in &scenarios {
        let out = match (&args.out, scenarios.len()) {
            (Some(d), 1) => d.clone(),
            (Some(d), _) => d.join(&s.name),
            (None, _) => PathBuf::from("results/latest").join(&s.name),
        };
        let t0 = Instant::now();
        let (exp, failures) = run_one(s, &opts, &out, args.force)?;
        let wall = t0.elapsed().as_secs_f64();
        println!("{}", results::report::markdown(&exp));
        for r in &exp.runs {
            let per_seq_step_us = if r.record.seq_steps > 0 {
                1e6 * r.record.host_overhead_s / r.record.seq_steps as f64
            } else {
                0.0
            };
            println!(
                "{}: {} steps, {} sequence-steps, scheduler+admission+cache {:.3} us per running sequence per step",
                r.record.mode.name(),
                r.record.steps.len(),
                r.record.seq_steps,
                per_seq_step_us
            );
        }
        println!("wrote {} ({wall:.2} s wall)", out.display());
        if !failures.is_empty() {
            failed = true;
            for f in &failures {
                eprintln!("check failed: {}: {f}", s.name);
            }
        }
    }
    if failed {
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}
