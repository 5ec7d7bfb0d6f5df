//! The marker kvbench writes into every results folder it makes (`.kvbench.json`: the folder's
//! kind, the marker's format version, every file written), and the rule it decides: a folder is
//! kvbench's to replace only when its marker names the same kind and it holds nothing else. A
//! familiar file name proves nothing (anyone's project may hold a `summary.json`), and a file
//! someone added to a results folder is theirs. `staging.rs` asks it before replacing anything.

use std::path::Path;

use super::{io, ResultsError};

/// What a results folder is, as its marker names it: a folder is replaced only by one of the
/// same kind (`run --force` never replaces a tune, a suite or a sweep).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `run` (and each scenario folder of a suite).
    Run,
    /// `suite`'s collecting folder written by `merge`.
    Suite,
    Sweep,
    Tune,
    /// `calibrate --check`.
    Calibration,
    Isolation,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Suite => "suite",
            Kind::Sweep => "sweep",
            Kind::Tune => "tune",
            Kind::Calibration => "calibration",
            Kind::Isolation => "isolation",
        }
    }
}

/// The file kvbench writes into every results folder it makes: its kind, the format version and
/// every file it wrote there. A folder is recognised as kvbench's own by this marker alone (not
/// by holding a file with a familiar name), and replaced only when it holds nothing but what the
/// marker lists, so a file someone added is never deleted.
pub const MARKER: &str = ".kvbench.json";
/// The marker's format version.
pub const MARKER_FORMAT: u32 = 1;
/// Files a marker may list (and a folder may hold to be replaced): a bound on what a hostile
/// marker makes kvbench read and compare.
const MARKER_MAX_FILES: usize = 100_000;

#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    kind: String,
    format: u32,
    files: Vec<String>,
}

/// Every file under `dir` (links and other non-folders included, never followed), as paths
/// relative to `dir` joined with `/`, sorted; at most `limit` (None past it).
fn files_under(dir: &Path, limit: usize) -> Result<Option<Vec<String>>, ResultsError> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, rel)) = stack.pop() {
        for e in std::fs::read_dir(&path).map_err(io(&path))? {
            let e = e.map_err(io(&path))?;
            let name = e.file_name().to_string_lossy().to_string();
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type().map_err(io(&e.path()))?.is_dir() {
                stack.push((e.path(), rel));
            } else {
                out.push(rel);
            }
            if out.len() + stack.len() > limit {
                return Ok(None);
            }
        }
    }
    out.sort();
    Ok(Some(out))
}

/// Write the marker of a finished results folder of `kind` into `dir`, listing what is there.
pub fn mark(dir: &Path, kind: Kind) -> Result<(), ResultsError> {
    let files = files_under(dir, MARKER_MAX_FILES)?
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != MARKER)
        .collect();
    let marker = Marker {
        kind: kind.name().into(),
        format: MARKER_FORMAT,
        files,
    };
    let mut text = serde_json::to_string_pretty(&marker).expect("a marker serialises");
    text.push('\n');
    let path = dir.join(MARKER);
    std::fs::write(&path, text).map_err(io(&path))
}

/// Whether `dir` may be replaced by a results folder of `kind`: `None` when it is empty or a
/// folder kvbench marked as `kind` holding nothing but what it wrote; otherwise why not.
pub(super) fn not_replaceable(dir: &Path, kind: Kind) -> Result<Option<String>, ResultsError> {
    let mut entries = std::fs::read_dir(dir).map_err(io(dir))?;
    if entries.next().is_none() {
        return Ok(None);
    }
    let path = dir.join(MARKER);
    let marker = std::fs::symlink_metadata(&path)
        .ok()
        .filter(|m| m.is_file() && m.len() <= 64 << 20)
        .and_then(|_| std::fs::read_to_string(&path).ok())
        .and_then(|t| serde_json::from_str::<Marker>(&t).ok());
    let Some(marker) = marker else {
        return Ok(Some(format!(
            "holds files but no {MARKER} marker kvbench could read (not a kvbench results folder)"
        )));
    };
    if marker.kind != kind.name() {
        return Ok(Some(format!(
            "a kvbench {} folder, not a {} folder",
            marker.kind,
            kind.name()
        )));
    }
    if marker.format > MARKER_FORMAT {
        return Ok(Some(format!(
            "its marker has format {}, newer than this kvbench's {MARKER_FORMAT}",
            marker.format
        )));
    }
    let Some(present) = files_under(dir, MARKER_MAX_FILES)? else {
        return Ok(Some(format!(
            "holds more than {MARKER_MAX_FILES} files (not a kvbench results folder)"
        )));
    };
    let written: std::collections::BTreeSet<&str> =
        marker.files.iter().map(String::as_str).collect();
    if let Some(extra) = present
        .iter()
        .find(|f| *f != MARKER && !written.contains(f.as_str()))
    {
        return Ok(Some(format!(
            "holds {extra}, which kvbench did not write there"
        )));
    }
    Ok(None)
}
