//! The grouped managers on `cpu` (`cache.manager = "hybrid"`): the hybrid paged manager and the
//! grouped contiguous baseline run the tiny layer-group variants with real compute, each layer
//! reading through its own table, and the independent f64 oracle checks the logits. A sliding
//! table's released blocks, its page copies, swaps and the recurrent state per stream are all
//! exercised on real data; the planted faults fail the run where the cpu can see them.
//!
//! Every run is seeded: `KVBENCH_SEED` replays another seed (printed by each test).

use crate::support;
use crate::support::cpu_groups as cpu_groups_support;
use cpu_groups_support::{cpu, root, seed, tiny};
use support::kvbench;

use std::path::Path;

use kvbench::backend::cpu::{kv_tolerance, CpuBackend};
use kvbench::backend::{Clock, RunSetup};
use kvbench::engine::sink::Collect;
use kvbench::engine::EngineConfig;
use kvbench::experiment::{self, RunOptions};
use kvbench::scenario::{CacheManager, Scenario};
use kvbench_cache_api::{CacheMode, Fault};

/// `file` (under `scenarios/`) with `preset`, `dtype` KV, the grouped managers, `requests`
/// requests and `sets` besides.
fn scenario(file: &str, preset: &str, dtype: &str, requests: u32, sets: &[&str]) -> Scenario {
    let all = [&["cache.manager=hybrid"], sets].concat();
    tiny(file, preset, dtype, requests, &all)
}

/// Runs `s` on cpu in both modes and checks that the grouped managers ran, every check passed
/// (invariants, reclamation: all memory came back, numerics, the same tokens in both modes) and
/// every checked step was within the format's tolerance.
fn passes(s: &Scenario, seed: u64, what: &str) -> kvbench::results::Experiment {
    let exp = experiment::run_scenario(s, &cpu(seed)).expect("cpu run");
    assert_eq!(exp.cache_manager, CacheManager::Hybrid, "{what}");
    assert!(
        exp.failures().is_empty(),
        "{what} seed {seed}: {:?}",
        exp.failures()
    );
    assert_eq!(exp.token_mismatch, None, "{what} seed {seed}");
    let tol = kv_tolerance(s.model_shape().expect("shape").kv_dtype);
    for r in &exp.runs {
        let n = r.end.numerics.expect("cpu reports numerics");
        assert!(
            n.ok && n.checked_steps > 0 && n.max_rel_err <= tol,
            "{what} {:?} seed {seed}: {n:?}",
            r.end.mode
        );
        assert!(r.end.reclamation.ok, "{what} {:?}", r.end.mode);
        println!(
            "{what} {:?}: {} checked steps, max rel err {:.3e} (tolerance {tol:e})",
            r.end.mode, n.checked_steps, n.max_rel_err
        );
    }
    exp
}

#[test]
fn each_tiny_variant_passes_the_oracle_through_both_grouped_managers_in_bf16_and_fp8_e4m3() {
    let seed = seed();
    for preset in ["tiny-sliding", "tiny-mla", "tiny-hybrid"] {
        for dtype in ["bf16", "fp8_e4m3"] {
            let s = scenario("quick-basic.toml", preset, dtype, 8, &[]);
            passes(&s, seed, &format!("{preset} {dtype}"));
        }
    }
}

/// Shared prefixes, forks (parallel sampling: page copies of shared partial pages), cancellations
/// and a tight budget: the non-recurrent variants hit the prefix cache and pass the oracle; the
/// recurrent one (prefix cache off) forks its state with its pages.
#[test]
fn prefix_hits_and_forks_pass_the_oracle_on_every_variant() {
    let seed = seed();
    for preset in ["tiny-sliding", "tiny-mla", "tiny-hybrid"] {
        let s = scenario("quick-mixed.toml", preset, "bf16", 16, &[]);
        let exp = passes(&s, seed, &format!("{preset} mixed"));
        let paged = exp.run(CacheMode::Paged).expect("paged run");
        assert!(
            paged.metrics.streams.total > u64::from(s.traffic.requests.unwrap_or(0)),
            "{preset} seed {seed}: no fork ran ({:?})",
            paged.metrics.streams
        );
        if preset != "tiny-hybrid" {
            assert!(
                paged.metrics.cached_prompt_tokens > 0,
                "{preset} seed {seed}: no prefix hit"
            );
        }
    }
}

/// Preemption by swap: each swapped sequence's cells go out table by table (a sliding table's
/// window only) and come back through its new tables, and the oracle still passes.
#[test]
fn swaps_move_each_tables_cells_and_pass_the_oracle() {
    let seed = seed();
    for preset in ["tiny-sliding", "tiny-hybrid"] {
        let s = scenario(
            "quick-mixed.toml",
            preset,
            "bf16",
            40,
            &[
                "scheduler.prefix_cache=false",
                "scheduler.preemption=swap",
                "memory.kv_budget=800 KiB",
            ],
        );
        let exp = passes(&s, seed, &format!("{preset} swap"));
        let paged = exp.run(CacheMode::Paged).expect("paged run");
        assert!(
            paged.metrics.swapped_bytes > 0,
            "{preset} seed {seed}: nothing swapped ({} preemptions)",
            paged.metrics.preemptions
        );
    }
}

