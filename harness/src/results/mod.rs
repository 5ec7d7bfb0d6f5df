//! Results: the files one `kvbench run` leaves in its output folder, and how they are written.
//!
//! Contract (field names fixed; fields may be added): `summary.json`, `requests.csv`,
//! `trace.jsonl`, `report.md`, `environment.json`, plus `memory.csv` (the ledger timeline) and
//! `trace.perfetto.json`. On `sim` every file but `environment.json` is byte-identical between two
//! runs with one seed: times are integer nanoseconds, floats come from deterministic formatting,
//! and nothing iterates a hash map.
//!
//! Writes are atomic: everything goes into a temporary folder beside the target, which is renamed
//! into place only when complete; an existing folder is replaced only with `force`.

pub mod calibration;
pub mod env;
pub mod experiment;
pub mod fuzz;
pub mod perfetto;
pub mod report;
pub mod summary;
pub mod tables;
pub mod trace;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub use experiment::{run_scenario, Experiment, ExperimentError, ModeRun, RunOptions};

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("{}: output folder exists (use --force to replace it)", .0.display())]
    Exists(PathBuf),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ResultsError + '_ {
    move |source| ResultsError::Io {
        path: path.to_path_buf(),
        source,
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

/// Write every results file of `exp` into `out`.
pub fn write(
    exp: &Experiment,
    out: &Path,
    force: bool,
    trace_tokens: bool,
) -> Result<(), ResultsError> {
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
        .map_or_else(|| "results".into(), |n| n.to_string_lossy().to_string());
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    let result = write_all(exp, &tmp, trace_tokens).and_then(|_| {
        if out.exists() {
            let old = parent.join(format!(".{name}.old-{}", std::process::id()));
            std::fs::rename(out, &old).map_err(io(out))?;
            std::fs::rename(&tmp, out).map_err(io(out))?;
            std::fs::remove_dir_all(&old).map_err(io(&old))
        } else {
            std::fs::rename(&tmp, out).map_err(io(out))
        }
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

fn write_all(exp: &Experiment, dir: &Path, trace_tokens: bool) -> Result<(), ResultsError> {
    write_file(dir, "summary.json", |w| {
        serde_json::to_writer_pretty(&mut *w, &summary::build(exp))?;
        writeln!(w)
    })?;
    write_file(dir, "requests.csv", |w| tables::write_requests(exp, w))?;
    write_file(dir, "memory.csv", |w| tables::write_memory(exp, w))?;
    write_file(dir, "trace.jsonl", |w| trace::write(exp, trace_tokens, w))?;
    write_file(dir, "trace.perfetto.json", |w| perfetto::write(exp, w))?;
    write_file(dir, "report.md", |w| {
        w.write_all(report::markdown(exp).as_bytes())
    })?;
    write_file(dir, "environment.json", |w| {
        serde_json::to_writer_pretty(&mut *w, &env::collect(exp.backend))?;
        writeln!(w)
    })?;
    Ok(())
}
