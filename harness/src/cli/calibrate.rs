//! `kvbench calibrate`: fit a device profile to measured step times, or check one.
//!
//! - `calibrate [--backend cpu] SCENARIO [--out FILE]`: measure the grid for the scenario's
//!   model, fit, write the profile and its grid (`FILE` with `.grid.json`);
//! - `calibrate --from-grid GRID [--out FILE]`: fit a grid measured elsewhere (a GPU session);
//! - `calibrate --check SCENARIO --profile FILE [--out DIR]`: measured backend vs `sim`,
//!   `calibration.json` and the error table.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use crate::backend::sim::profile::DeviceProfile;
use crate::backend::BackendKind;
use crate::calibrate::{self, fit, grid::Grid, measure::BackendSource, write};
use crate::results::staging::write_file_atomic;
use crate::scenario;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario whose model shape and step limits set the grid (or the scenario to check).
    #[arg(required_unless_present = "from_grid")]
    pub scenario: Option<PathBuf>,
    /// The measured backend.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendKind,
    /// Where the fitted profile goes (its grid beside it, `.grid.json`); with --check, the
    /// output folder.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Replace existing output.
    #[arg(long)]
    pub force: bool,
    /// Timed repetitions of each grid point (after one warm-up).
    #[arg(long, default_value_t = 7, value_name = "N")]
    pub repeats: u32,
    /// Fit a grid file measured elsewhere instead of measuring.
    #[arg(long, value_name = "GRID", conflicts_with_all = ["check", "scenario"])]
    pub from_grid: Option<PathBuf>,
    /// The profile whose constants the grid cannot see are kept (default: cpu, or h200 for a
    /// cuda grid); it also names the result unless --name does.
    #[arg(long, value_name = "NAME")]
    pub base: Option<String>,
    /// The `name` written into the profile (default: the base's).
    #[arg(long)]
    pub name: Option<String>,
    /// Run SCENARIO on the measured backend and on sim with --profile; report the errors.
    #[arg(long, requires = "profile")]
    pub check: bool,
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override a scenario key (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.check {
        return check(&a);
    }
    let (grid, default_out) = match (&a.from_grid, &a.scenario) {
        (Some(g), _) => (read_grid(g)?, g.with_extension("toml")),
        (None, Some(s)) => {
            let sc = load(s, &a.overrides)?;
            let kind = a.backend.resolve();
            if kind == BackendKind::Sim {
                anyhow::bail!("--backend: calibrate measures a real backend, not sim");
            }
            let slots = calibrate::slots_for(
                &calibrate::grid::default_points(&calibrate::limits(&sc)),
                sc.block_size(),
            );
            let mut source = BackendSource::new(
                kind,
                model(&sc)?,
                sc.block_size(),
                a.seed.unwrap_or(sc.seed),
                sc.scheduler.max_tokens_per_step,
                slots,
            );
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            if let Some(w) = calibrate::grid::load_average()
                .and_then(|l| calibrate::grid::load_warning(l, cores))
            {
                eprintln!("warning: {w}");
            }
            let tty = std::io::stderr().is_terminal();
            let grid = calibrate::measure_grid(&sc, &mut source, a.repeats, |i, n| {
                if tty {
                    eprint!("\rmeasured round {i}/{n} of the grid");
                }
            })?;
            if tty {
                eprintln!();
            }
            (
                grid,
                PathBuf::from(format!("results/latest/{}-profile.toml", kind.name())),
            )
        }
        (None, None) => anyhow::bail!("give a SCENARIO or --from-grid GRID"),
    };
    let out = a.out.clone().unwrap_or(default_out);
    let grid_out = out.with_extension("grid.json");
    for p in [&out, &grid_out] {
        if p.exists() && !a.force && a.from_grid.as_deref() != Some(p.as_path()) {
            anyhow::bail!("{}: exists (use --force to replace it)", p.display());
        }
    }
    let base_name = a.base.clone().unwrap_or_else(|| {
        if grid.backend == "cuda" {
            "h200".into()
        } else {
            "cpu".into()
        }
    });
    let base = DeviceProfile::load(&base_name, None)?;
    let name = a.name.clone().unwrap_or_else(|| base_name.clone());
    let fitted = fit::fit(&grid, &base, &name).with_context(|| match &a.from_grid {
        Some(g) => g.display().to_string(),
        None => "the measured grid".into(),
    })?;
    if let Some(why) = fitted.refusal() {
        // Nothing is written: a profile at its bounds or with a poor fit would pass for a
        // measured device.
        anyhow::bail!(
            "the fit of {} points on {} is refused: {why}; nothing written",
            fitted.points,
            grid.device
        );
    }
    let text = write::profile_toml(&fitted, &grid, &base_name);
    // The written file must load like a shipped one.
    DeviceProfile::parse(&text, Some(&out)).context("the fitted profile does not validate")?;
    if a.from_grid.is_none() {
        let json = serde_json::to_string_pretty(&grid)? + "\n";
        write_file_atomic(&grid_out, &json)?;
    }
    write_file_atomic(&out, &text)?;
    println!(
        "fitted {} points on {}: R² {:.4}, median |error| {:.1}%, max {:.1}%; {}",
        fitted.points,
        grid.device,
        fitted.r2,
        100.0 * fitted.median_abs_rel_err,
        100.0 * fitted.max_abs_rel_err,
        match (fitted.noise_rel, fitted.error_over_noise) {
            (Some(n), Some(r)) => format!(
                "the machine's noise (median half p10–p90 spread of repeated probes) {:.1}%, \
                 the median point's error {r:.2}× its own spread",
                100.0 * n
            ),
            _ => "the machine's noise unmeasured (no point probed twice)".into(),
        }
    );
    for (key, origin) in fit::PARAMS.iter().zip(fitted.origins) {
        let v = fitted.profile.value(key).unwrap_or(f64::NAN);
        println!("  {key:<28} {v:<12.4e} {origin:?}");
    }
    for (p, (y, t)) in grid
        .points
        .iter()
        .filter(|p| p.median_s().is_some_and(|m| m > 0.0))
        .zip(&fitted.predictions)
    {
        let shape: Vec<String> = p
            .groups
            .iter()
            .map(|g| format!("{}x({}+{})", g.count, g.context_tokens, g.new_tokens))
            .collect();
        println!(
            "  {:<8} {:<10} {:<28} copy {:>4} swap {:>4}/{:<4} measured {:>10.1} us (spread {:>5.1}%) model {:>10.1} us ({:+.1}%)",
            format!("{:?}", p.kind).to_lowercase(),
            p.cache.name(),
            shape.join(" "),
            p.copy_tokens,
            p.swap_out_tokens,
            p.swap_in_tokens,
            y * 1e6,
            100.0 * p.spread().unwrap_or(0.0),
            t * 1e6,
            100.0 * (t - y) / y
        );
    }
    if a.from_grid.is_none() {
        println!("wrote {} and {}", out.display(), grid_out.display());
    } else {
        println!("wrote {}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn check(a: &Args) -> anyhow::Result<ExitCode> {
    let Some(path) = &a.scenario else {
        anyhow::bail!("--check needs a SCENARIO");
    };
    let Some(profile_path) = &a.profile else {
        anyhow::bail!("--check needs --profile FILE");
    };
    let sc = load(path, &a.overrides)?;
    let profile = DeviceProfile::load_file(profile_path)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("results/latest/calibration-{}", sc.name)));
    let staging =
        crate::results::Staging::begin(&out, crate::results::marker::Kind::Calibration, a.force)?;
    let c = calibrate::check::check(&sc, a.backend, &profile, a.seed)?;
    crate::results::calibration::write(&c, profile_path, staging)
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "# calibrate --check: {} on {} vs sim with profile {:?}\n",
        sc.name, c.measured.backend, profile.name
    );
    println!("{}", calibrate::check::table(&c));
    println!("wrote {}", out.join("calibration.json").display());
    let misses = calibrate::check::misses(&c);
    if !misses.is_empty() {
        for m in &misses {
            eprintln!("calibration target missed: {m}");
        }
        return Err(
            anyhow::Error::new(crate::cli::ExitStatus(1)).context(format!(
                "{} of {} figures missed their target",
                misses.len(),
                calibrate::check::FIGURES.len() * c.runs.len()
            )),
        );
    }
    println!(
        "all {} figures within their targets",
        calibrate::check::FIGURES.len() * c.runs.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn load(path: &Path, overrides: &[String]) -> anyhow::Result<scenario::Scenario> {
    scenario::load(path, overrides).map_err(|e| anyhow::anyhow!("{e}"))
}

fn model(s: &scenario::Scenario) -> anyhow::Result<crate::model::ModelShape> {
    s.model_shape()
        .ok_or_else(|| anyhow::anyhow!("model: unknown preset or incomplete shape"))
}

fn read_grid(path: &Path) -> anyhow::Result<Grid> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let grid: Grid = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a grid file", path.display()))?;
    if grid.format != calibrate::grid::GRID_FORMAT {
        anyhow::bail!(
            "{}: format {:?}, expected {:?}",
            path.display(),
            grid.format,
            calibrate::grid::GRID_FORMAT
        );
    }
    let problems = grid.problems();
    if !problems.is_empty() {
        anyhow::bail!(
            "{}",
            problems
                .iter()
                .map(|p| format!("{}: {p}", path.display()))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(grid)
}
