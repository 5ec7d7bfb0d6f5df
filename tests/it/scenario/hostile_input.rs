//! Hostile input: every shipped scenario (and device profile) mutated field by field — zero,
//! −1, tiny and huge magnitudes, integer maxima, empty and path-like strings, wrong types,
//! missing and unknown keys — and handed to the `kvbench` binary as a child process under an
//! address-space limit and a wall-time bound. The binary may only exit 0, 1 or 2, never panic
//! or abort, and every exit 2 names `FILE:LINE:COL: KEY`; a value of the wrong type is named by
//! its own full key on its own line.
//!
//! `validate` covers every mutation (many files per process). A seeded sample of the mutations
//! that validate also runs on `sim`; `KVBENCH_SEED` replays a sample, `KVBENCH_HOSTILE_RUNS`
//! widens it (default 16).
//!
//! The mutation tables — the hostile values, the extra keys, the named cases — are data in
//! `tests/it/support/hostile_input.toml`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use toml::Value;

use crate::support::hostile_tables;
use hostile_tables::{
    entries, field, hostile_values, kind, leaves, parse_value, set, tables, text,
};

const BIN: &str = env!("CARGO_BIN_EXE_kvbench");
/// Address-space limit of every child (KiB): far below what an unchecked allocation asks for.
const MEMORY_LIMIT_KIB: u64 = 2 << 20;
const VALIDATE_WALL: Duration = Duration::from_secs(60);
const RUN_WALL: Duration = Duration::from_secs(60);
/// Files per `validate` process.
const BATCH: usize = 250;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the binary under `ulimit -v` (through `sh`) with output to files, killed past `wall`.
fn run_limited(args: &[String], dir: &Path, wall: Duration) -> Outcome {
    let out_path = dir.join("child.stdout");
    let err_path = dir.join("child.stderr");
    let stdout = std::fs::File::create(&out_path).expect("stdout file");
    let stderr = std::fs::File::create(&err_path).expect("stderr file");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {MEMORY_LIMIT_KIB} && exec \"$0\" \"$@\""
        ))
        .arg(BIN)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("spawn sh");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > wall {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvbench {args:?} ran past {wall:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Outcome {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

fn assert_clean_exit(o: &Outcome, what: &str) {
    assert!(
        matches!(o.code, Some(0..=2)),
        "{what}: exit {:?} (0, 1 or 2 only)\n{}",
        o.code,
        o.stderr
    );
    for bad in ["panicked at", "memory allocation of", "RUST_BACKTRACE"] {
        assert!(
            !o.stderr.contains(bad),
            "{what}: `{bad}` in stderr\n{}",
            o.stderr
        );
    }
}

/// One mutation: what was done, to which key, and the rendered file.
struct Mutation {
    scenario: String,
    key: String,
    label: String,
    /// The key's written type was replaced by another kind of value (not number for number).
    wrong_type: bool,
    text: String,
}

/// Scenario files with the request count held small, so that a run of any valid mutation is
/// cheap; `requests` itself is still mutated.
fn base_scenarios() -> Vec<(String, toml::Table)> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("scenarios"))
        .expect("scenarios/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p).expect("read scenario");
        let mut t: toml::Table = toml::from_str(&text).expect("shipped scenario parses");
        if let Some(Value::Table(traffic)) = t.get_mut("traffic") {
            if let Some(Value::Integer(n)) = traffic.get_mut("requests") {
                *n = (*n).min(12);
            }
        }
        let name = p.file_stem().map(|s| s.to_string_lossy().to_string());
        out.push((name.unwrap_or_default(), t));
    }
    out
}

fn mutations() -> Vec<Mutation> {
    let mut out = Vec::new();
    for (scenario, base) in base_scenarios() {
        let mut ls = Vec::new();
        leaves(&base, "", &mut ls);
        // Keys a scenario may give besides the ones shipped files write.
        for extra in entries("extra_key") {
            let key = text(&extra, "key");
            if !ls.iter().any(|(k, _)| *k == key) && base.contains_key("traffic") {
                ls.push((key, field(&extra, "v")));
            }
        }
        for (key, original) in &ls {
            for (label, v) in hostile_values() {
                let mut t = base.clone();
                let mut value = v.clone();
                // Sub-tables whose siblings a new key needs (tenants, shared prefix).
                if key == "traffic.tenants.count" && !base_has(&base, "traffic.tenants") {
                    let mut tn = toml::Table::new();
                    tn.insert("count".into(), v.clone());
                    set(&mut t, "traffic.tenants", Some(Value::Table(tn)));
                    set(
                        &mut t,
                        "scheduler.tenant_fairness",
                        Some(Value::Boolean(true)),
                    );
                    value = v.clone();
                } else if key == "traffic.shared_prefix.groups"
                    && !base_has(&base, "traffic.shared_prefix")
                {
                    let mut sp = toml::Table::new();
                    sp.insert("groups".into(), v.clone());
                    sp.insert("prefix_tokens".into(), Value::Integer(4));
                    sp.insert("share".into(), Value::Float(0.5));
                    set(&mut t, "traffic.shared_prefix", Some(Value::Table(sp)));
                }
                set(&mut t, key, Some(value));
                let wrong_type = kind(original) != kind(&v)
                    && kind(original) != 3
                    && kind(&v) != 3
                    && key != "cache.block_size";
                out.push(Mutation {
                    scenario: scenario.clone(),
                    key: key.clone(),
                    label: format!("{key} = {label}"),
                    wrong_type,
                    text: toml::to_string(&t).expect("render"),
                });
            }
            let mut t = base.clone();
            set(&mut t, key, None);
            out.push(Mutation {
                scenario: scenario.clone(),
                key: key.clone(),
                label: format!("{key} removed"),
                wrong_type: false,
                text: toml::to_string(&t).expect("render"),
            });
        }
        let mut ts = Vec::new();
        tables(&base, "", &mut ts);
        for table in ts {
            let key = if table.is_empty() {
                "bogus_key".to_string()
            } else {
                format!("{table}.bogus_key")
            };
            let mut t = base.clone();
            set(&mut t, &key, Some(Value::Integer(1)));
            out.push(Mutation {
                scenario: scenario.clone(),
                key: key.clone(),
                label: format!("{key} added"),
                wrong_type: true,
                text: toml::to_string(&t).expect("render"),
            });
        }
    }
    out
}

fn base_has(t: &toml::Table, path: &str) -> bool {
    let mut cur = t;
    for p in path.split('.') {
        match cur.get(p) {
            Some(Value::Table(inner)) => cur = inner,
            Some(_) => return true,
            None => return false,
        }
    }
    true
}

/// The 1-based line where `key` is written in a file `toml::to_string` rendered (one key per
/// line under `[dotted.table]` headers), found without the harness's own locator.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let mut table = String::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if let Some(h) = l.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            table = h.trim().to_string();
            continue;
        }
        let Some((k, _)) = l.split_once('=') else {
            continue;
        };
        let k = k.trim().trim_matches('"');
        let full = if table.is_empty() {
            k.to_string()
        } else {
            format!("{table}.{k}")
        };
        if full == key {
            return Some(i + 1);
        }
    }
    None
}

