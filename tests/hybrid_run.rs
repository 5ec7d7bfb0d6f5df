//! Runs of grouped models through the grouped managers (`cache.manager`): both choices run a
//! sliding-window model on `sim` to completion and say which managers ran; every byte figure of
//! `memory.csv` and `summary.json` is recomputed here from the model's published shape by the
//! grouping rule (one page = the tables' common layer count × block size × the largest per-layer
//! token bytes; a slot = a page ÷ the block size), not read from the library; the hybrid paged
//! manager holds more sequences than the summed one; the grouped contiguous baseline reserves a
//! sliding table's window and the largest step, not `max_seq_len`; and the refusals name the
//! file, line and key and write nothing.
//!
//! Most runs pass `--no-shadow` to stay quick (the grouped shadow has its own tests in
//! `tests/shadow_grouped.rs`; the prefix-cache run keeps it on); `--check-every 0` checks
//! invariants at the end of each run.

mod engine_support;
mod support;
use support::kvbench;

use std::path::Path;

use serde_json::Value;

const GPT_OSS: &str = "scenarios/gpt-oss-120b-h200.toml";

/// gpt-oss-120b (its `config.json`): 36 layers alternating a 128-token sliding window and full
/// attention, 8 KV heads of 64, bf16.
const LAYERS_PER_KIND: u64 = 18;
const WINDOW_TOKENS: u64 = 128;
const TOKEN_BYTES_PER_LAYER: u64 = 2 * 8 * 64 * 2;
const BLOCK_TOKENS: u64 = 16;
const BUDGET_BYTES: u64 = 1 << 30;
const STEP_TOKENS: u64 = 512;
const MAX_SEQ_LEN: u64 = 4096;

/// Both kinds have 18 layers and the same bytes a token: one table each of 18 layers, one page
/// = 18 layers × 16 tokens × 2 KiB.
fn page_bytes() -> u64 {
    LAYERS_PER_KIND * BLOCK_TOKENS * TOKEN_BYTES_PER_LAYER
}

fn slot_bytes() -> u64 {
    page_bytes() / BLOCK_TOKENS
}

/// One sequence's grouped contiguous reservation: `max_seq_len` tokens of pages for the full
/// table, and for the sliding one the window plus the largest step, and one page a ring turns
/// into — not `max_seq_len`.
fn contiguous_sequence_bytes() -> u64 {
    let full_pages = MAX_SEQ_LEN.div_ceil(BLOCK_TOKENS);
    let ring_pages = (WINDOW_TOKENS + STEP_TOKENS).div_ceil(BLOCK_TOKENS) + 1;
    assert!(ring_pages < full_pages);
    (full_pages + ring_pages) * page_bytes()
}

/// Run gpt-oss-120b under pressure (1 GiB, 512-token steps, 40 requests/s) with `manager`.
fn run_pressed(out: &Path, manager: &str) -> Value {
    let set_manager = format!("cache.manager={manager}");
    let (code, text) = kvbench(&[
        "run",
        GPT_OSS,
        "--backend",
        "sim",
        "--no-shadow",
        "--check-every",
        "0",
        "--trace-level",
        "requests",
        "--memory-resolution-ms",
        "0",
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
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ]);
    assert_eq!(code, 0, "{manager}: {text}");
    assert!(
        text.contains(&format!("cache manager `{manager}`")),
        "the terminal names the managers: {text}"
    );
    let summary = std::fs::read_to_string(out.join("summary.json")).expect("summary");
    serde_json::from_str(&summary).expect("json")
}

