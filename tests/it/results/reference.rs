//! The committed reference results (`results/reference/sim/`) still come out of this code byte for
//! byte: `sim` is deterministic, so any change in a figure — intended or not — fails here and shows
//! up in review. After an intended change, regenerate them with the command in
//! `results/README.md` and commit the diff.

use crate::support;
use support::kvbench;

fn check(scenario: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join(scenario);
    let (code, text) = kvbench(&[
        "run",
        &format!("scenarios/{scenario}.toml"),
        "--backend",
        "sim",
        "--check-every",
        "0",
        "--trace-level",
        "requests",
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ]);
    assert_eq!(code, 0, "{scenario}: {text}");
    let reference = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("results/reference/sim")
        .join(scenario);
    for file in ["summary.json", "report.md"] {
        let want = std::fs::read_to_string(reference.join(file)).expect("reference file");
        let got = std::fs::read_to_string(out.join(file)).expect("fresh result");
        assert!(
            want == got,
            "{scenario}/{file} differs from results/reference/sim (regenerate it if the change is \
             intended; see results/README.md)\n--- reference\n{want}\n--- now\n{got}"
        );
    }
}

#[test]
fn quick_scenarios_match_the_committed_reference() {
    check("quick-basic");
    check("quick-mixed");
}

#[test]
fn the_chat_headline_matches_the_committed_reference() {
    check("chat-8b-h200");
}

#[test]
fn the_chat_scenario_on_h100_matches_the_committed_reference() {
    check("chat-8b-h100");
}
