//! Layer groups (full, sliding, MLA, recurrent) priced against hand computations: per-token
//! bytes for every group type and KV precision (FP8 scale overheads included), per-sequence and
//! contiguous figures from `plan`, the `[[model.layer_groups]]` schema with its errors located
//! at their line, and a model without groups priced as before.

use std::path::Path;

use kvbench::model::{Dtype, KvScale, LayerGroup, ModelShape};
use kvbench::plan::{Plan, PlanInput};
use kvbench::scenario::{self, Reservation};

fn shape(groups: Vec<LayerGroup>, dtype: Dtype, tp: u32) -> ModelShape {
    let layers = groups.iter().map(|g| g.layers()).sum();
    ModelShape {
        name: "grouped".into(),
        layers,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        d_model: 4096,
        ffn_dim: 14336,
        vocab: 32000,
        weight_dtype: Dtype::Bf16,
        kv_dtype: dtype,
        tp,
        moe: None,
        kv_scale: None,
        layer_groups: groups,
        dense_layers: 0,
    }
}

const FULL: LayerGroup = LayerGroup::Full {
    layers: 4,
    kv_heads: 8,
    head_dim: 128,
};
const SLIDING: LayerGroup = LayerGroup::Sliding {
    layers: 6,
    window: 100,
    kv_heads: 8,
    head_dim: 64,
};
const MLA: LayerGroup = LayerGroup::Mla {
    layers: 3,
    latent_dim: 512,
    rope_dim: 64,
    q_lora_rank: 0,
};
const RECURRENT: LayerGroup = LayerGroup::Recurrent {
    layers: 5,
    state_bytes: 1_000_000,
};

#[test]
fn per_token_bytes_of_every_group_and_precision_match_the_hand_count() {
    // (group, dtype, tp) → bytes per token per layer, by hand.
    let cases: [(LayerGroup, Dtype, u32, u64); 14] = [
        (FULL, Dtype::Bf16, 1, 2 * 8 * 128 * 2),
        (FULL, Dtype::F32, 1, 2 * 8 * 128 * 4),
        (FULL, Dtype::Fp8E4m3, 1, 2 * 8 * 128),
        (FULL, Dtype::Bf16, 4, 2 * 2 * 128 * 2),
        (SLIDING, Dtype::Bf16, 1, 2 * 8 * 64 * 2),
        (SLIDING, Dtype::Fp8E5m2, 2, 2 * 4 * 64),
        (SLIDING, Dtype::F16, 8, 2 * 64 * 2),
        // MLA: the latent and the RoPE part, one vector, the same on every device.
        (MLA, Dtype::Bf16, 1, (512 + 64) * 2),
        (MLA, Dtype::Bf16, 8, (512 + 64) * 2),
        (MLA, Dtype::F32, 1, (512 + 64) * 4),
        // FlashMLA's FP8 layout: 512 latent bytes, 4 f32 scales, 64 RoPE values in bf16.
        (MLA, Dtype::Fp8E4m3, 1, 512 + 4 * 4 + 64 * 2),
        (MLA, Dtype::Fp8E5m2, 8, 656),
        (RECURRENT, Dtype::Bf16, 1, 0),
        (RECURRENT, Dtype::Fp8E4m3, 4, 0),
    ];
    for (g, dtype, tp, want) in cases {
        assert_eq!(
            g.bytes_per_token_per_layer(tp, dtype),
            Some(want),
            "{g:?} {dtype:?} tp {tp}"
        );
        assert_eq!(
            g.bytes_per_token(tp, dtype),
            Some(want * g.layers() as u64),
            "{g:?}"
        );
        let m = shape(vec![g, FULL], dtype, tp);
        let full = FULL.bytes_per_token(tp, dtype).expect("fits");
        if !dtype.is_fp8() {
            assert_eq!(m.kv_bytes_per_token(), want * g.layers() as u64 + full);
        }
    }
    assert_eq!(RECURRENT.state_bytes_per_sequence(1), Some(5_000_000));
    assert_eq!(RECURRENT.state_bytes_per_sequence(3), Some(5 * 333_334));
}

