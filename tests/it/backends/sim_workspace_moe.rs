//! The sim's activation workspace for a mixture of experts, by hand: a step's tokens hold the
//! intermediates of the experts they are routed to (`active_experts` routed plus the shared
//! ones, each `2 × expert_ffn_dim` wide: gate and up), not one dense MLP of `ffn_dim`, plus
//! the router's f32 logits; a model with dense layers before its MoE ones holds the wider of
//! the two (`harness/src/backend/sim/workspace.rs`). Activations are counted in bf16 (2 bytes)
//! whatever the weights are stored in, so an FP8 model holds the same workspace as its bf16 twin.
//! Checked on the function and on the ledger `SimBackend` reports.

use kvbench::backend::sim::workspace;
use kvbench::backend::sim::SimBackend;
use kvbench::backend::{Backend, Clock, RunSetup, TierSetup};
use kvbench::model::{Dtype, ModelShape};

/// The ledger's workspace a `sim` run of `model` on an H200 reports for steps of `tokens`.
fn ledger_workspace(model: &ModelShape, tokens: u32) -> u64 {
    let setup = RunSetup {
        model: model.clone(),
        device: "h200".into(),
        scenario_dir: None,
        cache_slots: 1024,
        block_size: 16,
        seed: 1,
        max_step_tokens: tokens,
        swap_gbytes_per_s: None,
        workspace_bytes: None,
        profile: None,
        clock: Clock::default(),
        tiers: TierSetup::default(),
    };
    SimBackend::new(&setup)
        .expect("sim backend")
        .memory()
        .workspace_bytes
}

#[test]
fn mixtral_8x7b_holds_its_two_routed_experts_intermediates() {
    let m = ModelShape::preset("mixtral-8x7b").expect("preset");
    // Mixtral 8x7B: d_model 4096, 8 experts of width 14336, 2 active, no shared, bf16, vocab
    // 32000. Per token: 4 hidden vectors (4 × 4096) and 2 routed experts' gate and up
    // (2 × 2 × 14336) in 2-byte bf16, 8 f32 router logits, 32000 f32 logits.
    let hidden = 4 * 4096u64;
    let routed = 2 * 2 * 14336u64;
    let per_token = (hidden + routed) * 2 + 8 * 4 + 32_000 * 4;
    assert_eq!(per_token, 275_488);
    assert_eq!(workspace::bytes_per_token(&m), per_token);
    // One dense MLP of ffn_dim (the dense formula) would hold one expert's width only.
    let dense_formula = (hidden + 2 * 14336) * 2 + 32_000 * 4;
    assert_eq!(per_token - dense_formula, 2 * 14336 * 2 + 8 * 4);
    for tokens in [1u32, 2048, 8192] {
        assert_eq!(ledger_workspace(&m, tokens), per_token * u64::from(tokens));
    }
}

#[test]
fn deepseek_v3_holds_the_wider_of_its_dense_mlp_and_its_routed_and_shared_experts() {
    let mut m = ModelShape::preset("deepseek-v3").expect("preset");
    // DeepSeek-V3: d_model 7168; 3 dense layers of intermediate 18432; 58 MoE layers of 256
    // routed experts, 8 active, 1 shared, each of width 2048; FP8 weights, but bf16 activations
    // (2 bytes a value); vocab 129280. The MoE layer's intermediates: (8 + 1) experts × 2 × 2048
    // = 36864 values, the dense layer's 2 × 18432 = 36864: equal, so either sets the buffer.
    let hidden = 4 * 7168u64;
    let routed_and_shared = (8 + 1) * 2 * 2048u64;
    let dense = 2 * 18432u64;
    assert_eq!(routed_and_shared, dense);
    let per_token = (hidden + routed_and_shared) * 2 + 256 * 4 + 129_280 * 4;
    assert_eq!(per_token, 649_216);
    assert_eq!(workspace::bytes_per_token(&m), per_token);
    // Without the dense layers the routed experts alone set it; with fewer active experts
    // the dense layers' MLP does.
    m.dense_layers = 0;
    assert_eq!(workspace::bytes_per_token(&m), per_token);
    let mut fewer = m.clone();
    fewer.dense_layers = 3;
    if let Some(moe) = fewer.moe.as_mut() {
        moe.active_experts = 2;
    }
    assert_eq!(
        workspace::bytes_per_token(&fewer),
        (hidden + dense) * 2 + 256 * 4 + 129_280 * 4
    );
    fewer.dense_layers = 0;
    assert_eq!(
        workspace::bytes_per_token(&fewer),
        (hidden + 3 * 2 * 2048) * 2 + 256 * 4 + 129_280 * 4
    );
    // Split over 8 devices (tp = 8): an eighth of the step's bytes on each.
    m.dense_layers = 3;
    m.tp = 8;
    assert_eq!(workspace::bytes(&m, 8192), per_token * 8192 / 8);
    assert_eq!(ledger_workspace(&m, 8192), per_token * 8192 / 8);
}

#[test]
fn a_dense_model_keeps_the_dense_formula() {
    let m = ModelShape::llama3_8b();
    let per_token = (4 * 4096 + 2 * 14336) * 2 + 4 * 128_256u64;
    assert_eq!(workspace::bytes_per_token(&m), per_token);
    assert_eq!(ledger_workspace(&m, 512), per_token * 512);
}

/// FP8 weights are a storage format: the activations a step holds are bf16 either way, so the
/// workspace of an FP8 model equals its bf16 twin's, on the function and on the ledger, while a
/// model stored in f32 computes, and holds its activations, in f32.
#[test]
fn fp8_weights_hold_bf16_activations() {
    for name in ["deepseek-v3", "gpt-oss-120b"] {
        let fp8 = ModelShape::preset(name).expect("preset");
        assert_eq!(fp8.weight_dtype, Dtype::Fp8E4m3, "{name}");
        let mut bf16 = fp8.clone();
        bf16.weight_dtype = Dtype::Bf16;
        assert_eq!(workspace::activation_dtype_bytes(&fp8), 2, "{name}");
        assert_eq!(
            workspace::bytes_per_token(&fp8),
            workspace::bytes_per_token(&bf16),
            "{name}"
        );
        assert_eq!(
            ledger_workspace(&fp8, 4096),
            ledger_workspace(&bf16, 4096),
            "{name}"
        );
    }
    // gpt-oss-120b by hand: d_model 2880, 4 active experts of width 2880, no shared, 128
    // experts, vocab 201088: (4 × 2880 + 4 × 2 × 2880) values in 2 bytes, f32 router and
    // vocabulary logits.
    let oss = ModelShape::preset("gpt-oss-120b").expect("preset");
    let per_token = (4 * 2880 + 4 * 2 * 2880u64) * 2 + 128 * 4 + 201_088 * 4;
    assert_eq!(workspace::bytes_per_token(&oss), per_token);
    let tiny = ModelShape::tiny();
    assert_eq!(tiny.weight_dtype, Dtype::F32);
    assert_eq!(workspace::activation_dtype_bytes(&tiny), 4);
    assert_eq!(
        workspace::bytes_per_token(&tiny),
        (4 * 256 + 2 * 512) * 4 + 512 * 4
    );
}
