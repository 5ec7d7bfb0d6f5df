//! FP8 KV caches: the bytes each scale granularity adds (by hand), quantisation that stores the
//! same values whichever layout and chunking wrote them, `cpu` runs that agree with the f64
//! oracle within the stated tolerance (and would not within bf16's), and the keys refused at
//! file:line. The FP8 codes themselves are tested in `kvbench_kernels::fp8` (all 256 of each
//! format, and a seeded nearest-even property test).

use std::path::PathBuf;
use std::process::Command;

use kvbench::backend::cpu::{kv_tolerance, BF16_TOLERANCE, FP8_E4M3_TOLERANCE, FP8_E5M2_TOLERANCE};
use kvbench::backend::BackendKind;
use kvbench::experiment::{self, RunOptions};
use kvbench::model::{Dtype, KvScale, ModelShape};
use kvbench::plan::{Plan, PlanInput};
use kvbench::scenario::Reservation;
use kvbench_kernels::{
    Fp8Format, KvCache, KvQuant, ModelConfig, PagedTable, ScaleGranularity, StepSeq, Transformer,
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn quick(sets: &[&str]) -> kvbench::scenario::Scenario {
    let mut all = vec!["traffic.requests=10".to_string()];
    all.extend(sets.iter().map(|s| s.to_string()));
    kvbench::scenario::load(&root().join("scenarios/quick-basic.toml"), &all).expect("scenario")
}

fn fp8(shape: ModelShape, dtype: Dtype, scale: Option<KvScale>, block: u32) -> ModelShape {
    ModelShape {
        kv_dtype: dtype,
        kv_scale: scale.map(|g| (g, block)),
        ..shape
    }
}

#[test]
fn per_token_bytes_with_each_scale_granularity_by_hand() {
    // tiny: 2 layers x 2 KV heads x head dim 32. Values: 2 x 2 x 2 x 32 x 1 byte = 256.
    let t = ModelShape::tiny();
    let tensor = fp8(t.clone(), Dtype::Fp8E4m3, None, 16);
    assert_eq!(tensor.kv_bytes_per_token(), 256);
    // Per tensor: one f32 per layer for K and for V = 2 x 2 x 4 = 16 bytes, fixed.
    assert_eq!(tensor.kv_scale_fixed_bytes(), Some(16));
    let head = fp8(t.clone(), Dtype::Fp8E5m2, Some(KvScale::PerHead), 16);
    assert_eq!(head.kv_bytes_per_token(), 256);
    // Per head: 2 (K, V) x 2 layers x 2 heads x 4 = 32 bytes, fixed.
    assert_eq!(head.kv_scale_fixed_bytes(), Some(32));
    // Per block of 16: 32 bytes a block = 2 bytes a token, in the formula.
    let block = fp8(t.clone(), Dtype::Fp8E4m3, Some(KvScale::PerBlock), 16);
    assert_eq!(block.kv_scale_bytes_per_block(), Some(32));
    assert_eq!(block.kv_bytes_per_token(), 258);
    assert_eq!(block.kv_scale_fixed_bytes(), Some(0));
    // A block of 64 tokens: 32 / 64 rounds up to one byte a token.
    let big = fp8(t.clone(), Dtype::Fp8E4m3, Some(KvScale::PerBlock), 64);
    assert_eq!(big.kv_bytes_per_token(), 257);
    // llama3-8b, blocks of 16: 65536 value bytes + 2 x 32 x 8 x 4 / 16 = 128.
    let l = fp8(
        ModelShape::llama3_8b(),
        Dtype::Fp8E4m3,
        Some(KvScale::PerBlock),
        16,
    );
    assert_eq!(l.kv_bytes_per_token(), 65_536 + 128);
    // bf16 carries no scales whatever kv_scale says.
    let b = fp8(t, Dtype::Bf16, Some(KvScale::PerBlock), 16);
    assert_eq!(b.kv_bytes_per_token(), 512);
    assert_eq!(b.kv_scale_fixed_bytes(), Some(0));
}

#[test]
fn a_scenario_prices_its_scales_and_fp8_is_e4m3() {
    let s = quick(&["model.kv_dtype=fp8", "model.kv_scale=per_block"]);
    let shape = s.model_shape().expect("shape");
    assert_eq!(shape.kv_dtype, Dtype::Fp8E4m3);
    assert_eq!(shape.kv_scale, Some((KvScale::PerBlock, 16)));
    assert_eq!(shape.kv_bytes_per_token(), 258);
    let plain = quick(&["model.kv_dtype=fp8_e5m2"])
        .model_shape()
        .expect("shape");
    assert_eq!(plain.kv_scale_granularity(), Some(KvScale::PerTensor));
    assert_eq!(plain.kv_bytes_per_token(), 256);
}

#[test]
fn plan_counts_scale_bytes_and_takes_fixed_ones_off_the_budget() {
    let input = |g| PlanInput {
        shape: fp8(ModelShape::llama3_8b(), Dtype::Fp8E4m3, Some(g), 16),
        block_size: 16,
        max_seq_len: 4096,
        reservation: Reservation::MaxSeqLen,
        budget_bytes: Some(65_536 * 16 * 10),
    };
    let p = Plan::compute(&input(KvScale::PerBlock), 16).expect("plan");
    assert_eq!(
        (p.scale_bytes_per_block, p.scale_bytes_per_token),
        (2048, 128)
    );
    assert_eq!(p.block_bytes, 16 * (65_536 + 128));
    // Ten value-only blocks of budget: per-block scales leave room for nine.
    assert_eq!(p.fits_paged, Some(9));
    let h = Plan::compute(&input(KvScale::PerHead), 16).expect("plan");
    assert_eq!((h.scale_fixed_bytes, h.bytes_per_token), (2048, 65_536));
    // The 2 KiB of fixed scales cost the tenth block.
    assert_eq!(h.fits_paged, Some(9));
    assert_eq!(h.kv_scale.as_deref(), Some("per_head"));
}

/// A run divides what is left of the budget after the fixed scales into slots, as `plan` does,
/// and a budget that holds one request only without its scales is refused at load.
#[test]
fn a_run_takes_fixed_scales_off_the_budget_before_dividing_it_into_slots() {
    let opts = RunOptions {
        backend: BackendKind::Sim,
        ..RunOptions::default()
    };
    for (scale, fixed) in [("per_tensor", 2u64 * 2 * 4), ("per_head", 2 * 2 * 2 * 4)] {
        let s = quick(&["model.kv_dtype=fp8", &format!("model.kv_scale={scale}")]);
        let shape = s.model_shape().expect("shape");
        assert_eq!(shape.kv_scale_fixed_bytes(), Some(fixed), "{scale}");
        let setup = experiment::setup(&s, &opts).expect("setup");
        assert_eq!(setup.kv_bytes_per_token, 256);
        assert_eq!(
            setup.total_slots,
            (setup.kv_budget_bytes - fixed) / 256,
            "{scale}"
        );
    }
    // The largest request's need, as the refusal of a 1-byte budget states it; a budget of
    // exactly that is refused once per-head scales take their share, and holds with room for them.
    let load = |budget: u64| {
        let sets = [
            "traffic.requests=10".to_string(),
            "model.kv_dtype=fp8".to_string(),
            "model.kv_scale=per_head".to_string(),
            format!("memory.kv_budget=\"{budget} B\""),
        ];
        kvbench::scenario::load(&root().join("scenarios/quick-basic.toml"), &sets)
    };
    let text = load(1).expect_err("1 byte").to_string();
    let need: u64 = text
        .split(" contiguous")
        .next()
        .and_then(|t| t.rsplit("and ").next())
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no need in: {text}"));
    let text = load(need).expect_err("no room for the scales").to_string();
    assert!(
        text.contains("memory.kv_budget") && text.contains("hold the FP8 scales"),
        "{text}"
    );
    load(need + 2 * 2 * 2 * 4).expect("room for the scales");
}

/// Writes `tokens` through `addr` in chunks of `chunk`, returning each position's stored K and
/// V rows (all layers).
fn stored(
    model: &Transformer,
    quant: Option<&KvQuant>,
    blocks: &[u32],
    chunk: usize,
    tokens: &[u32],
) -> Vec<Vec<f32>> {
    let bs = 4;
    let mut kv: KvCache<f32> = model.new_cache(64);
    if let Some(q) = quant {
        kv = kv.quantised(q.clone()).expect("f32 cache");
    }
    let addr = PagedTable {
        block_size: bs,
        blocks,
    };
    let mut at = 0;
    while at < tokens.len() {
        let end = (at + chunk).min(tokens.len());
        let seq = StepSeq {
            addr: &addr,
            start_pos: at,
            tokens: &tokens[at..end],
            want_logits: false,
        };
        model.forward(&mut kv, &[seq]).expect("forward");
        at = end;
    }
    let row = kv.row_elems();
    (0..tokens.len())
        .map(|p| {
            let slot = blocks[p / bs] as usize * bs + p % bs;
            kv.layers
                .iter()
                .flat_map(|l| {
                    l.k[slot * row..(slot + 1) * row]
                        .iter()
                        .chain(&l.v[slot * row..(slot + 1) * row])
                        .copied()
                })
                .collect()
        })
        .collect()
}

#[test]
fn quantised_storage_does_not_depend_on_layout_or_chunking() {
    let cfg = ModelConfig {
        layers: 2,
        q_heads: 4,
        kv_heads: 2,
        head_dim: 16,
        d_model: 64,
        ffn_dim: 128,
        vocab: 97,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
    };
    let model = Transformer::seeded(cfg, 11).expect("model");
    let tokens: Vec<u32> = (0..13).map(|i| (i * 31 + 5) % 97).collect();
    let amax = model.kv_amax(&tokens).expect("calibration");
    for format in Fp8Format::ALL {
        for g in [
            ScaleGranularity::PerTensor,
            ScaleGranularity::PerHead,
            ScaleGranularity::PerBlock { block_tokens: 4 },
        ] {
            let q = KvQuant::calibrated(format, g, &amax, 2);
            // Paged: scattered blocks, prefilled whole; contiguous: consecutive slots from an
            // offset, one token at a time.
            let paged = stored(&model, Some(&q), &[9, 2, 14, 5], 13, &tokens);
            let contiguous = stored(&model, Some(&q), &[3, 4, 5, 6], 1, &tokens);
            let chunked = stored(&model, Some(&q), &[7, 0, 1, 12], 5, &tokens);
            assert_eq!(paged, contiguous, "{} {g:?}", format.name());
            assert_eq!(paged, chunked, "{} {g:?}", format.name());
            // The values are really quantised: most of layer 0's (whose inputs no earlier
            // quantisation moved: K and V, the first 2 × 32 of a position) differ from the
            // unquantised ones, by at most the format's relative half ulp — or, per block, less
            // in magnitude where a value beyond the first token's headroom saturated.
            let raw = stored(&model, None, &[9, 2, 14, 5], 13, &tokens);
            let (mut moved, mut all) = (0, 0);
            let half_ulp = 2f32.powi(-(format.mantissa_bits() as i32) - 1);
            for (pq, pr) in paged.iter().zip(&raw) {
                for (a, b) in pq[..64].iter().zip(&pr[..64]) {
                    all += 1;
                    moved += usize::from(a != b);
                    let near = (a - b).abs() <= half_ulp * b.abs() * 1.001 + 1e-6;
                    let saturated = matches!(g, ScaleGranularity::PerBlock { .. })
                        && a.abs() < b.abs()
                        && a.signum() == b.signum();
                    assert!(near || saturated, "{} {g:?}: {a} vs {b}", format.name());
                }
            }
            assert!(
                moved * 2 > all,
                "{} {g:?}: {moved} of {all} moved",
                format.name()
            );
        }
    }
}

#[test]
fn quantisation_error_is_within_half_an_ulp_of_the_format() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("KV_FP8_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_201);
    println!("kv_fp8 seed {seed} (replay: KV_FP8_SEED={seed})");
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    for f in Fp8Format::ALL {
        let half_ulp_rel = 2f64.powi(-(f.mantissa_bits() as i32) - 1);
        for _ in 0..50_000 {
            // Values in the normal range of the format after scaling by a random scale.
            let scale = 2f32.powf(rng.gen_range(-12.0..4.0));
            let emin = f.min_normal_exp() as f32;
            let mag = 2f32.powf(rng.gen_range(emin..f.max_finite().log2()));
            let x = if rng.gen_bool(0.5) { mag } else { -mag } * scale;
            let back = f.round(x / scale) * scale;
            let rel = ((back as f64 - x as f64) / x as f64).abs();
            // f32 rounding of the division and product adds at most 2^-23 relative.
            assert!(
                rel <= half_ulp_rel * (1.0 + 1e-6) + 2f64.powi(-22),
                "seed {seed}: {} x = {x}, scale {scale}: relative error {rel} > {half_ulp_rel}",
                f.name()
            );
        }
    }
}

#[test]
fn cpu_runs_in_fp8_pass_the_oracle_within_the_stated_tolerance_and_not_bf16s() {
    for (dtype, tol) in [
        ("fp8_e4m3", FP8_E4M3_TOLERANCE),
        ("fp8_e5m2", FP8_E5M2_TOLERANCE),
    ] {
        let set = format!("model.kv_dtype={dtype}");
        let s = quick(&[&set, "model.kv_scale=per_block"]);
        assert_eq!(kv_tolerance(s.model_shape().expect("shape").kv_dtype), tol);
        let opts = RunOptions {
            backend: BackendKind::Cpu,
            ..RunOptions::default()
        };
        let exp = experiment::run_scenario(&s, &opts).expect("cpu run");
        assert!(exp.failures().is_empty(), "{dtype}: {:?}", exp.failures());
        // Paged and contiguous stored identically, so they sampled the same tokens.
        assert_eq!(exp.token_mismatch, None, "{dtype}");
        for r in &exp.runs {
            let n = r.end.numerics.expect("cpu reports numerics");
            assert!(n.ok && n.checked_steps > 0, "{dtype}: {n:?}");
            assert_eq!(n.tolerance, tol);
            assert!(n.max_rel_err <= tol, "{dtype}: {n:?}");
            // The quantisation is real: bf16's tolerance would fail this run.
            assert!(n.max_rel_err > BF16_TOLERANCE, "{dtype}: {n:?}");
        }
    }
}

fn run_cli(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(args)
        .output()
        .expect("run kvbench");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn hostile_kv_keys_are_refused_at_file_line_and_cuda_refuses_fp8() {
    let dir = std::env::temp_dir().join(format!("kv_fp8_hostile_{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let base = std::fs::read_to_string(root().join("scenarios/quick-basic.toml")).expect("read");
    let line = base
        .lines()
        .position(|l| l.trim() == "preset = \"tiny\"")
        .expect("preset line")
        + 2;
    for (extra, want) in [
        (
            "kv_scale = \"per_head\"",
            "model.kv_scale: per_head scales belong to an FP8 cache",
        ),
        (
            "kv_scale = \"per_row\"",
            "model.kv_scale: unknown variant `per_row`",
        ),
        ("kv_scale = 3", "model.kv_scale"),
        ("kv_dtype = \"fp9\"", "model.kv_dtype"),
    ] {
        let text = base.replace("preset = \"tiny\"", &format!("preset = \"tiny\"\n{extra}"));
        let file = dir.join("bad.toml");
        std::fs::write(&file, text).expect("write");
        let out = dir.join("out");
        let f = file.to_str().expect("utf8");
        let (code, err) = run_cli(&[
            "run",
            f,
            "--backend",
            "cpu",
            "--out",
            out.to_str().expect("utf8"),
        ]);
        assert_eq!(code, 2, "{extra}: {err}");
        assert!(err.contains(&format!("{f}:{line}:")), "{extra}: {err}");
        assert!(err.contains(want), "{extra}: {err}");
        assert!(
            !out.join("summary.json").exists(),
            "{extra}: results written"
        );
    }
    let out = dir.join("cuda");
    let (code, err) = run_cli(&[
        "run",
        root()
            .join("scenarios/quick-basic.toml")
            .to_str()
            .expect("utf8"),
        "--backend",
        "cuda-emu",
        "--set",
        "model.kv_dtype=fp8_e5m2",
        "--out",
        out.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("model.kv_dtype") && err.contains("fp8_e5m2"),
        "{err}"
    );
    assert!(!out.join("summary.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sim_reads_fp8_kv_at_one_byte_a_value_plus_its_block_scales() {
    use kvbench::backend::sim::cost::CostModel;
    use kvbench::backend::sim::profile::DeviceProfile;
    use kvbench::backend::SeqWork;
    let h200 = DeviceProfile::load("h200", None).expect("h200");
    let decode = [SeqWork {
        seq: 0,
        context_tokens: 1000,
        new_tokens: 1,
        sample: true,
    }];
    let read = |m: &ModelShape| {
        CostModel::new(m, &h200, None)
            .load(&decode, &[], &[])
            .kv_read_bytes
    };
    let bf16 = ModelShape::llama3_8b();
    let e4m3 = fp8(bf16.clone(), Dtype::Fp8E4m3, None, 16);
    let block = fp8(bf16.clone(), Dtype::Fp8E5m2, Some(KvScale::PerBlock), 16);
    // The step reads its context (and the new token's own K/V) once.
    let tokens = read(&bf16) / 131_072.0;
    assert!(tokens >= 1000.0, "{tokens}");
    assert_eq!(read(&e4m3), tokens * 65_536.0);
    assert_eq!(read(&block), tokens * (65_536.0 + 128.0));
}
