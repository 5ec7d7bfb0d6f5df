//! `kvbench suite` writes one combined table; `kvbench fuzz` cases pass their per-step invariant
//! checks and replay from a seed.

use std::path::PathBuf;

use kvbench::experiment::fuzz::{run_case, Outcome};

use crate::support;
use support::kvbench;

#[test]
fn suite_writes_a_combined_markdown_and_csv_table() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("suite");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let a = root.join("chat-8b-h200.toml");
    let b = root.join("cancel-storm-8b-h200.toml");
    let args = [
        "suite",
        a.to_str().expect("path"),
        b.to_str().expect("path"),
        "--backend",
        "sim",
        "--set",
        "traffic.requests=20",
        "--out",
        out.to_str().expect("path"),
    ];
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{text}");
    let csv = std::fs::read_to_string(out.join("suite.csv")).expect("suite.csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("scenario,cache,backend"));
    assert_eq!(lines.len(), 1 + 2 * 2, "two scenarios x two cache modes");
    assert!(lines
        .iter()
        .any(|l| l.starts_with("cancel-storm-8b-h200,contiguous,sim")));
    assert!(std::fs::read_to_string(out.join("suite.md"))
        .expect("suite.md")
        .contains("| chat-8b-h200 | paged |"));
    assert!(out.join("chat-8b-h200/summary.json").is_file());
    // The suite owns its folder: running again replaces the per-scenario results.
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn fuzz_cases_pass_and_most_are_feasible() {
    let (mut passed, mut refused) = (0, 0);
    for seed in 0..40 {
        match run_case(seed) {
            Outcome::Passed => passed += 1,
            Outcome::Infeasible(_) => refused += 1,
            Outcome::Failed(e) => {
                panic!("fuzz seed {seed} failed: {e} (replay: kvbench fuzz --seed {seed})")
            }
        }
    }
    assert!(passed >= 30, "{passed} passed, {refused} refused");
}

#[test]
fn fuzz_replays_a_seed_and_prints_its_scenario() {
    let (code, text) = kvbench(&["fuzz", "--seed", "3"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("name = \"fuzz-3\""), "{text}");
    assert!(text.contains("seed 3: ok"), "{text}");
    let (again, text2) = kvbench(&["fuzz", "--seed", "3"]);
    assert_eq!((again, text2), (code, text), "a replay is deterministic");
}
