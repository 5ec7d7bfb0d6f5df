//! Mixture of experts and tensor parallelism: the mixtral-8x7b preset against hand computations
//! from its published configuration, the touched-expert formula against a seeded simulation of
//! routing, the all-reduce a tp = N step pays recomputed from the device profile, tp = 1 and
//! dense shapes costing what they did, MoE keys refused at their line, and `kvbench plan`'s
//! host-tier pricing recomputed independently.

use std::path::Path;
use std::process::Command;

use kvbench::backend::sim::cost::CostModel;
use kvbench::backend::sim::profile::DeviceProfile;
use kvbench::backend::SeqWork;
use kvbench::model::{Dtype, ModelShape, Moe};
use kvbench::plan::{PlanInput, TierPlan};
use kvbench::scenario::{self, Origin, Reservation};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Mixtral 8x7B by hand, from mistralai/Mixtral-8x7B-v0.1's `config.json`: 32 layers, hidden
/// 4096, 32 query heads and 8 KV heads of 128, `intermediate_size` 14336 per expert, 8 experts,
/// 2 per token, vocab 32000, bf16.
const ATTN: u64 = 2 * 4096 * 4096 + 2 * 4096 * 1024;
const EXPERT: u64 = 3 * 4096 * 14336;
const ROUTER: u64 = 4096 * 8;
const NORMS: u64 = 2 * 4096;
const OUTSIDE: u64 = 2 * 32000 * 4096 + 4096;
const TOTAL: u64 = 32 * (ATTN + 8 * EXPERT + ROUTER + NORMS) + OUTSIDE;
const ACTIVE: u64 = 32 * (ATTN + 2 * EXPERT + ROUTER + NORMS) + OUTSIDE;

fn kvbench(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kvbench");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn decode(seq: u64, ctx: u32) -> SeqWork {
    SeqWork {
        seq,
        context_tokens: ctx,
        new_tokens: 1,
        sample: true,
    }
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
}

