//! `kvbench plan --preset NAME` prices every preset, and its per-token KV bytes and the preset's
//! weight bytes agree with hand computations from the models' published configurations.

use std::process::Command;

use kvbench::model::ModelShape;

/// Per-token KV bytes by hand: 2 (K and V) × layers × kv_heads × head_dim × bytes per element,
/// with the figures of each model's published `config.json`.
const KV_BYTES_PER_TOKEN: &[(&str, u64)] = &[
    // 32 layers, 8 KV heads, head dim 128, bf16.
    ("llama3-8b", 2 * 32 * 8 * 128 * 2),
    // 80 layers, 8 KV heads, head dim 128, bf16.
    ("llama3-70b", 2 * 80 * 8 * 128 * 2),
    // 126 layers, 8 KV heads, head dim 16384 / 128 = 128, bf16.
    ("llama3-405b", 2 * 126 * 8 * 128 * 2),
    // 32 layers, 32 KV heads (MHA), head dim 4096 / 32 = 128, 2-byte elements.
    ("llama2-7b", 2 * 32 * 32 * 128 * 2),
    // 32 layers, 8 KV heads, head dim 4096 / 32 = 128, bf16: the experts add no KV.
    ("mixtral-8x7b", 2 * 32 * 8 * 128 * 2),
    // 61 MLA layers in FlashMLA's FP8 layout: 512 latent bytes + 4 f32 scales + 64 bf16 RoPE.
    ("deepseek-v3", 61 * (512 + 4 * 4 + 64 * 2)),
    // 52 sliding + 10 full layers, 16 KV heads, head dim 128, bf16 (a sliding layer's token
    // costs a full layer's; it keeps only 1024 of them).
    ("gemma3-27b", 2 * 62 * 16 * 128 * 2),
    // 18 sliding + 18 full layers, 8 KV heads, head dim 64, bf16.
    ("gpt-oss-120b", 2 * 36 * 8 * 64 * 2),
    // 12 full layers, 2 KV heads, head dim 256, bf16; the 36 recurrent layers store no token.
    ("qwen3-next-80b", 2 * 12 * 2 * 256 * 2),
    // The cpu model: 2 layers, 2 KV heads, head dim 32, f32.
    ("tiny", 2 * 2 * 2 * 32 * 4),
    // tiny with 2 sliding + 2 full layers: a sliding layer's token costs a full layer's.
    ("tiny-sliding", 2 * 4 * 2 * 32 * 4),
    // tiny with 2 MLA layers: a 64-value latent + 16 RoPE values per layer, f32.
    ("tiny-mla", 2 * (64 + 16) * 4),
    // tiny with 2 full + 2 recurrent layers: the recurrent ones store no token.
    ("tiny-hybrid", 2 * 2 * 2 * 32 * 4),
];

/// Parameters by hand for the dense presets: per layer q/o (d × q_heads·head_dim each), k/v
/// (d × kv_heads·head_dim each), gated MLP (3 × d × ffn) and two norms (2d); embedding and LM
/// head (2 × vocab × d); the final norm (d). Beside each, the model's published size.
const PARAMETERS: &[(&str, u64, u64)] = &[
    (
        "llama3-8b",
        32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
            + 2 * 128256 * 4096
            + 4096,
        8_030_000_000,
    ),
    (
        "llama3-70b",
        80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192)
            + 2 * 128256 * 8192
            + 8192,
        70_600_000_000,
    ),
    (
        "llama3-405b",
        126 * (2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248 + 2 * 16384)
            + 2 * 128256 * 16384
            + 16384,
        405_000_000_000,
    ),
    (
        "llama2-7b",
        32 * (2 * 4096 * 4096 + 2 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096)
            + 2 * 32000 * 4096
            + 4096,
        6_740_000_000,
    ),
];

#[test]
fn every_preset_has_a_hand_computed_kv_figure() {
    for name in ModelShape::PRESETS {
        assert!(
            KV_BYTES_PER_TOKEN.iter().any(|(n, _)| n == name),
            "preset {name} has no hand computation in this test"
        );
    }
}