fn run_of<'a>(s: &'a Value, cache: &str) -> &'a Value {
    s["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .find(|r| r["cache"] == cache)
        .expect("mode run")
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// `memory.csv`'s rows of one mode, as name → value maps.
fn memory_rows(dir: &Path, cache: &str) -> Vec<std::collections::BTreeMap<String, String>> {
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

fn col(r: &std::collections::BTreeMap<String, String>, k: &str) -> u64 {
    r[k].parse().unwrap_or_else(|e| panic!("{k}: {e}"))
}

#[test]
fn hybrid_and_summed_both_run_the_sliding_model_and_hybrid_holds_more_sequences() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (hy_dir, su_dir) = (tmp.path().join("hybrid"), tmp.path().join("summed"));
    let hybrid = run_pressed(&hy_dir, "hybrid");
    let summed = run_pressed(&su_dir, "summed");
    for (s, name) in [(&hybrid, "hybrid"), (&summed, "summed")] {
        assert_eq!(s["cache_manager"], name);
        assert_eq!(s["checks"]["ok"], true, "{name}: {}", s["checks"]);
        for mode in ["paged", "contiguous"] {
            let r = run_of(s, mode);
            assert_eq!(r["requests"]["completed"], 120, "{name} {mode}");
            assert_eq!(r["reclamation"]["ok"], true, "{name} {mode}");
            assert_eq!(num(&r["reclamation"]["leaked_bytes"]), 0, "{name} {mode}");
            assert_eq!(r["invariants"]["ok"], true, "{name} {mode}");
        }
    }
    // Peak running from memory.csv's every-step rows agrees with the summary, and the hybrid
    // paged manager, whose sliding tables keep ~128 tokens a sequence, holds more sequences than
    // the summed slots in the same bytes.
    let peak = |dir: &Path, s: &Value, cache: &str| {
        let csv = memory_rows(dir, cache)
            .iter()
            .map(|r| col(r, "running_sequences"))
            .max()
            .expect("rows");
        assert_eq!(csv, num(&run_of(s, cache)["peak_running_sequences"]));
        csv
    };
    let (hy_paged, su_paged) = (
        peak(&hy_dir, &hybrid, "paged"),
        peak(&su_dir, &summed, "paged"),
    );
    assert!(
        hy_paged > su_paged,
        "hybrid paged held {hy_paged} sequences at most, summed {su_paged}"
    );
    let (hy_contig, su_contig) = (
        peak(&hy_dir, &hybrid, "contiguous"),
        peak(&su_dir, &summed, "contiguous"),
    );
    assert!(
        hy_contig > su_contig,
        "grouped contiguous held {hy_contig} sequences at most, summed contiguous {su_contig}"
    );
}

#[test]
fn the_grouped_ledger_is_slots_times_a_page_share_and_contiguous_reserves_the_window() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("hybrid");
    let s = run_pressed(&dir, "hybrid");
    // The pool: whole pages of the budget (no recurrent state to reserve).
    let pages = BUDGET_BYTES / page_bytes();
    let budget_slots = pages * BLOCK_TOKENS;
    for mode in ["paged", "contiguous"] {
        let r = run_of(&s, mode);
        assert_eq!(
            num(&r["memory"]["kv_budget_bytes"]),
            budget_slots * slot_bytes(),
            "{mode}"
        );
        let rows = memory_rows(&dir, mode);
        assert!(rows.len() > 10, "{mode}: every step is a row");
        let mut peak_allocated = 0;
        for row in &rows {
            let parts = [
                "kv_live_bytes",
                "kv_allocated_unfilled_bytes",
                "kv_cached_free_bytes",
                "kv_pending_free_bytes",
                "kv_free_bytes",
            ]
            .map(|k| col(row, k));
            for (k, b) in parts.iter().enumerate() {
                assert_eq!(
                    b % slot_bytes(),
                    0,
                    "{mode}: column {k} is whole slots: {row:?}"
                );
            }
            assert_eq!(
                parts.iter().sum::<u64>(),
                budget_slots * slot_bytes(),
                "{mode}: the ledger covers the pool at every step: {row:?}"
            );
            peak_allocated = peak_allocated.max(parts[0] + parts[1]);
            if mode == "contiguous" {
                // Every sequence reserves the same (`max_seq_len` reservations): whole
                // reservations, at most one a running sequence.
                let held = parts[0] + parts[1];
                assert_eq!(held % contiguous_sequence_bytes(), 0, "contiguous: {row:?}");
                assert!(
                    held / contiguous_sequence_bytes() <= col(row, "running_sequences"),
                    "contiguous: {row:?}"
                );
            }
        }
        if mode == "contiguous" {
            let peak_running = num(&run_of(&s, mode)["peak_running_sequences"]);
            assert_eq!(peak_allocated, peak_running * contiguous_sequence_bytes());
        }
        assert_eq!(
            peak_allocated,
            num(&run_of(&s, mode)["memory"]["kv_peak_allocated_bytes"]),
            "{mode}"
        );
    }
}

/// Run `scenario` with `extra` flags into a fresh folder; returns the exit code, the output
/// and whether the folder exists afterwards.
fn refused(scenario: &Path, extra: &[&str]) -> (i32, String, bool) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let mut args = vec![
        "run",
        scenario.to_str().expect("utf-8 path"),
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ];
    args.extend_from_slice(extra);
    let (code, text) = kvbench(&args);
    (code, text, out.exists())
}

