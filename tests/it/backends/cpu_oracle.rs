//! The `cpu` backend end to end: every shipped quick scenario passes the f64 oracle in both
//! cache modes with identical greedy streams, and the planted `skip-cow` and `bad-block-table`
//! faults are caught by the oracle alone (invariant checks off until the end of the run).

use std::path::{Path, PathBuf};

use kvbench::backend::BackendKind;
use kvbench::engine::TraceKind;
use kvbench::experiment::{run_scenario, Experiment, RunOptions};
use kvbench::scenario;
use kvbench_cache_api::{CacheMode, Fault};

fn quick_scenarios() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("scenarios/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("quick-") && n.ends_with(".toml"))
        })
        .collect();
    v.sort();
    v
}

fn run(path: &Path, overrides: &[String], fault: Option<Fault>) -> Experiment {
    let s = scenario::load(path, overrides).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let opts = RunOptions {
        backend: BackendKind::Cpu,
        fault,
        invariant_check_every: if fault.is_some() { 0 } else { 1 },
        ..RunOptions::default()
    };
    run_scenario(&s, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_quick_scenario_passes_the_oracle_in_both_modes() {
    let paths = quick_scenarios();
    assert!(!paths.is_empty(), "no scenarios/quick-*.toml shipped");
    for path in &paths {
        let exp = run(path, &[], None);
        assert_eq!(exp.failures(), Vec::<String>::new(), "{}", path.display());
        assert!(
            exp.token_mismatch.is_none(),
            "{}: paged and contiguous streams differ",
            path.display()
        );
        for mode in [CacheMode::Paged, CacheMode::Contiguous] {
            let r = exp.run(mode).expect("both modes ran");
            let n = r.end.numerics.expect("cpu reports numerics");
            eprintln!("{} {}: {n:?}", path.display(), mode.name());
            assert!(n.ok, "{} {}: {n:?}", path.display(), mode.name());
            assert!(
                n.checked_steps > 0,
                "{} {}: nothing was checked",
                path.display(),
                mode.name()
            );
            assert!(n.max_rel_err <= n.tolerance && n.tolerance <= 1e-4);
        }
    }
}

/// The mixed scenario has forks (copy-on-write), shared prefixes and preemption; a planted
/// fault there must move some checked logits far beyond tolerance.
#[test]
fn planted_faults_are_caught_by_the_oracle() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-mixed.toml");
    for fault in [Fault::SkipCow, Fault::BadBlockTable] {
        let exp = run(&path, &["traffic.requests=40".into()], Some(fault));
        let paged = exp
            .run(CacheMode::Paged)
            .and_then(|r| r.end.numerics)
            .expect("paged numerics");
        let contiguous = exp
            .run(CacheMode::Contiguous)
            .and_then(|r| r.end.numerics)
            .expect("contiguous numerics");
        eprintln!("{}: paged {paged:?}", fault.name());
        assert!(
            !paged.ok,
            "{}: the oracle did not notice: {paged:?}",
            fault.name()
        );
        assert!(
            paged.max_rel_err > 100.0 * paged.tolerance,
            "{}: {paged:?}",
            fault.name()
        );
        assert!(
            contiguous.ok,
            "{}: the fault is armed on the paged manager only: {contiguous:?}",
            fault.name()
        );
        assert!(
            exp.failures().iter().any(|f| f.contains("numerics")),
            "{}: {:?}",
            fault.name(),
            exp.failures()
        );
    }
}

/// bf16 KV storage: the run passes under its own stated tolerance (1e-2), not the f32 one.
#[test]
fn bf16_kv_passes_under_its_stated_tolerance() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-basic.toml");
    let exp = run(
        &path,
        &[
            "model.kv_dtype=\"bf16\"".into(),
            "traffic.requests=16".into(),
        ],
        None,
    );
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let n = exp
            .run(mode)
            .and_then(|r| r.end.numerics)
            .expect("numerics");
        eprintln!("bf16 {}: {n:?}", mode.name());
        assert!(n.ok && n.checked_steps > 0, "{n:?}");
        assert_eq!(n.tolerance, 1e-2);
        assert!(n.max_rel_err > 1e-6, "bf16 rounding should show: {n:?}");
    }
}

/// Preemption by swap: K/V really leave for the host and come back into fresh blocks; the
/// resumed sequences must still match the oracle and the contiguous run token for token.
#[test]
fn swapped_sequences_resume_exactly() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-mixed.toml");
    let exp = run(
        &path,
        &[
            "scheduler.preemption=\"swap\"".into(),
            "traffic.requests=50".into(),
        ],
        None,
    );
    assert_eq!(exp.failures(), Vec::<String>::new());
    let paged = exp.run(CacheMode::Paged).expect("paged ran");
    let swaps = paged
        .record
        .as_ref()
        .expect("collected")
        .events
        .iter()
        .filter(|e| matches!(e.kind, TraceKind::SwapOut { .. }))
        .count();
    assert!(
        swaps > 0,
        "the scenario no longer swaps; the test proves nothing"
    );
    let n = paged.end.numerics.expect("numerics");
    assert!(n.ok && n.checked_steps > 0, "{n:?}");
}
