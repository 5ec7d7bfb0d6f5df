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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Run,
    Suite,
    Sweep,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Suite => "suite",
            Kind::Sweep => "sweep",
        }
    }
}

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

/// A sweep run's headline figure and the per-seed fields it is computed from.
struct SweepFigure {
    name: &'static str,
    /// The per-seed figure the headline is the mean of.
    seed_key: &'static str,
    bracket_key: &'static str,
}

const SWEEP_FIGURES: [SweepFigure; 2] = [
    SweepFigure {
        name: "rate_at_target_rps",
        seed_key: "rate_at_target_rps",
        bracket_key: "rate_bracket_rps",
    },
    SweepFigure {
        name: "throughput_at_target_tokens_per_s",
        seed_key: "throughput_at_target_tokens_per_s",
        bracket_key: "throughput_bracket_tokens_per_s",
    },
];

fn read_sweep(dir: &Path) -> Result<Folder, CompareError> {
    let path = dir.join("sweep.json");
    let j = read_json(&path)?;
    let file = path.display().to_string();
    let mut problems = Vec::new();
    let scenario = text(&j, "scenario", &path)?;
    let mut identity = Identity::default();
    let mut seeds: Vec<u64> = Vec::new();
    for s in field(&j, "seeds", &path)?.as_array().into_iter().flatten() {
        match s.as_u64() {
            Some(x) if seeds.contains(&x) => {
                problems.push(format!("{file}: seed {x} listed twice"))
            }
            Some(x) => seeds.push(x),
            None => problems.push(format!("{file}: seeds: {s} is not a seed")),
        }
    }
    if seeds.is_empty() {
        problems.push(format!("{file}: no seeds"));
    }
    let hashes: Vec<String> = match j.get("workload_hashes").and_then(Value::as_array) {
        Some(a) => a
            .iter()
            .filter_map(|h| h.as_str().map(str::to_string))
            .collect(),
        None => vec![text(&j, "workload_hash", &path)?],
    };
    if hashes.len() != seeds.len() {
        problems.push(format!(
            "{file}: {} workload hashes for {} seeds",
            hashes.len(),
            seeds.len()
        ));
    }
    for (seed, h) in seeds.iter().zip(hashes) {
        identity.workloads.insert((scenario.clone(), *seed), h);
    }
    let definition = match j.get("definition_hash") {
        Some(d) => d.as_str().unwrap_or_default().to_string(),
        None => field(&j, "slo", &path)?.to_string(),
    };
    identity.definitions.insert(scenario.clone(), definition);
    identity.axis.insert(
        scenario.clone(),
        format!(
            "by {} slo {}",
            text(&j, "by", &path)?,
            field(&j, "slo", &path)?
        ),
    );
    if let Some(d) = j.get("device").and_then(Value::as_str) {
        identity.devices.insert(scenario.clone(), d.to_string());
    }
    match j.get("checks_ok") {
        Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => problems.push(format!(
            "{file}: the sweep's own checks failed (checks_ok: false{})",
            failures_note(j.get("check_failures"))
        )),
        _ => problems.push(format!(
            "{file}: no checks_ok: whether its checks passed is unknown"
        )),
    }
    let mut metrics = Vec::new();
    let mut caches = BTreeSet::new();
    for run in field(&j, "runs", &path)?.as_array().into_iter().flatten() {
        let cache = text(run, "cache", &path)?;
        if !caches.insert(cache.clone()) {
            problems.push(format!("{file}: cache mode {cache} appears twice in runs"));
            continue;
        }
        let seeds_json = run.get("per_seed").and_then(Value::as_array);
        let listed: Vec<u64> = seeds_json
            .into_iter()
            .flatten()
            .filter_map(|s| s.get("seed").and_then(Value::as_u64))
            .collect();
        let distinct: BTreeSet<u64> = listed.iter().copied().collect();
        if distinct.len() != listed.len() {
            problems.push(format!("{file}: {cache}: a seed appears twice in per_seed"));
        }
        if distinct != seeds.iter().copied().collect::<BTreeSet<u64>>() {
            problems.push(format!(
                "{file}: {cache}: per_seed holds seeds {listed:?}, the sweep ran {seeds:?}"
            ));
        }
        for fig in &SWEEP_FIGURES {
            let what = format!("{file}: {cache} {}", fig.name);
            let point = figure(run.get(fig.name), &what, &mut problems);
            let ci = pair(run.get(format!("{}_ci", fig.name)));
            let mut per_seed = BTreeMap::new();
            let mut seed_figures = Vec::new();
            for s in seeds_json.into_iter().flatten() {
                let Some(seed) = s.get("seed").and_then(Value::as_u64) else {
                    continue;
                };
                let x = figure(
                    s.get(fig.seed_key),
                    &format!("{what} seed {seed}"),
                    &mut problems,
                );
                let bracket = pair(s.get(fig.bracket_key));
                if let (Some(x), Some([lo, hi])) = (x, bracket) {
                    if !(lo - x <= 1e-9 * x.abs().max(1.0) && x - hi <= 1e-9 * x.abs().max(1.0)) {
                        problems.push(format!(
                            "{what} seed {seed}: {x} lies outside its own bracket [{lo}, {hi}]"
                        ));
                    }
                }
                if let Some(b) = bracket {
                    per_seed.insert(seed, b);
                }
                seed_figures.push(x);
            }
            match point {
                Some(p) => {
                    let ci = match ci {
                        Some(ci) => ci,
                        None => {
                            problems.push(format!("{what}_ci: missing or not [low, high]"));
                            [p, p]
                        }
                    };
                    if !(ci[0] - p <= 1e-9 * p.abs().max(1.0)
                        && p - ci[1] <= 1e-9 * p.abs().max(1.0))
                    {
                        problems.push(format!(
                            "{what}: the headline {p} lies outside its own interval [{}, {}]",
                            ci[0], ci[1]
                        ));
                    }
                    let xs: Option<Vec<f64>> = seed_figures.iter().copied().collect();
                    match xs.filter(|xs| !xs.is_empty()) {
                        Some(xs) => {
                            let mean = crate::sweep::stats::mean_sd(&xs).0;
                            if !close(mean, p) {
                                problems.push(format!(
                                    "{what}: the headline {p} is not the mean {mean} of its per-seed figures"
                                ));
                            }
                        }
                        None => problems.push(format!(
                            "{what}: a headline {p} where some seed has no figure"
                        )),
                    }
                    metrics.push(Metric {
                        scenario: scenario.clone(),
                        cache: cache.clone(),
                        name: fig.name.into(),
                        better: Better::Higher,
                        gated: true,
                        value: Some(p),
                        lo: ci[0],
                        hi: ci[1],
                        n: seed_figures.len(),
                        per_seed,
                    });
                }
                None => {
                    if !seed_figures.is_empty() && seed_figures.iter().all(Option::is_some) {
                        problems.push(format!("{what}: no headline where every seed has a figure"));
                    }
                    metrics.push(Metric {
                        scenario: scenario.clone(),
                        cache: cache.clone(),
                        name: fig.name.into(),
                        better: Better::Higher,
                        gated: true,
                        value: None,
                        lo: f64::NAN,
                        hi: f64::NAN,
                        n: seed_figures.len(),
                        per_seed,
                    });
                }
            }
        }
    }
    Ok(Folder {
        path: dir.to_path_buf(),
        kind: Kind::Sweep,
        backend: text(&j, "backend", &path)?,
        metrics,
        identity,
        problems,
    })
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
    Ok(Folder {
        path: dir.to_path_buf(),
        kind: Kind::Run,
        backend: text(&j, "backend", &path)?,
        metrics,
        identity,
        problems,
    })
}

