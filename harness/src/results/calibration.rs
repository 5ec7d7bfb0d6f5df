//! `calibration.json` and the folder `kvbench calibrate --check` leaves: `measured/` and `sim/`
//! (each a full results folder, so every error can be recomputed from their `summary.json`),
//! and `calibration.json` with `runs[]`, each with `cache` and `errors` keyed by figure.
//! Written atomically like a run's folder ([`Staging`]).

use std::collections::BTreeMap;
use std::path::Path;

use kvbench_cache_api::CacheMode;
use serde::Serialize;

use super::{io, write_file, Experiment, ResultsError, Staging};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure {
    pub measured: f64,
    pub model: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeCheck {
    pub cache: CacheMode,
    /// Signed relative error per figure key (`calibrate::check::FIGURES`; null where the
    /// measured figure is 0).
    pub errors: BTreeMap<&'static str, Option<f64>>,
    /// The machine's noise per figure: |second − first| ÷ first of two identical measured runs
    /// (null where the first is 0).
    pub noise: BTreeMap<&'static str, Option<f64>>,
    pub figures: BTreeMap<&'static str, Figure>,
    /// Steps each run took (scheduling diverges where the step times do).
    pub measured_steps: usize,
    pub model_steps: usize,
}

pub struct Check {
    /// The profile `sim` ran with.
    pub profile: String,
    pub measured: Experiment,
    pub model: Experiment,
    pub runs: Vec<ModeCheck>,
}

#[derive(Debug, Serialize)]
pub struct Calibration<'a> {
    pub scenario: &'a str,
    pub measured_backend: &'a str,
    pub profile: &'a str,
    /// Where the profile was read from.
    pub profile_file: String,
    pub seed: u64,
    pub runs: &'a [ModeCheck],
}

pub fn build<'a>(c: &'a Check, profile_file: &Path) -> Calibration<'a> {
    Calibration {
        scenario: &c.measured.scenario.name,
        measured_backend: c.measured.backend,
        profile: &c.profile,
        profile_file: profile_file.display().to_string(),
        seed: c.measured.seed,
        runs: &c.runs,
    }
}

/// Writes `out/{measured,sim}/…` and `out/calibration.json` through a [`Staging`] folder begun
/// before the runs (so a target that cannot be written is refused before any work).
pub fn write(c: &Check, profile_file: &Path, staging: Staging) -> Result<(), ResultsError> {
    for (exp, sub) in [(&c.measured, "measured"), (&c.model, "sim")] {
        let dir = staging.dir().join(sub);
        std::fs::create_dir(&dir).map_err(io(&dir))?;
        super::write_all(exp, &dir, true)?;
    }
    write_file(staging.dir(), "calibration.json", |w| {
        serde_json::to_writer_pretty(&mut *w, &build(c, profile_file))?;
        std::io::Write::write_all(w, b"\n")
    })?;
    staging.commit()
}
