//! Reading a results folder into comparable metrics: a run (`summary.json`), a suite
//! (`suite.csv`, with every cell's `summary.json` for workload hashes) or a sweep
//! (`sweep.json`). Only the contract's fields are read, so a folder from an older or newer
//! kvbench compares as long as those are there.
//!
//! A folder is input, not trusted: every file is size-capped and parsed strictly, and whatever
//! would make a figure untrustworthy on its own — an entry twice, a figure that is not a number,
//! a headline that does not follow from the per-seed figures it summarizes, a run whose checks
//! failed, rows from several backends or builds — is recorded in [`Folder::problems`], each a
//! sentence naming the file and the entry. The gate refuses a folder with any.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Better, CompareError, Metric};
use crate::results::plot::data::{read_capped, MAX_READ_WHOLE_BYTES};

mod suite;
mod sweep;
use suite::{cell_folders, read_suite};
use sweep::read_sweep;

/// What a compared folder is: the kinds kvbench marks its results folders with (compare reads
/// runs, suites and sweeps).
pub use crate::results::marker::Kind;

/// What must match for two folders to be comparable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Identity {
    /// (scenario, seed) → workload hash.
    pub workloads: BTreeMap<(String, u64), String>,
    /// Sweeps: scenario → definition hash (name, model, traffic, SLO), and the swept axis.
    pub definitions: BTreeMap<String, String>,
    pub axis: BTreeMap<String, String>,
    /// Scenario → the device profile its figures were priced with (name and a hash of its
    /// constants); absent where the folder does not record it (written by an older kvbench).
    pub devices: BTreeMap<String, String>,
    /// Scenario → the model an endpoint run measured (its `endpoint.model`); a run against a
    /// server has no device profile, and two models are two experiments.
    pub models: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct Folder {
    pub path: PathBuf,
    pub kind: Kind,
    pub backend: String,
    pub metrics: Vec<Metric>,
    pub identity: Identity,
    /// Why this folder's figures cannot be gated, each a sentence naming the file and entry.
    pub problems: Vec<String>,
}

fn format_error(path: &Path, message: impl std::fmt::Display) -> CompareError {
    CompareError::Format {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// A JSON file, size-capped and parsed whole: a truncated or oversized file is an error naming it.
pub fn read_json(path: &Path) -> Result<Value, CompareError> {
    let text = read_capped(path, MAX_READ_WHOLE_BYTES).map_err(|e| CompareError::Format {
        path: e.path,
        message: e.message,
    })?;
    let v = super::strict_json::parse(&text).map_err(|e| format_error(path, e))?;
    if !v.is_object() {
        return Err(format_error(path, "not a JSON object"));
    }
    Ok(v)
}

fn field<'a>(v: &'a Value, key: &str, path: &Path) -> Result<&'a Value, CompareError> {
    v.get(key)
        .ok_or_else(|| format_error(path, format!("missing field {key:?}")))
}

fn text(v: &Value, key: &str, path: &Path) -> Result<String, CompareError> {
    match field(v, key, path)? {
        Value::String(s) => Ok(s.clone()),
        other => Err(format_error(
            path,
            format!("{key:?}: expected a string, found {other}"),
        )),
    }
}

fn uint(v: &Value, key: &str, path: &Path) -> Result<u64, CompareError> {
    field(v, key, path)?.as_u64().ok_or_else(|| {
        format_error(
            path,
            format!("{key:?}: expected an unsigned integer, found {}", v[key]),
        )
    })
}

/// A figure: a finite number, `null` (no figure), or a problem (anything else).
fn figure(v: Option<&Value>, what: &str, problems: &mut Vec<String>) -> Option<f64> {
    match v {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64().filter(|x| x.is_finite()),
        Some(other) => {
            problems.push(format!("{what}: {other} is not a number"));
            None
        }
    }
}

/// `[low, high]`: two finite numbers, low ≤ high.
fn pair(v: Option<&Value>) -> Option<[f64; 2]> {
    match v?.as_array()?.as_slice() {
        [a, b] => {
            let (a, b) = (a.as_f64()?, b.as_f64()?);
            (a.is_finite() && b.is_finite() && a <= b).then_some([a, b])
        }
        _ => None,
    }
}

/// Equal up to the rounding of a mean recomputed in another order.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

pub fn read(dir: &Path) -> Result<Folder, CompareError> {
    if dir.join("sweep.json").is_file() {
        read_sweep(dir)
    } else if dir.join("suite.csv").is_file() {
        read_suite(dir)
    } else if dir.join("summary.json").is_file() {
        read_run(dir)
    } else {
        Err(format_error(
            dir,
            "not a results folder: no sweep.json, suite.csv or summary.json",
        ))
    }
}

fn failures_note(v: Option<&Value>) -> String {
    let list: Vec<String> = v
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|f| f.as_str().map_or_else(|| f.to_string(), str::to_string))
        .collect();
    match list.as_slice() {
        [] => String::new(),
        [one] => format!(": {one}"),
        [first, rest @ ..] => format!(": {first}; and {} more", rest.len()),
    }
}

/// A run's figures; `gated` marks those the gate judges (throughput and p99s at the fixed rate).
const RUN_METRICS: &[(&str, &[&str], Better, bool)] = &[
    (
        "throughput_tokens_per_s",
        &["throughput_tokens_per_s"],
        Better::Higher,
        true,
    ),
    (
        "goodput_requests_per_s",
        &["goodput_requests_per_s"],
        Better::Higher,
        false,
    ),
    ("ttft_p50_ms", &["ttft_ms", "p50"], Better::Lower, false),
    ("ttft_p99_ms", &["ttft_ms", "p99"], Better::Lower, true),
    ("itl_p50_ms", &["itl_ms", "p50"], Better::Lower, false),
    ("itl_p99_ms", &["itl_ms", "p99"], Better::Lower, true),
    ("e2e_p99_ms", &["e2e_ms", "p99"], Better::Lower, false),
    (
        "peak_running_sequences",
        &["peak_running_sequences"],
        Better::Higher,
        false,
    ),
];

