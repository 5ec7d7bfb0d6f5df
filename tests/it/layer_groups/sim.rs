//! The `sim` cost of layer groups: a sliding layer reads at most its window of each sequence
//! and attends to at most that many tokens, an MLA layer reads its latent, a recurrent layer
//! reads and writes its state once per sequence — each recomputed by hand here — and the
//! compute backends refuse a model with such groups before any work, naming the group.

use std::path::Path;
use std::process::Command;

use kvbench::backend::sim::cost::CostModel;
use kvbench::backend::sim::profile::DeviceProfile;
use kvbench::backend::SeqWork;
use kvbench::model::{LayerGroup, ModelShape};

fn h200() -> DeviceProfile {
    DeviceProfile::load("h200", None).expect("h200")
}

fn work(ctx: u32, new: u32) -> SeqWork {
    SeqWork {
        seq: 0,
        context_tokens: ctx,
        new_tokens: new,
        sample: true,
    }
}

fn with_groups(groups: Vec<LayerGroup>) -> ModelShape {
    ModelShape {
        layers: groups.iter().map(|g| g.layers()).sum(),
        layer_groups: groups,
        ..ModelShape::llama3_8b()
    }
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

#[test]
fn a_sliding_layer_reads_its_window_and_a_full_layer_everything() {
    // 16 sliding layers (window 1024) and 16 full ones of llama3-8b's heads: 4096 bytes per
    // token per layer in bf16.
    let m = with_groups(vec![
        LayerGroup::Sliding {
            layers: 16,
            window: 1024,
            kv_heads: 8,
            head_dim: 128,
        },
        LayerGroup::Full {
            layers: 16,
            kv_heads: 8,
            head_dim: 128,
        },
    ]);
    let cost = CostModel::new(&m, &h200(), None);
    let per_layer = 4096.0;
    // Decode at context 5000: the sliding layers read 1024 tokens, the full ones 5001.
    let load = cost.load(&[work(5000, 1)], &[], &[]);
    let want = 16.0 * per_layer * 1024.0 + 16.0 * per_layer * 5001.0;
    assert!(rel(load.kv_read_bytes, want) < 1e-12, "{load:?}");
    // Attention FLOPs: 4 × 32 query heads × 128 per pair per layer; 1024 pairs sliding, 5001 full.
    let pair = 4.0 * 32.0 * 128.0;
    let want = 16.0 * pair * 1024.0 + 16.0 * pair * 5001.0;
    assert!(rel(load.attn_flops, want) < 1e-12, "{load:?}");
    // Every layer writes the new token's K/V.
    assert_eq!(load.kv_write_bytes, 32.0 * per_layer);
    // Below the window a sliding layer costs a full one's: the same as llama3-8b.
    let dense = CostModel::new(&ModelShape::llama3_8b(), &h200(), None);
    let short = [work(300, 1), work(0, 500)];
    let (a, b) = (cost.load(&short, &[], &[]), dense.load(&short, &[], &[]));
    assert!(rel(a.kv_read_bytes, b.kv_read_bytes) < 1e-12);
    assert!(rel(a.attn_flops, b.attn_flops) < 1e-12);
    // A prefill chunk of 2048 after 0: sliding reads its 2048 tokens (window − 1 before the
    // chunk's first, none exist) and attends Σ min(p, 1024) pairs.
    let load = cost.load(&[work(0, 2048)], &[], &[]);
    let sliding_pairs: f64 = (1..=2048u64).map(|p| p.min(1024) as f64).sum();
    let full_pairs = 2048.0 * 2049.0 / 2.0;
    let want = 16.0 * pair * (sliding_pairs + full_pairs);
    assert!(rel(load.attn_flops, want) < 1e-12, "{load:?}");
}

#[test]
fn an_mla_layer_reads_its_latent_and_a_recurrent_layer_its_state() {
    let mla = LayerGroup::Mla {
        layers: 61,
        latent_dim: 512,
        rope_dim: 64,
        q_lora_rank: 1536,
    };
    let mut m = ModelShape::preset("deepseek-v3").expect("preset");
    assert_eq!(m.layer_groups, vec![mla]);
    m.tp = 8;
    let cost = CostModel::new(&m, &h200(), None);
    let load = cost.load(&[work(4095, 1), work(999, 1)], &[], &[]);
    // FP8 latent: 656 bytes per token per layer, whole on every device.
    assert!(rel(load.kv_read_bytes, (4096.0 + 1000.0) * 61.0 * 656.0) < 1e-12);
    // Absorbed attention: 2 × 16 query heads per device × (2 × 512 + 64) per pair per layer.
    let pair = 61.0 * 2.0 * 16.0 * (2.0 * 512.0 + 64.0);
    assert!(rel(load.attn_flops, pair * (4096.0 + 1000.0)) < 1e-12);

    let m = with_groups(vec![
        LayerGroup::Recurrent {
            layers: 24,
            state_bytes: 1 << 20,
        },
        LayerGroup::Full {
            layers: 8,
            kv_heads: 8,
            head_dim: 128,
        },
    ]);
    let cost = CostModel::new(&m, &h200(), None);
    let load = cost.load(&[work(10_000, 1), work(0, 300)], &[], &[]);
    // Each sequence reads and writes 24 states of 1 MiB; the 8 full layers read every token.
    let state = 24.0 * (1u64 << 20) as f64;
    let kv = 8.0 * 4096.0;
    assert!(rel(load.kv_read_bytes, 2.0 * state + kv * (10_001.0 + 300.0)) < 1e-12);
    assert!(rel(load.kv_write_bytes, 2.0 * state + kv * 301.0) < 1e-12);
    let pair = 8.0 * 4.0 * 32.0 * 128.0;
    let pairs = 10_001.0 + 300.0 * 301.0 / 2.0;
    assert!(rel(load.attn_flops, pair * pairs) < 1e-12);
}

#[test]
fn deepseek_dense_layers_hold_no_experts_in_the_weight_read() {
    // A decode step of one token reads the always-on weights plus 8 experts in each of the 58
    // MoE layers (not 61).
    let m = ModelShape::preset("deepseek-v3").expect("preset");
    let cost = CostModel::new(&m, &h200(), None);
    let load = cost.load(&[work(100, 1)], &[], &[]);
    let expert = 3.0 * 7168.0 * 2048.0; // FP8: one byte a weight.
    let routed = 58.0 * 256.0 * expert;
    let want = m.weight_bytes_per_device() as f64 - routed + 58.0 * 8.0 * expert;
    assert!(rel(load.weight_bytes, want) < 1e-9, "{load:?}");
}

const TINY_RECURRENT: &str = r#"name = "tiny-recurrent"
device = "cpu"

[model]
preset = "tiny"

[[model.layer_groups]]
attention = "recurrent"
layers = 1
state_bytes = 4096

[[model.layer_groups]]
attention = "full"
layers = 1

[memory]
kv_budget = "8 MiB"

[cache]
block_size = 16
max_seq_len = 256

[traffic]
requests = 6

[traffic.arrival]
kind = "poisson"
rate_per_s = 100.0

[traffic.prompt_tokens]
dist = "uniform"
min = 16
max = 64

[traffic.output_tokens]
dist = "uniform"
min = 4
max = 16
"#;

#[test]
fn the_compute_backends_refuse_a_recurrent_group_before_any_work_and_sim_runs_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiny-recurrent.toml");
    std::fs::write(&file, TINY_RECURRENT).expect("write");
    let run = |backend: &str, out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(["run", file.to_str().expect("utf-8"), "--backend", backend])
            .arg("--out")
            .arg(out)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run kvbench")
    };
    let out = dir.path().join("cuda-emu");
    let o = run("cuda-emu", &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("model.layer_groups.0 (attention = \"recurrent\")"),
        "{err}"
    );
    assert!(!out.exists(), "a results folder was written");
    let out = dir.path().join("sim");
    let o = run("sim", &out);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.join("summary.json").exists());
}

