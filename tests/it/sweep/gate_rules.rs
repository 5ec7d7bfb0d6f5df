//! The gate's refusals, one test per rule: it compares only what both sides hold, from one
//! consistent source, and anything else is exit 2 with a sentence naming it — never a pass.
//! Each case is a copy of a real folder (the committed sim baseline sweep, a sim run of
//! quick-basic, a two-seed sim suite) with one thing planted; each passed the gate before.

use crate::support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::kvbench;

const BASELINE: &str = "results/baseline/sim/chat-8b-h200";

fn gate(base: &Path, cur: &Path) -> (i32, String) {
    kvbench(&[
        "gate",
        "--baseline",
        base.to_str().unwrap(),
        "--current",
        cur.to_str().unwrap(),
        "--max-regression",
        "5",
    ])
}

fn read(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn write(p: &Path, v: &Value) {
    std::fs::write(p, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// A copy of the committed baseline sweep with `edit` applied to its `sweep.json`.
fn planted_sweep(root: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    let mut j = read(&Path::new(BASELINE).join("sweep.json"));
    edit(&mut j);
    write(&dir.join("sweep.json"), &j);
    dir
}

fn run_folder(out: &Path) {
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
}

/// A sim run of quick-basic and a copy of it with `edit` applied to the copy's `summary.json`.
fn planted_run(root: &Path, edit: impl FnOnce(&mut Value)) -> (PathBuf, PathBuf) {
    let (a, b) = (root.join("run-a"), root.join("run-b"));
    run_folder(&a);
    copy_tree(&a, &b);
    let mut j = read(&b.join("summary.json"));
    edit(&mut j);
    write(&b.join("summary.json"), &j);
    (a, b)
}

fn refused(code: i32, text: &str, needle: &str) {
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not comparable:"), "{text}");
    assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    assert!(!text.contains("gate: passed"), "{text}");
}

#[test]
fn the_unplanted_copies_pass() {
    let dir = tempfile::tempdir().unwrap();
    let b = planted_sweep(dir.path(), "b", |_| {});
    let (code, text) = gate(Path::new(BASELINE), &b);
    assert_eq!(code, 0, "{text}");
    let (a, b) = planted_run(dir.path(), |_| {});
    let (code, text) = gate(&a, &b);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn a_cache_mode_the_baseline_has_and_the_current_lacks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = planted_sweep(dir.path(), "b", |j| {
        j["runs"]
            .as_array_mut()
            .unwrap()
            .retain(|r| r["cache"] == "paged");
    });
    let (code, text) = gate(Path::new(BASELINE), &b);
    refused(code, &text, "cache mode contiguous is in");
}

#[test]
fn a_non_finite_figure_where_the_baseline_has_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = planted_run(dir.path(), |j| {
        j["runs"][0]["ttft_ms"]["p99"] = Value::Null;
    });
    let (code, text) = gate(&a, &b);
    refused(code, &text, "ttft_p99_ms: ");
    assert!(text.contains("has no finite figure"), "{text}");
}

#[test]
fn a_suite_with_a_nan_a_table_off_its_cells_or_mixed_builds_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--seeds",
        "2",
        "--out",
        a.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    copy_tree(&a, &b);
    let csv = std::fs::read_to_string(b.join("suite.csv")).unwrap();
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = head.iter().position(|h| *h == "ttft_p99_ms").unwrap();
    let mut lines: Vec<String> = csv.lines().map(String::from).collect();
    let mut cells: Vec<String> = lines[1].split(',').map(String::from).collect();
    cells[col] = "NaN".into();
    lines[1] = cells.join(",");
    std::fs::write(b.join("suite.csv"), lines.join("\n") + "\n").unwrap();
    // The table no longer holds what suite.json records, and the figure is not a number.
    let (code, text) = gate(&a, &b);
    refused(code, &text, "has no finite figure");
    assert!(
        text.contains("does not hold the rows suite.json records"),
        "{text}"
    );
    // Without suite.json (an older suite) the NaN alone refuses it.
    std::fs::remove_file(b.join("suite.json")).unwrap();
    let (code, text) = gate(&a, &b);
    refused(code, &text, "has no finite figure");

    // The table and a cell disagree: the cell's summary was rerun or edited, the table not.
    let t = dir.path().join("t");
    copy_tree(&a, &t);
    let cell = std::fs::read_dir(&t)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("summary.json").is_file())
        .unwrap();
    let mut sj = read(&cell.join("summary.json"));
    let x = sj["runs"][0]["throughput_tokens_per_s"].as_f64().unwrap();
    sj["runs"][0]["throughput_tokens_per_s"] = Value::from(x * 0.5);
    write(&cell.join("summary.json"), &sj);
    let (code, text) = gate(&a, &t);
    refused(code, &text, "throughput_tokens_per_s is ");
    assert!(text.contains("its cell's"), "{text}");

    // Cells made by another build: one cell's environment names another revision.
    let c = dir.path().join("c");
    copy_tree(&a, &c);
    let cell = std::fs::read_dir(&c)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("environment.json").is_file())
        .unwrap();
    let mut env = read(&cell.join("environment.json"));
    env["git_revision"] = Value::from("0000000000000000000000000000000000000000");
    write(&cell.join("environment.json"), &env);
    let (code, text) = gate(&a, &c);
    refused(code, &text, "cells made by different kvbench revisions");
}

