//! Layer groups on `cpu`: the tiny variants run through the whole harness and agree with the
//! independent f64 oracle within each KV format's stated tolerance; the comparison fails when
//! the cpu path and the oracle disagree on what a layer attends to (planted faults); the presets
//! are accepted where `tiny` is.

use crate::support::cpu_groups as cpu_groups_support;

use std::process::Command;

use cpu_groups_support::{cpu, seed, tiny, tiny_as_given};

use kvbench::backend::cpu::{
    kv_tolerance, layer_kinds, oracle_for, seeded_model, BF16_TOLERANCE, F32_TOLERANCE,
    FP8_E5M2_TOLERANCE,
};
use kvbench::experiment::{self, RunOptions};
use kvbench::model::{Dtype, ModelShape, TINY_SLIDING_WINDOW};
use kvbench_cache_api::{CacheMode, Fault};
use kvbench_kernels::{KvCache, LayerKind, PagedTable, StepSeq, Transformer};

/// `quick-basic` with `preset` and `dtype` KV.
fn quick(preset: &str, dtype: &str) -> kvbench::scenario::Scenario {
    tiny("quick-basic.toml", preset, dtype, 10, &[])
}

/// Runs `preset` on `quick-basic` in both cache modes on `cpu` with `dtype` KV and checks that
/// every checked step passed the oracle within the format's tolerance and that paged and
/// contiguous runs sampled the same tokens. Returns the worst error seen.
fn passes_the_oracle(preset: &str, dtype: &str, seed: u64) -> f64 {
    let s = quick(preset, dtype);
    let shape = s.model_shape().expect("shape");
    assert_eq!(shape.name, preset);
    let tol = kv_tolerance(shape.kv_dtype);
    let opts = cpu(seed);
    let exp = experiment::run_scenario(&s, &opts).expect("cpu run");
    assert!(
        exp.failures().is_empty(),
        "{preset} {dtype} seed {seed}: {:?}",
        exp.failures()
    );
    assert_eq!(exp.token_mismatch, None, "{preset} {dtype} seed {seed}");
    let mut worst = 0f64;
    for r in &exp.runs {
        let n = r.end.numerics.expect("cpu reports numerics");
        assert!(n.ok && n.checked_steps > 0, "{preset} {dtype}: {n:?}");
        assert_eq!(n.tolerance, tol);
        assert!(n.max_rel_err <= tol, "{preset} {dtype} seed {seed}: {n:?}");
        worst = worst.max(n.max_rel_err);
    }
    println!("{preset} {dtype}: max rel err {worst:.3e} (tolerance {tol:e})");
    worst
}

/// `preset` in bf16, FP8 e4m3 and FP8 e5m2, each within its tolerance. Each FP8 format is
/// really quantised: e4m3's error is beyond what bf16 storage gives, and e5m2 (one mantissa
/// bit fewer, so twice e4m3's step) beyond e4m3's — equal errors would mean e5m2 fell back
/// to the other format. Returns the three errors.
fn passes_in_every_kv_format(preset: &str, seed: u64) -> [f64; 3] {
    let bf16 = passes_the_oracle(preset, "bf16", seed);
    let e4m3 = passes_the_oracle(preset, "fp8_e4m3", seed);
    let e5m2 = passes_the_oracle(preset, "fp8_e5m2", seed);
    assert!(e4m3 > bf16, "{preset}: e4m3 {e4m3:e} vs bf16 {bf16:e}");
    assert!(e5m2 > e4m3, "{preset}: e5m2 {e5m2:e} vs e4m3 {e4m3:e}");
    [bf16, e4m3, e5m2]
}

#[test]
fn tiny_sliding_passes_the_oracle_in_bf16_and_both_fp8_formats() {
    let seed = seed();
    let [_, e4m3, e5m2] = passes_in_every_kv_format("tiny-sliding", seed);
    assert!(e4m3 > BF16_TOLERANCE, "e4m3 {e4m3:e}");
    assert!(e5m2 > BF16_TOLERANCE, "e5m2 {e5m2:e}");
}

#[test]
fn tiny_mla_passes_the_oracle_in_bf16_and_both_fp8_formats() {
    passes_in_every_kv_format("tiny-mla", seed());
}

