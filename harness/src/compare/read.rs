//! Reading a results folder into comparable metrics: a run (`summary.json`), a suite
//! (`suite.csv`, with every `summary.json` below it for workload hashes) or a sweep
//! (`sweep.json`). Only the contract's fields are read, so a folder from an older or newer
//! kvbench compares as long as those are there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Better, CompareError, Metric};

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
}

#[derive(Debug, Clone)]
pub struct Folder {
    pub path: PathBuf,
    pub kind: Kind,
    pub backend: String,
    pub metrics: Vec<Metric>,
    pub identity: Identity,
}

fn read_json(path: &Path) -> Result<Value, CompareError> {
    let text = std::fs::read_to_string(path).map_err(|e| CompareError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| CompareError::Format {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn field<'a>(v: &'a Value, key: &str, path: &Path) -> Result<&'a Value, CompareError> {
    v.get(key).ok_or_else(|| CompareError::Format {
        path: path.to_path_buf(),
        message: format!("missing field {key:?}"),
    })
}

fn text(v: &Value, key: &str, path: &Path) -> Result<String, CompareError> {
    Ok(field(v, key, path)?
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| field(v, key, path).map_or_else(|_| String::new(), |x| x.to_string())))
}

pub fn read(dir: &Path) -> Result<Folder, CompareError> {
    if dir.join("sweep.json").is_file() {
        read_sweep(dir)
    } else if dir.join("suite.csv").is_file() {
        read_suite(dir)
    } else if dir.join("summary.json").is_file() {
        read_run(dir)
    } else {
        Err(CompareError::Format {
            path: dir.to_path_buf(),
            message: "not a results folder: no sweep.json, suite.csv or summary.json".into(),
        })
    }
}

fn read_sweep(dir: &Path) -> Result<Folder, CompareError> {
    let path = dir.join("sweep.json");
    let j = read_json(&path)?;
    let scenario = text(&j, "scenario", &path)?;
    let mut identity = Identity::default();
    let seeds: Vec<u64> = field(&j, "seeds", &path)?
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let hashes: Vec<String> = match j.get("workload_hashes").and_then(Value::as_array) {
        Some(a) => a
            .iter()
            .filter_map(|h| h.as_str().map(str::to_string))
            .collect(),
        None => vec![text(&j, "workload_hash", &path)?],
    };
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
    let mut metrics = Vec::new();
    for run in field(&j, "runs", &path)?.as_array().into_iter().flatten() {
        let cache = text(run, "cache", &path)?;
        for name in ["rate_at_target_rps", "throughput_at_target_tokens_per_s"] {
            let point = run.get(name).and_then(Value::as_f64);
            let ci = run
                .get(format!("{name}_ci"))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_f64).collect::<Vec<_>>())
                .unwrap_or_default();
            let (lo, hi) = match (point, ci.as_slice()) {
                (Some(_), [lo, hi]) => (*lo, *hi),
                (Some(p), _) => (p, p),
                (None, _) => (f64::NAN, f64::NAN),
            };
            let seeds_json = run.get("per_seed").and_then(Value::as_array);
            let n = seeds_json.map_or(1, Vec::len);
            let bracket_key = match name {
                "rate_at_target_rps" => "rate_bracket_rps",
                _ => "throughput_bracket_tokens_per_s",
            };
            let mut per_seed = BTreeMap::new();
            for s in seeds_json.into_iter().flatten() {
                let b = s.get(bracket_key).and_then(Value::as_array);
                if let (Some(seed), Some([lo, hi])) = (
                    s.get("seed").and_then(Value::as_u64),
                    b.map(|a| a.iter().filter_map(Value::as_f64).collect::<Vec<_>>())
                        .as_deref(),
                ) {
                    per_seed.insert(seed, [*lo, *hi]);
                }
            }
            metrics.push(Metric {
                scenario: scenario.clone(),
                cache: cache.clone(),
                name: name.into(),
                better: Better::Higher,
                gated: true,
                value: point,
                lo,
                hi,
                n,
                per_seed,
            });
        }
    }
    Ok(Folder {
        path: dir.to_path_buf(),
        kind: Kind::Sweep,
        backend: text(&j, "backend", &path)?,
        metrics,
        identity,
    })
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

/// Every `summary.json` at or below `dir` (a run folder, or a suite's per-scenario folders).
fn summaries(dir: &Path, out: &mut Vec<PathBuf>, depth: u32) {
    let p = dir.join("summary.json");
    if p.is_file() {
        out.push(p);
    }
    if depth == 0 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut subs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    subs.sort();
    for s in subs {
        summaries(&s, out, depth - 1);
    }
}