#[test]
fn a_run_whose_checks_failed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = planted_run(dir.path(), |j| {
        j["checks"]["ok"] = Value::Bool(false);
        j["checks"]["failures"] = Value::from(vec!["paged: reclamation: 3 blocks leaked"]);
    });
    let (code, text) = gate(&a, &b);
    refused(code, &text, "the run's own checks failed");
    assert!(text.contains("3 blocks leaked"), "{text}");
    // And as the baseline.
    let (code, text) = gate(&b, &a);
    refused(code, &text, "the run's own checks failed");
    // A sweep's too.
    let s = planted_sweep(dir.path(), "s", |j| {
        j["checks_ok"] = Value::Bool(false);
    });
    let (code, text) = gate(Path::new(BASELINE), &s);
    refused(code, &text, "the sweep's own checks failed");
}

#[test]
fn another_backend_is_refused_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = planted_run(dir.path(), |j| {
        j["backend"] = Value::from("cpu");
    });
    for (x, y) in [(&a, &b), (&b, &a)] {
        let (code, text) = gate(x, y);
        refused(code, &text, "on backend cpu");
    }
}

#[test]
fn another_device_profile_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = planted_sweep(dir.path(), "b", |j| {
        j["device"] = Value::from("h200-slow (0123456789abcdef)");
    });
    let (code, text) = gate(Path::new(BASELINE), &b);
    refused(code, &text, "with device profile");
    // A folder that does not say which profile priced it cannot be matched to one that does.
    let c = planted_sweep(dir.path(), "c", |j| {
        j.as_object_mut().unwrap().remove("device");
    });
    let (code, text) = gate(Path::new(BASELINE), &c);
    refused(code, &text, "does not record its device profile");
    // Runs record it in environment.json.
    let (a, r) = planted_run(dir.path(), |_| {});
    let mut env = read(&r.join("environment.json"));
    assert!(
        env["device_profile"].as_str().unwrap().contains(" ("),
        "{env}"
    );
    env["device_profile"] = Value::from("other (ffffffffffffffff)");
    write(&r.join("environment.json"), &env);
    let (code, text) = gate(&a, &r);
    refused(code, &text, "with device profile");
}

#[test]
fn a_headline_outside_its_own_interval_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // The headline moved 30%, the per-seed brackets it is computed from did not.
    let b = planted_sweep(dir.path(), "b", |j| {
        let r = &mut j["runs"][0];
        let x = r["rate_at_target_rps"].as_f64().unwrap();
        r["rate_at_target_rps"] = Value::from(x * 0.7);
    });
    let (code, text) = gate(Path::new(BASELINE), &b);
    refused(code, &text, "lies outside its own interval");
    assert!(text.contains("is not the mean"), "{text}");
    // Interval moved with it: still not the mean of its per-seed figures.
    let c = planted_sweep(dir.path(), "c", |j| {
        let r = &mut j["runs"][0];
        let x = r["rate_at_target_rps"].as_f64().unwrap();
        r["rate_at_target_rps"] = Value::from(x * 0.7);
        for e in r["rate_at_target_rps_ci"].as_array_mut().unwrap() {
            *e = Value::from(e.as_f64().unwrap() * 0.7);
        }
    });
    let (code, text) = gate(Path::new(BASELINE), &c);
    refused(code, &text, "is not the mean");
}