/// `FILE:LINE:COL: KEY: message` lines naming `file` (after any `error: ...:` context a
/// command puts in front): (line, key) of each.
fn diagnostics(stderr: &str, file: &str) -> Vec<(usize, String)> {
    let prefix = format!("{file}:");
    stderr
        .lines()
        .filter_map(|l| {
            let at = l.find(&prefix)?;
            // The whole file name, not the tail of a longer one.
            if at > 0 && !l[..at].ends_with([' ', '/']) {
                return None;
            }
            let rest = &l[at + prefix.len()..];
            let mut parts = rest.splitn(4, ": ");
            let pos = parts.next()?;
            let key = parts.next()?.to_string();
            let (line, col) = pos.split_once(':')?;
            let line: usize = line.parse().ok()?;
            let _col: usize = col.parse().ok()?;
            Some((line, key))
        })
        .collect()
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
}

fn seed() -> u64 {
    std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0605_711e)
}

/// The tables hold what their labels say: a value the TOML reader turned into something else
/// (a subnormal flushed to 0, a maximum clipped) would quietly test another input.
#[test]
fn the_mutation_tables_hold_what_their_labels_say() {
    let values: BTreeMap<String, Value> = hostile_values().into_iter().collect();
    assert_eq!(values.len(), hostile_values().len(), "labels are unique");
    let int = |label: &str| match values.get(label) {
        Some(Value::Integer(i)) => *i,
        other => panic!("{label}: {other:?}"),
    };
    let float = |label: &str| match values.get(label) {
        Some(Value::Float(f)) => *f,
        other => panic!("{label}: {other:?}"),
    };
    assert_eq!(int("i64::MAX"), i64::MAX);
    assert_eq!(int("u32::MAX"), u32::MAX as i64);
    assert_eq!(int("2^31"), 1 << 31);
    assert_eq!(int("1e9"), 1_000_000_000);
    assert_eq!(int("-1"), -1);
    assert!(float("1e-320") > 0.0 && !float("1e-320").is_normal());
    assert!(float("nan").is_nan());
    assert_eq!(float("inf"), f64::INFINITY);
    assert_eq!(float("1e300"), 1e300);
    assert_eq!(values.get("[]"), Some(&Value::Array(vec![])));
    assert_eq!(values.get("\"\""), Some(&Value::String(String::new())));
    for name in ["extra_key", "named", "arrival_case", "huge"] {
        assert!(!entries(name).is_empty(), "`{name}` is empty");
    }
}

