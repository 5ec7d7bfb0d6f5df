//! `kvbench tune`: which configuration serves a scenario's traffic best at its latency target.
//! A coarse pass over one knob at a time, then a neighbour search ([`search`]), over a stated space ([`space`]) for the highest rate at target
//! per cache mode, each configuration measured under one or more seeds by the sweep's probes and
//! bracket search ([`eval`]), with the sweep's interval over the seeds, judged by [`rank`], written by [`write`] and [`html`].

pub mod eval;
pub mod html;
pub mod rank;
pub mod search;
pub mod space;
pub mod write;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::experiment::RunOptions;
use crate::scenario::Scenario;
use crate::sweep::{By, SweepError};

pub use search::{Bracket, Evaluator, Interval, ModeSearch, Status, Tried};
pub use space::{Config, Knob, Space};

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// Bad input, already located (`FILE:LINE:COL: KEY: message`): exit 2.
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Sweep(#[from] SweepError),
}

impl TuneError {
    pub fn exit_code(&self) -> u8 {
        match self {
            TuneError::Input(_) => 2,
            TuneError::Sweep(e) => e.exit_code(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TuneConfig {
    /// The sweep's bisection precision (relative) and rerun cap.
    pub search: crate::sweep::SearchConfig,
    /// Wall-clock cap: no probe starts after it.
    pub budget: Option<Duration>,
    /// The workload seeds each configuration is measured under (`--seed` upwards, `--seeds N`).
    pub seeds: Vec<u64>,
    /// Round 1 is the coarse pass (every value of every knob), not only adjacent values.
    pub coarse_first: bool,
    pub opts: RunOptions,
}

/// Everything one tune produced.
#[derive(Debug, Clone)]
pub struct Tune {
    pub scenario: Scenario,
    pub scenario_path: PathBuf,
    pub base_overrides: Vec<String>,
    pub space: Space,
    /// The `--space` file, or `None` for the default space.
    pub space_file: Option<PathBuf>,
    pub backend: &'static str,
    /// The first of `seeds`.
    pub seed: u64,
    pub seeds: Vec<u64>,
    pub config: TuneConfig,
    pub modes: Vec<ModeSearch>,
    pub wall_s: f64,
    pub check_failures: Vec<String>,
}

/// The space to search: `file` read and checked, or the default for `s`. Each value is checked
/// alone through the override path on top of the command line's own overrides.
pub fn load_space(
    file: Option<&Path>,
    scenario_path: &Path,
    overrides: &[String],
    s: &Scenario,
) -> Result<Space, TuneError> {
    let check = |set: &str| {
        let mut all = overrides.to_vec();
        all.push(set.to_string());
        let knob = set.split_once('=').map_or(set, |(k, _)| k);
        crate::scenario::load(scenario_path, &all)
            .map(|_| ())
            .map_err(|e| match e.diagnostics() {
                [] => e.to_string(),
                ds => ds
                    .iter()
                    .map(|d| match d.key == knob {
                        true => d.message.clone(),
                        false => format!("{}: {}", d.key, d.message),
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            })
    };
    match file {
        None => Ok(space::default_space(s, check)),
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .map_err(|e| TuneError::Input(format!("{}: {e}", f.display())))?;
            space::parse_space(&text, f, s, check).map_err(|ds| {
                TuneError::Input(
                    ds.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("\n"),
                )
            })
        }
    }
}

/// Search `space` for `s` (loaded from `scenario_path` with `overrides`) in both cache modes.
pub fn run(
    s: &Scenario,
    scenario_path: &Path,
    overrides: &[String],
    space: Space,
    space_file: Option<PathBuf>,
    config: &TuneConfig,
) -> Result<Tune, TuneError> {
    crate::sweep::check(s, By::Rate, config.search.max_extend)?;
    let t0 = Instant::now();
    let eval = eval::SweepEvaluator::new(
        scenario_path.to_path_buf(),
        overrides.to_vec(),
        &space,
        config.search,
        config.opts.clone(),
        s,
    )?;
    let seeds = match config.seeds.is_empty() {
        true => vec![config.opts.seed.unwrap_or(s.seed)],
        false => config.seeds.clone(),
    };
    let cfg = search::SearchConfig {
        precision: config.search.precision,
        deadline: config.budget.map(|b| t0 + b),
        seeds: seeds.clone(),
        coarse_first: config.coarse_first,
    };
    let modes = search::search(&eval, &space, &cfg)?;
    let check_failures = eval.check_failures();
    drop(eval);
    Ok(Tune {
        scenario: s.clone(),
        scenario_path: scenario_path.to_path_buf(),
        base_overrides: overrides.to_vec(),
        space,
        space_file,
        backend: config.opts.backend.resolve().name(),
        seed: seeds.first().copied().unwrap_or(s.seed),
        seeds,
        config: config.clone(),
        modes,
        wall_s: t0.elapsed().as_secs_f64(),
        check_failures,
    })
}
