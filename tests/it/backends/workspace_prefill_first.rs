//! `sim` and `cpu` size the ledger's workspace for the largest step the policy can schedule
//! (`engine::policy::max_step_tokens`), as `cuda` sizes its own: under `prefill_first` a prompt
//! runs whole, past `max_tokens_per_step`, so the workspace is that of a `max_seq_len` step.

use std::path::PathBuf;

use kvbench::backend::BackendKind;
use kvbench::engine::policy::max_step_tokens;
use kvbench::experiment::{self, RunOptions};
use kvbench::scenario::PolicyName;

/// `quick-basic` (prompts 16–96 tokens, `max_seq_len` 256) under `policy` with a chunk budget
/// of `budget` tokens on `backend`: the workspace both cache modes reported (asserted equal).
fn workspace_bytes(backend: BackendKind, policy: &str, budget: u32) -> u64 {
    let sets = [
        "traffic.requests=4".to_string(),
        format!("scheduler.policy={policy}"),
        format!("scheduler.max_tokens_per_step={budget}"),
    ];
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-basic.toml");
    let s = kvbench::scenario::load(&path, &sets).expect("scenario");
    let opts = RunOptions {
        backend,
        ..RunOptions::default()
    };
    let exp = experiment::run_scenario(&s, &opts).expect("run");
    assert!(exp.failures().is_empty(), "{:?}", exp.failures());
    let bytes: Vec<u64> = exp
        .runs
        .iter()
        .map(|r| r.end.memory.workspace_bytes)
        .collect();
    assert_eq!(bytes.len(), 2);
    assert_eq!(bytes[0], bytes[1], "{backend:?} {policy} {budget}");
    bytes[0]
}

#[test]
fn prefill_first_workspace_is_that_of_a_max_seq_len_step_on_sim_and_cpu() {
    // The bound itself: a budget below max_seq_len is lifted to it only under prefill_first.
    assert_eq!(max_step_tokens(PolicyName::PrefillFirst, 64, 256), 256);
    assert_eq!(max_step_tokens(PolicyName::DecodeFirst, 64, 256), 64);
    for backend in [BackendKind::Sim, BackendKind::Cpu] {
        let prefill_first = workspace_bytes(backend, "prefill_first", 64);
        let chunked = workspace_bytes(backend, "decode_first", 64);
        let whole = workspace_bytes(backend, "decode_first", 256);
        assert!(chunked > 0, "{backend:?}");
        // Activations grow with the step's tokens: 256 tokens take 4 × what 64 do.
        assert_eq!(whole, 4 * chunked, "{backend:?}");
        assert_eq!(prefill_first, whole, "{backend:?}");
    }
}