/// A copy of the gpt-oss scenario with `cache_lines` added to its `[cache]` table (and the
/// prefix cache as `prefix_cache` says), in `dir`; the line `cache.manager` is written on.
fn grouped_scenario(
    dir: &Path,
    cache_lines: &str,
    prefix_cache: bool,
) -> (std::path::PathBuf, usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(GPT_OSS)).expect("scenario");
    let text = text.replace("[cache]\n", &format!("[cache]\n{cache_lines}"));
    assert!(
        text.contains("\nprefix_cache = false\n"),
        "the shipped scenario turns it off"
    );
    let text = text.replace(
        "\nprefix_cache = false\n",
        &format!("\nprefix_cache = {prefix_cache}\n"),
    );
    let line = text
        .lines()
        .position(|l| l.starts_with("manager"))
        .expect("manager line")
        + 1;
    std::fs::create_dir_all(dir.join("devices")).expect("devices");
    std::fs::copy(
        root.join("scenarios/devices/h200.toml"),
        dir.join("devices/h200.toml"),
    )
    .expect("device profile");
    let p = dir.join("grouped.toml");
    std::fs::write(&p, text).expect("write scenario");
    (p, line)
}

#[test]
fn hybrid_with_a_tier_a_bad_value_or_off_sim_is_refused_naming_the_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, bool, &[&str], &[&str]); 3] = [
        (
            "manager = \"hybrid\"\n",
            false,
            &["--backend", "cuda"],
            &["cache.manager", "cuda", "one block table"],
        ),
        (
            "manager = \"hybrid\"\n",
            true,
            &[
                "--backend",
                "sim",
                "--set",
                "cache.host_tier.capacity=4 GiB",
            ],
            &["cache.manager", "cache.host_tier"],
        ),
        (
            "manager = \"grouped\"\n",
            false,
            &["--backend", "sim"],
            &["cache.manager", "hybrid", "summed"],
        ),
    ];
    for (i, (lines, prefix, flags, words)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("case{i}"));
        let (path, line) = grouped_scenario(&dir, lines, *prefix);
        let (code, text, wrote) = refused(&path, flags);
        assert_eq!(code, 2, "case {i}: {text}");
        assert!(!wrote, "case {i}: the refused run wrote its folder");
        let at = format!("{}:{line}:", path.display());
        assert!(text.contains(&at), "case {i}: no {at} in {text}");
        for w in *words {
            assert!(text.contains(w), "case {i}: no {w:?} in {text}");
        }
    }
}

#[test]
fn auto_picks_hybrid_on_sim_with_or_without_the_prefix_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (prefix, want) in [(false, "hybrid"), (true, "hybrid")] {
        let dir = tmp.path().join(format!("prefix-{prefix}"));
        let (path, _) = grouped_scenario(&dir, "manager = \"auto\"\n", prefix);
        let out = dir.join("out");
        let (code, text) = kvbench(&[
            "run",
            path.to_str().expect("utf-8"),
            "--backend",
            "sim",
            "--no-shadow",
            "--check-every",
            "0",
            "--trace-level",
            "requests",
            "--set",
            "traffic.requests=20",
            "--out",
            out.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, 0, "{text}");
        let s: Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("summary.json")).expect("summary"),
        )
        .expect("json");
        assert_eq!(s["cache_manager"], want, "prefix_cache = {prefix}");
        let report = std::fs::read_to_string(out.join("report.md")).expect("report");
        assert!(
            report.contains(&format!("cache manager `{want}`")),
            "{report}"
        );
    }
}

