//! Where `run` and `suite` write, and what they refuse: a scenario `name` that is a path, a
//! target that is a file or someone's folder (refused before any work, leaving nothing behind),
//! interrupted runs (no temporary folder left), I/O errors (the OS message once), the default
//! folders that both commands replace, and the smaller flag checks of `fuzz` and `kernel-bench`.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_kvbench")
}

/// Runs the binary in `dir`; returns its exit code and stdout+stderr.
fn kvbench_in(dir: &Path, args: &[&str]) -> (i32, String) {
    support::kvbench_env(dir, &[], args)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kvbench(args: &[&str]) -> (i32, String) {
    kvbench_in(&repo(), args)
}

fn scenario(name: &str) -> String {
    repo()
        .join("scenarios")
        .join(format!("{name}.toml"))
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

/// quick-basic with its `name` line replaced, written into `dir`.
fn renamed_scenario(dir: &Path, file: &str, name: &str) -> String {
    let text = std::fs::read_to_string(scenario("quick-basic")).expect("quick-basic");
    let text = text.replace("name = \"quick-basic\"", &format!("name = {name:?}"));
    assert!(text.contains(&format!("name = {name:?}")));
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write scenario");
    path.to_str().expect("utf-8 path").to_string()
}

/// Every entry of `dir`, sorted, as names.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

fn no_panic(text: &str) {
    assert!(
        !text.contains("panicked") && !text.contains("RUST_BACKTRACE"),
        "{text}"
    );
}

#[test]
fn a_traversal_name_never_writes_outside_the_output_folder() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("a/b");
    std::fs::create_dir_all(&root).expect("mkdir");
    let sc = renamed_scenario(&root, "evil.toml", "../../x");
    for cmd in ["suite", "run"] {
        let (code, text) = kvbench_in(&root, &[cmd, &sc, "--backend", "sim"]);
        assert_eq!(code, 2, "{cmd}: {text}");
        assert!(text.contains("../../x"), "{cmd} names the bad name: {text}");
        no_panic(&text);
        assert!(
            !tmp.path().join("x").exists(),
            "{cmd} wrote outside results/"
        );
        assert!(!root.join("x").exists() && !root.join("results").exists());
        assert_eq!(entries(tmp.path()), ["a"], "{cmd} left nothing beside");
    }
}

#[test]
fn an_absolute_name_never_replaces_that_directory() {
    // Even another run's results folder (which --force could replace by its own path).
    for precious in ["precious.txt", "summary.json"] {
        absolute_name_case(precious);
    }
}

fn absolute_name_case(precious: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&victim).expect("mkdir");
    std::fs::write(victim.join(precious), "keep me").expect("write");
    let sc = renamed_scenario(tmp.path(), "abs.toml", victim.to_str().expect("utf-8"));
    let out = tmp.path().join("out");
    let o = out.to_str().expect("utf-8");
    for args in [
        vec!["suite", &sc, "--backend", "sim", "--out", o],
        vec!["run", &sc, &sc, "--backend", "sim", "--out", o, "--force"],
        vec!["run", &sc, "--backend", "sim"],
    ] {
        let (code, text) = kvbench_in(tmp.path(), &args);
        assert_eq!(code, 2, "{args:?}: {text}");
        no_panic(&text);
        assert_eq!(entries(&victim), [precious], "{args:?}");
        assert_eq!(
            std::fs::read_to_string(victim.join(precious)).expect("kept"),
            "keep me"
        );
        assert!(!tmp.path().join("results").exists(), "{args:?}");
        assert!(
            entries(tmp.path()).iter().all(|e| !e.starts_with('.')),
            "no temporary left: {:?}",
            entries(tmp.path())
        );
    }
}