/// Under e5m2's tolerance — the loosest the oracle check has — a planted fault still fails
/// each tiny variant: `skip-cow` on `quick-mixed` (forks write into the blocks they share)
/// with invariant checks off, so only the oracle can see it.
#[test]
fn a_planted_fault_fails_each_tiny_variant_under_fp8_e5m2() {
    let seed = seed();
    for preset in ["tiny-sliding", "tiny-mla", "tiny-hybrid"] {
        let s = tiny("quick-mixed.toml", preset, "fp8_e5m2", 24, &[]);
        let opts = RunOptions {
            fault: Some(Fault::SkipCow),
            invariant_check_every: 0,
            ..cpu(seed)
        };
        let exp = experiment::run_scenario(&s, &opts).expect("cpu run");
        assert!(exp.fault_fired() > 0, "{preset} seed {seed}: never fired");
        let numerics = |mode| {
            exp.run(mode)
                .and_then(|r| r.end.numerics)
                .expect("cpu reports numerics")
        };
        let (paged, contiguous) = (numerics(CacheMode::Paged), numerics(CacheMode::Contiguous));
        println!("{preset} e5m2 skip-cow: paged {paged:?}");
        assert_eq!(paged.tolerance, FP8_E5M2_TOLERANCE);
        assert!(
            !paged.ok && paged.max_rel_err > FP8_E5M2_TOLERANCE,
            "{preset} seed {seed}: the oracle did not notice under e5m2: {paged:?}"
        );
        assert!(
            contiguous.ok,
            "{preset} seed {seed}: armed on the paged manager only: {contiguous:?}"
        );
        assert!(
            exp.failures().iter().any(|f| f.contains("numerics")),
            "{preset} seed {seed}: {:?}",
            exp.failures()
        );
    }
}

#[test]
fn an_mla_cache_holds_one_latent_row_a_token_and_swapped_projections_fail_the_oracle() {
    let seed = seed();
    let shape = ModelShape::tiny_mla();
    let model = seeded_model(&shape, seed).expect("cpu model");
    // One row of latent + RoPE values per token per layer, no V.
    let kv: KvCache<f32> = model.new_cache(8);
    for i in 0..2 {
        assert_eq!(kv.rows_of(i), (64 + 16, 0));
    }
    assert_eq!(
        kv.bytes_per_token() as u64,
        shape.kv_bytes_per_token(),
        "the store holds what the budget prices"
    );
    let oracle = oracle_for(&model).expect("oracle");
    let toks = tokens(seed, 40, shape.vocab);
    let reference = oracle.logits(&toks).expect("oracle logits");
    let good = kvbench_oracle::rel_err(&cpu_logits(&model, &toks), &reference);
    assert!(good <= F32_TOLERANCE, "seed {seed}: clean {good:e}");
    // Planted: the cpu model's key and value up-projections swapped in one layer.
    let mut bad = model.clone();
    let m = bad.weights.layers[1].mla.as_mut().expect("an MLA layer");
    std::mem::swap(&mut m.w_uk, &mut m.w_uv);
    let err = kvbench_oracle::rel_err(&cpu_logits(&bad, &toks), &reference);
    assert!(
        err > BF16_TOLERANCE,
        "seed {seed}: swapped projections agreed within {err:e}"
    );
}

/// Prefills `tokens` through a scattered block table and returns the logits after the last
/// one, with `model`'s own layer kinds.
fn cpu_logits(model: &Transformer, tokens: &[u32]) -> Vec<f32> {
    let bs = 16;
    let blocks: Vec<u32> = (0..tokens.len().div_ceil(bs) as u32).rev().collect();
    let mut kv: KvCache<f32> = model.new_cache(blocks.len() * bs);
    let addr = PagedTable {
        block_size: bs,
        blocks: &blocks,
    };
    // Two chunks, so the second's queries read the first's K/V through the cache.
    let half = tokens.len() / 2;
    let mut last = None;
    for (start, end) in [(0, half), (half, tokens.len())] {
        let seq = StepSeq {
            addr: &addr,
            start_pos: start,
            tokens: &tokens[start..end],
            want_logits: end == tokens.len(),
        };
        last = model.forward(&mut kv, &[seq]).expect("forward")[0].clone();
    }
    last.expect("logits")
}

fn tokens(seed: u64, n: usize, vocab: u32) -> Vec<u32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..vocab)).collect()
}