/// Qwen3-Next 80B (its `config.json`): 12 full layers of 2 KV heads of 256 in bf16, and 36
/// gated-DeltaNet layers whose state is (32 × 128 × 128 + 3 × 8192) bf16 values each.
#[test]
fn a_recurrent_state_is_live_in_the_ledger_and_reserved_off_the_budget_by_the_baseline_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(GPT_OSS)).expect("scenario");
    let text = text
        .replace("preset = \"gpt-oss-120b\"", "preset = \"qwen3-next-80b\"")
        .replace("device = \"h200\"", "device = \"b200\"");
    std::fs::create_dir_all(tmp.path().join("devices")).expect("devices");
    std::fs::copy(
        root.join("scenarios/devices/b200.toml"),
        tmp.path().join("devices/b200.toml"),
    )
    .expect("device profile");
    let path = tmp.path().join("qwen3-next.toml");
    std::fs::write(&path, text).expect("write scenario");
    let out = tmp.path().join("out");
    let (code, text) = kvbench(&[
        "run",
        path.to_str().expect("utf-8"),
        "--backend",
        "sim",
        "--no-shadow",
        "--check-every",
        "0",
        "--trace-level",
        "requests",
        "--memory-resolution-ms",
        "0",
        "--set",
        "traffic.requests=60",
        "--set",
        "scheduler.max_seqs_per_step=64",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary"))
            .expect("json");
    assert_eq!(s["cache_manager"], "hybrid");
    let page_bytes: u64 = 12 * 16 * (2 * 2 * 256 * 2);
    let slot_bytes = page_bytes / 16;
    let state_bytes: u64 = 36 * (32 * 128 * 128 + 3 * 8192) * 2;
    let state_slots = state_bytes.div_ceil(slot_bytes);
    // The contiguous baseline: 64 states reserved first (max_seqs_per_step), the rest whole
    // pages. The paged manager: the whole budget in pages, states taken from them.
    let pages = (6 * (1u64 << 30) - 64 * state_bytes) / page_bytes;
    let contiguous_bytes = (pages * 16 + 64 * state_slots) * slot_bytes;
    let paged_bytes = (6 * (1u64 << 30) / page_bytes) * page_bytes;
    // The sequences holding a state at a row's time, from requests.csv: admitted before it and
    // not yet finished (no preemption gave one back in between: checked below).
    let requests = std::fs::read_to_string(out.join("requests.csv")).expect("requests.csv");
    let mut lines = requests.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let at = |k: &str| header.iter().position(|h| *h == k).expect("column");
    let (cache_col, admitted_col, finish_col) = (at("cache"), at("admitted_ms"), at("finish_ms"));
    for (mode, total_bytes) in [("paged", paged_bytes), ("contiguous", contiguous_bytes)] {
        let r = run_of(&s, mode);
        assert_eq!(r["requests"]["completed"], 60, "{mode}");
        assert_eq!(r["reclamation"]["ok"], true, "{mode}");
        assert_eq!(num(&r["memory"]["kv_budget_bytes"]), total_bytes, "{mode}");
        assert_eq!(num(&r["preemptions"]), 0, "{mode}");
        let held: Vec<(f64, f64)> = lines
            .clone()
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|c| c[cache_col] == mode)
            .map(|c| {
                let ms = |i: usize| c[i].parse::<f64>().expect("ms");
                (ms(admitted_col), ms(finish_col))
            })
            .collect();
        let mut checked = 0;
        for row in memory_rows(&out, mode) {
            let live = col(&row, "kv_live_bytes");
            let total: u64 = [
                "kv_live_bytes",
                "kv_allocated_unfilled_bytes",
                "kv_cached_free_bytes",
                "kv_pending_free_bytes",
                "kv_free_bytes",
            ]
            .iter()
            .map(|k| col(&row, k))
            .sum();
            assert_eq!(total, total_bytes, "{mode}: {row:?}");
            let t: f64 = row["t_ms"].parse().expect("t_ms");
            let holding = held.iter().filter(|&&(a, f)| a < t && f > t).count() as u64;
            assert!(
                live >= holding * state_slots * slot_bytes,
                "{mode}: {holding} states are live: {row:?}"
            );
            checked += u64::from(holding > 0);
        }
        assert!(checked > 100, "{mode}: {checked} rows checked");
    }
}

/// Gemma 3 27B (its `config.json`): 52 sliding layers of window 1024 and 10 full ones, 16 KV
/// heads of 128 in bf16 (8 KiB a token a layer): tables of gcd(52, 10) = 2 layers.
#[test]
fn plan_shows_the_hybrid_layout_of_a_grouped_model() {
    let (code, text) = kvbench(&[
        "plan",
        "--preset",
        "gemma3-27b",
        "--budget",
        "16 GiB",
        "--tokens",
        "4096",
    ]);
    assert_eq!(code, 0, "{text}");
    let page_bytes: u64 = 2 * 16 * 8192;
    let pages = (16u64 << 30) / page_bytes;
    // At 4096 tokens a full table holds 256 blocks, a sliding one the 64 from the block holding
    // position 4096 − 1024.
    let sequence_pages = 5 * 256 + 26 * ((4096 / 16) - (4096 - 1024) / 16);
    let summed_blocks = (16u64 << 30) / (62 * 8192) / 16;
    let lines = [
        format!(
            "hybrid      tables of 2 layers: 26 sliding (window 1024) x 16 tokens a page, 5 full x \
             16 tokens a page; page {page_bytes} bytes"
        ),
        format!(
            "hybrid fit  {pages} pages in the budget; a 4096-token sequence holds {} bytes",
            sequence_pages * page_bytes
        ),
        format!(
            "{} sequences fit, {} with summed slots",
            pages / sequence_pages,
            summed_blocks / 256
        ),
    ];
    for l in &lines {
        assert!(text.contains(l.as_str()), "no {l:?} in\n{text}");
    }
}