#[test]
fn fp8_scales_count_over_full_and_sliding_layers_only() {
    let mut m = shape(vec![FULL, SLIDING, MLA, RECURRENT], Dtype::Fp8E4m3, 2);
    // Values: full 4 × 2 × 4 × 128, sliding 6 × 2 × 4 × 64, MLA 3 × 656, recurrent 0.
    let values = 4 * 2 * 4 * 128 + 6 * 2 * 4 * 64 + 3 * 656;
    // Per tensor (the default): one K and one V scale per full or sliding layer, fixed.
    assert_eq!(m.kv_bytes_per_token(), values);
    assert_eq!(m.kv_scale_fixed_bytes(), Some(2 * 10 * 4));
    // Per head: per layer per KV head on this device (4 of 8 at tp 2).
    m.kv_scale = Some((KvScale::PerHead, 16));
    assert_eq!(m.kv_scale_fixed_bytes(), Some(2 * 10 * 4 * 4));
    assert_eq!(m.kv_bytes_per_token(), values);
    // Per block of 16: 2 × (10 layers × 4 heads) × 4 bytes = 320 a block, 20 a token.
    m.kv_scale = Some((KvScale::PerBlock, 16));
    assert_eq!(m.kv_scale_bytes_per_block(), Some(320));
    assert_eq!(m.kv_bytes_per_token(), values + 20);
    assert_eq!(m.kv_scale_fixed_bytes(), Some(0));
}

fn input(m: ModelShape, budget: Option<u64>) -> PlanInput {
    PlanInput {
        shape: m,
        block_size: 16,
        max_seq_len: 4096,
        reservation: Reservation::MaxSeqLen,
        budget_bytes: budget,
    }
}

#[test]
fn plan_prices_each_group_and_a_sliding_layer_never_reserves_more_than_its_window() {
    let m = shape(vec![FULL, SLIDING, MLA, RECURRENT], Dtype::Bf16, 1);
    let (full, sliding, mla) = (4 * 4096, 6 * 2048, 3 * 1152);
    let p = Plan::compute(&input(m, Some(1 << 30)), 1000).expect("plan");
    assert_eq!(p.bytes_per_token, full + sliding + mla);
    assert_eq!(p.groups.len(), 4);
    let g = &p.groups;
    assert_eq!(
        (g[0].resident_tokens, g[0].sequence_bytes),
        (1000, 1000 * full)
    );
    assert_eq!(
        (g[1].resident_tokens, g[1].sequence_bytes),
        (100, 100 * sliding)
    );
    assert_eq!(
        (g[2].resident_tokens, g[2].sequence_bytes),
        (1000, 1000 * mla)
    );
    assert_eq!((g[3].resident_tokens, g[3].sequence_bytes), (0, 5_000_000));
    // Contiguous: max_seq_len for full and MLA, the window for sliding, the state for recurrent.
    assert_eq!(g[0].contiguous_bytes, 4096 * full);
    assert_eq!(
        (g[1].contiguous_tokens, g[1].contiguous_bytes),
        (100, 100 * sliding)
    );
    assert_eq!(g[2].contiguous_bytes, 4096 * mla);
    assert_eq!(
        (g[3].contiguous_tokens, g[3].contiguous_bytes),
        (0, 5_000_000)
    );
    let t = p.group_totals.as_ref().expect("totals");
    let held = 1000 * full + 100 * sliding + 1000 * mla + 5_000_000;
    let reserved = 4096 * full + 100 * sliding + 4096 * mla + 5_000_000;
    assert_eq!((t.sequence_bytes, t.contiguous_bytes), (held, reserved));
    assert_eq!(t.state_bytes_per_sequence, 5_000_000);
    assert_eq!(t.fits_held, Some((1 << 30) / held));
    assert_eq!(t.fits_contiguous, Some((1 << 30) / reserved));
}

