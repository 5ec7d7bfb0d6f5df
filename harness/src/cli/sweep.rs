//! `kvbench sweep SCENARIO...`: the highest load at which each scenario's `[slo]` holds, for the
//! paged cache and the contiguous baseline separately, with 95% intervals; writes `sweep.json`
//! and `sweep.md`. Exit 1 when a probe's run failed a check, 2 on bad input (a scenario without
//! a latency target, an arrival kind the axis cannot scale).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;

use crate::backend::BackendKind;
use crate::cli::run::load_all;
use crate::cli::ExitStatus;
use crate::experiment::RunOptions;
use crate::sweep::{self, By, SearchConfig, SweepConfig};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario files (each needs `slo.ttft_p99_ms` and/or `slo.itl_p99_ms`).
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Output folder (default results/latest/<scenario-name>-sweep; with several scenarios,
    /// DIR/<name>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace an existing output folder.
    #[arg(long)]
    pub force: bool,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendKind,
    /// rate: scale the open-loop arrival rate (shape kept); concurrency: closed-loop clients.
    #[arg(long, value_enum, default_value = "rate")]
    pub by: By,
    /// Number of seeds, from the scenario's seed (or --seed) upwards; each is its own search.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub seeds: u32,
    /// First seed (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Bisection stops when the passing and failing loads are this close (percent).
    #[arg(long, default_value_t = 2.0, value_name = "PCT")]
    pub precision: f64,
    /// An unresolved probe is rerun with 2x, 4x, ... the requests, up to this factor.
    #[arg(long, default_value_t = 4, value_name = "FACTOR")]
    pub max_extend: u32,
    /// Override a scenario key (repeatable), as for `run`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Check cache invariants every N steps in each probe (0: only after the run).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub check_every: u32,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !(args.precision > 0.0 && args.precision < 100.0) {
        anyhow::bail!("--precision: must be in (0, 100) percent");
    }
    if args.seeds == 0 || args.max_extend == 0 {
        anyhow::bail!("--seeds and --max-extend: must be at least 1");
    }
    let scenarios = load_all(&args.scenarios, &args.overrides)?;
    for s in &scenarios {
        sweep::check(s, args.by, args.max_extend)
            .map_err(|e| anyhow::Error::new(ExitStatus(2)).context(e.to_string()))?;
    }
    let mut failed = false;
    for s in &scenarios {
        let first = args.seed.unwrap_or(s.seed);
        let seeds = (0..u64::from(args.seeds))
            .map(|i| first.checked_add(i))
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| anyhow::anyhow!("--seed: seeds overflow u64"))?;
        let config = SweepConfig {
            search: SearchConfig {
                by: args.by,
                precision: args.precision / 100.0,
                max_extend: args.max_extend,
            },
            seeds,
            opts: RunOptions {
                backend: args.backend,
                seed: None,
                fault: None,
                trace_tokens: false,
                invariant_check_every: args.check_every,
                shadow: true,
                ..RunOptions::default()
            },
        };
        let out = match (&args.out, scenarios.len()) {
            (Some(d), 1) => d.clone(),
            (Some(d), _) => d.join(&s.name),
            (None, _) => PathBuf::from("results/latest").join(format!("{}-sweep", s.name)),
        };
        sweep::write::check_target(&out, args.force).map_err(|e| anyhow::anyhow!(e))?;
        let t0 = Instant::now();
        let result = sweep::run(s, &config).map_err(|e| {
            let code = e.exit_code();
            anyhow::Error::new(ExitStatus(code)).context(e.to_string())
        })?;
        let probes: usize = result.searches.iter().map(|x| x.probes.len()).sum();
        let json = sweep::write(&result, &out, args.force).map_err(|e| anyhow::anyhow!(e))?;
        let html = crate::results::html::write_sweep_report(&out)
            .with_context(|| format!("{}: report.html", out.display()))?;
        print!("{}", sweep::write::summary_lines(&json));
        println!(
            "wrote {} and {} ({probes} probes, {:.2} s wall)",
            out.join("sweep.json").display(),
            html.display(),
            t0.elapsed().as_secs_f64()
        );
        for f in &json.check_failures {
            failed = true;
            eprintln!("check failed: {}: {f}", s.name);
        }
    }
    if failed {
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}
