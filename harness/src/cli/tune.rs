//! `kvbench tune SCENARIO`: the configuration with the highest rate at the scenario's latency
//! target, per cache mode, found by a neighbour search over a stated space; writes `tune.json`,
//! `tune.md` and `report.html` and prints the `--set` line that reproduces the best. Exit 1 when
//! a probe's run failed a check, 2 on bad input (a bad `--space` file, a scenario the sweep
//! cannot judge).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::backend::BackendKind;
use crate::cli::run::load_all;
use crate::cli::ExitStatus;
use crate::experiment::RunOptions;
use crate::sweep::{By, SearchConfig};
use crate::tune::{self, TuneConfig};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario file (needs `slo.ttft_p99_ms` and/or `slo.itl_p99_ms`, and a rate to scale).
    pub scenario: PathBuf,
    /// The space: a TOML file of `key = [values]` under cache, scheduler or memory (default:
    /// block size, tokens per step, policy, preemption, sequences per step).
    #[arg(long, value_name = "FILE")]
    pub space: Option<PathBuf>,
    /// Stop starting probes after this many seconds of wall time (the output says so).
    #[arg(long, value_name = "N")]
    pub budget_s: Option<f64>,
    /// Output folder (default results/latest/<scenario-name>-tune).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace an existing results folder there.
    #[arg(long)]
    pub force: bool,
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: BackendKind,
    /// Workload seed (default: the scenario's): the first of `--seeds`.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seeds each configuration is measured under, from `--seed` upwards, as `sweep --seeds`:
    /// its interval is the sweep's interval over them, and pruning and ties read it.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub seeds: u32,
    /// Skip the coarse first pass (every value of every knob): a neighbour search from the
    /// scenario's values alone.
    #[arg(long)]
    pub no_coarse_pass: bool,
    /// Bisection stops when the passing and failing rates are this close (percent).
    #[arg(long, default_value_t = 2.0, value_name = "PCT")]
    pub precision: f64,
    /// An unresolved probe is rerun with 2x, 4x, ... the requests, up to this factor.
    #[arg(long, default_value_t = 4, value_name = "FACTOR")]
    pub max_extend: u32,
    /// Override a scenario key before the search (repeatable), as for `run`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

fn bad(msg: String) -> anyhow::Error {
    anyhow::Error::new(ExitStatus(2)).context(msg)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !(args.precision > 0.0 && args.precision < 100.0) {
        return Err(bad("--precision: must be in (0, 100) percent".into()));
    }
    if args.seeds == 0 {
        return Err(bad("--seeds: must be at least 1".into()));
    }
    if args.max_extend == 0 {
        return Err(bad("--max-extend: must be at least 1".into()));
    }
    let budget = match args.budget_s {
        None => None,
        Some(b) if b.is_finite() && b > 0.0 => Some(Duration::from_secs_f64(b)),
        Some(_) => return Err(bad("--budget-s: must be a positive number".into())),
    };
    let s = load_all(std::slice::from_ref(&args.scenario), &args.overrides)?
        .into_iter()
        .next()
        .ok_or_else(|| bad(format!("{}: no scenario", args.scenario.display())))?;
    let search = SearchConfig {
        by: By::Rate,
        precision: args.precision / 100.0,
        max_extend: args.max_extend,
    };
    crate::sweep::check(&s, By::Rate, args.max_extend).map_err(|e| bad(e.to_string()))?;
    let space = tune::load_space(args.space.as_deref(), &args.scenario, &args.overrides, &s)
        .map_err(|e| bad(e.to_string()))?;
    let out = match &args.out {
        Some(d) => d.clone(),
        None => crate::results::staging::scenario_folder(
            &PathBuf::from("results/latest"),
            &format!("{}-tune", s.name),
        )
        .map_err(|e| bad(e.to_string()))?,
    };
    crate::results::staging::check_target(&out, crate::results::marker::Kind::Tune, args.force)
        .map_err(|e| bad(e.to_string()))?;
    let first = args.seed.unwrap_or(s.seed);
    let seeds = (0..u64::from(args.seeds))
        .map(|i| first.checked_add(i))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| bad("--seed: seeds overflow u64".into()))?;
    let config = TuneConfig {
        search,
        budget,
        seeds,
        coarse_first: !args.no_coarse_pass,
        opts: RunOptions {
            backend: args.backend,
            seed: args.seed,
            fault: None,
            trace_tokens: false,
            invariant_check_every: 0,
            shadow: true,
            ..RunOptions::default()
        },
    };
    let result = tune::run(
        &s,
        &args.scenario,
        &args.overrides,
        space,
        args.space.clone(),
        &config,
    )
    .map_err(|e| {
        let code = e.exit_code();
        anyhow::Error::new(ExitStatus(code)).context(e.to_string())
    })?;
    let json = tune::write::to_json(&result);
    tune::write::write_folder(&json, &out, args.force)
        .map_err(|e| anyhow::anyhow!(e.to_string()))?;
    print!("{}", tune::write::summary_lines(&json));
    println!(
        "wrote {}, {} and {}",
        out.join("tune.json").display(),
        out.join("tune.md").display(),
        out.join("report.html").display()
    );
    for f in &json.check_failures {
        eprintln!("check failed: {f}");
    }
    if !json.checks_ok {
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}
