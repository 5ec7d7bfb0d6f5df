//! The `cuda` backend's host code end to end on the emulated device (`--backend cuda-emu`): the
//! quick scenarios pass the oracle on every sequence with identical paged and contiguous token
//! streams, reclamation holds, the ledger reconciles with the emulated `cuMemGetInfo` and every
//! device allocation is freed — with synchronous and with asynchronous steps, under seeded
//! completion delays; `tiny-sliding`'s sliding layers attend their windows and pass the oracle,
//! MLA and recurrent groups are refused by name. The planted faults are caught; `kvbench fuzz
//! --backend cuda-emu` runs and replays. Request counts are cut so the whole file stays within a CI minute or two.

use std::path::PathBuf;

use kvbench::backend::cuda::backend::take_teardowns;
use kvbench::backend::BackendKind;
use kvbench::experiment::{self, RunOptions};
use kvbench::results::{self, Experiment};
use kvbench_cache_api::{CacheMode, Fault};

use crate::support;
use support::kvbench;

fn scenario(name: &str, overrides: &[&str]) -> kvbench::scenario::Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    kvbench::scenario::load(&path, &o).expect("scenario loads")
}

fn run_emu(name: &str, overrides: &[&str], fault: Option<Fault>) -> Experiment {
    let opts = RunOptions {
        backend: BackendKind::CudaEmu,
        fault,
        invariant_check_every: if fault.is_some() { 0 } else { 1 },
        ..RunOptions::default()
    };
    experiment::run_scenario(&scenario(name, overrides), &opts).expect("cuda-emu run")
}

/// A clean run: every check passed, both modes checked by the oracle, same tokens, and both
/// backends' teardowns freed everything and reconciled.
fn assert_clean(label: &str, exp: &Experiment) {
    assert_eq!(exp.backend, "cuda-emu", "{label}");
    assert!(exp.failures().is_empty(), "{label}: {:?}", exp.failures());
    assert_eq!(exp.token_mismatch, None, "{label}");
    for r in &exp.runs {
        let n = r.end.numerics.expect("cuda-emu reports numerics");
        assert!(n.ok && n.checked_steps > 0, "{label}: {n:?}");
        assert!(r.end.reclamation.ok, "{label}");
    }
    let t = take_teardowns();
    assert_eq!(t.len(), 2, "{label}: one backend per cache mode: {t:?}");
    for td in &t {
        assert_eq!(td.backend, "cuda-emu");
        assert!(td.ok(), "{label}: {td:?}");
    }
}

#[test]
fn quick_scenarios_pass_every_check_on_the_emulated_device() {
    take_teardowns();
    for (name, n) in [
        ("quick-basic", "traffic.requests=10"),
        ("quick-mixed", "traffic.requests=14"),
        ("conversation-quick", "traffic.requests=4"),
    ] {
        let exp = run_emu(name, &[n], None);
        assert_clean(name, &exp);
    }
}

#[test]
fn quick_scenarios_pass_with_asynchronous_steps() {
    take_teardowns();
    for (name, n) in [
        ("quick-basic", "traffic.requests=8"),
        ("quick-mixed", "traffic.requests=14"),
        ("conversation-quick", "traffic.requests=3"),
    ] {
        let exp = run_emu(name, &[n, "scheduler.async_steps=true"], None);
        assert_clean(&format!("{name} async"), &exp);
    }
}

/// `tiny-sliding` (two sliding layers of window 12, then two full ones) on the emulated device:
/// each sliding layer's kernels attend its window only, and the oracle, which bounds the window
/// by its own loops, checks every sequence at every sampled step; paged and contiguous emit the
/// same tokens. f32 KV with synchronous steps, bf16 KV with asynchronous ones; prompts far
/// longer than the window and than a block.
#[test]
fn tiny_sliding_passes_the_oracle_on_the_emulated_device() {
    take_teardowns();
    for (name, sets) in [
        (
            "quick-basic",
            &["traffic.requests=8", "model.preset=tiny-sliding"][..],
        ),
        (
            "quick-mixed",
            &[
                "traffic.requests=12",
                "model.preset=tiny-sliding",
                "model.kv_dtype=bf16",
                "scheduler.async_steps=true",
            ][..],
        ),
    ] {
        let exp = run_emu(name, sets, None);
        assert_eq!(
            exp.cache_manager,
            kvbench::scenario::CacheManager::Summed,
            "{name}: cuda maps one block table a sequence"
        );
        assert_clean(&format!("{name} tiny-sliding"), &exp);
        for r in &exp.runs {
            let n = r.end.numerics.expect("numerics");
            println!(
                "{name} tiny-sliding {:?}: {} checked steps, max rel err {:.3e}",
                r.end.mode, n.checked_steps, n.max_rel_err
            );
        }
    }
}