/// Shared system prompts on a sliding-window model (gemma3-27b: 5 sliding layers of a
/// 1024-token window to 1 full) through the hybrid manager with its prefix cache, the grouped
/// shadow on: prompts hit, nothing the shadow reads is wrong, every page comes back.
#[test]
fn hybrid_with_the_prefix_cache_hits_shared_prompts_under_the_shadow() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/shared-prompts-8b-h200.toml",
        "--backend",
        "sim",
        "--trace-level",
        "requests",
        "--set",
        "model.preset=gemma3-27b",
        "--set",
        "cache.manager=hybrid",
        "--set",
        "traffic.requests=20",
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("cache manager `hybrid`"), "{text}");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary"))
            .expect("json");
    assert_eq!(s["shadow"], true, "the shadow ran");
    assert_eq!(s["checks"]["ok"], true, "{}", s["checks"]);
    let paged = run_of(&s, "paged");
    assert!(
        num(&paged["prefix_cache"]["hit_tokens"]) > 0,
        "{}",
        paged["prefix_cache"]
    );
    assert_eq!(
        num(&paged["shadow"]["violations"]),
        0,
        "{}",
        paged["shadow"]
    );
    assert!(num(&paged["shadow"]["checked_slots"]) > 0);
    assert_eq!(paged["reclamation"]["ok"], true, "{}", paged["reclamation"]);
    assert_eq!(num(&paged["reclamation"]["leaked_blocks"]), 0);
    assert_eq!(paged["invariants"]["ok"], true, "{}", paged["invariants"]);
}

/// A run of `scenario` on sim with the grouped shadow on, swap preemption and pressure (a small
/// budget, long outputs, no watermark): its summary and `trace.jsonl`'s swap lines.
fn swap_run(scenario: &str, extra: &[&str]) -> (Value, Vec<Value>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let mut args = vec![
        "run",
        scenario,
        "--backend",
        "sim",
        "--check-every",
        "0",
        "--trace-level",
        "requests",
        "--set",
        "traffic.requests=60",
        "--set",
        "traffic.arrival.rate_per_s=40",
        "--set",
        "traffic.prompt_tokens.median=300",
        "--set",
        "traffic.output_tokens.median=900",
        "--set",
        "scheduler.preemption=swap",
        "--set",
        "scheduler.watermark=0",
        "--set",
        "scheduler.max_tokens_per_step=512",
        "--out",
        out.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{scenario}: {text}");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary"))
            .expect("json");
    let swaps = std::fs::read_to_string(out.join("trace.jsonl"))
        .expect("trace")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("trace line"))
        .filter(|v| v["event"] == "swap_out" || v["event"] == "swap_in")
        .collect();
    (s, swaps)
}

/// Both shapes' swaps, recomputed from each trace line's tokens by the grouping rule: a full
/// table swaps every block, a sliding table the blocks touching its window, and a recurrent
/// state its bytes (in slots, rounded up); the shadow sees every swap-in restore what was
/// swapped out, so the runs being clean is the check that the restored tables are right.
#[test]
fn swap_preemption_on_grouped_runs_is_shadowed_clean_and_priced_at_what_the_tables_keep() {
    // gpt-oss-120b: one full and one sliding (window 128) table of 18 layers, 16-token pages of
    // 18 × 16 × 2 KiB.
    let gpt_oss = |tokens: u64| {
        let blocks = tokens.div_ceil(BLOCK_TOKENS);
        let sliding = blocks - tokens.saturating_sub(WINDOW_TOKENS) / BLOCK_TOKENS;
        (blocks + sliding) * page_bytes()
    };
    // qwen3-next-80b: one table of its 12 full layers (2 KV heads of 256, bf16), and 36
    // DeltaNet states of (32 × 128 × 128 + 3 × 8192) bf16 values.
    let qwen_page: u64 = 12 * 16 * (2 * 2 * 256 * 2);
    let qwen_state: u64 = 36 * (32 * 128 * 128 + 3 * 8192) * 2;
    let qwen_slot = qwen_page / 16;
    let qwen =
        |tokens: u64| tokens.div_ceil(16) * qwen_page + qwen_state.div_ceil(qwen_slot) * qwen_slot;
    type Price<'a> = &'a dyn Fn(u64) -> u64;
    let cases: [(&str, &[&str], Price); 2] = [
        (GPT_OSS, &["--set", "memory.kv_budget=512 MiB"], &gpt_oss),
        (
            "scenarios/qwen3-next-80b-h200.toml",
            &[
                "--set",
                "memory.kv_budget=1 GiB",
                "--set",
                "scheduler.max_seqs_per_step=24",
            ],
            &qwen,
        ),
    ];
    for (scenario, extra, price) in cases {
        let (s, swaps) = swap_run(scenario, extra);
        assert_eq!(s["cache_manager"], "hybrid", "{scenario}");
        for mode in ["paged", "contiguous"] {
            let r = run_of(&s, mode);
            assert_eq!(r["requests"]["completed"], 60, "{scenario} {mode}");
            assert_eq!(r["reclamation"]["ok"], true, "{scenario} {mode}");
            assert_eq!(r["invariants"]["ok"], true, "{scenario} {mode}");
            assert_eq!(r["shadow"]["violations"], 0, "{scenario} {mode}");
            assert!(num(&r["shadow"]["checked_slots"]) > 0, "{scenario} {mode}");
        }
        let paged = run_of(&s, "paged");
        let preempted = num(&paged["preemptions"]);
        assert!(preempted > 5, "{scenario}: {preempted} preemptions");
        let (mut outs, mut ins, mut bytes) = (0u64, 0u64, 0u64);
        for v in &swaps {
            assert_eq!(
                v["cache"], "paged",
                "{scenario}: only the paged manager preempts"
            );
            let tokens = num(&v["tokens"]);
            assert_eq!(num(&v["bytes"]), price(tokens), "{scenario}: {v}");
            bytes += num(&v["bytes"]);
            if v["event"] == "swap_out" {
                outs += 1;
            } else {
                ins += 1;
            }
        }
        assert_eq!((outs, ins), (preempted, preempted), "{scenario}");
        assert_eq!(num(&paged["swapped_bytes"]), bytes, "{scenario}");
        eprintln!("{scenario}: {preempted} swaps out and in, {bytes} bytes moved");
    }
}

