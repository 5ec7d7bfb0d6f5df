//! `calibration.json` and the folder `kvbench calibrate --check` leaves: `measured/` and `sim/`
//! (each a full results folder, so every error can be recomputed from their `summary.json`),
//! and `calibration.json` with `runs[]`, each with `cache` and `errors` keyed by figure.
//! Written atomically like a run's folder.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{io, write_file, ResultsError};
use crate::calibrate::check::{Check, ModeCheck};

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

/// Writes `out/{measured,sim}/…` and `out/calibration.json`; `out` is replaced only with `force`.
pub fn write(c: &Check, profile_file: &Path, out: &Path, force: bool) -> Result<(), ResultsError> {
    if out.exists() && !force {
        return Err(ResultsError::Exists(out.to_path_buf()));
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let name = out
        .file_name()
        .map_or_else(|| "calibration".into(), |n| n.to_string_lossy().to_string());
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    let result = super::write(&c.measured, &tmp.join("measured"), false, true)
        .and_then(|_| super::write(&c.model, &tmp.join("sim"), false, true))
        .and_then(|_| {
            write_file(&tmp, "calibration.json", |w| {
                serde_json::to_writer_pretty(&mut *w, &build(c, profile_file))?;
                std::io::Write::write_all(w, b"\n")
            })
        })
        .and_then(|_| {
            if out.exists() {
                std::fs::remove_dir_all(out).map_err(io(out))?;
            }
            std::fs::rename(&tmp, out).map_err(io(out))
        });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}
