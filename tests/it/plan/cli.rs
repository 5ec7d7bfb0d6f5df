//! `kvbench plan` prints the essay's figures exactly, through the binary.

use std::process::{Command, Output};

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .arg("plan")
        .args(args)
        .output()
        .expect("run kvbench")
}

fn stdout_ok(args: &[&str]) -> String {
    let out = plan(args);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "kvbench plan {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

const ESSAY: &[&str] = &[
    "--layers",
    "32",
    "--kv-heads",
    "8",
    "--head-dim",
    "128",
    "--dtype",
    "bf16",
    "--block-size",
    "16",
];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    ESSAY.iter().chain(extra).copied().collect()
}

#[test]
fn bytes_per_token_and_per_sequence() {
    let text = stdout_ok(&with(&["--tokens", "4096"]));
    assert!(text.contains("131072 bytes per token (128 KiB)"), "{text}");
    assert!(
        text.contains("4096 tokens: 536870912 bytes (512 MiB)"),
        "{text}"
    );
    assert!(text.contains("256 blocks of 16 tokens"), "{text}");
}

#[test]
fn tail_waste_of_a_33_token_sequence() {
    let text = stdout_ok(&with(&["--tokens", "33"]));
    assert!(text.contains("3 blocks of 16 tokens"), "{text}");
    assert!(
        text.contains("15 empty slots, 1966080 bytes (1.875 MiB) of tail waste"),
        "{text}"
    );
    assert!(
        text.contains("4096 slots reserved (max_seq_len 4096): 536870912 bytes (512 MiB)"),
        "{text}"
    );
}

#[test]
fn sequences_that_fit_each_way() {
    let text = stdout_ok(&with(&["--tokens", "33", "--budget", "80 GiB"]));
    // 80 GiB / 512 MiB = 160 contiguous; 80 GiB / (3 x 2 MiB) = 13653 paged.
    assert!(text.contains("paged 13653 sequences"), "{text}");
    assert!(text.contains("contiguous 160 sequences"), "{text}");
}

#[test]
fn json_carries_the_same_figures() {
    let text = stdout_ok(&with(&["--tokens", "33", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let s = &v["sequence"];
    assert_eq!(s["bytes_per_token"], 131072);
    assert_eq!(s["blocks"], 3);
    assert_eq!(s["empty_slots"], 15);
    assert_eq!(s["tail_waste_bytes"], 1966080);
    assert_eq!(s["contiguous_bytes"], 536870912u64);
}

#[test]
fn preset_and_tensor_parallelism() {
    let text = stdout_ok(&["--preset", "llama3-8b", "--tp", "2", "--tokens", "4096"]);
    assert!(text.contains("65536 bytes per token (64 KiB)"), "{text}");
}

#[test]
fn scenario_distribution() {
    let scen = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/quick-basic.toml");
    let text = stdout_ok(&["--scenario", scen]);
    assert!(text.contains("48 sequences from the scenario"), "{text}");
    assert!(text.contains("1024 bytes per token (1 KiB)"), "{text}");
}

#[test]
fn bad_input_exits_2() {
    for args in [
        vec!["--tokens", "33"],
        with(&["--tokens", "33", "--block-size", "12"]),
        with(&["--tokens", "33", "--budget", "lots"]),
        with(&[]),
    ] {
        let out = plan(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
}

#[test]
fn tensor_parallel_that_splits_a_kv_head_is_refused_like_scenarios() {
    let out = plan(&with(&["--tp", "3", "--tokens", "1024"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("does not divide 8 KV heads"), "{err}");
    let ok = plan(&with(&["--tp", "2", "--tokens", "1024"]));
    assert!(ok.status.success());
}

#[test]
fn non_physical_shapes_are_refused_not_wrapped() {
    let out = plan(&[
        "--layers",
        "2147483648",
        "--kv-heads",
        "8",
        "--head-dim",
        "2147483648",
        "--tokens",
        "1024",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("overflow"), "{err}");
}

/// Each refused value is blamed on its own flag, not on `--tokens` (the figure being computed)
/// or `--host-tier`.
#[test]
fn a_bad_value_names_its_own_flag() {
    for (extra, flag, needle) in [
        (
            vec!["--tp", "3"],
            "--tp",
            "tensor-parallel degree 3 does not divide 8 KV heads",
        ),
        (vec!["--tp", "0"], "--tp", "tp must be at least 1"),
        (
            vec!["--block-size", "12"],
            "--block-size",
            "block size 12 must be a power of two",
        ),
        (
            vec!["--block-size", "0"],
            "--block-size",
            "block size 0 must be a power of two",
        ),
        (
            vec!["--kv-heads", "0"],
            "--kv-heads",
            "kv_heads must be at least 1",
        ),
        (
            vec!["--kv-heads", "3", "--tp", "2"],
            "--tp, --kv-heads",
            "does not divide 3 KV heads",
        ),
        (
            vec!["--max-seq-len", "0"],
            "--max-seq-len",
            "max_seq_len must be at least 1",
        ),
        (
            vec!["--max-seq-len", "4294967295", "--block-size", "1048576"],
            "--max-seq-len, --block-size",
            "overflow",
        ),
        (
            vec!["--max-seq-len", "100"],
            "--tokens, --max-seq-len",
            "exceeds max_seq_len 100",
        ),
    ] {
        let args: Vec<&str> = ["--preset", "llama3-8b", "--tokens", "1024"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let out = plan(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("error: {flag}: ")) && err.contains(needle),
            "{args:?}: the message must name {flag}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: printed a plan");
    }
    // Without --tokens the refusal is the flag's too, not the host tier's.
    let out = plan(&["--preset", "llama3-8b", "--tp", "3", "--host-tier", "1 GiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("error: --tp: tensor-parallel degree 3"),
        "{err}"
    );
}