#[test]
fn a_model_without_groups_plans_as_before() {
    let p = Plan::compute(&input(ModelShape::llama3_8b(), Some(80 << 30)), 33).expect("plan");
    assert!(p.groups.is_empty() && p.group_totals.is_none());
    let json = serde_json::to_string(&p).expect("json");
    assert!(!json.contains("groups"), "{json}");
    let shape = serde_json::to_string(&ModelShape::llama3_8b()).expect("json");
    assert!(!shape.contains("layer_groups") && !shape.contains("dense_layers"));
    // One explicit full group of every layer is the same shape priced the same way.
    let mut one = ModelShape::llama3_8b();
    one.layer_groups = vec![LayerGroup::Full {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
    }];
    assert_eq!(one.kv_bytes_per_token(), 131_072);
    assert_eq!(
        one.parameter_count(),
        ModelShape::llama3_8b().parameter_count()
    );
}

#[test]
fn plan_refuses_groups_that_do_not_hold_the_layers_and_a_recurrent_only_model() {
    let mut m = shape(vec![FULL, SLIDING], Dtype::Bf16, 1);
    m.layers = 11;
    let e = Plan::compute(&input(m, None), 10).expect_err("10 of 11 layers");
    assert!(e.to_string().contains("hold 10 layers"), "{e}");
    let e = Plan::compute(&input(shape(vec![RECURRENT], Dtype::Bf16, 1), None), 10)
        .expect_err("no attention");
    assert!(e.to_string().contains("bytes per token"), "{e}");
}

const GROUPED: &str = r#"name = "grouped"
device = "h100"

[model]
name = "hybrid"
layers = 12
q_heads = 32
kv_heads = 8
head_dim = 128
d_model = 4096
ffn_dim = 14336
vocab = 32000

[[model.layer_groups]]
attention = "sliding"
layers = 6
window = 1024

[[model.layer_groups]]
attention = "full"
layers = 2

[[model.layer_groups]]
attention = "mla"
layers = 2
latent_dim = 512
rope_dim = 64

[[model.layer_groups]]
attention = "recurrent"
layers = 2
state_bytes = 65536

[memory]
kv_budget = "8 GiB"

[cache]
block_size = 16
max_seq_len = 4096

[traffic]
requests = 10

[traffic.arrival]
kind = "poisson"
rate_per_s = 1.0

[traffic.prompt_tokens]
dist = "fixed"
value = 100

[traffic.output_tokens]
dist = "fixed"
value = 10
"#;

#[test]
fn a_scenario_states_its_groups_and_they_default_to_the_models_heads() {
    let s = scenario::parse_str(GROUPED, Some(Path::new("g.toml")), &[]).expect("loads");
    let m = s.model_shape().expect("shape");
    assert_eq!(
        m.layer_groups,
        vec![
            LayerGroup::Sliding {
                layers: 6,
                window: 1024,
                kv_heads: 8,
                head_dim: 128
            },
            LayerGroup::Full {
                layers: 2,
                kv_heads: 8,
                head_dim: 128
            },
            MLA_2,
            LayerGroup::Recurrent {
                layers: 2,
                state_bytes: 65536
            },
        ]
    );
    assert_eq!(m.kv_bytes_per_token(), 8 * 4096 + 2 * 1152);
    assert_eq!(m.checked_state_bytes_per_sequence(), Some(2 * 65536));
}

const MLA_2: LayerGroup = LayerGroup::Mla {
    layers: 2,
    latent_dim: 512,
    rope_dim: 64,
    q_lora_rank: 0,
};

