//! The checks can fail, and do only when they should: every planted fault is caught and reported
//! (exit 1 through the binary); a cancellation storm ends with every block reclaimed; bad input
//! exits 2; an existing results folder is not overwritten without --force.

use std::path::PathBuf;

use kvbench::experiment::{self, RunOptions};
use kvbench::results;
use kvbench_cache_api::Fault;

use crate::support;
use support::kvbench;

fn scenario_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"))
}

fn scenario(name: &str, overrides: &[&str]) -> kvbench::scenario::Scenario {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    kvbench::scenario::load(&scenario_path(name), &o).expect("scenario loads")
}

#[test]
fn every_planted_fault_is_caught_on_sim() {
    // Parallel sampling shares partially filled blocks (copy-on-write matters) and finishes
    // streams while steps are in flight once the fault pipelines the run.
    let s = scenario("parallel-sampling-8b-h200", &["traffic.requests=30"]);
    for fault in Fault::ALL {
        let opts = RunOptions {
            fault: Some(fault),
            ..RunOptions::default()
        };
        let exp = experiment::run_scenario(&s, &opts).expect("run");
        let paged = exp
            .run(kvbench_cache_api::CacheMode::Paged)
            .expect("paged run");
        let contiguous = exp
            .run(kvbench_cache_api::CacheMode::Contiguous)
            .expect("contiguous run");
        assert!(
            paged.end.violation.is_some() || !paged.end.reclamation.ok,
            "{}: not detected",
            fault.name()
        );
        assert!(
            !exp.failures().is_empty(),
            "{}: no failure reported",
            fault.name()
        );
        assert!(
            contiguous.end.violation.is_none() && contiguous.end.reclamation.ok,
            "the fault is armed on paged only"
        );
        let summary = results::summary::build(&exp);
        assert!(!summary.checks.ok);
        assert_eq!(summary.fault.as_deref(), Some(fault.name()));
    }
}

#[test]
fn without_a_fault_the_same_runs_pass_every_check() {
    for async_steps in ["false", "true"] {
        let s = scenario(
            "parallel-sampling-8b-h200",
            &[
                "traffic.requests=30",
                &format!("scheduler.async_steps={async_steps}"),
            ],
        );
        let exp = experiment::run_scenario(&s, &RunOptions::default()).expect("run");
        assert!(exp.failures().is_empty(), "{:?}", exp.failures());
    }
}

#[test]
fn a_cancellation_storm_ends_with_every_block_reclaimed() {
    for extra in [
        &[][..],
        &["scheduler.async_steps=true"][..],
        &[
            "memory.kv_budget=2GiB",
            "scheduler.preemption=swap",
            "scheduler.async_steps=true",
        ][..],
        &["memory.kv_budget=2GiB", "scheduler.policy=prefill_first"][..],
    ] {
        let mut o = vec!["traffic.requests=80"];
        o.extend_from_slice(extra);
        let exp = experiment::run_scenario(
            &scenario("cancel-storm-8b-h200", &o),
            &RunOptions::default(),
        )
        .expect("run");
        for r in &exp.runs {
            assert!(
                r.end.reclamation.ok,
                "{extra:?} {}: {}",
                r.end.mode.name(),
                r.end.reclamation.detail
            );
            assert_eq!(r.end.reclamation.leaked_slots, 0);
            assert!(
                r.metrics.counts.cancelled >= 20,
                "{extra:?}: a storm cancels many: {:?}",
                r.metrics.counts
            );
        }
        assert!(exp.failures().is_empty(), "{extra:?}: {:?}", exp.failures());
    }
}

#[test]
fn the_binary_exits_1_on_a_caught_fault_and_2_on_bad_input() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("r");
    let sc = scenario_path("parallel-sampling-8b-h200");
    let sc = sc.to_str().expect("utf-8 path");
    let o = out.to_str().expect("utf-8 path");
    let base = [
        "run",
        sc,
        "--backend",
        "sim",
        "--set",
        "traffic.requests=20",
        "--out",
        o,
    ];

    let (code, text) = kvbench(&[&base[..], &["--inject-fault", "leak"]].concat());
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("reclamation"), "{text}");
    let summary = std::fs::read_to_string(out.join("summary.json"))
        .expect("results written even when a check fails");
    assert!(summary.contains("\"fault\": \"leak\""));

    let (code, text) = kvbench(&base);
    assert_eq!(code, 2, "existing folder without --force: {text}");
    assert!(text.contains("--force"), "{text}");
    assert!(
        std::fs::read_to_string(out.join("summary.json"))
            .expect("kept")
            .contains("\"fault\": \"leak\""),
        "folder untouched"
    );

    let (code, text) = kvbench(&[&base[..], &["--force"]].concat());
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("| paged"),
        "prints the side-by-side table: {text}"
    );
    assert!(std::fs::read_to_string(out.join("report.md"))
        .expect("report")
        .contains("peak concurrent sequences"));

    let (code, text) = kvbench(&["run", sc, "--backend", "cuda", "--out", o, "--force"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("backend unavailable: cuda"), "{text}");

    let (code, text) = kvbench(&[&base[..], &["--force", "--inject-fault", "nonsense"]].concat());
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("skip-cow"), "lists the known faults: {text}");

    let (code, text) =
        kvbench(&[&base[..], &["--force", "--set", "cache.max_seq_len=oops"]].concat());
    assert_eq!(code, 2, "{text}");
}