/// Forced pressure on any manager: the third append of each sequence is refused once as if the
/// pool were full, so the engine preempts (the newest running sequence) and, with swap
/// preemption, swaps it out and back in through this manager. Everything else is the inner
/// manager's.
struct Pressed {
    inner: Box<dyn kvbench_cache_api::KvCacheManager>,
    appends: std::collections::BTreeMap<u64, u32>,
    refused: u64,
}

impl kvbench_cache_api::KvCacheManager for Pressed {
    fn mode(&self) -> kvbench_cache_api::CacheMode {
        self.inner.mode()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn probe_start(&self, req: &kvbench_cache_api::StartRequest<'_>) -> kvbench_cache_api::Probe {
        self.inner.probe_start(req)
    }
    fn start(
        &mut self,
        req: &kvbench_cache_api::StartRequest<'_>,
    ) -> Result<kvbench_cache_api::Started, kvbench_cache_api::AllocError> {
        self.inner.start(req)
    }
    fn fill(&mut self, seq: u64, n: u32) -> Result<(), kvbench_cache_api::AllocError> {
        self.inner.fill(seq, n)
    }
    fn restore(&mut self, seq: u64, n: u32) -> Result<(), kvbench_cache_api::AllocError> {
        self.inner.restore(seq, n)
    }
    fn swap_slots(&self, seq: u64, tokens: u32) -> u64 {
        self.inner.swap_slots(seq, tokens)
    }
    fn append(
        &mut self,
        seq: u64,
    ) -> Result<Vec<kvbench_cache_api::CopyOp>, kvbench_cache_api::AllocError> {
        let n = self.appends.entry(seq).or_insert(0);
        *n += 1;
        if *n == 3 {
            self.refused += 1;
            return Err(kvbench_cache_api::AllocError::NoSpace {
                needed_slots: 1,
                available_slots: 0,
            });
        }
        self.inner.append(seq)
    }
    fn append_cost(&self, seq: u64) -> u64 {
        self.inner.append_cost(seq)
    }
    fn sequence_slots(&self, tokens: u64, reserve_tokens: u32) -> u64 {
        self.inner.sequence_slots(tokens, reserve_tokens)
    }
    fn fork(
        &mut self,
        parent: u64,
        child: u64,
    ) -> Result<Vec<kvbench_cache_api::CopyOp>, kvbench_cache_api::AllocError> {
        self.inner.fork(parent, child)
    }
    fn release(
        &mut self,
        seq: u64,
        why: kvbench_cache_api::ReleaseReason,
    ) -> Result<(), kvbench_cache_api::AllocError> {
        self.inner.release(seq, why)
    }
    fn begin_step(&mut self) -> kvbench_cache_api::StepId {
        self.inner.begin_step()
    }
    fn retire_step(&mut self, step: kvbench_cache_api::StepId) {
        self.inner.retire_step(step)
    }
    fn layout(&self, seq: u64) -> Option<kvbench_cache_api::SeqLayout<'_>> {
        self.inner.layout(seq)
    }
    fn seq_tokens(&self, seq: u64) -> Option<u32> {
        self.inner.seq_tokens(seq)
    }
    fn accounting(&self) -> kvbench_cache_api::Accounting {
        self.inner.accounting()
    }
    fn prefix_stats(&self) -> kvbench_cache_api::PrefixStats {
        self.inner.prefix_stats()
    }
    fn largest_free_extent(&self) -> u64 {
        self.inner.largest_free_extent()
    }
    fn flush_prefix_cache(&mut self) {
        self.inner.flush_prefix_cache()
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.inner.check_invariants()
    }
    fn assert_quiescent(&self) -> Result<(), String> {
        self.inner.assert_quiescent()
    }
    fn inject_fault(&mut self, fault: kvbench_cache_api::Fault) {
        self.inner.inject_fault(fault)
    }
    fn fault_fired(&self) -> u64 {
        self.inner.fault_fired()
    }
}