#[test]
fn a_window_off_by_one_or_ignored_fails_the_oracle_check() {
    let seed = seed();
    let shape = ModelShape::tiny_sliding();
    let model = seeded_model(&shape, seed).expect("cpu model");
    let w = TINY_SLIDING_WINDOW as usize;
    assert_eq!(
        layer_kinds(&shape).expect("kinds"),
        vec![
            LayerKind::Sliding { window: w },
            LayerKind::Sliding { window: w },
            LayerKind::Full,
            LayerKind::Full
        ]
    );
    let oracle = oracle_for(&model).expect("oracle");
    let toks = tokens(seed, 5 * w, shape.vocab);
    let reference = oracle.logits(&toks).expect("oracle logits");
    let good = kvbench_oracle::rel_err(&cpu_logits(&model, &toks), &reference);
    assert!(good <= F32_TOLERANCE, "seed {seed}: clean {good:e}");

    // Planted: the cpu path's window one token too long, and one too short.
    for planted in [w + 1, w - 1] {
        let off = model
            .clone()
            .with_layer_kinds(vec![
                LayerKind::Sliding { window: planted },
                LayerKind::Sliding { window: planted },
                LayerKind::Full,
                LayerKind::Full,
            ])
            .expect("kinds");
        let err = kvbench_oracle::rel_err(&cpu_logits(&off, &toks), &reference);
        assert!(
            err > BF16_TOLERANCE,
            "seed {seed}: window {planted} instead of {w} gave rel err {err:e}, within bf16's tolerance"
        );
    }
    // Planted: an oracle that ignores the window (every layer full).
    let full = model
        .clone()
        .with_layer_kinds(vec![LayerKind::Full; 4])
        .expect("kinds");
    let ignoring = oracle_for(&full).expect("oracle");
    let err = kvbench_oracle::rel_err(
        &cpu_logits(&model, &toks),
        &ignoring.logits(&toks).expect("oracle logits"),
    );
    assert!(
        err > BF16_TOLERANCE,
        "seed {seed}: the oracle without the window agreed within {err:e}"
    );
    // Within the window, a sliding layer is a full one: a prompt no longer than it agrees
    // with the window-ignoring oracle.
    let short = &toks[..w];
    let err = kvbench_oracle::rel_err(
        &cpu_logits(&model, short),
        &ignoring.logits(short).expect("oracle logits"),
    );
    assert!(err <= F32_TOLERANCE, "seed {seed}: {err:e}");
}

#[test]
fn cuda_runs_tiny_sliding_refuses_the_other_variants_naming_the_group_and_cpu_runs_them() {
    let sliding = kvbench::backend::cuda::setup::config(&ModelShape::tiny_sliding())
        .expect("cuda runs sliding layers");
    assert!(
        sliding.windows.iter().any(|&w| w > 0),
        "{:?}",
        sliding.windows
    );
    for (shape, key) in [
        (
            ModelShape::tiny_mla(),
            "model.layer_groups.0 (attention = \"mla\")",
        ),
        (
            ModelShape::tiny_hybrid(),
            "model.layer_groups.1 (attention = \"recurrent\")",
        ),
    ] {
        let err = kvbench::backend::cuda::setup::config(&shape)
            .expect_err("cuda runs full and sliding layers only")
            .to_string();
        assert!(err.contains(key), "{err}");
        seeded_model(&shape, 1).expect("cpu runs it");
    }
    // A state the cpu cannot hold in f32 values is refused naming the group.
    let mut odd = ModelShape::tiny_hybrid();
    odd.layer_groups[1] = kvbench::model::LayerGroup::Recurrent {
        layers: 2,
        state_bytes: 6,
    };
    let err = seeded_model(&odd, 1).expect_err("odd state").to_string();
    assert!(
        err.contains("model.layer_groups.1 (attention = \"recurrent\")"),
        "{err}"
    );
}

#[test]
fn tiny_hybrid_passes_the_oracle_in_bf16_and_both_fp8_formats() {
    passes_in_every_kv_format("tiny-hybrid", seed());
}

