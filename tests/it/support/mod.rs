//! Helpers shared by the integration tests: running the `kvbench` binary and seeds (here), and
//! one module per family of tests that share set-ups, drivers or reference models.
#![allow(dead_code)]

pub mod cache_hybrid;
pub mod check_strings;
pub mod cpu_groups;
pub mod engine;
pub mod groups;
pub mod hostile_tables;
pub mod hybrid_kv;
pub mod hybrid_prefix;
pub mod hybrid_run;
#[path = "../../../kernels/tests/common/mod.rs"]
pub mod kernels_common;
pub mod report_browser;
pub mod shadow_grouped;
pub mod tier_cpu;
pub mod tier_results_files;
pub mod tune_small;

use std::path::Path;
use std::process::Command;

/// Runs the binary from the repository root; returns its exit code and stdout+stderr.
pub fn kvbench(args: &[&str]) -> (i32, String) {
    kvbench_env(Path::new(env!("CARGO_MANIFEST_DIR")), &[], args)
}

/// Runs the binary in `dir` with extra environment variables; returns its exit code and
/// stdout+stderr.
pub fn kvbench_env(dir: &Path, envs: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .current_dir(dir)
        .envs(envs.iter().copied())
        .args(args)
        .output()
        .expect("run kvbench");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A five-row Mooncake trace whose reuse the trace tests work out by hand (16 tokens per hash
/// id): r0 48 tokens [1,2,3], r1 64 [1,2,4,5], r2 33 [1,2,3], r3 32 [1,2], r4 40 [9,1,2].
/// Written as `hand.jsonl` in `dir`; returns its path.
pub fn hand_mooncake_trace(dir: &Path) -> String {
    let rows = [
        (0, 48, "[1, 2, 3]"),
        (1, 64, "[1, 2, 4, 5]"),
        (2, 33, "[1, 2, 3]"),
        (3, 32, "[1, 2]"),
        (4, 40, "[9, 1, 2]"),
    ];
    let text: String = rows
        .iter()
        .map(|(t, n, ids)| {
            format!(
                "{{\"timestamp\": {t}, \"input_length\": {n}, \"output_length\": 4, \"hash_ids\": {ids}}}\n"
            )
        })
        .collect();
    let p = dir.join("hand.jsonl");
    std::fs::write(&p, text).expect("write fixture");
    p.display().to_string()
}

/// `kvbench run SCENARIO --backend sim --out OUT EXTRA...`, which must exit 0.
pub fn run_sim(scenario: &str, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "run",
        scenario,
        "--backend",
        "sim",
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ];
    args.extend_from_slice(extra);
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{text}");
}

/// Writes scenario `text` to `dir/NAME` and runs it on `sim`, which must refuse it: exit 2, no
/// results folder, and a message naming `FILE:LINE` of the first line that starts with `key`.
/// Returns the message, for the caller's own words to look for.
pub fn run_refused(dir: &Path, name: &str, text: &str, key: &str) -> String {
    let line = text
        .lines()
        .position(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no line starts with {key:?}"))
        + 1;
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write scenario");
    let out = dir.join(format!("{name}.out"));
    let (code, said) = kvbench(&[
        "run",
        path.to_str().expect("utf-8 path"),
        "--backend",
        "sim",
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(code, 2, "{name}: {said}");
    assert!(!out.exists(), "{name}: the refused run wrote its folder");
    let at = format!("{}:{line}:", path.display());
    assert!(said.contains(&at), "{name}: no {at} in {said}");
    said
}

/// The directed AUC (a hit faster than a miss) by brute force over every (hit, miss) pair:
/// written out independently of the library's rank-based estimator.
pub fn pairwise_auc(hits: &[f64], misses: &[f64]) -> f64 {
    let mut score = 0.0;
    for h in hits {
        for m in misses {
            score += if m > h {
                1.0
            } else if m == h {
                0.5
            } else {
                0.0
            };
        }
    }
    score / (hits.len() * misses.len()) as f64
}

/// The seed a seeded test runs: `KVBENCH_SEED` when set (to replay a printed failure), else
/// `default`; printed either way.
pub fn seed_or(default: u64) -> u64 {
    let seed = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("seed {seed} (replay with KVBENCH_SEED={seed})");
    seed
}

/// The seeds a seeded test sweeps: `KVBENCH_SEED` alone (to replay a printed failure), or
/// `count_var` seeds (`default` when unset) from `first` on.
pub fn seeds(count_var: &str, default: u64, first: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![seed];
    }
    let n: u64 = std::env::var(count_var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    (0..n).map(|i| first + i).collect()
}