#[test]
fn a_bad_group_is_refused_at_its_line_naming_its_key() {
    for (from, to, key, line, needle) in [
        // A window on a full group.
        (
            "attention = \"full\"\nlayers = 2",
            "attention = \"full\"\nlayers = 2\nwindow = 8",
            "model.layer_groups.1.window",
            22,
            "takes `kv_heads`, `head_dim`",
        ),
        // A sliding group without its window.
        (
            "layers = 6\nwindow = 1024",
            "layers = 6",
            "model.layer_groups.0.window",
            14,
            "needs `window`",
        ),
        // Groups that do not hold the model's layers.
        (
            "layers = 12",
            "layers = 13",
            "model.layers",
            6,
            "hold 12 layers",
        ),
        // A zero state.
        (
            "state_bytes = 65536",
            "state_bytes = 0",
            "model.layer_groups.3.state_bytes",
            32,
            "must be in 1..=",
        ),
        // tp that splits a group's heads.
        (
            "window = 1024",
            "window = 1024\nkv_heads = 2",
            "model.layer_groups.0.kv_heads",
            16,
            "",
        ),
    ] {
        let text = GROUPED.replacen(from, to, 1);
        let text = if key.ends_with("kv_heads") {
            text.replacen("kv_heads = 8", "kv_heads = 8\ntp = 4", 1)
        } else {
            text
        };
        let e = scenario::parse_str(&text, Some(Path::new("g.toml")), &[])
            .expect_err(key)
            .to_string();
        if key.ends_with("kv_heads") {
            assert!(e.contains("model.tp") && e.contains("layer group 0"), "{e}");
            continue;
        }
        assert!(e.contains(&format!("g.toml:{line}:")), "{key}: {e}");
        assert!(e.contains(key) && e.contains(needle), "{key}: {e}");
    }
}

/// Parameters by hand from each published `config.json` (doc of each preset), and the size its
/// publisher states, with the tolerance the shape reaches.
#[test]
fn preset_parameters_match_the_hand_count_and_the_published_size() {
    let gqa = |d: u64, q: u64, kv: u64, hd: u64| 2 * d * q * hd + 2 * d * kv * hd;
    // DeepSeek-V3: MLA projections (q down 1536, q up to 128 × (128 + 64), kv down to 512 + 64,
    // kv up to 128 × (128 + 128), out), 3 dense MLPs of 18432, 58 MoE layers of 256 + 1
    // experts of 2048 with a router.
    let d = 7168u64;
    let mla = d * 1536 + 1536 * 128 * 192 + d * 576 + 512 * 128 * 256 + 128 * 128 * d;
    let expert = 3 * d * 2048;
    let outside = 61 * (mla + 2 * d) + 3 * 3 * d * 18432 + 2 * 129280 * d + d;
    let ds = ModelShape::preset("deepseek-v3").expect("preset");
    assert_eq!(
        ds.parameter_count(),
        outside + 58 * (d * 256 + 257 * expert)
    );
    assert_eq!(
        ds.active_parameter_count(),
        outside + 58 * (d * 256 + 9 * expert)
    );
    // Gemma 3 27B, dense, untied.
    let d = 5376u64;
    let gemma = 62 * (gqa(d, 32, 16, 128) + 3 * d * 21504 + 2 * d) + 2 * 262208 * d + d;
    assert_eq!(
        ModelShape::preset("gemma3-27b")
            .expect("preset")
            .parameter_count(),
        gemma
    );
    // gpt-oss-120b: 128 experts of 2880, 4 active.
    let d = 2880u64;
    let base = 36 * (gqa(d, 64, 8, 64) + 2 * d + d * 128) + 2 * 201088 * d + d;
    let oss = ModelShape::preset("gpt-oss-120b").expect("preset");
    assert_eq!(oss.parameter_count(), base + 36 * 128 * 3 * d * 2880);
    assert_eq!(oss.active_parameter_count(), base + 36 * 4 * 3 * d * 2880);
    // Qwen3-Next: 512 + 1 experts of 512, 10 + 1 active; DeltaNet layers priced as full ones.
    let d = 2048u64;
    let base = 48 * (gqa(d, 16, 2, 256) + 2 * d + d * 512) + 2 * 151936 * d + d;
    let qn = ModelShape::preset("qwen3-next-80b").expect("preset");
    assert_eq!(qn.parameter_count(), base + 48 * 513 * 3 * d * 512);
    assert_eq!(qn.active_parameter_count(), base + 48 * 11 * 3 * d * 512);
    // Against the published sizes: (preset, total, tolerance, active, tolerance).
    for (name, total, t_tol, active, a_tol) in [
        ("deepseek-v3", 671e9, 0.01, 37e9, 0.02),
        ("gemma3-27b", 27e9, 0.06, f64::NAN, 0.0),
        ("gpt-oss-120b", 116.8e9, 0.01, 5.1e9 + 0.58e9, 0.02),
        ("qwen3-next-80b", 80e9, 0.02, 3e9, 0.1),
    ] {
        let m = ModelShape::preset(name).expect("preset");
        let err = (m.parameter_count() as f64 - total).abs() / total;
        assert!(err <= t_tol, "{name}: {} vs {total}", m.parameter_count());
        if active.is_finite() {
            let err = (m.active_parameter_count() as f64 - active).abs() / active;
            assert!(err <= a_tol, "{name}: {}", m.active_parameter_count());
        }
    }
}