/// The gated `suite.csv` columns, each with the `summary.json` figure it prints and how the
/// suite writes it (`cli/suite.rs`): the table and its cells must say the same.
const CELL_FIGURES: &[(&str, &[&str])] = &[
    ("throughput_tokens_per_s", &["throughput_tokens_per_s"]),
    ("ttft_p99_ms", &["ttft_ms", "p99"]),
    ("itl_p99_ms", &["itl_ms", "p99"]),
];

fn printed_as(column: &str, x: f64) -> String {
    if column == "throughput_tokens_per_s" {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// Where a suite's table and one of its cells' `summary.json` disagree on a gated figure (a
/// cell rerun, a row edited): one source says one thing, the other another.
fn disagreements(
    table: &str,
    summary: &Path,
    j: &Value,
    o: &RunOrigin,
    printed: &BTreeMap<(String, String, u64, &str), (u64, String)>,
    problems: &mut Vec<String>,
) {
    for run in j
        .get("runs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(cache) = run.get("cache").and_then(Value::as_str) else {
            continue;
        };
        let cache = match run.get("block_size").and_then(Value::as_u64) {
            Some(b) => format!("{cache} b{b}"),
            None => cache.to_string(),
        };
        for (column, keys) in CELL_FIGURES {
            let key = (o.scenario.clone(), cache.clone(), o.seed, *column);
            let (Some((line, text)), Some(x)) =
                (printed.get(&key), dig(run, keys).and_then(Value::as_f64))
            else {
                continue;
            };
            let cell = printed_as(column, x);
            if *text != cell {
                problems.push(format!(
                    "{table}: line {line}: {} {cache} seed {} {column} is {text}, its cell's {} says {cell}",
                    o.scenario,
                    o.seed,
                    summary.display()
                ));
            }
        }
    }
}

/// suite.csv columns compared, with the run metric each corresponds to.
const SUITE_COLUMNS: &[(&str, Better, bool)] = &[
    ("throughput_tokens_per_s", Better::Higher, true),
    ("goodput_requests_per_s", Better::Higher, false),
    ("ttft_p50_ms", Better::Lower, false),
    ("ttft_p99_ms", Better::Lower, true),
    ("itl_p50_ms", Better::Lower, false),
    ("itl_p99_ms", Better::Lower, true),
    ("peak_running_sequences", Better::Higher, false),
];

/// Column → (seed, value; `None` where the cell holds no finite number) of one (scenario,
/// cache) group.
type SeedValues = BTreeMap<&'static str, Vec<(u64, Option<f64>)>>;

/// The cell folders of a suite: its plan's (each `dir` a slug, checked by `suite::read`) when
/// it has a `suite.json`, else every sub-folder holding a `summary.json`.
fn cell_folders(dir: &Path) -> Result<Vec<PathBuf>, CompareError> {
    if dir.join("suite.json").is_file() {
        let meta = crate::results::suite::read(dir).map_err(|e| CompareError::Format {
            path: e.path,
            message: e.message,
        })?;
        return Ok(meta.ran().iter().map(|c| dir.join(&c.dir)).collect());
    }
    let mut subs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| CompareError::io(dir, e))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| p.join("summary.json").is_file())
        .collect();
    subs.sort();
    Ok(subs)
}

