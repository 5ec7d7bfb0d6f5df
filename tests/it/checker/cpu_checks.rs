//! On the `cpu` backend the run compares what it computed: the oracle's numerics and the paged
//! vs contiguous greedy token streams. A clean run passes both; a planted bad block table with
//! invariant checks off is caught by them alone.

use std::path::PathBuf;

use kvbench::backend::BackendKind;
use kvbench::experiment::{self, RunOptions};
use kvbench_cache_api::Fault;

fn quick() -> kvbench::scenario::Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-basic.toml");
    kvbench::scenario::load(&path, &["traffic.requests=10".to_string()]).expect("scenario")
}

#[test]
fn a_clean_cpu_run_agrees_with_the_oracle_and_across_cache_modes() {
    let opts = RunOptions {
        backend: BackendKind::Cpu,
        ..RunOptions::default()
    };
    let exp = experiment::run_scenario(&quick(), &opts).expect("cpu run");
    assert_eq!(exp.backend, "cpu");
    assert!(exp.failures().is_empty(), "{:?}", exp.failures());
    assert_eq!(exp.token_mismatch, None);
    for r in &exp.runs {
        let n = r.end.numerics.expect("cpu reports numerics");
        assert!(n.ok && n.checked_steps > 0, "{n:?}");
        assert!(r
            .record
            .as_ref()
            .expect("collected")
            .streams
            .iter()
            .all(|s| s.token_ids.len() == s.token_ns.len()));
    }
}

#[test]
fn a_bad_block_table_is_caught_by_computation_alone() {
    let opts = RunOptions {
        backend: BackendKind::Cpu,
        fault: Some(Fault::BadBlockTable),
        invariant_check_every: 0,
        ..RunOptions::default()
    };
    let exp = experiment::run_scenario(&quick(), &opts).expect("cpu run");
    let paged = &exp.runs[0].end;
    assert!(
        paged.violation.is_none()
            || paged
                .violation
                .as_deref()
                .is_some_and(|v| v.starts_with("after the run"))
    );
    let numerics_failed = paged.numerics.is_some_and(|n| !n.ok);
    assert!(
        numerics_failed || exp.token_mismatch.is_some(),
        "{:?}",
        exp.failures()
    );
    assert!(!exp.failures().is_empty());
}