/// Sliding, MLA and full layers in one model (f32): three kinds of table, and the MLA table's
/// layers store fewer bytes a token, so its pages hold 25 tokens where the others hold 16 — the
/// store's page stride is wider than the block size. Forks included; the prefix cache is on,
/// though a hit must be whole blocks of every table (a multiple of 400 tokens here, longer than
/// any prompt), so none is asserted.
const TINY_MIX: &str = r#"name = "tiny-mix"
device = "cpu"

[model]
preset = "tiny"
layers = 6

[[model.layer_groups]]
attention = "sliding"
layers = 2
window = 12

[[model.layer_groups]]
attention = "mla"
layers = 2
latent_dim = 64
rope_dim = 16

[[model.layer_groups]]
attention = "full"
layers = 2

[memory]
kv_budget = "2 MiB"

[cache]
block_size = 16
max_seq_len = 256
manager = "hybrid"

[traffic]
requests = 12

[traffic.arrival]
kind = "poisson"
rate_per_s = 200.0

[traffic.prompt_tokens]
dist = "uniform"
min = 16
max = 96

[traffic.output_tokens]
dist = "uniform"
min = 8
max = 48

[traffic.shared_prefix]
groups = 2
prefix_tokens = 32
share = 0.5

[traffic.parallel_sampling]
n = 2
share = 0.3

[scheduler]
prefix_cache = true
"#;

#[test]
fn a_model_of_three_table_kinds_with_a_wider_mla_page_passes_the_oracle() {
    let seed = seed();
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("tiny-mix.toml");
    std::fs::write(&path, TINY_MIX).expect("write scenario");
    let s = kvbench::scenario::load(&path, &[]).expect("scenario");
    let setup = experiment::setup(&s, &cpu(seed)).expect("setup");
    let shapes = setup.layout.expect("grouped").grouped_pool().shapes;
    let pages: Vec<(u32, Option<u32>)> =
        shapes.iter().map(|t| (t.block_tokens, t.window)).collect();
    // A page is 2 layers × 16 tokens × 512 bytes (a full layer's f32 K and V); an MLA layer's
    // token is 80 f32 values, so 16 384 / (2 × 320) = 25 tokens.
    assert_eq!(pages, vec![(16, Some(12)), (25, None), (16, None)]);
    let exp = passes(&s, seed, "tiny-mix");
    let paged = exp.run(CacheMode::Paged).expect("paged run");
    assert!(paged.metrics.streams.total > 12, "seed {seed}: no fork");
}

/// The paged rows of `memory.csv` in `dir`: per step, running sequences and the bytes in use
/// (live, allocated but unfilled, pending free).
fn paged_rows(dir: &Path) -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string(dir.join("memory.csv")).expect("memory.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (cache, running) = (col("cache"), col("running_sequences"));
    let used = [
        col("kv_live_bytes"),
        col("kv_allocated_unfilled_bytes"),
        col("kv_pending_free_bytes"),
    ];
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[cache] == "paged")
        .map(|f| {
            let n = |i: usize| f[i].parse::<u64>().expect("a number");
            (n(running), used.iter().map(|&i| n(i)).sum())
        })
        .collect()
}