#[test]
fn a_duplicated_entry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A second paged entry carrying a 50% regression, after the first.
    let b = planted_sweep(dir.path(), "b", |j| {
        let mut dup = j["runs"][0].clone();
        let x = dup["rate_at_target_rps"].as_f64().unwrap();
        dup["rate_at_target_rps"] = Value::from(x * 0.5);
        j["runs"].as_array_mut().unwrap().push(dup);
    });
    let (code, text) = gate(Path::new(BASELINE), &b);
    refused(code, &text, "cache mode paged appears twice in runs");
    // A seed twice in the per-seed figures.
    let c = planted_sweep(dir.path(), "c", |j| {
        let seeds = j["runs"][0]["per_seed"].as_array_mut().unwrap();
        let first = seeds[0].clone();
        seeds.push(first);
    });
    let (code, text) = gate(Path::new(BASELINE), &c);
    refused(code, &text, "a seed appears twice in per_seed");
    // A key twice in one object: a reader keeping the last would see 1.0 req/s.
    let d = planted_sweep(dir.path(), "d", |_| {});
    let text = std::fs::read_to_string(d.join("sweep.json")).unwrap();
    let at = text.find("\"rate_at_target_rps\":").unwrap();
    let planted = format!(
        "{}\"rate_at_target_rps\": 1.0, {}",
        &text[..at],
        &text[at..]
    );
    std::fs::write(d.join("sweep.json"), planted).unwrap();
    let (code, text) = gate(Path::new(BASELINE), &d);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("sweep.json: key \"rate_at_target_rps\" appears twice"),
        "{text}"
    );
}

/// `compare` says what the gate refuses in its own table, and never calls a change between two
/// single runs significant.
#[test]
fn compare_states_refusals_and_single_runs_have_no_interval() {
    let dir = tempfile::tempdir().unwrap();
    let b = planted_sweep(dir.path(), "b", |j| {
        j["runs"]
            .as_array_mut()
            .unwrap()
            .retain(|r| r["cache"] == "paged");
    });
    let (code, text) = kvbench(&["compare", BASELINE, b.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("The gate refuses this comparison"), "{text}");
    assert!(
        text.contains("cannot compare**: chat-8b-h200 contiguous"),
        "{text}"
    );
    assert!(text.contains("refused: in A only"), "{text}");

    // Two single runs whose figures differ a little: a change, no interval.
    let (a, r) = planted_run(dir.path(), |j| {
        let t = &mut j["runs"][0]["throughput_tokens_per_s"];
        *t = Value::from(t.as_f64().unwrap() * 1.0006);
    });
    let (code, text) = kvbench(&["compare", a.to_str().unwrap(), r.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    let row = text
        .lines()
        .find(|l| l.contains("| paged | throughput_tokens_per_s |"))
        .unwrap();
    assert!(row.contains("+0.06%"), "{row}");
    assert!(row.contains("no interval"), "{row}");
    assert!(!text.contains("yes ("), "{text}");
}

/// Two suites of one tiered scenario at different host-tier capacities are two
/// configurations: each suite lists one capacity, so only the capacity in the row's key tells
/// them apart, and the gate refuses instead of comparing them as one.
#[test]
fn suites_at_different_host_tier_capacities_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let suite = |name: &str, cap: &str| {
        let out = dir.path().join(name);
        let (code, text) = kvbench(&[
            "suite",
            "scenarios/quick-tiered.toml",
            "--backend",
            "sim",
            "--seeds",
            "2",
            "--set",
            &format!("cache.host_tier.capacity={cap}"),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{text}");
        out
    };
    let (a, b, same) = (
        suite("a", "1 MiB"),
        suite("b", "2 MiB"),
        suite("c", "1024 KiB"),
    );
    let (code, text) = gate(&a, &b);
    refused(code, &text, "host 1 MiB");
    // The same capacity, however spelled, is the same configuration.
    let (code, text) = gate(&a, &same);
    assert_eq!(code, 0, "{text}");
}