#[test]
fn every_mutation_of_every_shipped_scenario_exits_cleanly_and_names_its_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let all = mutations();
    assert!(all.len() > 1000, "only {} mutations", all.len());
    let mut valid: Vec<usize> = Vec::new();
    for (b, chunk) in all.chunks(BATCH).enumerate() {
        let mut files = Vec::new();
        for (i, m) in chunk.iter().enumerate() {
            let name = format!("m{b}-{i}-{}.toml", m.scenario);
            std::fs::write(dir.path().join(&name), &m.text).expect("write mutation");
            files.push(name);
        }
        let mut args = vec!["validate".to_string()];
        args.extend(files.iter().cloned());
        let o = run_limited(&args, dir.path(), VALIDATE_WALL);
        assert_clean_exit(&o, &format!("validate batch {b}"));
        for (i, m) in chunk.iter().enumerate() {
            let file = &files[i];
            let ok = o
                .stdout
                .lines()
                .any(|l| l.starts_with(&format!("{file}: ok")));
            let found = diagnostics(&o.stderr, file);
            let what = format!("{} ({}; file {file})", m.label, m.scenario);
            assert!(
                ok == found.is_empty(),
                "{what}: neither ok nor FILE:LINE:COL: KEY (or both)\n{}",
                o.stderr
                    .lines()
                    .filter(|l| l.contains(file.as_str()))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            for (line, key) in &found {
                assert!(valid_key(key), "{what}: key `{key}` is not a dotted key");
                assert!(*line >= 1, "{what}: line {line}");
            }
            // A key reported missing is named by its full path, wherever it sat.
            if let Some(leaf) = m.label.strip_suffix(" removed") {
                let short = leaf.rsplit('.').next().unwrap_or(leaf);
                let missing = format!("missing field `{short}`");
                for l in o.stderr.lines().filter(|l| l.contains(file.as_str())) {
                    if l.contains(&missing) {
                        assert!(
                            l.contains(&format!(": {}: ", m.key)),
                            "{what}: a missing key must be named `{}`: {l}",
                            m.key
                        );
                    }
                }
            }
            if m.wrong_type {
                let want_line = line_of(&m.text, &m.key);
                assert!(
                    found
                        .iter()
                        .any(|(line, key)| *key == m.key && Some(*line) == want_line),
                    "{what}: a wrong type must be named by its full key on its own line \
                     {want_line:?}; got {found:?}"
                );
            }
            if ok {
                valid.push(b * BATCH + i);
            }
        }
    }
    println!(
        "{} mutations validated, {} accepted",
        all.len(),
        valid.len()
    );

    // A seeded sample of the accepted mutations runs on sim.
    let runs: usize = std::env::var("KVBENCH_HOSTILE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let seed = seed();
    println!("sim runs: seed {seed} (KVBENCH_SEED replays), {runs} runs (KVBENCH_HOSTILE_RUNS)");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    valid.shuffle(&mut rng);
    let mut by_scenario: BTreeMap<&str, usize> = BTreeMap::new();
    for &i in valid.iter().take(runs) {
        let m = &all[i];
        *by_scenario.entry(&m.scenario).or_default() += 1;
        let file = format!("run-{i}.toml");
        std::fs::write(dir.path().join(&file), &m.text).expect("write");
        let args: Vec<String> = [
            "run",
            &file,
            "--backend",
            "sim",
            "--out",
            &format!("out-{i}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let o = run_limited(&args, dir.path(), RUN_WALL);
        let what = format!("run {} ({})", m.label, m.scenario);
        assert_clean_exit(&o, &what);
        if o.code == Some(2) {
            assert!(
                !diagnostics(&o.stderr, &file).is_empty() || o.stderr.contains("device"),
                "{what}: exit 2 without FILE:LINE:COL: KEY\n{}",
                o.stderr
            );
        }
    }
    println!("sim runs per scenario: {by_scenario:?}");
}

/// The cases the issue names, each refused at load with its key (not by an abort).
#[test]
fn named_hostile_cases_are_refused_with_their_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let quick = std::fs::read_to_string(root().join("scenarios/quick-basic.toml")).expect("read");
    let cases: Vec<(String, String, String, String)> = entries("named")
        .iter()
        .map(|e| {
            let base = root().join(format!("scenarios/{}.toml", text(e, "scenario")));
            (
                std::fs::read_to_string(base).expect("read"),
                text(e, "key"),
                text(e, "value"),
                text(e, "needle"),
            )
        })
        .collect();
    for (i, (base, key, value, needle)) in cases.iter().enumerate() {
        let mut t: toml::Table = toml::from_str(base).expect("parse");
        set(&mut t, key, parse_value(value));
        let what = format!("{key} = {value}");
        let stderr = refused_naming(dir.path(), &format!("case-{i}.toml"), &t, key, &what);
        assert!(
            stderr.contains(needle),
            "{what}: `{needle}` not in\n{stderr}"
        );
    }

    // Arrival-dependent ones: a burst with a rate, think time and delays past their range.
    let more: Vec<(String, String, String)> = entries("arrival_case")
        .iter()
        .map(|e| (text(e, "key"), text(e, "value"), text(e, "named")))
        .collect();
    for (i, (key, value, named)) in more.iter().enumerate() {
        let text = quick.replace("[traffic.arrival]", "[traffic.arrival_unused]");
        let mut t: toml::Table = toml::from_str(&text).expect("parse");
        if let Some(Value::Table(traffic)) = t.get_mut("traffic") {
            let arrival = traffic.remove("arrival_unused");
            if key != "traffic.arrival" {
                if let Some(a) = arrival {
                    traffic.insert("arrival".into(), a);
                }
            }
        }
        set(&mut t, key, parse_value(value));
        let what = format!("{key} = {value}");
        refused_naming(dir.path(), &format!("more-{i}.toml"), &t, named, &what);
    }
}

/// Writes `t` as `file` in `dir` and validates it: it must exit cleanly with 2 and a
/// diagnostic naming `key`. Returns its stderr for further checks.
fn refused_naming(dir: &Path, file: &str, t: &toml::Table, key: &str, what: &str) -> String {
    std::fs::write(dir.join(file), toml::to_string(t).expect("render")).expect("write");
    let o = run_limited(
        &["validate".to_string(), file.to_string()],
        dir,
        VALIDATE_WALL,
    );
    assert_clean_exit(&o, what);
    assert_eq!(o.code, Some(2), "{what}: accepted\n{}", o.stdout);
    assert!(
        diagnostics(&o.stderr, file).iter().any(|(_, k)| k == key),
        "{what}: no diagnostic names `{key}`:\n{}",
        o.stderr
    );
    o.stderr
}

/// Cost follows use: four billion prefix groups and a hundred million fair-share tenants,
/// drawn by a few requests, run in the memory limit (building every group or one queue lane
/// per tenant would need hundreds of GiB).
#[test]
fn huge_group_and_tenant_counts_cost_what_is_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let quick = std::fs::read_to_string(root().join("scenarios/quick-basic.toml")).expect("read");
    let mut t: toml::Table = toml::from_str(&quick).expect("parse");
    for e in entries("huge") {
        set(&mut t, &text(&e, "key"), parse_value(&text(&e, "value")));
    }
    std::fs::write(
        dir.path().join("many.toml"),
        toml::to_string(&t).expect("render"),
    )
    .expect("write");
    let args: Vec<String> = ["run", "many.toml", "--backend", "sim", "--out", "out"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let o = run_limited(&args, dir.path(), RUN_WALL);
    assert_clean_exit(&o, "many groups and tenants");
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let csv = std::fs::read_to_string(dir.path().join("out/requests.csv")).expect("requests.csv");
    let tenants: std::collections::BTreeSet<&str> = csv
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').nth(3))
        .collect();
    assert!(
        tenants.len() > 1,
        "requests spread over tenants: {tenants:?}"
    );
}

/// Device profiles mutated field by field and run on `sim` beside a small scenario; every exit 2
/// must be `devices/<name>.toml:LINE:COL: KEY`.
///
/// Profiles are validated like scenarios (`backend/sim/profile.rs`): every exit 2 names
/// `devices/<device>.toml:LINE:COL: KEY` for the mutated key.
#[test]
fn every_mutation_of_every_device_profile_exits_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("devices")).expect("devices/");
    let scenarios = [("cpu", "quick-basic"), ("h200", "chat-8b-h200")];
    let runs: usize = std::env::var("KVBENCH_HOSTILE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let seed = seed();
    println!("profile mutations: seed {seed}, {runs} per profile");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (device, scenario) in scenarios {
        let text = std::fs::read_to_string(root().join(format!("scenarios/{scenario}.toml")))
            .expect("scenario");
        let mut st: toml::Table = toml::from_str(&text).expect("parse");
        if let Some(Value::Table(traffic)) = st.get_mut("traffic") {
            traffic.insert("requests".into(), Value::Integer(6));
        }
        let scenario_file = format!("{scenario}.toml");
        std::fs::write(
            dir.path().join(&scenario_file),
            toml::to_string(&st).expect("render"),
        )
        .expect("write");
        let profile_text =
            std::fs::read_to_string(root().join(format!("scenarios/devices/{device}.toml")))
                .expect("profile");
        let profile: toml::Table = toml::from_str(&profile_text).expect("parse");
        let mut cases = Vec::new();
        let mut ls = Vec::new();
        leaves(&profile, "", &mut ls);
        for (key, _) in &ls {
            for (label, v) in hostile_values() {
                let mut t = profile.clone();
                set(&mut t, key, Some(v));
                cases.push((format!("{key} = {label}"), key.clone(), t));
            }
            let mut t = profile.clone();
            set(&mut t, key, None);
            cases.push((format!("{key} removed"), key.clone(), t));
        }
        cases.shuffle(&mut rng);
        for (label, key, t) in cases.into_iter().take(runs) {
            let profile_file = dir.path().join("devices").join(format!("{device}.toml"));
            std::fs::write(&profile_file, toml::to_string(&t).expect("render")).expect("write");
            let args: Vec<String> = ["run", &scenario_file, "--backend", "sim", "--out", "out"]
                .iter()
                .map(|s| s.to_string())
                .chain(["--force".to_string()])
                .collect();
            let o = run_limited(&args, dir.path(), RUN_WALL);
            let what = format!("{device} profile: {label}");
            assert_clean_exit(&o, &what);
            if o.code == Some(2) {
                let found = diagnostics(&o.stderr, &format!("devices/{device}.toml"));
                assert!(
                    found.iter().any(|(_, k)| *k == key),
                    "{what}: exit 2 must be `devices/{device}.toml:LINE:COL: {key}`\n{}",
                    o.stderr
                );
            }
        }
    }
}