#[test]
fn a_recurrent_state_not_carried_across_chunks_fails_the_oracle_check() {
    let seed = seed();
    let shape = ModelShape::tiny_hybrid();
    let model = seeded_model(&shape, seed).expect("cpu model");
    assert_eq!(model.state_len(), 2 * 64);
    let oracle = oracle_for(&model).expect("oracle");
    let toks = tokens(seed, 40, shape.vocab);
    let reference = oracle.logits(&toks).expect("oracle logits");
    let run = |carry: bool| {
        let bs = 16;
        let blocks: Vec<u32> = (0..3).rev().collect();
        let mut kv: KvCache<f32> = model.new_cache(blocks.len() * bs);
        let addr = PagedTable {
            block_size: bs,
            blocks: &blocks,
        };
        let mut states = vec![vec![0f32; model.state_len()]];
        let mut last = None;
        // The gates forget within tens of tokens: the reset is planted two tokens from the end.
        for (start, end) in [(0, 38), (38, 40)] {
            if !carry {
                states[0].fill(0.0);
            }
            let seq = StepSeq {
                addr: &addr,
                start_pos: start,
                tokens: &toks[start..end],
                want_logits: end == toks.len(),
            };
            last = model
                .forward_with_states(&mut kv, &[seq], &mut states)
                .expect("forward")[0]
                .clone();
        }
        kvbench_oracle::rel_err(&last.expect("logits"), &reference)
    };
    let good = run(true);
    assert!(good <= F32_TOLERANCE, "seed {seed}: clean {good:e}");
    let bad = run(false);
    assert!(
        bad > BF16_TOLERANCE,
        "seed {seed}: a state reset mid-sequence agreed within {bad:e}"
    );
}

#[test]
fn the_tiny_variants_are_presets_where_tiny_is() {
    for name in ["tiny-sliding", "tiny-mla", "tiny-hybrid"] {
        assert!(ModelShape::PRESETS.contains(&name));
        let shape = ModelShape::preset(name).expect("preset");
        assert_eq!(shape.name, name);
        assert_eq!(shape.kv_dtype, Dtype::F32);
        let s = quick(name, "f32");
        assert_eq!(s.model_shape().expect("shape"), shape);
        let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(["plan", "--preset", name, "--tokens", "100", "--json"])
            .output()
            .expect("run kvbench");
        assert!(
            out.status.success(),
            "plan --preset {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(
            v["sequence"]["bytes_per_token"].as_u64(),
            Some(shape.kv_bytes_per_token()),
            "{v}"
        );
    }
}

/// `quick-mixed` on `tiny-hybrid` in bf16, its prefix cache as `sets` leave it.
fn mixed(sets: &[&str]) -> kvbench::scenario::Scenario {
    tiny_as_given("quick-mixed.toml", "tiny-hybrid", "bf16", 24, sets)
}

/// Forks copy the recurrent state, preemption by recompute rebuilds it, swaps keep it: a
/// run with all three (and cancellations) passes the oracle once the prefix cache is off.
/// With it on, the summed managers keep no state checkpoint, so a prefix hit would skip the
/// recurrent layers' prefill: the run is refused at set-up with the reason (the CLI's side:
/// `cpu_recurrent_prefix_cache.rs`). By default it runs the hybrid manager, whose hits resume
/// from checkpoints, with forks, recompute and swaps alike, and passes the oracle.
#[test]
fn tiny_hybrid_survives_forks_and_preemption_and_refuses_prefix_hits() {
    let seed = seed();
    let opts = cpu(seed);
    let exp = experiment::run_scenario(&mixed(&["scheduler.prefix_cache=false"]), &opts)
        .expect("cpu run");
    assert!(
        exp.failures().is_empty(),
        "seed {seed}: {:?}",
        exp.failures()
    );
    assert_eq!(exp.token_mismatch, None, "seed {seed}");
    for r in &exp.runs {
        let n = r.end.numerics.expect("cpu reports numerics");
        assert!(n.ok && n.checked_steps > 0, "seed {seed}: {n:?}");
    }
    for preemption in ["recompute", "swap"] {
        let p = format!("scheduler.preemption={preemption}");
        let exp = experiment::run_scenario(
            &mixed(&["cache.checkpoint_every_blocks=1", p.as_str()]),
            &opts,
        )
        .expect("cpu run");
        assert!(
            exp.failures().is_empty(),
            "seed {seed} {preemption}: {:?}",
            exp.failures()
        );
        assert_eq!(exp.token_mismatch, None, "seed {seed} {preemption}");
        let paged = exp
            .runs
            .iter()
            .find(|r| r.end.mode == kvbench_cache_api::CacheMode::Paged)
            .expect("paged run");
        assert!(
            paged.end.prefix.checkpoint_resumes > 0,
            "seed {seed} {preemption}: {:?}",
            paged.end.prefix
        );
    }
    let err = match experiment::run_scenario(&mixed(&["cache.manager=summed"]), &opts) {
        Ok(e) => panic!("seed {seed}: ran, failures {:?}", e.failures()),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("scheduler.prefix_cache: ")
            && err.contains("model.layer_groups.1 (attention = \"recurrent\")")
            && err.contains("scheduler.prefix_cache = false")
            && err.contains("cache.manager = \"hybrid\""),
        "seed {seed}: {err}"
    );
}
