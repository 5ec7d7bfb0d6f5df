//! A suite folder (`suite.csv`, and every cell's `summary.json`) read into comparable metrics;
//! the table and its cells must say the same.

use super::*;

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
        // A scenario run with a host tier keys its rows by capacity too.
        let with_host = host_capacity_bytes(j).map(|b| format!("{cache} {}", host_key(b)));
        for (column, keys) in CELL_FIGURES {
            let key = (o.scenario.clone(), cache.clone(), o.seed, *column);
            let found = with_host
                .as_ref()
                .and_then(|c| printed.get(&(o.scenario.clone(), c.clone(), o.seed, *column)))
                .or_else(|| printed.get(&key));
            let (Some((line, text)), Some(x)) = (found, dig(run, keys).and_then(Value::as_f64))
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

/// The host tier's capacity of a cell, from any of its runs that had tiers.
fn host_capacity_bytes(j: &Value) -> Option<u64> {
    j.get("runs")?
        .as_array()?
        .iter()
        .find_map(|r| r.get("tiers")?.get(0)?.get("capacity_bytes")?.as_u64())
}

fn host_key(bytes: u64) -> String {
    format!("host {}", crate::units::format_bytes(bytes))
}

/// Per scenario, whether its rows carry several host-tier capacities (a capacity list the
/// suite expanded, where a row without a tier is keyed `host` with no figure).
fn several_capacities(csv_text: &str) -> BTreeSet<String> {
    let mut rdr = csv::Reader::from_reader(csv_text.as_bytes());
    let Ok(headers) = rdr.headers().cloned() else {
        return BTreeSet::new();
    };
    let col = |name: &str| headers.iter().position(|h| h == name);
    let (Some(sc), Some(ht)) = (col("scenario"), col("host_tier")) else {
        return BTreeSet::new();
    };
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rec in rdr.records().flatten() {
        if let (Some(s), Some(h)) = (rec.get(sc), rec.get(ht)) {
            seen.entry(s.to_string()).or_default().insert(h.to_string());
        }
    }
    seen.into_iter()
        .filter(|(_, caps)| caps.len() > 1)
        .map(|(s, _)| s)
        .collect()
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
pub(super) fn cell_folders(dir: &Path) -> Result<Vec<PathBuf>, CompareError> {
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

pub(super) fn read_suite(dir: &Path) -> Result<Folder, CompareError> {
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
    let (seed_col, bs, ht) = (col("seed"), col("block_size"), col("host_tier"));
    let multi_capacity = several_capacities(&csv_text);
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
        let mut cache = match bs.map(get).filter(|b| !b.is_empty()) {
            Some(b) => format!("{} b{b}", get(ca)),
            None => get(ca).to_string(),
        };
        let scenario = get(sc).to_string();
        // ... and one with a host tier a row per capacity: cells of another capacity are
        // another configuration, whether the suite listed one capacity or several.
        let h = ht.map(get).unwrap_or_default();
        if multi_capacity.contains(&scenario) || !h.is_empty() {
            match crate::units::parse_bytes(h) {
                Ok(b) => cache = format!("{cache} {}", host_key(b)),
                Err(_) => cache = format!("{cache} host {h}"),
            }
        }
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
                    let (m, _) = crate::stats::mean_sd(xs);
                    let (lo, hi) =
                        crate::stats::mean_interval(xs, crate::stats::CONFIDENCE).unwrap_or((m, m));
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