/// The grouped contiguous baseline (and the hybrid paged manager beside it) swapped out and
/// back in by the engine: prompts of 150 tokens on `tiny-sliding` (2 sliding layers of window
/// 12, 2 full) with 64-token steps, so the baseline's rings (⌈(12 + 64) / 16⌉ + 1 = 6 pages)
/// turn, and a whole-prompt fill at swap-in would be refused. The shadow checks every read after
/// each swap-in; each swap moves the full table's blocks and the sliding table's window blocks.
#[test]
fn swap_preemption_restores_grouped_sequences_under_the_shadow_in_both_modes() {
    use kvbench::backend::sim::SimBackend;
    use kvbench::backend::RunSetup;
    use kvbench::cache::hybrid::{HybridKv, HybridLayout};
    use kvbench::engine::TraceKind;
    use kvbench::model::ModelShape;
    use kvbench::scenario::PreemptionMode;
    use kvbench_cache_api::CacheMode;

    let shape = ModelShape::tiny_sliding();
    let layout = HybridLayout::new(&shape, 16, 64 << 20, 8).expect("layout");
    let slot_bytes = layout.slot_bytes();
    // Both tables of 2 layers store the same bytes a token: 16 tokens a page.
    assert!(layout.tables.iter().all(|t| t.block_tokens == 16));
    let window = u64::from(kvbench::model::TINY_SLIDING_WINDOW);
    let price = |tokens: u64| {
        let blocks = tokens.div_ceil(16);
        let sliding = blocks - tokens.saturating_sub(window) / 16;
        (blocks + sliding) * 16 * slot_bytes
    };
    for mode in [CacheMode::Contiguous, CacheMode::Paged] {
        let mut sched = engine_support::sched();
        sched.max_tokens_per_step = 64;
        sched.preemption = PreemptionMode::Swap;
        let mut cfg = engine_support::config(mode, sched);
        cfg.kv_bytes_per_token = shape.kv_bytes_per_token();
        cfg.slot_bytes = slot_bytes;
        cfg.model_name = shape.name.clone();
        let requests = (0..12u64)
            .map(|i| engine_support::req(i, i as f64 * 0.5, 150, 30))
            .collect();
        let w = engine_support::workload(requests);
        let inner: Box<dyn kvbench_cache_api::KvCacheManager> = match mode {
            CacheMode::Paged => Box::new(HybridKv::new(layout.clone())),
            CacheMode::Contiguous => Box::new(kvbench_baselines::manager::GroupedContiguous::new(
                layout.grouped_pool(),
                64,
            )),
        };
        let mut cache = Pressed {
            inner,
            appends: Default::default(),
            refused: 0,
        };
        let total = cache.inner.accounting().total_slots;
        let setup = RunSetup {
            model: shape.clone(),
            device: "cpu".into(),
            scenario_dir: None,
            cache_slots: total,
            block_size: 16,
            seed: 1,
            max_step_tokens: 64,
            swap_gbytes_per_s: None,
            workspace_bytes: None,
            profile: Some(engine_support::engine_test_device()),
            clock: Default::default(),
            tiers: Default::default(),
        };
        let mut backend = SimBackend::new(&setup)
            .and_then(|b| b.with_shadow())
            .expect("sim backend");
        let r = kvbench::engine::run(&cfg, &w, &mut cache, &mut backend).expect("engine run");
        assert_eq!(r.end.violation, None, "{mode:?}");
        assert!(
            r.end.reclamation.ok,
            "{mode:?}: {}",
            r.end.reclamation.detail
        );
        let report = backend.shadow_report().expect("shadow");
        assert_eq!(report.violations, 0, "{mode:?}: {:?}", report.messages);
        assert!(report.checked_slots > 0, "{mode:?}");
        let completed = engine_support::count(&r, kvbench::engine::StreamStatus::Completed);
        assert_eq!(completed, 12, "{mode:?}");
        let (mut outs, mut ins) = (0, 0);
        for e in &r.events {
            let (bytes, tokens) = match e.kind {
                TraceKind::SwapOut { bytes, tokens } => {
                    outs += 1;
                    (bytes, tokens)
                }
                TraceKind::SwapIn { bytes, tokens } => {
                    ins += 1;
                    (bytes, tokens)
                }
                _ => continue,
            };
            assert!(tokens >= 150, "{mode:?}: swapped while decoding");
            assert_eq!(bytes, price(u64::from(tokens)), "{mode:?}: {tokens} tokens");
        }
        assert!(cache.refused > 0, "{mode:?}");
        assert!(outs > 0 && outs == ins, "{mode:?}: {outs} out, {ins} in");
        eprintln!("{mode:?}: {outs} swaps out and in under the shadow");
    }
}