#[test]
fn mixtral_kv_parameters_and_weights_match_the_hand_count_and_the_published_sizes() {
    let m = ModelShape::preset("mixtral-8x7b").expect("preset");
    assert_eq!(m.kv_bytes_per_token(), 2 * 32 * 8 * 128 * 2);
    assert_eq!(m.parameter_count(), TOTAL);
    assert_eq!(m.active_parameter_count(), ACTIVE);
    assert_eq!(m.weight_bytes_per_device(), TOTAL * 2);
    assert_eq!(
        m.routed_expert_weight_bytes_per_device(),
        32 * 8 * EXPERT * 2
    );
    // Mistral AI states 46.7 B parameters, 12.9 B used per token.
    assert!(rel(TOTAL as f64, 46.7e9) < 0.005, "{TOTAL}");
    assert!(rel(ACTIVE as f64, 12.9e9) < 0.005, "{ACTIVE}");

    let (code, out, err) = kvbench(&[
        "plan",
        "--preset",
        "mixtral-8x7b",
        "--tokens",
        "4096",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let w = &v["weights"];
    assert_eq!(w["parameters"].as_u64(), Some(TOTAL), "{v}");
    assert_eq!(w["active_parameters"].as_u64(), Some(ACTIVE), "{v}");
    assert_eq!(
        w["weight_bytes_per_device"].as_u64(),
        Some(TOTAL * 2),
        "{v}"
    );
    assert_eq!(
        w["active_weight_bytes_per_device"].as_u64(),
        Some(ACTIVE * 2),
        "{v}"
    );
    assert_eq!(w["moe"]["experts"].as_u64(), Some(8), "{v}");
    assert_eq!(
        v["sequence"]["bytes_per_token"].as_u64(),
        Some(131_072),
        "{v}"
    );

    // At tp = 2 each device holds half of every weight and half of the KV heads.
    let (code, out, err) = kvbench(&[
        "plan",
        "--preset",
        "mixtral-8x7b",
        "--tp",
        "2",
        "--tokens",
        "16",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        v["weights"]["weight_bytes_per_device"].as_u64(),
        Some(TOTAL)
    );
    assert_eq!(v["sequence"]["bytes_per_token"].as_u64(), Some(65_536));

    let (code, text, err) = kvbench(&["plan", "--preset", "mixtral-8x7b", "--tokens", "16"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("46.70 B parameters in all"), "{text}");
    assert!(
        text.contains("12.88 B parameters per token (2 of 8"),
        "{text}"
    );
}

fn seed() -> u64 {
    let s = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0e_8e17);
    println!("seed {s} (replay with KVBENCH_SEED={s})");
    s
}

/// Routes `tokens` tokens, each to `k` distinct experts of `e` drawn uniformly (a partial
/// Fisher–Yates shuffle), and counts the distinct experts touched.
fn routed(rng: &mut ChaCha20Rng, e: u32, k: u32, tokens: u64) -> u32 {
    let mut touched = vec![false; e as usize];
    let mut order: Vec<u32> = (0..e).collect();
    for _ in 0..tokens {
        for i in 0..k as usize {
            let j = rng.gen_range(i..e as usize);
            order.swap(i, j);
            touched[order[i] as usize] = true;
        }
    }
    touched.iter().filter(|t| **t).count() as u32
}

#[test]
fn the_touched_expert_formula_agrees_with_a_seeded_simulation_of_uniform_routing() {
    let mut rng = ChaCha20Rng::seed_from_u64(seed());
    const TRIALS: u32 = 3000;
    for (e, k, tokens) in [
        (8, 2, 1),
        (8, 2, 2),
        (8, 2, 5),
        (8, 2, 64),
        (64, 6, 10),
        (128, 8, 40),
        (256, 8, 16),
    ] {
        let moe = Moe {
            experts: e,
            active_experts: k,
            expert_ffn_dim: 1,
            shared_experts: 0,
        };
        let counts: Vec<f64> = (0..TRIALS)
            .map(|_| routed(&mut rng, e, k, tokens) as f64)
            .collect();
        let mean = counts.iter().sum::<f64>() / TRIALS as f64;
        let var = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / (TRIALS - 1) as f64;
        let se = (var / TRIALS as f64).sqrt();
        let want = moe.expected_touched_experts(tokens);
        assert!(
            (mean - want).abs() <= 4.0 * se + 1e-6,
            "E {e}, k {k}, {tokens} tokens: simulated {mean} ± {se}, formula {want}"
        );
    }
    let moe = Moe {
        experts: 8,
        active_experts: 2,
        expert_ffn_dim: 1,
        shared_experts: 0,
    };
    assert_eq!(moe.expected_touched_experts(0), 0.0);
    assert!(rel(moe.expected_touched_experts(1), 2.0) < 1e-12);
    // Two tokens: 8 · (1 − 0.75²) = 3.5.
    assert!(rel(moe.expected_touched_experts(2), 3.5) < 1e-12);
}

#[test]
fn an_moe_step_reads_the_touched_experts_and_computes_with_the_active_ones() {
    let m = ModelShape::mixtral_8x7b();
    let h200 = DeviceProfile::load("h200", None).expect("h200");
    let cost = CostModel::new(&m, &h200, None);
    let always = ((TOTAL - 32 * 8 * EXPERT) * 2) as f64;
    let expert = (EXPERT * 2) as f64;
    for batch in [1u64, 2, 7, 64, 256] {
        let seqs: Vec<_> = (0..batch).map(|i| decode(i, 500)).collect();
        let load = cost.load(&seqs, &[], &[]);
        let touched = 8.0 * (1.0 - 0.75f64.powi(batch as i32));
        let want = always + 32.0 * touched * expert;
        assert!(
            rel(load.weight_bytes, want) < 1e-12,
            "batch {batch}: {} vs {want}",
            load.weight_bytes
        );
        assert!(rel(load.dense_flops, batch as f64 * 2.0 * ACTIVE as f64) < 1e-12);
        assert_eq!(load.all_reduces, 0);
    }
    // One token reads 2 of 8 experts; a large batch nearly all, never more than the weights.
    let one = cost.load(&[decode(0, 10)], &[], &[]).weight_bytes;
    assert!(rel(one, always + 32.0 * 2.0 * expert) < 1e-12);
    let many: Vec<_> = (0..512).map(|i| decode(i, 10)).collect();
    let all = cost.load(&many, &[], &[]).weight_bytes;
    assert!(all <= (TOTAL * 2) as f64 && rel(all, (TOTAL * 2) as f64) < 1e-9);
}

#[test]
fn a_tp_step_pays_two_ring_all_reduces_per_layer_recomputed_from_the_profile() {
    let h100 = DeviceProfile::load("h100", None).expect("h100");
    let link = h100.nvlink_bytes_per_s.expect("h100 states its NVLink");
    let latency = h100.nvlink_latency_s.unwrap_or(0.0);
    let mut m = ModelShape::llama3_70b();
    for tp in [2u32, 4, 8] {
        m.tp = tp;
        let cost = CostModel::new(&m, &h100, None);
        let seqs: Vec<_> = (0..5).map(|i| decode(i, 1000)).collect();
        let c = cost.step(&seqs, &[], &[], true);
        let n = tp as f64;
        // 5 new tokens × d_model 8192 × 2 bytes per all-reduce; a ring sends 2(N−1)/N of it.
        let sent = 2.0 * (n - 1.0) / n * 5.0 * 8192.0 * 2.0;
        let want = 2.0 * 80.0 * (latency + sent / link);
        assert!(
            rel(c.all_reduce_s, want) < 1e-12,
            "tp {tp}: {} vs {want}",
            c.all_reduce_s
        );
        let core = c.memory_s.max(c.compute_s);
        let rest = core + c.all_reduce_s + h100.step_overhead_s;
        assert!(rel(c.total_s, rest) < 1e-12, "tp {tp}: {c:?}");
        // Weights and KV per device.
        assert_eq!(
            m.weight_bytes_per_device(),
            ModelShape::llama3_70b().parameter_count() * 2 / tp as u64
        );
        assert_eq!(m.kv_bytes_per_token(), 2 * 80 * (8 / tp as u64) * 128 * 2);
    }
    // An empty step pays nothing, and a profile without a device link refuses tp > 1.
    m.tp = 4;
    let cost = CostModel::new(&m, &h100, None);
    assert_eq!(cost.step(&[], &[], &[], true).total_s, 0.0);
    let cpu = DeviceProfile::load("cpu", None).expect("cpu");
    let why = cpu.tp_refusal(4).expect("refused");
    assert!(
        why.contains("model.tp") && why.contains("nvlink_bytes_per_s"),
        "{why}"
    );
    assert_eq!(cpu.tp_refusal(1), None);
}

#[test]
fn an_fp8_model_reduces_bf16_activations_not_its_weights_dtype() {
    // DeepSeek-V3's FP8 checkpoint at tp 8 on H200: each all-reduce carries `new tokens ×
    // d_model` bf16 values (2 bytes), not FP8 ones — the same bytes as the bf16 model of the
    // same shape, recomputed here from the profile.
    let h200 = DeviceProfile::load("h200", None).expect("h200");
    let link = h200.nvlink_bytes_per_s.expect("h200 states its NVLink");
    let latency = h200.nvlink_latency_s.unwrap_or(0.0);
    let mut fp8 = ModelShape::deepseek_v3();
    fp8.tp = 8;
    assert_eq!(fp8.weight_dtype, Dtype::Fp8E4m3);
    let mut bf16 = fp8.clone();
    bf16.weight_dtype = Dtype::Bf16;
    let seqs: Vec<_> = (0..7).map(|i| decode(i, 500)).collect();
    let (n, d) = (8.0, fp8.d_model as f64);
    let sent = 2.0 * (n - 1.0) / n * 7.0 * d * 2.0;
    let want = 2.0 * fp8.layers as f64 * (latency + sent / link);
    for m in [&fp8, &bf16] {
        let cost = CostModel::new(m, &h200, None);
        let load = cost.load(&seqs, &[], &[]);
        assert_eq!(load.all_reduces, 2 * u64::from(m.layers));
        assert!(
            rel(load.all_reduce_bytes, 2.0 * fp8.layers as f64 * sent) < 1e-12,
            "{:?}: {} bytes",
            m.weight_dtype,
            load.all_reduce_bytes
        );
        let c = cost.time(&load, true);
        assert!(
            rel(c.all_reduce_s, want) < 1e-12,
            "{:?}: {} vs {want}",
            m.weight_dtype,
            c.all_reduce_s
        );
    }
}

#[test]
fn tp_1_and_dense_shapes_cost_what_the_dense_formula_says() {
    let h200 = DeviceProfile::load("h200", None).expect("h200");
    let m = ModelShape::llama3_8b();
    assert_eq!(m.active_parameter_count(), m.parameter_count());
    assert_eq!(m.routed_expert_weight_bytes_per_device(), 0);
    let cost = CostModel::new(&m, &h200, None);
    for batch in [1u64, 9, 300] {
        let seqs: Vec<_> = (0..batch).map(|i| decode(i, 2047)).collect();
        let load = cost.load(&seqs, &[], &[]);
        assert_eq!(load.weight_bytes, m.weight_bytes_per_device() as f64);
        assert_eq!(load.all_reduces, 0);
        assert_eq!(load.all_reduce_bytes, 0.0);
        let c = cost.time(&load, false);
        assert_eq!(c.all_reduce_s, 0.0);
        let bw = h200.hbm_effective_bytes_per_s;
        let memory = m.weight_bytes_per_device() as f64 / bw
            + batch as f64 * 131_072.0 / bw
            + batch as f64 * 2048.0 * 131_072.0 / bw;
        // Each decode's query sees 2,047 cached tokens and itself: 2,048 pairs of 4 × layers ×
        // query heads × head dim FLOPs.
        let compute = batch as f64 * 2.0 * m.parameter_count() as f64 / h200.peak_flops_per_s
            + batch as f64 * 2048.0 * 4.0 * 32.0 * 32.0 * 128.0 / h200.peak_flops_per_s;
        let want = memory.max(compute) + h200.step_overhead_s;
        assert!(rel(c.total_s, want) < 1e-12, "{c:?} vs {want}");
    }
}

/// Writes `model` as the `[model]` table of a small valid scenario and loads it: the error's
/// first diagnostic as (line, key, message).
fn model_error(model: &str) -> (Option<usize>, String, String) {
    let text = format!(
        "name = \"moe\"\ndevice = \"h200\"\n\n[model]\n{model}\n\n[memory]\nkv_budget = \"8 GiB\"\n\n\
         [cache]\nblock_size = 16\nmax_seq_len = 512\n\n[traffic]\nrequests = 4\n\
         arrival = {{ kind = \"burst\" }}\nprompt_tokens = {{ dist = \"fixed\", value = 64 }}\n\
         output_tokens = {{ dist = \"fixed\", value = 8 }}\n"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("moe.toml");
    std::fs::write(&path, &text).expect("write");
    let err = match scenario::load(&path, &[]) {
        Ok(s) => panic!("{model}: accepted as {:?}", s.model_shape()),
        Err(e) => e,
    };
    let d = &err.diagnostics()[0];
    let line = match &d.origin {
        Origin::File { line, .. } => Some(*line),
        _ => None,
    };
    // The CLI's line names the file too.
    assert!(
        err.to_string().contains("moe.toml:"),
        "{model}: {err} does not name the file"
    );
    (line, d.key.clone(), d.message.clone())
}

#[test]
fn hostile_moe_keys_are_refused_at_their_line_naming_the_key() {
    // [model] is line 4; its keys follow from line 5.
    for (model, want_line, key, says) in [
        (
            "preset = \"mixtral-8x7b\"\nexperts = 0",
            6,
            "model.experts",
            "must be in 1..=",
        ),
        (
            "preset = \"mixtral-8x7b\"\nactive_experts = 9",
            6,
            "model.active_experts",
            "more than the 8 experts",
        ),
        (
            "preset = \"mixtral-8x7b\"\nexperts = 4294967295",
            6,
            "model.experts",
            "must be in 1..=",
        ),
        (
            "preset = \"llama3-8b\"\nexperts = 8",
            5,
            "model.active_experts",
            "needs `experts` and `active_experts`",
        ),
        (
            "preset = \"mixtral-8x7b\"\nexpert_ffn_dim = 0",
            6,
            "model.expert_ffn_dim",
            "must be in 1..=",
        ),
        (
            "preset = \"mixtral-8x7b\"\nshared_experts = 100000",
            6,
            "model.shared_experts",
            "must be in 0..=",
        ),
        (
            "preset = \"mixtral-8x7b\"\nexperts = \"eight\"",
            6,
            "model.experts",
            "invalid type",
        ),
        (
            "preset = \"mixtral-8x7b\"\nexperts = -1",
            6,
            "model.experts",
            "",
        ),
    ] {
        let (line, got_key, message) = model_error(model);
        assert_eq!(got_key, key, "{model}: {message}");
        assert!(message.contains(says), "{model}: {message}");
        // A key the file gives is named at its own line; one left out at its table's.
        let want = if got_key == "model.active_experts" && !model.contains("active_experts") {
            4
        } else {
            want_line
        };
        assert_eq!(line, Some(want), "{model}: {got_key}: {message}");
    }
}

#[test]
fn dense_backends_refuse_an_moe_model_naming_the_key() {
    let mut tiny = ModelShape::tiny();
    tiny.moe = Some(Moe {
        experts: 4,
        active_experts: 2,
        expert_ffn_dim: 64,
        shared_experts: 0,
    });
    let err = kvbench::backend::cpu::model_config(&tiny)
        .expect_err("cpu refuses MoE")
        .to_string();
    assert!(
        err.contains("model.experts") && err.contains("cpu"),
        "{err}"
    );
    let err = kvbench::backend::cuda::setup::config(&tiny)
        .expect_err("cuda refuses MoE")
        .to_string();
    assert!(
        err.contains("model.experts") && err.contains("cuda"),
        "{err}"
    );
    tiny.moe = None;
    kvbench::backend::cpu::model_config(&tiny).expect("dense tiny runs");
}

/// The h200 recompute of a `p`-token llama3-8b prefix by hand: one paged prefill step, the
/// roofline's larger side plus the step overhead; attention at the profile's attention rate for
/// `tokens` attended, `attention_flops_per_s × L ÷ (L + attention_half_tokens)`.
fn llama3_8b_prefill_s(p: &DeviceProfile, tokens: f64) -> f64 {
    let m = ModelShape::llama3_8b();
    let kv = 131_072.0;
    let bw = p.hbm_effective_bytes_per_s;
    let memory = m.weight_bytes_per_device() as f64 / bw
        + tokens * kv / bw
        + tokens * kv / (bw * p.paged_attention_efficiency);
    let pairs = tokens * (tokens + 1.0) / 2.0;
    let attention_rate = p.attention_flops_per_s.unwrap_or(p.peak_flops_per_s) * tokens
        / (tokens + p.attention_half_tokens.unwrap_or(0.0));
    let compute = tokens * 2.0 * m.parameter_count() as f64 / p.peak_flops_per_s
        + pairs * 4.0 * 32.0 * 32.0 * 128.0 / attention_rate;
    memory.max(compute) + p.step_overhead_s
}

#[test]
fn plan_prices_a_host_tier_as_recomputed_by_hand() {
    let (code, out, err) = kvbench(&[
        "plan",
        "--preset",
        "llama3-8b",
        "--host-tier",
        "512 GiB",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let t = &v["host_tier"];
    let h200 = DeviceProfile::load("h200", None).expect("h200");
    assert_eq!(t["tokens_held"].as_u64(), Some((512u64 << 30) / 131_072));
    assert_eq!(
        t["blocks_held"].as_u64(),
        Some((512u64 << 30) / (16 * 131_072))
    );
    let latency = h200.host_link_latency_s.expect("h200 states its latency");
    let link = h200.host_link_bytes_per_s;
    let onload = latency + 4096.0 * 131_072.0 / link;
    let recompute = llama3_8b_prefill_s(&h200, 4096.0);
    let f = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
    assert!(rel(f("onload_s"), onload) < 1e-12, "{t}");
    assert!(
        rel(f("recompute_s"), recompute) < 1e-12,
        "{t} vs {recompute}"
    );
    assert!(rel(f("prefill_tokens_per_s"), 4096.0 / recompute) < 1e-12);
    let per_token = recompute / 4096.0 - 131_072.0 / link;
    let want = ((latency / per_token).ceil() as u64).max(1);
    assert_eq!(t["break_even_tokens"].as_u64(), Some(want), "{t}");

    // A slow first byte moves the break-even out: 0.1 s of latency; onloading is no slower
    // exactly from that length on, at the prefill rate.
    let mut slow = h200.clone();
    slow.host_link_latency_s = Some(0.1);
    let input = PlanInput {
        shape: ModelShape::llama3_8b(),
        block_size: 16,
        max_seq_len: 4096,
        reservation: Reservation::MaxSeqLen,
        budget_bytes: None,
    };
    let plan = TierPlan::compute(&input, &slow, 1 << 30, 4096).expect("plan");
    let n = plan.break_even_tokens.expect("a break-even") as f64;
    let onload = |x: f64| 0.1 + x * 131_072.0 / link;
    let recompute = |x: f64| x * recompute / 4096.0;
    assert!(onload(n) <= recompute(n) * (1.0 + 1e-12), "{plan:?}");
    assert!(onload(n - 1.0) > recompute(n - 1.0), "{plan:?}");
    assert_eq!(plan.tokens_held, (1 << 30) / 131_072);

    // A link slower than recomputing: no break-even at any length.
    let mut crawl = h200.clone();
    crawl.host_link_bytes_per_s = 1e9;
    let plan = TierPlan::compute(&input, &crawl, 1 << 30, 4096).expect("plan");
    assert_eq!(plan.break_even_tokens, None);
    assert!(plan.onload_s > plan.recompute_s);

    let (code, text, err) = kvbench(&["plan", "--preset", "llama3-8b", "--host-tier", "1 TiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("holds 8388608 tokens"), "{text}");
    assert!(text.contains("break-even"), "{text}");
    let (code, _, err) = kvbench(&["plan", "--preset", "llama3-8b", "--host-tier", "lots"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--host-tier"), "{err}");
    // A shape from flags alone has no stated weights to recompute with.
    let (code, _, err) = kvbench(&[
        "plan",
        "--layers",
        "32",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--host-tier",
        "1 GiB",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--preset or --scenario"), "{err}");
}

#[test]
fn the_shipped_tp_and_moe_scenarios_load_with_their_shapes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let s = scenario::load(&root.join("llama3-70b-4xh100.toml"), &[]).expect("70b");
    let m = s.model_shape().expect("shape");
    assert_eq!((m.tp, m.kv_bytes_per_token()), (4, 2 * 80 * 2 * 128 * 2));
    let t = scenario::load(&root.join("mixtral-8x7b-h200.toml"), &[]).expect("mixtral");
    let m = t.model_shape().expect("shape");
    assert_eq!(m.parameter_count(), TOTAL);
    // `suite` runs every scenarios/*.toml on sim by default: these stay small.
    for s in [&s, &t] {
        let n = s.traffic.requests.unwrap_or(u32::MAX);
        assert!(n <= 500, "{}: {n} requests slows the default suite", s.name);
    }
}

#[test]
fn the_binary_refuses_moe_on_cpu_and_tp_without_a_link_with_exit_2_and_no_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (backend, sets, needle) in [
        (
            "cpu",
            ["model.experts=4", "model.active_experts=2"],
            "model.experts",
        ),
        ("sim", ["model.tp=2", "seed=7"], "nvlink_bytes_per_s"),
    ] {
        let out = dir.path().join(backend);
        let out_s = out.to_str().expect("utf-8 temp path");
        let mut args = vec!["run", "scenarios/quick-basic.toml", "--backend", backend];
        for s in sets {
            args.extend(["--set", s]);
        }
        args.extend(["--out", out_s]);
        let (code, _, err) = kvbench(&args);
        assert_eq!(code, 2, "{backend}: {err}");
        assert!(err.contains(needle), "{backend}: {err}");
        assert!(!out.exists(), "{backend}: a results folder was written");
    }
}