fn identity_of_summaries(paths: &[PathBuf]) -> Result<Identity, CompareError> {
    let mut id = Identity::default();
    for p in paths {
        let j = read_json(p)?;
        let seed = field(&j, "seed", p)?.as_u64().unwrap_or(0);
        id.workloads.insert(
            (text(&j, "scenario", p)?, seed),
            text(&j, "workload_hash", p)?,
        );
    }
    Ok(id)
}

fn read_run(dir: &Path) -> Result<Folder, CompareError> {
    let path = dir.join("summary.json");
    let j = read_json(&path)?;
    let scenario = text(&j, "scenario", &path)?;
    let seed = field(&j, "seed", &path)?.as_u64().unwrap_or(0);
    let mut metrics = Vec::new();
    for run in field(&j, "runs", &path)?.as_array().into_iter().flatten() {
        let cache = text(run, "cache", &path)?;
        for (name, keys, better, gated) in RUN_METRICS {
            let v = dig(run, keys).and_then(Value::as_f64);
            metrics.push(Metric {
                scenario: scenario.clone(),
                cache: cache.clone(),
                name: (*name).into(),
                better: *better,
                gated: *gated,
                value: v,
                lo: v.unwrap_or(f64::NAN),
                hi: v.unwrap_or(f64::NAN),
                n: 1,
                per_seed: v.map(|v| (seed, [v, v])).into_iter().collect(),
            });
        }
    }
    Ok(Folder {
        path: dir.to_path_buf(),
        kind: Kind::Run,
        backend: text(&j, "backend", &path)?,
        metrics,
        identity: identity_of_summaries(&[path])?,
    })
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

/// Column → (seed, value) rows of one (scenario, cache) group.
type SeedValues = BTreeMap<&'static str, Vec<(u64, f64)>>;

fn read_suite(dir: &Path) -> Result<Folder, CompareError> {
    let path = dir.join("suite.csv");
    let mut rdr = csv::Reader::from_path(&path).map_err(|e| CompareError::Format {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let headers = rdr
        .headers()
        .map_err(|e| CompareError::Format {
            path: path.clone(),
            message: e.to_string(),
        })?
        .clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let (Some(sc), Some(ca), Some(be)) = (col("scenario"), col("cache"), col("backend")) else {
        return Err(CompareError::Format {
            path,
            message: "missing scenario, cache or backend column".into(),
        });
    };
    // (scenario, cache) → column → (seed, value) over seeds.
    let mut groups: BTreeMap<(String, String), SeedValues> = BTreeMap::new();
    let seed_col = col("seed");
    let bs = col("block_size");
    let mut backend = String::new();
    for (line, rec) in rdr.records().enumerate() {
        let rec = rec.map_err(|e| CompareError::Format {
            path: path.clone(),
            message: format!("line {}: {e}", line + 2),
        })?;
        backend = rec.get(be).unwrap_or_default().to_string();
        let seed = seed_col
            .and_then(|i| rec.get(i))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        // A scenario listing several block sizes has a row per size: each is its own figure.
        let cache = rec.get(ca).unwrap_or_default();
        let cache = match bs.and_then(|i| rec.get(i)).filter(|b| !b.is_empty()) {
            Some(b) => format!("{cache} b{b}"),
            None => cache.to_string(),
        };
        let g = groups
            .entry((rec.get(sc).unwrap_or_default().to_string(), cache))
            .or_default();
        for (name, _, _) in SUITE_COLUMNS {
            if let Some(v) = col(name)
                .and_then(|i| rec.get(i))
                .and_then(|s| s.parse().ok())
            {
                g.entry(name).or_default().push((seed, v));
            }
        }
    }
    let mut metrics = Vec::new();
    for ((scenario, cache), cols) in &groups {
        for (name, better, gated) in SUITE_COLUMNS {
            let Some(rows) = cols.get(name) else { continue };
            let xs: Vec<f64> = rows.iter().map(|r| r.1).collect();
            let (m, _) = crate::sweep::stats::mean_sd(&xs);
            let (lo, hi) = crate::sweep::stats::mean_interval(&xs, crate::sweep::stats::CONFIDENCE)
                .unwrap_or((m, m));
            metrics.push(Metric {
                scenario: scenario.clone(),
                cache: cache.clone(),
                name: (*name).into(),
                better: *better,
                gated: *gated,
                value: Some(m),
                lo,
                hi,
                n: xs.len(),
                per_seed: rows.iter().map(|&(seed, v)| (seed, [v, v])).collect(),
            });
        }
    }
    let mut paths = Vec::new();
    summaries(dir, &mut paths, 2);
    Ok(Folder {
        path: dir.to_path_buf(),
        kind: Kind::Suite,
        backend,
        metrics,
        identity: identity_of_summaries(&paths)?,
    })
}