fn read_suite(dir: &Path) -> Result<Folder, CompareError> {
    let path = dir.join("suite.csv");
    let file = path.display().to_string();
    let csv_text = read_capped(&path, MAX_READ_WHOLE_BYTES).map_err(|e| CompareError::Format {
        path: e.path,
        message: e.message,
    })?;
    let mut problems = Vec::new();
    if dir.join("suite.json").is_file() {
        let meta = crate::results::suite::read(dir).map_err(|e| CompareError::Format {
            path: e.path,
            message: e.message,
        })?;
        if crate::results::suite::csv(&meta.header, &meta.rows()) != csv_text {
            problems.push(format!(
                "{file}: does not hold the rows suite.json records (edited after the suite ran?)"
            ));
        }
    }
    let mut rdr = csv::Reader::from_reader(csv_text.as_bytes());
    let headers = rdr.headers().map_err(|e| format_error(&path, e))?.clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let (Some(sc), Some(ca), Some(be)) = (col("scenario"), col("cache"), col("backend")) else {
        return Err(format_error(
            &path,
            "missing scenario, cache or backend column",
        ));
    };
    // (scenario, cache) → column → (seed, value) over seeds.
    let mut groups: BTreeMap<(String, String), SeedValues> = BTreeMap::new();
    let mut seen: BTreeMap<(String, String, u64), u64> = BTreeMap::new();
    // (scenario, cache, seed, column) → (line, the table's text), to hold against each cell.
    let mut printed: BTreeMap<(String, String, u64, &str), (u64, String)> = BTreeMap::new();
    let (seed_col, bs) = (col("seed"), col("block_size"));
    let mut backends = BTreeSet::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| format_error(&path, format!("line {line}: {e}")))?;
        let get = |c: usize| rec.get(c).unwrap_or_default();
        backends.insert(get(be).to_string());
        let seed = match seed_col {
            None => 0,
            Some(c) => get(c).parse().map_err(|_| {
                format_error(
                    &path,
                    format!("line {line}: seed {:?} is not a seed", get(c)),
                )
            })?,
        };
        // A scenario listing several block sizes has a row per size: each is its own figure.
        let cache = match bs.map(get).filter(|b| !b.is_empty()) {
            Some(b) => format!("{} b{b}", get(ca)),
            None => get(ca).to_string(),
        };
        let scenario = get(sc).to_string();
        if let Some(first) = seen.insert((scenario.clone(), cache.clone(), seed), line) {
            problems.push(format!(
                "{file}: line {line}: {scenario} {cache} seed {seed} appears twice (first on line {first})"
            ));
            continue;
        }
        for check in ["checks_ok", "reclamation_ok"] {
            if let Some(v) = col(check).map(get) {
                if v != "true" {
                    problems.push(format!(
                        "{file}: line {line}: {scenario} {cache} seed {seed}: the run's own checks failed ({check}: {v})"
                    ));
                }
            }
        }
        for (name, _) in CELL_FIGURES {
            if let Some(c) = col(name) {
                printed.insert(
                    (scenario.clone(), cache.clone(), seed, *name),
                    (line, get(c).to_string()),
                );
            }
        }
        let g = groups.entry((scenario, cache)).or_default();
        for (name, _, _) in SUITE_COLUMNS {
            if let Some(c) = col(name) {
                let v = get(c).parse::<f64>().ok().filter(|x| x.is_finite());
                g.entry(name).or_default().push((seed, v));
            }
        }
    }
    if backends.len() > 1 {
        problems.push(format!(
            "{file}: rows from several backends ({})",
            backends.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    let mut metrics = Vec::new();
    for ((scenario, cache), cols) in &groups {
        for (name, better, gated) in SUITE_COLUMNS {
            let Some(rows) = cols.get(name) else { continue };
            let xs: Option<Vec<f64>> = rows.iter().map(|r| r.1).collect();
            let (value, lo, hi) = match &xs {
                Some(xs) if !xs.is_empty() => {
                    let (m, _) = crate::sweep::stats::mean_sd(xs);
                    let (lo, hi) =
                        crate::sweep::stats::mean_interval(xs, crate::sweep::stats::CONFIDENCE)
                            .unwrap_or((m, m));
                    (Some(m), lo, hi)
                }
                // A seed without a finite figure: the mean would not be of every seed.
                _ => (None, f64::NAN, f64::NAN),
            };
            metrics.push(Metric {
                scenario: scenario.clone(),
                cache: cache.clone(),
                name: (*name).into(),
                better: *better,
                gated: *gated,
                value,
                lo,
                hi,
                n: rows.len(),
                per_seed: rows
                    .iter()
                    .filter_map(|&(seed, v)| v.map(|v| (seed, [v, v])))
                    .collect(),
            });
        }
    }
    let mut identity = Identity::default();
    let mut revisions: BTreeMap<String, PathBuf> = BTreeMap::new();
    for cell in cell_folders(dir)? {
        let sp = cell.join("summary.json");
        let j = read_json(&sp)?;
        let mut cell_problems = Vec::new();
        let o = origin(&cell, &j, &mut cell_problems)?;
        disagreements(&file, &sp, &j, &o, &printed, &mut problems);
        // A cell's failed checks already show in its suite.csv row; say them once.
        if col("checks_ok").is_none() {
            problems.extend(cell_problems);
        }
        if let Some(h) = identity
            .workloads
            .insert((o.scenario.clone(), o.seed), o.workload_hash.clone())
        {
            if h != o.workload_hash {
                problems.push(format!(
                    "{}: {} seed {} ran another workload than a cell before it",
                    sp.display(),
                    o.scenario,
                    o.seed
                ));
            }
        }
        if let Some(d) = o.device {
            if let Some(prev) = identity.devices.insert(o.scenario.clone(), d.clone()) {
                if prev != d {
                    problems.push(format!(
                        "{}: {} priced with device profile {d}, another cell with {prev}",
                        cell.join("environment.json").display(),
                        o.scenario
                    ));
                }
            }
        }
        if let Some(r) = o.revision {
            revisions.entry(r).or_insert(cell);
        }
    }
    if revisions.len() > 1 {
        let list: Vec<String> = revisions
            .iter()
            .map(|(r, cell)| format!("{r} ({})", cell.display()))
            .collect();
        problems.push(format!(
            "{}: cells made by different kvbench revisions: {}",
            dir.display(),
            list.join(", ")
        ));
    }
    Ok(Folder {
        path: dir.to_path_buf(),
        kind: Kind::Suite,
        backend: backends.into_iter().next().unwrap_or_default(),
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
