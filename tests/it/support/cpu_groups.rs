//! What the layer-group tests on `cpu` share (`layer_groups::cpu`, `layer_groups::cpu_hybrid`): the
//! printed, replayable seed, a shipped scenario turned to one tiny variant, and the cpu run
//! options.
#![allow(dead_code)]

use std::path::PathBuf;

use kvbench::backend::BackendKind;
use kvbench::experiment::RunOptions;
use kvbench::scenario::Scenario;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The seed of the run and of the hand-driven sequences: `KVBENCH_SEED` replays another.
pub fn seed() -> u64 {
    crate::support::seed_or(7)
}

/// A run on `cpu` with `seed`, everything else the default.
pub fn cpu(seed: u64) -> RunOptions {
    RunOptions {
        backend: BackendKind::Cpu,
        seed: Some(seed),
        ..RunOptions::default()
    }
}

/// `scenarios/FILE` with `requests` requests of `preset` in `dtype` KV and `sets` besides, as
/// given (a recurrent model keeps its prefix cache: see [`tiny`]).
pub fn tiny_as_given(
    file: &str,
    preset: &str,
    dtype: &str,
    requests: u32,
    sets: &[&str],
) -> Scenario {
    let mut all = vec![
        format!("traffic.requests={requests}"),
        format!("model.preset={preset}"),
        format!("model.kv_dtype={dtype}"),
    ];
    all.extend(sets.iter().map(|s| s.to_string()));
    kvbench::scenario::load(&root().join("scenarios").join(file), &all).expect("scenario")
}

/// [`tiny_as_given`], a recurrent model's with the prefix cache off: the runs it serves compare
/// models without prefix hits (a recurrent model with the prefix cache on runs the hybrid
/// manager's checkpoints: `layer_groups::cpu_recurrent_prefix_cache`).
pub fn tiny(file: &str, preset: &str, dtype: &str, requests: u32, sets: &[&str]) -> Scenario {
    let mut all = sets.to_vec();
    if preset == "tiny-hybrid" {
        all.push("scheduler.prefix_cache=false");
    }
    tiny_as_given(file, preset, dtype, requests, &all)
}