/// The sliding table really lets its blocks go: on the same schedule (the model clock, so the
/// schedule does not depend on this machine), the hybrid paged manager's peak bytes in use are
/// well below the summed manager's, which keeps every sliding layer's every token. Without the
/// release the two would be equal: `tiny-sliding`'s layers all store the same bytes a token, so
/// a page of either table is a summed block's half.
#[test]
fn the_sliding_table_releases_blocks_so_peak_memory_is_below_the_summed_managers() {
    let seed = seed();
    let tmp = tempfile::tempdir().expect("tempdir");
    let seed_arg = seed.to_string();
    let run = |manager: &str| {
        let out = tmp.path().join(manager);
        let set_manager = format!("cache.manager={manager}");
        let (code, text) = kvbench(&[
            "run",
            root()
                .join("scenarios/quick-basic.toml")
                .to_str()
                .expect("utf-8"),
            "--backend",
            "cpu",
            "--clock",
            "model",
            "--seed",
            &seed_arg,
            "--memory-resolution-ms",
            "0",
            "--set",
            "model.preset=tiny-sliding",
            "--set",
            "traffic.requests=10",
            "--set",
            "scheduler.prefix_cache=false",
            "--set",
            &set_manager,
            "--out",
            out.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, 0, "{manager} seed {seed}: {text}");
        paged_rows(&out)
    };
    let hybrid = run("hybrid");
    let summed = run("summed");
    let running = |rows: &[(u64, u64)]| rows.iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(
        running(&hybrid),
        running(&summed),
        "seed {seed}: one schedule"
    );
    let peak = |rows: &[(u64, u64)]| rows.iter().map(|r| r.1).max().unwrap_or(0);
    let (h, s) = (peak(&hybrid), peak(&summed));
    println!("seed {seed}: peak bytes in use, hybrid {h}, summed {s}");
    assert!(
        h > 0 && h * 10 < s * 9,
        "seed {seed}: hybrid peak {h} bytes is not below 90% of summed {s}"
    );
}

/// Under the paged grouped manager, `skip-cow` (forks write into the partial page they share)
/// and `bad-block-table` (a table naming a page it does not hold) fail the oracle and the
/// token-stream comparison, with invariant checks only at the end. `early-reuse` is caught by
/// the invariants only: the cpu computes a step when it is submitted, so a page handed out
/// again under a step in flight was already read (the same holds for the summed managers).
#[test]
fn planted_faults_fail_a_grouped_run() {
    let seed = seed();
    for (preset, fault) in [
        ("tiny-sliding", Fault::SkipCow),
        ("tiny-mla", Fault::SkipCow),
        ("tiny-sliding", Fault::BadBlockTable),
        ("tiny-hybrid", Fault::BadBlockTable),
    ] {
        let s = scenario("quick-mixed.toml", preset, "bf16", 16, &[]);
        let opts = RunOptions {
            fault: Some(fault),
            invariant_check_every: 0,
            ..cpu(seed)
        };
        let exp = experiment::run_scenario(&s, &opts).expect("cpu run");
        let what = format!("{preset} {fault:?} seed {seed}");
        assert!(exp.fault_fired() > 0, "{what}: never fired");
        let paged = exp
            .run(CacheMode::Paged)
            .and_then(|r| r.end.numerics)
            .expect("numerics");
        assert!(!paged.ok, "{what}: the oracle did not notice: {paged:?}");
        let failures = exp.failures();
        assert!(
            failures.iter().any(|f| f.contains("numerics")),
            "{what}: {failures:?}"
        );
        println!("{what}: {paged:?}");
    }
    let s = scenario("quick-mixed.toml", "tiny-sliding", "bf16", 16, &[]);
    let opts = RunOptions {
        fault: Some(Fault::EarlyReuse),
        invariant_check_every: 0,
        ..cpu(seed)
    };
    let exp = experiment::run_scenario(&s, &opts).expect("cpu run");
    assert!(
        exp.fault_fired() > 0,
        "early-reuse seed {seed}: never fired"
    );
    assert!(
        exp.failures()
            .iter()
            .any(|f| f.contains("while its fence step")),
        "early-reuse seed {seed}: {:?}",
        exp.failures()
    );
}

/// The recurrent state lives with the cpu, one per stream: forks copy it (the forked streams
/// pass the oracle from their parent's position) and every release drops it, in both grouped
/// modes.
#[test]
fn recurrent_states_follow_forks_and_are_dropped_at_release() {
    let seed = seed();
    let s = scenario("quick-mixed.toml", "tiny-hybrid", "bf16", 16, &[]);
    let opts = cpu(seed);
    let setup = experiment::setup(&s, &opts).expect("setup");
    assert!(setup.layout.is_some(), "a grouped layout");
    let workload = kvbench::workload::generate(&s, setup.seed).expect("workload");
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let no_tiers = experiment::tiers::TierPlan::default();
        let spec = experiment::manager::spec(&s, &setup, mode, &no_tiers, s.scheduler.async_steps);
        let mut cache = kvbench::cache::build(&spec);
        let run_setup = RunSetup {
            model: setup.model.clone(),
            device: s.device.clone(),
            scenario_dir: setup.scenario_dir.clone(),
            cache_slots: setup.total_slots,
            block_size: s.block_size(),
            seed: setup.seed,
            max_step_tokens: setup.max_step_tokens,
            swap_gbytes_per_s: None,
            workspace_bytes: None,
            profile: None,
            clock: Clock::Measured,
            tiers: Default::default(),
        };
        let mut be = CpuBackend::new(&run_setup).expect("cpu backend");
        let cfg = EngineConfig {
            mode,
            block_size: cache.block_size(),
            kv_bytes_per_token: setup.kv_bytes_per_token,
            slot_bytes: setup.slot_bytes,
            max_seq_len: s.cache.max_seq_len,
            reservation: s.cache.contiguous_reservation,
            scheduler: s.scheduler.clone(),
            model_name: setup.model.name.clone(),
            trace_tokens: false,
            invariant_check_every: 1,
            fault: None,
        };
        let mut sink = Collect::default();
        let end = kvbench::engine::run_with(&cfg, &workload, cache.as_mut(), &mut be, &mut sink)
            .expect("run");
        let record = sink.into_record(end);
        let forks = record.streams.iter().filter(|st| st.rank > 0).count();
        assert!(forks > 0, "{mode:?} seed {seed}: no fork");
        assert!(be.is_grouped(), "{mode:?}: addressed per layer");
        let n = record.end.numerics.expect("numerics");
        assert!(n.ok && n.checked_steps > 0, "{mode:?} seed {seed}: {n:?}");
        assert_eq!(
            be.recurrent_states(),
            0,
            "{mode:?} seed {seed}: states left after every release"
        );
        println!("{mode:?}: {forks} forks, {n:?}");
    }
}