/// MLA and recurrent groups stay refused on the emulated device, before any work, naming the
/// group's key and kind.
#[test]
fn mla_and_recurrent_groups_are_refused_by_name() {
    for (preset, key) in [
        ("tiny-mla", "model.layer_groups.0 (attention = \"mla\")"),
        (
            "tiny-hybrid",
            "model.layer_groups.1 (attention = \"recurrent\")",
        ),
    ] {
        let opts = RunOptions {
            backend: BackendKind::CudaEmu,
            ..RunOptions::default()
        };
        let s = scenario(
            "quick-basic",
            &[
                "traffic.requests=2",
                &format!("model.preset={preset}"),
                "scheduler.prefix_cache=false",
            ],
        );
        let e = match experiment::run_scenario(&s, &opts) {
            Ok(_) => panic!("{preset} ran on cuda-emu"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(key), "{preset}: {e}");
    }
}

#[test]
fn the_four_planted_faults_are_caught_on_the_emulated_device() {
    let cases: [(Fault, &[&str]); 4] = [
        // Forks share partially filled blocks.
        (Fault::SkipCow, &["traffic.requests=14"]),
        // Cancellations while a step that reads the stream is in flight.
        (
            Fault::EarlyReuse,
            &["traffic.requests=20", "scheduler.async_steps=true"],
        ),
        (Fault::Leak, &["traffic.requests=8"]),
        (Fault::BadBlockTable, &["traffic.requests=8"]),
    ];
    for (fault, overrides) in cases {
        let exp = run_emu("quick-mixed", overrides, Some(fault));
        take_teardowns();
        let paged = exp.run(CacheMode::Paged).expect("paged run");
        assert!(paged.fault_fired > 0, "{}: never fired", fault.name());
        let failures = exp.failures();
        assert!(!failures.is_empty(), "{}: not caught", fault.name());
        assert!(
            !failures.iter().any(|f| f.contains("never fired")),
            "{failures:?}"
        );
        assert!(!results::summary::build(&exp).checks.ok);
    }
}

#[test]
fn the_cli_marks_the_backend_and_its_timings_as_emulated() {
    let dir = std::env::temp_dir().join(format!("kvbench-emu-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("run");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--backend",
        "cuda-emu",
        "--emu-seed",
        "42",
        "--set",
        "traffic.requests=3",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("--emu-seed 42"),
        "the delay seed is printed: {text}"
    );
    let summary = std::fs::read_to_string(out.join("summary.json")).expect("summary.json");
    assert!(summary.contains("\"backend\": \"cuda-emu\""), "{summary}");
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(report.contains("Timings are emulated"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fuzzing_on_the_emulated_device_runs_and_replays_a_case_from_both_seeds() {
    let (code, text) = kvbench(&["fuzz", "--backend", "cuda-emu", "--seconds", "4"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("delay seed") && text.contains("cases passed"),
        "{text}"
    );
    let (code, text) = kvbench(&[
        "fuzz",
        "--backend",
        "cuda-emu",
        "--seed",
        "3",
        "--emu-seed",
        "34",
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("seed 3: ok") && text.contains("--emu-seed 34"),
        "{text}"
    );
}

/// Found by `kvbench fuzz --backend cuda-emu`: with swap preemption and async steps a sequence
/// came back from the host in other runs of slots than it left in, and the host buffer's layout
/// followed the runs (K and V of each run together), so its V rows were read from K's place.
/// The host layout is now all K rows, then all V rows, whatever the runs.
#[test]
fn a_sequence_swapped_out_and_in_through_different_runs_keeps_its_kv() {
    take_teardowns();
    kvbench::backend::cuda::set_emu_seed(1);
    let seed = 1_796_158_746_852_104_363;
    let case = kvbench::experiment::fuzz::case_toml(seed);
    assert!(case.contains("preemption = \"swap\"") && case.contains("async_steps = true"));
    match kvbench::experiment::fuzz::run_case_on(seed, BackendKind::CudaEmu) {
        kvbench::experiment::fuzz::Outcome::Passed => {}
        kvbench::experiment::fuzz::Outcome::Failed(e) => panic!("seed {seed}: {e}"),
        kvbench::experiment::fuzz::Outcome::Infeasible(e) => panic!("seed {seed} refused: {e}"),
    }
    assert!(take_teardowns().iter().all(|t| t.ok()));
}

/// `prefill_first` runs a prompt whole, alone when it exceeds `max_tokens_per_step`: the cuda
/// backend's per-step workspace must hold such a step. This fuzz case (a 40-token budget, prompts
/// up to 149 tokens) once failed with "step of 128 tokens; the workspace holds 64".
#[test]
fn a_prefill_first_prompt_beyond_the_token_budget_fits_the_workspace() {
    let (code, text) = kvbench(&[
        "fuzz",
        "--backend",
        "cuda-emu",
        "--generator",
        "classic",
        "--seed",
        "1796191032084981358",
        "--emu-seed",
        "2317918318774540858",
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("policy = \"prefill_first\""), "{text}");
    assert!(text.contains(": ok"), "{text}");
}
