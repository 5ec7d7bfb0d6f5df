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

/// `quick-basic` written into `dir` as `name` with its `device` line replaced; returns the path
/// and the line the device is on.
fn quick_basic_on(dir: &Path, name: &str, device: &str) -> (PathBuf, usize) {
    let text = std::fs::read_to_string(root().join("scenarios/quick-basic.toml")).expect("read");
    let line = text
        .lines()
        .position(|l| l.starts_with("device ="))
        .expect("a device line")
        + 1;
    let text: String = text
        .lines()
        .map(|l| match l.starts_with("device =") {
            true => format!("device = {device:?}\n"),
            false => format!("{l}\n"),
        })
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    (path, line)
}

/// A device no profile describes is refused by `validate` as `run` refuses it, at the key.
#[test]
fn validate_refuses_an_unknown_device_as_run_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, line) = quick_basic_on(dir.path(), "tpu.toml", "tpu9");
    let p = path.to_str().expect("utf-8");
    let out = kvbench(&["validate", p]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{p}:{line}:1: device: unknown device profile \"tpu9\""
        )),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains(": ok"));
    // The same name through `--set` is blamed on the override.
    let good = root().join("scenarios/quick-basic.toml");
    let out = kvbench(&[
        "validate",
        good.to_str().unwrap_or(""),
        "--set",
        "device=tpu9",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--set device: unknown device profile \"tpu9\""),
        "{err}"
    );
    // What `run` says of it, before any work.
    let results = dir.path().join("out");
    let out = kvbench(&[
        "run",
        p,
        "--backend",
        "sim",
        "--out",
        results.to_str().expect("utf-8"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("unknown device profile \"tpu9\""), "{err}");
    assert!(!results.exists());
}

/// A malformed `devices/NAME.toml` beside the scenario is what `run` loads, so `validate` checks
/// it too and reports its problems at their lines in the profile.
#[test]
fn validate_checks_the_device_profile_beside_the_scenario() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, line) = quick_basic_on(dir.path(), "local.toml", "cpu");
    let p = path.to_str().expect("utf-8");
    let out = kvbench(&["validate", p]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::create_dir(dir.path().join("devices")).expect("devices/");
    let profile = dir.path().join("devices/cpu.toml");
    let text = std::fs::read_to_string(root().join("scenarios/devices/cpu.toml")).expect("read");
    let flops_line = text
        .lines()
        .position(|l| l.starts_with("peak_flops_per_s ="))
        .expect("peak_flops_per_s")
        + 1;
    let text: String = text
        .lines()
        .map(|l| match l.starts_with("peak_flops_per_s =") {
            true => "peak_flops_per_s = -1.0\n".to_string(),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&profile, text).expect("write");
    let out = kvbench(&["validate", p]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}:{flops_line}:1: peak_flops_per_s: must be between",
            profile.display()
        )),
        "{err}"
    );
    assert!(err.contains(&format!("{p}:{line}:1: device: ")), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(": ok"));
    // `run` refuses it with the same line.
    let results = dir.path().join("out");
    let out = kvbench(&[
        "run",
        p,
        "--backend",
        "sim",
        "--out",
        results.to_str().expect("utf-8"),
    ]);
    let run_err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{run_err}");
    assert!(
        run_err.contains(&format!(
            "{}:{flops_line}:1: peak_flops_per_s: must be between",
            profile.display()
        )),
        "{run_err}"
    );
    assert!(!results.exists());
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