/// gpt-oss-120b with an FP8 KV cache and per-block scales: a token of a layer is 2 × 8 × 64
/// bytes, and each 16-token block of a layer carries 2 × 8 f32 scales (64 bytes), so a page of
/// a table of 18 layers is 18 × (16 × 1024 + 64) bytes, its scales 18 × 64 of them — the
/// summed layout's figure (36 × 1024 + ⌈36 × 64 / 16⌉ = 37,008 bytes a token) cut by table.
#[test]
fn plan_lays_out_per_block_fp8_scales_in_each_page() {
    let (code, text) = kvbench(&[
        "plan",
        "--preset",
        "gpt-oss-120b",
        "--dtype",
        "fp8",
        "--kv-scale",
        "per_block",
        "--budget",
        "6 GiB",
        "--tokens",
        "4096",
    ]);
    assert_eq!(code, 0, "{text}");
    let scales: u64 = 18 * 2 * 8 * 4;
    let page_bytes: u64 = 18 * (16 * 2 * 8 * 64) + scales;
    let pages = (6u64 << 30) / page_bytes;
    // At 4096 tokens the full table holds 256 blocks, the sliding one the 8 from the block
    // holding position 4096 − 128.
    let sequence_pages = 256 + (256 - (4096 - 128) / 16);
    let summed_token_bytes = 36 * 1024 + (36 * 64u64).div_ceil(16);
    assert_eq!(summed_token_bytes, 37_008);
    let summed_blocks = (6u64 << 30) / summed_token_bytes / 16;
    let lines = [
        format!(
            "hybrid      tables of 18 layers: 1 sliding (window 128) x 16 tokens a page, {scales} \
             bytes (1.125 KiB) of scales a page, 1 full x 16 tokens a page, {scales} bytes \
             (1.125 KiB) of scales a page; page {page_bytes} bytes"
        ),
        format!(
            "hybrid fit  {pages} pages in the budget; a 4096-token sequence holds {} bytes",
            sequence_pages * page_bytes
        ),
        format!(
            "{} sequences fit, {} with summed slots",
            pages / sequence_pages,
            summed_blocks / 256
        ),
    ];
    for l in &lines {
        assert!(text.contains(l.as_str()), "no {l:?} in\n{text}");
    }
}

/// The shipped Qwen3-Next scenario runs the hybrid managers and still comes out of this code
/// byte for byte as its committed sim reference (`results/reference/sim/qwen3-next-80b-h200`),
/// as `tests/run_reference.rs` checks the others; its recurrent states show as live bytes.
#[test]
fn the_qwen3_next_scenario_matches_its_committed_reference() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("qwen3-next-80b-h200");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/qwen3-next-80b-h200.toml",
        "--backend",
        "sim",
        "--check-every",
        "0",
        "--trace-level",
        "requests",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    let reference =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("results/reference/sim/qwen3-next-80b-h200");
    for file in ["summary.json", "report.md"] {
        let want = std::fs::read_to_string(reference.join(file)).expect("reference file");
        let got = std::fs::read_to_string(out.join(file)).expect("fresh result");
        assert!(want == got, "{file} differs from the committed reference");
    }
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary"))
            .expect("json");
    assert_eq!(s["cache_manager"], "hybrid");
    // A sequence's state is 37.7 MiB: at its peak of 163 sequences the paged run's live bytes
    // are mostly states.
    let paged = run_of(&s, "paged");
    let state: u64 = 36 * (32 * 128 * 128 + 3 * 8192) * 2;
    let peak = num(&paged["peak_running_sequences"]);
    assert!(num(&paged["memory"]["kv_peak_live_bytes"]) >= peak * state);
}
