//! What the grouped-run tests share (`layer_groups::run`, `layer_groups::swap`): gpt-oss-120b's
//! shape by its published `config.json`, the grouping rule's page and slot sizes recomputed by
//! hand, and readers of a run's `summary.json` and `memory.csv`.
#![allow(dead_code)]

use std::path::Path;

use serde_json::Value;

use crate::support::kvbench;

pub const GPT_OSS: &str = "scenarios/gpt-oss-120b-h200.toml";

/// gpt-oss-120b (its `config.json`): 36 layers alternating a 128-token sliding window and full
/// attention, 8 KV heads of 64, bf16.
pub const LAYERS_PER_KIND: u64 = 18;
pub const WINDOW_TOKENS: u64 = 128;
pub const TOKEN_BYTES_PER_LAYER: u64 = 2 * 8 * 64 * 2;
pub const BLOCK_TOKENS: u64 = 16;
pub const BUDGET_BYTES: u64 = 1 << 30;
pub const STEP_TOKENS: u64 = 512;
pub const MAX_SEQ_LEN: u64 = 4096;

/// Both kinds have 18 layers and the same bytes a token: one table each of 18 layers, one page
/// = 18 layers × 16 tokens × 2 KiB.
pub fn page_bytes() -> u64 {
    LAYERS_PER_KIND * BLOCK_TOKENS * TOKEN_BYTES_PER_LAYER
}

pub fn slot_bytes() -> u64 {
    page_bytes() / BLOCK_TOKENS
}

/// One sequence's grouped contiguous reservation: `max_seq_len` tokens of pages for the full
/// table, and for the sliding one the window plus the largest step, and one page a ring turns
/// into — not `max_seq_len`.
pub fn contiguous_sequence_bytes() -> u64 {
    let full_pages = MAX_SEQ_LEN.div_ceil(BLOCK_TOKENS);
    let ring_pages = (WINDOW_TOKENS + STEP_TOKENS).div_ceil(BLOCK_TOKENS) + 1;
    assert!(ring_pages < full_pages);
    (full_pages + ring_pages) * page_bytes()
}

/// `kvbench run SCENARIO --backend sim --trace-level requests FLAGS --out OUT`: the grouped-run
/// tests' common invocation (`--trace-level requests` so `requests.csv` and `trace.jsonl`'s
/// request lines are there to recompute from); asserts exit 0 and returns the output and
/// `summary.json`.
pub fn run_sim(scenario: &str, out: &Path, flags: &[&str]) -> (String, Value) {
    let mut args = vec![
        "run",
        scenario,
        "--backend",
        "sim",
        "--trace-level",
        "requests",
    ];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--out", out.to_str().expect("utf-8 temp path")]);
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{scenario} {flags:?}: {text}");
    (text, summary(out))
}

/// A run folder's `summary.json`.
pub fn summary(out: &Path) -> Value {
    let text = std::fs::read_to_string(out.join("summary.json")).expect("summary");
    serde_json::from_str(&text).expect("json")
}

/// Flags of a run read for its memory ledger: a `memory.csv` row every step, invariants checked
/// at the end, no shadow (the grouped shadow has its own tests).
pub const LEDGER_RUN: [&str; 5] = [
    "--no-shadow",
    "--check-every",
    "0",
    "--memory-resolution-ms",
    "0",
];

/// Run gpt-oss-120b under pressure (1 GiB, 512-token steps, 40 requests/s) with `manager`.
pub fn run_pressed(out: &Path, manager: &str) -> Value {
    let set_manager = format!("cache.manager={manager}");
    let (text, s) = run_sim(
        GPT_OSS,
        out,
        &[
            &LEDGER_RUN[..],
            &[
                "--set",
                "memory.kv_budget=1 GiB",
                "--set",
                "traffic.requests=120",
                "--set",
                "traffic.arrival.rate_per_s=40",
                "--set",
                "scheduler.max_tokens_per_step=512",
                "--set",
                "scheduler.prefix_cache=false",
                "--set",
                &set_manager,
            ],
        ]
        .concat(),
    );
    assert!(
        text.contains(&format!("cache manager `{manager}`")),
        "the terminal names the managers: {text}"
    );
    s
}

pub fn run_of<'a>(s: &'a Value, cache: &str) -> &'a Value {
    s["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .find(|r| r["cache"] == cache)
        .expect("mode run")
}

pub fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// `memory.csv`'s rows of one mode, as name → value maps.
pub fn memory_rows(dir: &Path, cache: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("memory.csv")).expect("memory.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .map(|h| h.to_string())
                .zip(l.split(',').map(str::to_string))
                .collect::<std::collections::BTreeMap<_, _>>()
        })
        .filter(|r| r["cache"] == cache)
        .collect()
}

/// `memory.csv`'s columns that split the pool: every byte of it in exactly one of them.
pub const LEDGER_COLUMNS: [&str; 5] = [
    "kv_live_bytes",
    "kv_allocated_unfilled_bytes",
    "kv_cached_free_bytes",
    "kv_pending_free_bytes",
    "kv_free_bytes",
];

pub fn col(r: &std::collections::BTreeMap<String, String>, k: &str) -> u64 {
    r[k].parse().unwrap_or_else(|e| panic!("{k}: {e}"))
}