#[test]
fn a_model_of_full_groups_only_costs_what_the_dense_shape_costs() {
    let one = with_groups(vec![LayerGroup::Full {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
    }]);
    let (a, b) = (
        CostModel::new(&one, &h200(), None),
        CostModel::new(&ModelShape::llama3_8b(), &h200(), None),
    );
    let seqs = [work(1000, 1), work(0, 777), work(30, 64)];
    let (x, y) = (a.load(&seqs, &[], &[]), b.load(&seqs, &[], &[]));
    assert_eq!(x.kv_read_bytes, y.kv_read_bytes);
    assert_eq!(x.kv_write_bytes, y.kv_write_bytes);
    assert!(rel(x.attn_flops, y.attn_flops) < 1e-12);
    assert_eq!(x.weight_bytes, y.weight_bytes);
}

#[test]
fn the_shipped_layer_group_scenarios_load_with_their_shapes_and_stay_small() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let shipped: [(&str, &str, u32, u64); 4] = [
        ("deepseek-v3-8xh200.toml", "deepseek-v3", 8, 61 * 656),
        (
            "gemma3-27b-h100.toml",
            "gemma3-27b",
            1,
            2 * 62 * 16 * 128 * 2,
        ),
        (
            "gpt-oss-120b-h200.toml",
            "gpt-oss-120b",
            1,
            2 * 36 * 8 * 64 * 2,
        ),
        // Only the 12 full-attention layers keep tokens; the 36 DeltaNet layers' state is per
        // sequence, outside the bytes a token.
        (
            "qwen3-next-80b-h200.toml",
            "qwen3-next-80b",
            1,
            2 * 12 * 2 * 256 * 2,
        ),
    ];
    // The claim is every shipped grouped scenario: the list is checked against `scenarios/`, so
    // a new one cannot be left out.
    let mut grouped = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&root).expect("scenarios/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let s = kvbench::scenario::load(&path, &[]).expect("a shipped scenario loads");
            if !s.model_shape().expect("shape").layer_groups.is_empty() {
                let name = path.file_name().expect("name").to_string_lossy();
                grouped.insert(name.into_owned());
            }
        }
    }
    let listed = shipped.iter().map(|c| c.0.to_string()).collect();
    assert_eq!(grouped, listed, "the shipped layer-grouped scenarios");
    for (file, preset, tp, bytes_per_token) in shipped {
        let s = kvbench::scenario::load(&root.join(file), &[]).expect(file);
        let m = s.model_shape().expect("shape");
        assert_eq!(m.name, preset);
        assert_eq!(
            (m.tp, m.kv_bytes_per_token()),
            (tp, bytes_per_token),
            "{file}"
        );
        // `suite` runs every scenarios/*.toml on sim by default: these stay small.
        let n = s.traffic.requests.unwrap_or(u32::MAX);
        assert!(n <= 500, "{file}: {n} requests slows the default suite");
    }
}