#[test]
fn out_naming_a_regular_file_is_refused_before_any_work_even_with_force() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("notes.txt");
    std::fs::write(&file, "my notes").expect("write");
    let f = file.to_str().expect("utf-8");
    let sc = scenario("quick-basic");
    let (code, text) = kvbench(&["run", &sc, "--backend", "sim", "--out", f, "--force"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not a folder (a file or a link)"), "{text}");
    assert!(!text.contains("| paged"), "refused before the run: {text}");
    assert_eq!(std::fs::read_to_string(&file).expect("kept"), "my notes");
    assert_eq!(entries(tmp.path()), ["notes.txt"], "no leftovers");
}

#[test]
fn force_never_replaces_a_folder_that_is_not_a_results_folder() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mine");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("thesis.tex"), "chapter 1").expect("write");
    let d = dir.to_str().expect("utf-8");
    let sc = scenario("quick-basic");
    let (code, text) = kvbench(&["run", &sc, "--backend", "sim", "--out", d, "--force"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not a kvbench results folder"), "{text}");
    assert!(!text.contains("| paged"), "refused before the run: {text}");
    assert_eq!(entries(&dir), ["thesis.tex"]);
    assert_eq!(entries(tmp.path()), ["mine"], "no leftovers");
}

#[test]
fn an_io_error_prints_the_os_message_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("plain");
    std::fs::write(&file, "").expect("write");
    let out = file.join("sub");
    let sc = scenario("quick-basic");
    let o = out.to_str().expect("utf-8");
    let (code, text) = kvbench(&["run", &sc, "--backend", "sim", "--out", o]);
    assert_eq!(code, 2, "{text}");
    assert_eq!(
        text.matches("Not a directory").count(),
        1,
        "the OS message once: {text}"
    );
    assert!(text.contains(o), "names the path: {text}");
}

#[test]
fn run_and_suite_both_replace_their_default_folders_and_fault_runs_go_elsewhere() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cwd = tmp.path();
    let sc = scenario("quick-basic");
    let latest = cwd.join("results/latest/quick-basic/summary.json");
    let (code, text) = kvbench_in(cwd, &["suite", &sc, "--backend", "sim"]);
    assert_eq!(code, 0, "{text}");
    assert!(latest.is_file());
    // The tour: right after the suite, `run` on the same scenario replaces the suite's folder...
    let (code, text) = kvbench_in(cwd, &["run", &sc, "--backend", "sim"]);
    assert_eq!(code, 0, "run after suite: {text}");
    // ...and a planted fault writes its own folder, exits 1, and leaves the real results alone.
    for _ in 0..2 {
        let (code, text) = kvbench_in(
            cwd,
            &["run", &sc, "--backend", "sim", "--inject-fault", "leak"],
        );
        assert_eq!(code, 1, "caught, repeatably: {text}");
    }
    let faulted = std::fs::read_to_string(cwd.join("results/fault-leak/quick-basic/summary.json"))
        .expect("fault run's summary");
    assert!(faulted.contains("\"fault\": \"leak\""), "{faulted}");
    let real = std::fs::read_to_string(&latest).expect("latest summary");
    assert!(real.contains("\"fault\": null"), "{real}");
    let (code, text) = kvbench_in(cwd, &["suite", &sc, "--backend", "sim"]);
    assert_eq!(code, 0, "suite after run: {text}");
    // A folder named with --out is the user's: refused the second time without --force.
    let mine = cwd.join("mine");
    let m = mine.to_str().expect("utf-8");
    let (code, text) = kvbench_in(cwd, &["run", &sc, "--backend", "sim", "--out", m]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = kvbench_in(cwd, &["run", &sc, "--backend", "sim", "--out", m]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--force"), "{text}");
    for dir in ["results/latest", "results/fault-leak", "results", "."] {
        let hidden: Vec<String> = entries(&cwd.join(dir))
            .into_iter()
            .filter(|e| e.starts_with('.'))
            .collect();
        assert!(hidden.is_empty(), "{dir}: temporaries left: {hidden:?}");
    }
}

#[test]
fn two_scenarios_with_one_name_are_refused_before_any_work() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sc = scenario("quick-basic");
    let o = tmp.path().join("o");
    let (code, text) = kvbench(&[
        "run",
        &sc,
        &sc,
        "--backend",
        "sim",
        "--out",
        o.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("would both write"), "{text}");
    assert!(!o.exists(), "nothing written");
}

/// The temporary folder exists from before the run starts, so the signal lands mid-run.
fn interrupted_run_leaves_no_temporary(signal: &str, want_code: i32) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("r");
    let mut child = Command::new(bin())
        .current_dir(repo())
        .args([
            "run",
            &scenario("chat-8b-h200"),
            "--backend",
            "sim",
            "--set",
            "traffic.requests=200000",
            "--out",
            out.to_str().expect("utf-8"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvbench");
    let t0 = Instant::now();
    let staged = loop {
        let hidden: Vec<String> = entries(tmp.path())
            .into_iter()
            .filter(|e| e.starts_with(".r.tmp-"))
            .collect();
        if !hidden.is_empty() {
            break hidden;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("kvbench exited ({status}) before staging its folder");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no temporary folder"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Give the handler thread time to be installed and the run time to be under way.
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.id().to_string();
    // The shell's own `kill`, so no procps package is needed.
    let kill = Command::new("sh")
        .args(["-c", &format!("kill {signal} {pid}")])
        .status()
        .expect("kill");
    assert!(kill.success());
    let out_put = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out_put.stderr);
    assert_eq!(out_put.status.code(), Some(want_code), "{stderr}");
    assert!(stderr.contains("interrupted: removed"), "{stderr}");
    assert!(
        entries(tmp.path()).is_empty(),
        "left {:?} (staged {staged:?})",
        entries(tmp.path())
    );
}

#[test]
fn sigterm_during_a_run_removes_its_temporary_folder() {
    interrupted_run_leaves_no_temporary("-TERM", 128 + 15);
}

#[test]
fn sigint_during_a_run_removes_its_temporary_folder() {
    interrupted_run_leaves_no_temporary("-INT", 128 + 2);
}

#[test]
fn fuzz_refuses_unreachable_durations_and_seed_with_seconds() {
    for secs in ["1e20", "nan", "-1", "inf"] {
        let arg = format!("--seconds={secs}");
        let (code, text) = kvbench(&["fuzz", &arg]);
        assert_eq!(code, 2, "--seconds {secs}: {text}");
        assert!(text.contains("--seconds"), "{text}");
        no_panic(&text);
    }
    let (code, text) = kvbench(&["fuzz", "--seed", "3", "--seconds", "5"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("cannot be used with"), "{text}");
    let (code, text) = kvbench(&["fuzz", "--seconds", "0"]);
    assert_eq!(code, 0, "zero seconds runs one case: {text}");
    assert!(
        text.contains("1 cases passed") || text.contains("1 refused"),
        "{text}"
    );
}

#[test]
fn kernel_bench_refuses_bad_flags_and_offers_only_its_backends() {
    for (flag, value, says) in [
        ("--block-size", "3", "power of two"),
        ("--block-size", "0", "expected 1 to"),
        ("--max-gib", "nan", "--max-gib"),
        ("--max-gib", "0", "--max-gib"),
        ("--max-gib", "-1", "--max-gib"),
        ("--batch", "18446744073709551615", "--batch"),
        ("--context", "0", "--context"),
    ] {
        let arg = format!("{flag}={value}");
        let (code, text) = kvbench(&["kernel-bench", "--quick", &arg]);
        assert_eq!(code, 2, "{flag} {value}: {text}");
        assert!(text.contains(says), "{flag} {value}: {text}");
        no_panic(&text);
    }
    let (code, help) = kvbench(&["kernel-bench", "-h"]);
    assert_eq!(code, 0);
    assert!(help.contains("possible values: auto, cpu, cuda"), "{help}");
    assert!(!help.contains("sim"), "{help}");
    let (code, text) = kvbench(&["kernel-bench", "--backend", "sim"]);
    assert_eq!(code, 2, "{text}");
}

#[test]
fn help_says_what_auto_picks() {
    let (code, help) = kvbench(&["run", "--help"]);
    assert_eq!(code, 0);
    assert!(
        help.contains("auto = cuda where it is built and usable"),
        "{help}"
    );
    assert!(help.contains("else cpu"), "{help}");
}

#[test]
fn report_shows_max_rel_err_and_its_tolerance_recomputed_from_summary() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("cpu");
    let o = out.to_str().expect("utf-8");
    let sc = scenario("quick-basic");
    let (code, text) = kvbench(&[
        "run",
        &sc,
        "--backend",
        "cpu",
        "--set",
        "traffic.requests=6",
        "--out",
        o,
    ]);
    assert_eq!(code, 0, "{text}");
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).expect("summary.json"),
    )
    .expect("json");
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    let row = report
        .lines()
        .find(|l| l.starts_with("| numerics max rel err (tolerance)"))
        .unwrap_or_else(|| panic!("no numerics row: {report}"));
    let runs = summary["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for run in runs {
        let n = &run["numerics"];
        let (err, tol) = (
            n["max_rel_err"].as_f64().expect("max_rel_err"),
            n["tolerance"].as_f64().expect("tolerance"),
        );
        let cell = format!("{err:.2e} ({tol:.0e})");
        assert!(row.contains(&cell), "{cell} not in {row}");
    }
    // On sim nothing is computed, so there is no row to show.
    let sim = tmp.path().join("sim");
    let (code, text) = kvbench(&[
        "run",
        &sc,
        "--backend",
        "sim",
        "--out",
        sim.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    let report = std::fs::read_to_string(sim.join("report.md")).expect("report.md");
    assert!(!report.contains("numerics max rel err"), "{report}");
}

/// A folder is kvbench's own only by its marker: a `summary.json` alone (anyone's project may
/// hold one) is not enough, a folder of another command's kind is not replaced by `run`, and a
/// run folder where someone added a file keeps that file. A folder `run` marked is replaced.
#[test]
fn force_replaces_only_a_run_folder_kvbench_marked_holding_only_what_it_wrote() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sc = scenario("quick-basic");
    let refused = |dir: &Path, why: &str| {
        let d = dir.to_str().expect("utf-8");
        let before = entries(dir);
        let (code, text) = kvbench(&["run", &sc, "--backend", "sim", "--out", d, "--force"]);
        assert_eq!(code, 2, "{text}");
        assert!(text.contains(why), "{why:?} not in {text}");
        assert!(!text.contains("| paged"), "refused before the run: {text}");
        assert_eq!(entries(dir), before, "nothing deleted");
    };
    let lookalike = tmp.path().join("project");
    std::fs::create_dir(&lookalike).expect("mkdir");
    std::fs::write(lookalike.join("summary.json"), "{}").expect("write");
    std::fs::write(lookalike.join("thesis.tex"), "chapter 1").expect("write");
    refused(&lookalike, "not a kvbench results folder");

    let tune = tmp.path().join("tune");
    std::fs::create_dir(&tune).expect("mkdir");
    std::fs::write(tune.join("tune.json"), "{}").expect("write");
    std::fs::write(
        tune.join(".kvbench.json"),
        r#"{"kind": "tune", "format": 1, "files": ["tune.json"]}"#,
    )
    .expect("write");
    refused(&tune, "a kvbench tune folder, not a run folder");

    let mine = tmp.path().join("mine");
    let m = mine.to_str().expect("utf-8");
    let (code, text) = kvbench(&["run", &sc, "--backend", "sim", "--out", m]);
    assert_eq!(code, 0, "{text}");
    let marker = std::fs::read_to_string(mine.join(".kvbench.json")).expect("marker");
    for f in ["summary.json", "requests.csv", "trace.jsonl", "memory.csv"] {
        assert!(
            marker.contains(&format!("\"{f}\"")),
            "{f} not listed: {marker}"
        );
    }
    let (code, text) = kvbench(&["run", &sc, "--backend", "sim", "--out", m, "--force"]);
    assert_eq!(code, 0, "a marked run folder is replaced: {text}");
    std::fs::write(mine.join("notes.md"), "my notes").expect("write");
    refused(&mine, "holds notes.md, which kvbench did not write");
    assert_eq!(
        std::fs::read_to_string(mine.join("notes.md")).expect("kept"),
        "my notes"
    );
}

/// Flags that can only make a run that proves nothing, or a figure of nothing, are refused with
/// the flag and file named, before any work.
#[test]
fn flags_that_cannot_apply_are_refused_up_front() {
    let sc = scenario("quick-basic");
    let (code, text) = kvbench(&[
        "run",
        &sc,
        "--backend",
        "sim",
        "--inject-fault",
        "stale-onload",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("quick-basic.toml: cache.host_tier: --inject-fault stale-onload"),
        "{text}"
    );
    assert!(!text.contains("| paged"), "refused before the run: {text}");
    let (code, text) = kvbench(&["plan", "--preset", "llama3-8b", "--host-tier", "0 GiB"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--host-tier `0 GiB`"), "{text}");
    let trace = repo().join("scenarios/traces/mooncake-mini.jsonl");
    let t = trace.to_str().expect("utf-8");
    for flag in ["--hash-block-tokens", "--block-size"] {
        let (code, text) = kvbench(&["trace", "stats", t, flag, "0"]);
        assert_eq!(code, 2, "{flag}: {text}");
        assert!(text.contains(flag), "{flag}: {text}");
    }
}