fn dig<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().try_fold(v, |v, k| v.get(*k))
}

/// What one run folder says about its origin: `summary.json`'s scenario, seed, workload hash
/// and checks, and `environment.json`'s build and device profile where present.
struct RunOrigin {
    scenario: String,
    seed: u64,
    workload_hash: String,
    device: Option<String>,
    revision: Option<String>,
}

fn origin(dir: &Path, j: &Value, problems: &mut Vec<String>) -> Result<RunOrigin, CompareError> {
    let path = dir.join("summary.json");
    let file = path.display().to_string();
    match j.get("checks").and_then(|c| c.get("ok")) {
        Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => problems.push(format!(
            "{file}: the run's own checks failed (checks.ok: false{})",
            failures_note(j.get("checks").and_then(|c| c.get("failures")))
        )),
        _ => problems.push(format!(
            "{file}: no checks.ok: whether its checks passed is unknown"
        )),
    }
    let env_path = dir.join("environment.json");
    let env = if env_path.is_file() {
        Some(read_json(&env_path)?)
    } else {
        None
    };
    let env_text = |k: &str| {
        env.as_ref()
            .and_then(|e| e.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let revision = env.as_ref().map(|_| {
        format!(
            "kvbench {} git {}{}",
            env_text("kvbench_version").unwrap_or_else(|| "?".into()),
            env_text("git_revision").unwrap_or_else(|| "?".into()),
            match env.as_ref().and_then(|e| e.get("git_dirty")) {
                Some(Value::Bool(true)) => " (dirty)",
                _ => "",
            }
        )
    });
    Ok(RunOrigin {
        scenario: text(j, "scenario", &path)?,
        seed: uint(j, "seed", &path)?,
        workload_hash: text(j, "workload_hash", &path)?,
        device: env_text("device_profile"),
        revision,
    })
}

fn read_run(dir: &Path) -> Result<Folder, CompareError> {
    let path = dir.join("summary.json");
    let file = path.display().to_string();
    let j = read_json(&path)?;
    let mut problems = Vec::new();
    let o = origin(dir, &j, &mut problems)?;
    let mut metrics = Vec::new();
    let mut caches = BTreeSet::new();
    for run in field(&j, "runs", &path)?.as_array().into_iter().flatten() {
        let cache = text(run, "cache", &path)?;
        if !caches.insert(cache.clone()) {
            problems.push(format!("{file}: cache mode {cache} appears twice in runs"));
            continue;
        }
        for (name, keys, better, gated) in RUN_METRICS {
            let v = figure(
                dig(run, keys),
                &format!("{file}: {cache} {name}"),
                &mut problems,
            );
            metrics.push(Metric {
                scenario: o.scenario.clone(),
                cache: cache.clone(),
                name: (*name).into(),
                better: *better,
                gated: *gated,
                value: v,
                lo: v.unwrap_or(f64::NAN),
                hi: v.unwrap_or(f64::NAN),
                n: 1,
                per_seed: v.map(|v| (o.seed, [v, v])).into_iter().collect(),
            });
        }
    }
    let mut identity = Identity::default();
    identity
        .workloads
        .insert((o.scenario.clone(), o.seed), o.workload_hash.clone());
    if let Some(d) = &o.device {
        identity.devices.insert(o.scenario.clone(), d.clone());
    }
    if let Some(m) = dig(&j, &["endpoint", "model"]).and_then(Value::as_str) {
        identity.models.insert(o.scenario.clone(), m.to_string());
    }
    Ok(Folder {
        path: dir.to_path_buf(),
        kind: Kind::Run,
        backend: text(&j, "backend", &path)?,
        metrics,
        identity,
        problems,
    })
}

/// Files a report page reads whole: each must be a regular file within the size cap.
const READ_WHOLE: [&str; 5] = [
    "summary.json",
    "report.md",
    "suite.csv",
    "suite.json",
    "sweep.json",
];

fn check_read_whole(dir: &Path) -> Result<(), CompareError> {
    for name in READ_WHOLE {
        let path = dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() {
            return Err(format_error(&path, "not a regular file"));
        }
        if meta.len() > MAX_READ_WHOLE_BYTES {
            return Err(format_error(
                &path,
                format!(
                    "{} bytes: larger than the {MAX_READ_WHOLE_BYTES} bytes a results file may hold; refusing to read it",
                    meta.len()
                ),
            ));
        }
    }
    Ok(())
}

/// What `kvbench report` checks before it draws a page: every file the page reads whole is a
/// regular file within the size cap, and every `summary.json` (a run's own, or each cell's of a
/// suite) parses strictly — a truncated or malformed one refuses the folder rather than a page
/// being drawn from the rest.
pub fn check_summaries(dir: &Path) -> Result<(), CompareError> {
    check_read_whole(dir)?;
    let cells = if dir.join("suite.csv").is_file() || dir.join("suite.json").is_file() {
        cell_folders(dir)?
    } else if dir.join("summary.json").is_file() {
        vec![dir.to_path_buf()]
    } else {
        Vec::new()
    };
    for cell in cells {
        check_read_whole(&cell)?;
        let path = cell.join("summary.json");
        let j = read_json(&path)?;
        field(&j, "runs", &path)?
            .as_array()
            .ok_or_else(|| format_error(&path, "\"runs\": expected an array"))?;
    }
    Ok(())
}
