//! What the run's table (terminal and `report.md`) states: a run stopped by a violation prints
//! its figures as "aborted", never as measurements; TPOT sits beside ITL; goodput names each
//! SLO target with its unit; without a terminal each scenario's start is one line on stderr.

use crate::support;

use kvbench::experiment::{self, RunOptions};
use kvbench::results::report;
use kvbench_cache_api::Fault;
use support::kvbench;

fn scenario(name: &str) -> kvbench::scenario::Scenario {
    kvbench::scenario::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("scenarios/{name}.toml")),
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn an_aborted_run_prints_no_figures_as_measurements() {
    let s = scenario("quick-basic");
    let mut aborted = 0;
    for fault in Fault::ALL {
        let opts = RunOptions {
            fault: Some(fault),
            ..RunOptions::default()
        };
        let exp = experiment::run_scenario(&s, &opts).expect("run");
        let md = report::markdown(&exp);
        for (i, r) in exp.runs.iter().enumerate() {
            let rows = report::rows(&exp);
            let cell = |name: &str| {
                rows.iter()
                    .find(|(n, _)| n.starts_with(name))
                    .map(|(_, v)| v[i].clone())
                    .unwrap_or_else(|| panic!("row {name}"))
            };
            if r.end.violation.is_some() {
                aborted += 1;
                for name in ["throughput", "goodput", "TTFT", "TPOT", "ITL", "E2E"] {
                    assert_eq!(cell(name), report::ABORTED, "{} {name}", fault.name());
                }
                assert!(
                    md.contains(&format!("The {} run was aborted", r.end.mode.name())),
                    "{md}"
                );
            } else {
                assert_ne!(cell("throughput"), report::ABORTED);
            }
        }
    }
    println!("{aborted} aborted runs among the planted faults");
    assert!(aborted > 0, "no planted fault stopped a run");
}

#[test]
fn tpot_sits_beside_itl_and_goodput_names_its_targets_with_units() {
    let s = scenario("quick-basic");
    let exp = experiment::run_scenario(&s, &RunOptions::default()).expect("run");
    let md = report::markdown(&exp);
    assert!(md.contains("| TPOT p50 / p99 (ms, per request)"), "{md}");
    assert!(md.contains("| ITL p50 / p99 (ms, every gap)"), "{md}");
    let label = report::goodput_label(&s.slo);
    assert!(md.contains(&label), "{md}");
    if let Some(ms) = s.slo.ttft_p99_ms {
        assert!(label.contains(&format!("TTFT <= {ms} ms")), "{label}");
    }
    if let Some(ms) = s.slo.itl_p99_ms {
        assert!(label.contains(&format!("TPOT <= {ms} ms")), "{label}");
    }
    assert!(label.starts_with("goodput (req/s"), "{label}");
    // The TPOT cells are the run's per-request TPOT percentiles.
    let r = &exp.runs[0];
    let want = format!("{:.2} / {:.2}", r.metrics.tpot.p50, r.metrics.tpot.p99);
    assert!(md.contains(&want), "{want}\n{md}");
}

#[test]
fn without_a_terminal_each_scenario_start_is_a_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "scenarios/quick-mixed.toml",
        "--backend",
        "sim",
        "--out",
        tmp.path().join("out").to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("[1/2] quick-basic on sim: paged, then contiguous"),
        "{text}"
    );
    assert!(text.contains("[2/2] quick-mixed on sim"), "{text}");
}

/// `suite` traces requests by default (a whole suite at token level writes about a gigabyte);
/// `--trace-level tokens` asks for every token, and `run` keeps tokens as its default.
#[test]
fn suite_traces_requests_unless_tokens_are_asked_for() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tokens_in = |dir: &std::path::Path| {
        let text = std::fs::read_to_string(dir.join("quick-basic/trace.jsonl"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert!(
            text.contains("\"first_token\""),
            "no events in {}",
            dir.display()
        );
        text.lines()
            .filter(|l| l.contains("\"event\":\"token\""))
            .count()
    };
    let plain = tmp.path().join("plain");
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--out",
        plain.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(tokens_in(&plain), 0);
    let tokens = tmp.path().join("tokens");
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--trace-level",
        "tokens",
        "--out",
        tokens.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(tokens_in(&tokens) > 0);
}
