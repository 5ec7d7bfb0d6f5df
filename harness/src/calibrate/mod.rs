//! `kvbench calibrate`: how far `sim` can be trusted, measured.
//!
//! - [`measure_grid`] times a grid of steps ([`grid`]) for a scenario's model shape on a real
//!   backend through a [`measure::StepSource`];
//! - [`fit::fit`] fits the cost model's constants to it and [`write::profile_toml`] writes them
//!   as a device profile, each constant naming its source;
//! - [`check::check`] runs a scenario on the measured backend and on `sim` with a profile and
//!   reports the relative error of each headline figure (`calibration.json`).

pub mod check;
pub mod fit;
pub mod grid;
pub mod measure;
pub mod write;

use crate::scenario::Scenario;
use grid::{Grid, GridLimits, GRID_FORMAT};
use measure::StepSource;

#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("model: unknown preset or incomplete shape")]
    Model,
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    #[error(transparent)]
    Fit(#[from] fit::FitError),
}

/// The grid's bounds from the scenario's limits.
pub fn limits(s: &Scenario) -> GridLimits {
    GridLimits {
        max_seq_len: s.cache.max_seq_len,
        max_tokens_per_step: s.scheduler.max_tokens_per_step,
        max_seqs_per_step: s.scheduler.max_seqs_per_step,
        block_size: s.block_size(),
    }
}

/// Measures `points` on `source`, `repeats` times each, in rounds: every round times every
/// point once, so a burst of load elsewhere on the machine spreads over all points instead of
/// spoiling one. Round 0 is a warm-up and is not kept. `progress` is told each round done.
pub fn measure_points(
    points: &mut [grid::Point],
    source: &mut dyn StepSource,
    repeats: u32,
    mut progress: impl FnMut(u32, u32),
) -> Result<(), CalibrateError> {
    for round in 0..=repeats.max(1) {
        for p in points.iter_mut() {
            let t = source.time(p)?;
            if round > 0 {
                p.samples_s.push(t);
            }
        }
        progress(round, repeats.max(1));
    }
    Ok(())
}

/// The cache slots the largest of `points` needs.
pub fn slots_for(points: &[grid::Point], block_size: u32) -> u64 {
    points
        .iter()
        .map(|p| p.slots(block_size))
        .max()
        .unwrap_or(0)
}

/// Measures the default grid for `s`'s model on `source` (see [`measure_points`]).
pub fn measure_grid(
    s: &Scenario,
    source: &mut dyn StepSource,
    repeats: u32,
    progress: impl FnMut(u32, u32),
) -> Result<Grid, CalibrateError> {
    let model = s.model_shape().ok_or(CalibrateError::Model)?;
    let mut points = grid::default_points(&limits(s));
    let load_before = grid::load_average();
    measure_points(&mut points, source, repeats, progress)?;
    let load_average = load_before.zip(grid::load_average()).map(|(a, b)| [a, b]);
    Ok(Grid {
        format: GRID_FORMAT.into(),
        backend: source.backend().into(),
        device: source.device(),
        date: crate::results::env::now_utc(),
        model,
        block_size: s.block_size(),
        load_average,
        points,
    })
}