#[test]
fn plan_prices_every_preset_per_token_as_computed_by_hand() {
    for &(name, want) in KV_BYTES_PER_TOKEN {
        let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(["plan", "--preset", name, "--tokens", "1000", "--json"])
            .output()
            .expect("run kvbench");
        assert!(
            out.status.success(),
            "kvbench plan --preset {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let seq = &v["sequence"];
        assert_eq!(seq["bytes_per_token"].as_u64(), Some(want), "{name}: {v}");
        assert_eq!(
            seq["sequence_bytes"].as_u64(),
            Some(want * 1000),
            "{name}: {v}"
        );
        let shape = ModelShape::preset(name).expect("preset");
        assert_eq!(shape.kv_bytes_per_token(), want, "{name}");
    }
}

#[test]
fn plan_text_names_the_preset_figures() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["plan", "--preset", "llama2-7b", "--tokens", "4096"])
        .output()
        .expect("run kvbench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // MHA: four times llama3-8b's 128 KiB per token, 2 GiB for a 4096-token sequence.
    assert!(text.contains("524288 bytes per token (512 KiB)"), "{text}");
    assert!(
        text.contains("4096 tokens: 2147483648 bytes (2 GiB)"),
        "{text}"
    );
}

#[test]
fn dense_preset_weights_match_the_hand_count_and_the_published_size() {
    for &(name, by_hand, published) in PARAMETERS {
        let shape = ModelShape::preset(name).expect("preset");
        assert_eq!(shape.parameter_count(), by_hand, "{name}");
        assert_eq!(
            shape.weight_bytes_per_device(),
            by_hand * 2,
            "{name}: bf16 weights"
        );
        // Within 1% of the size the model's publisher states.
        let err = (by_hand as f64 - published as f64).abs() / published as f64;
        assert!(err < 0.01, "{name}: {by_hand} vs published {published}");
    }
}

#[test]
fn an_unknown_preset_is_refused_listing_the_known_ones() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["plan", "--preset", "gpt-9", "--tokens", "1"])
        .output()
        .expect("run kvbench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("llama3-405b") && err.contains("llama2-7b"),
        "{err}"
    );
}

/// Mixtral 8x7B by hand (mistralai/Mixtral-8x7B-v0.1 `config.json`): per layer attention as
/// llama's at 32/8 heads of 128, a router (4096 × 8), 8 experts of 3 × 4096 × 14336 (2 active),
/// two norms; embedding and LM head over a 32000 vocabulary; the final norm.
#[test]
fn moe_preset_counts_every_expert_in_its_weights_and_the_active_ones_per_token() {
    let attn = 2 * 4096 * 4096 + 2 * 4096 * 1024;
    let expert = 3 * 4096 * 14336;
    let outside = 2 * 32000 * 4096 + 4096;
    let total: u64 = 32 * (attn + 4096 * 8 + 8 * expert + 2 * 4096) + outside;
    let active: u64 = 32 * (attn + 4096 * 8 + 2 * expert + 2 * 4096) + outside;
    let shape = ModelShape::preset("mixtral-8x7b").expect("preset");
    assert_eq!(shape.parameter_count(), total);
    assert_eq!(shape.active_parameter_count(), active);
    assert_eq!(shape.weight_bytes_per_device(), total * 2);
    // The published 46.7 B and 12.9 B, within 0.5%.
    assert!((total as f64 - 46.7e9).abs() / 46.7e9 < 0.005, "{total}");
    assert!((active as f64 - 12.9e9).abs() / 12.9e9 < 0.005, "{active}");
    // A dense preset computes with everything it holds.
    for &(name, by_hand, _) in PARAMETERS {
        let s = ModelShape::preset(name).expect("preset");
        assert_eq!(s.active_parameter_count(), by_hand, "{name}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args([
            "plan",
            "--preset",
            "mixtral-8x7b",
            "--tokens",
            "1",
            "--json",
        ])
        .output()
        .expect("run kvbench");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["weights"]["parameters"].as_u64(), Some(total), "{v}");
    assert_eq!(
        v["weights"]["active_parameters"].as_u64(),
        Some(active),
        "{v}"
    );
}
