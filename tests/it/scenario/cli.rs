//! `kvbench validate` and `kvbench scenario show` through the binary: exit codes and messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kvbench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(args)
        .output()
        .expect("run kvbench")
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn shipped_scenarios() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("scenarios"))
        .expect("scenarios/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

#[test]
fn validate_accepts_every_shipped_scenario() {
    let files = shipped_scenarios();
    assert!(files.len() >= 8);
    let args: Vec<&str> = std::iter::once("validate")
        .chain(files.iter().map(|p| p.to_str().expect("utf-8 path")))
        .collect();
    let out = kvbench(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each shipped scenario tests something of its own: no two are the same scenario under two
/// names (`decode-first-8b-h200` was `chat-8b-h200` renamed).
#[test]
fn no_two_shipped_scenarios_differ_only_in_name() {
    let mut seen: Vec<(String, serde_json::Value)> = Vec::new();
    for p in shipped_scenarios() {
        let s = kvbench::scenario::load(&p, &[]).unwrap_or_else(|e| panic!("{e}"));
        let mut v = serde_json::to_value(&s).expect("json");
        if let Some(o) = v.as_object_mut() {
            for k in ["name", "description", "source"] {
                o.remove(k);
            }
        }
        if let Some((other, _)) = seen.iter().find(|(_, w)| *w == v) {
            panic!("{} is {other} under another name", s.name);
        }
        seen.push((s.name.clone(), v));
    }
}

#[test]
fn validate_rejects_a_malformed_file_with_file_line_and_exit_2() {
    let bad = root().join("tests/fixtures/scenarios/unknown_key.toml");
    let good = root().join("scenarios/quick-basic.toml");
    let out = kvbench(&[
        "validate",
        good.to_str().unwrap_or(""),
        bad.to_str().unwrap_or(""),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:12:1: cache.blok_size: unknown field",
            bad.display()
        )),
        "{err}"
    );
}

#[test]
fn validate_applies_overrides() {
    let good = root().join("scenarios/quick-basic.toml");
    let p = good.to_str().unwrap_or("");
    let out = kvbench(&["validate", p, "--set", "memory.kv_budget=1 KiB"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--set memory.kv_budget:"));
    let out = kvbench(&["validate", p, "--set", "traffic.requests=3"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn show_prints_the_resolved_scenario_and_its_workload() {
    let p = root().join("scenarios/quick-mixed.toml");
    let p = p.to_str().unwrap_or("");
    let out = kvbench(&["scenario", "show", p]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // Defaults are written out, and the whole output parses back as a scenario.
    assert!(text.contains("preemption = \"recompute\""), "{text}");
    let again = kvbench::scenario::parse_str(&text, None, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.name, "quick-mixed");
    assert!(text.contains("#   requests          80"), "{text}");
    assert!(text.contains("workload hash"), "{text}");

    // Same seed, same hash; another seed, another hash.
    let hash = |args: &[&str]| {
        let out = kvbench(args);
        let t = String::from_utf8_lossy(&out.stdout).to_string();
        t.lines()
            .find_map(|l| l.strip_prefix("#   workload hash     ").map(str::to_string))
            .unwrap_or_default()
    };
    let a = hash(&["scenario", "show", p]);
    assert_eq!(a.len(), 64);
    assert_eq!(a, hash(&["scenario", "show", p]));
    assert_ne!(a, hash(&["scenario", "show", p, "--seed", "12345"]));
}

#[test]
fn show_json_is_one_object() {
    let p = root().join("scenarios/quick-basic.toml");
    let out = kvbench(&["scenario", "show", p.to_str().unwrap_or(""), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["workload"]["requests"], 48);
    assert_eq!(v["scenario"]["name"], "quick-basic");
}

#[test]
fn show_json_prints_the_resolved_model_without_nulls() {
    let p = root().join("scenarios/chat-8b-h200.toml");
    let out = kvbench(&["scenario", "show", p.to_str().unwrap_or(""), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let model = v["scenario"]["model"].as_object().expect("a model object");
    let nulls: Vec<&String> = model
        .iter()
        .filter(|(_, x)| x.is_null())
        .map(|(k, _)| k)
        .collect();
    assert!(nulls.is_empty(), "null model fields: {nulls:?}");
    // The preset's shape, resolved (llama3-8b: 32 layers, 8 KV heads of 128).
    assert_eq!(model["layers"], 32);
    assert_eq!(model["kv_heads"], 8);
    assert_eq!(model["head_dim"], 128);
}

#[test]
fn a_set_value_with_a_line_break_is_refused() {
    let p = root().join("scenarios/quick-basic.toml");
    let out = kvbench(&[
        "validate",
        p.to_str().unwrap_or(""),
        "--set",
        "seed=3\n[extra]\nkey = 1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("one line"), "{err}");
}

/// Output into a closed pipe (`kvbench ... | head -1` after head exited) must not panic: the
/// command finishes its work and exits with its own verdict.
#[test]
fn a_closed_stdout_pipe_is_not_a_panic() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader); // every write to the pipe now fails with EPIPE
    let scenario = root().join("scenarios/quick-basic.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["scenario", "show"])
        .arg(&scenario)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run kvbench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
}