#[test]
fn preset_groups_per_token_and_per_sequence_match_the_hand_count() {
    let plan = |name: &str, tokens: u32| {
        let m = ModelShape::preset(name).expect("preset");
        assert_eq!(
            m.groups().iter().map(|g| g.layers()).sum::<u32>(),
            m.layers,
            "{name}"
        );
        Plan::compute(&input(m, Some(40 << 30)), tokens).expect("plan")
    };
    // DeepSeek-V3: one MLA group, 656 bytes per token per layer, held in full.
    let p = plan("deepseek-v3", 4096);
    assert_eq!(p.groups[0].bytes_per_token_per_layer, 656);
    assert_eq!(
        p.group_totals.as_ref().map(|t| t.sequence_bytes),
        Some(4096 * 61 * 656)
    );
    // Gemma 3: the 52 sliding layers keep 1024 tokens of 8 KiB a layer, the 10 full ones all.
    let p = plan("gemma3-27b", 4096);
    let per_layer = 2 * 16 * 128 * 2;
    assert_eq!(p.groups[0].sequence_bytes, 52 * 1024 * per_layer);
    assert_eq!(p.groups[1].sequence_bytes, 10 * 4096 * per_layer);
    assert_eq!(p.groups[0].contiguous_tokens, 1024);
    // gpt-oss: window 128.
    let p = plan("gpt-oss-120b", 4096);
    let per_layer = 2 * 8 * 64 * 2;
    assert_eq!(
        p.group_totals.as_ref().map(|t| t.sequence_bytes),
        Some(18 * 128 * per_layer + 18 * 4096 * per_layer)
    );
    // Qwen3-Next: 36 states of 1,097,728 bytes and 12 full layers.
    let p = plan("qwen3-next-80b", 4096);
    assert_eq!(p.groups[0].state_bytes_per_sequence, 36 * 1_097_728);
    assert_eq!(
        p.group_totals.as_ref().map(|t| t.sequence_bytes),
        Some(36 * 1_097_728 + 12 * 4096 * 2 * 2 * 256 * 2)
    );
    // The MLA latent is replicated under tp: every device holds all of it.
    let mut ds = ModelShape::preset("deepseek-v3").expect("preset");
    ds.tp = 8;
    assert_eq!(ds.kv_bytes_per_token(), 61 * 656);
}

#[test]
fn plan_text_shows_each_group_and_what_a_sequence_holds_by_group() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args([
            "plan",
            "--preset",
            "gemma3-27b",
            "--tokens",
            "4096",
            "--budget",
            "16 GiB",
        ])
        .output()
        .expect("run kvbench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // 52 sliding layers keep 1024 tokens of 8 KiB a layer; 10 full layers keep all 4096.
    assert!(
        text.contains("sliding (window 1024), 52 layers x 16 KV heads: 8192 bytes per token per layer, 425984 per token; keeps 1024 of 4096 tokens: 436207616 bytes"),
        "{text}"
    );
    assert!(
        text.contains("keeps 4096 of 4096 tokens: 335544320 bytes"),
        "{text}"
    );
    // 16 GiB ÷ (436207616 + 335544320) = 22 sequences by group; 8 at the summed bytes.
    assert!(
        text.contains("by group: 22 sequences held, 22 contiguous"),
        "{text}"
    );
    assert!(text.contains("fit         paged 8 sequences"), "{text}");
    // A dense preset's text has no group lines.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["plan", "--preset", "llama3-8b", "--tokens", "4096"])
        .output()
        .expect("run kvbench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("group") && text.contains("32 layers x 8 KV heads"),
        "{text}"
    );
}
