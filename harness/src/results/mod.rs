//! Results: the files one `kvbench run` leaves in its output folder, and how they are written.
//!
//! Contract (field names fixed; fields may be added): `summary.json`, `requests.csv`,
//! `trace.jsonl`, `report.md`, `environment.json`, plus `memory.csv` (the ledger timeline) and
//! `trace.perfetto.json`, and `report.html` (see [`html`]). On `sim` every file but
//! `environment.json` is byte-identical between two runs with one seed: times are integer
//! nanoseconds, floats come from deterministic formatting, and nothing iterates a hash map.
//!
//! Writes are atomic (`staging.rs`): everything goes into a temporary folder beside the target,
//! created before the run and renamed into place only when complete; only an existing results
//! folder is ever replaced, and only when the caller allows it.

pub mod calibration;
pub mod env;
pub mod experiment;
pub mod html;
pub mod marker;
pub mod perfetto;
pub mod plot;
pub mod report;
pub mod sink;
pub mod staging;
pub mod suite;
pub mod summary;
pub mod tables;
pub mod tier_report;
pub mod trace;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub use experiment::{Experiment, ModeRun, Served};
pub use staging::{check_target, scenario_folder, Staging};

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("{}: output folder exists (use --force to replace it)", .0.display())]
    Exists(PathBuf),
    #[error("{}: not a folder (a file or a link); refusing to replace it", .0.display())]
    NotAFolder(PathBuf),
    #[error("{}: {why}; refusing to replace it", path.display())]
    NotResults { path: PathBuf, why: String },
    #[error(
        "scenario name {0:?} cannot name a results folder: use letters, digits, '-', '_', '.' \
         (not \".\" or \"..\")"
    )]
    BadName(String),
    /// The OS message is part of this one's text, so it is deliberately not a `source`: an error
    /// chain prints it once.
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Report(#[from] html::ReportError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ResultsError + '_ {
    move |err| ResultsError::Io {
        path: path.to_path_buf(),
        err,
    }
}

fn write_file(
    dir: &Path,
    name: &str,
    f: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), ResultsError> {
    let path = dir.join(name);
    let file = File::create(&path).map_err(io(&path))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    f(&mut w).and_then(|_| w.flush()).map_err(io(&path))
}

/// Write every results file of `exp` into `out` (see [`Staging`] for what may be replaced:
/// with `force`, an existing results folder).
pub fn write(
    exp: &Experiment,
    out: &Path,
    force: bool,
    trace_tokens: bool,
) -> Result<(), ResultsError> {
    let staging = Staging::begin(out, marker::Kind::Run, force)?;
    write_into(exp, staging, trace_tokens)
}

/// Write every results file of `exp` into a folder staged before the run, and put it in place.
pub fn write_into(
    exp: &Experiment,
    staging: Staging,
    trace_tokens: bool,
) -> Result<(), ResultsError> {
    write_all(exp, staging.dir(), trace_tokens)?;
    staging.commit()
}

/// The collect path: the data files from each run's record, through the streaming writer.
fn write_all(exp: &Experiment, dir: &Path, trace_tokens: bool) -> Result<(), ResultsError> {
    let mut files = sink::FileSink::create(dir, trace_tokens, exp.memory_resolution)?;
    for run in &exp.runs {
        let Some(record) = &run.record else {
            return Err(ResultsError::Io {
                path: dir.to_path_buf(),
                err: std::io::Error::other(
                    "a streaming run's files are written as it runs, not afterwards",
                ),
            });
        };
        crate::engine::sink::replay(record, &mut files);
        files.end_mode()?;
    }
    files.finish()?;
    write_rest(exp, dir)
}

/// summary.json, report.md, environment.json and report.html (from the data files written).
pub(crate) fn write_rest(exp: &Experiment, dir: &Path) -> Result<(), ResultsError> {
    write_file(dir, "summary.json", |w| {
        serde_json::to_writer_pretty(&mut *w, &summary::build(exp))?;
        writeln!(w)
    })?;
    write_file(dir, "report.md", |w| {
        w.write_all(report::markdown(exp).as_bytes())
    })?;
    write_file(dir, "environment.json", |w| {
        let mut environment = env::collect(exp.backend);
        environment.device_profile = env::device_identity(&exp.scenario);
        serde_json::to_writer_pretty(&mut *w, &environment)?;
        writeln!(w)
    })?;
    // Last, and from the files just written, so the page shows only what the folder holds.
    html::write_run_report(dir)?;
    Ok(())
}
