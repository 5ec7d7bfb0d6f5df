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
//! `checker::shadow_grouped`; the prefix-cache run keeps it on); `--check-every 0` checks
//! invariants at the end of each run.

use crate::support;
use crate::support::hybrid_run as hybrid_run_support;
use hybrid_run_support::*;
use support::kvbench;

use std::path::Path;

use serde_json::Value;

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
            let parts = LEDGER_COLUMNS.map(|k| col(row, k));
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
        let (_, s) = run_sim(
            path.to_str().expect("utf-8"),
            &out,
            &[
                "--no-shadow",
                "--check-every",
                "0",
                "--set",
                "traffic.requests=20",
            ],
        );
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
    let (_, s) = run_sim(
        path.to_str().expect("utf-8"),
        &out,
        &[
            &LEDGER_RUN[..],
            &[
                "--set",
                "traffic.requests=60",
                "--set",
                "scheduler.max_seqs_per_step=64",
            ],
        ]
        .concat(),
    );
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
            let total: u64 = LEDGER_COLUMNS.iter().map(|k| col(&row, k)).sum();
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
    let (text, s) = run_sim(
        "scenarios/shared-prompts-8b-h200.toml",
        &out,
        &[
            "--set",
            "model.preset=gemma3-27b",
            "--set",
            "cache.manager=hybrid",
            "--set",
            "traffic.requests=20",
        ],
    );
    assert!(text.contains("cache manager `hybrid`"), "{text}");
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
    // One cache of whole blocks does not bound a pool of per-table pages: no bounds, and why.
    let pc = &paged["prefix_cache"];
    assert!(pc.get("bounds").is_none_or(Value::is_null), "{pc}");
    let why = pc["bounds_unavailable"].as_str().unwrap_or_default();
    assert!(why.contains("hybrid") && why.contains("summed"), "{pc}");
    // The infinite cache bounds any manager: the hybrid run states the ceiling, equal to the
    // summed run's of the same request list, and its share at admission recomputes from
    // requests.csv (the rows without a parent) over the ceiling's lookup tokens.
    let ceiling = &pc["ceiling"];
    let summed_out = tmp.path().join("summed");
    let (_, summed) = run_sim(
        "scenarios/shared-prompts-8b-h200.toml",
        &summed_out,
        &[
            "--set",
            "model.preset=gemma3-27b",
            "--set",
            "cache.manager=summed",
            "--set",
            "traffic.requests=20",
            "--no-shadow",
        ],
    );
    let bounds = &run_of(&summed, "paged")["prefix_cache"]["bounds"];
    assert_eq!(s["workload_hash"], summed["workload_hash"]);
    for key in ["lookup_tokens", "ceiling_hit_tokens"] {
        assert_eq!(
            num(&ceiling[key]),
            num(&bounds[key]),
            "{key}: {ceiling} {bounds}"
        );
    }
    assert!(num(&ceiling["ceiling_hit_tokens"]) > 0, "{ceiling}");
    let csv = std::fs::read_to_string(out.join("requests.csv")).expect("requests.csv");
    let mut rows = csv.lines();
    let header: Vec<&str> = rows.next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (cache, parent, cached) = (col("cache"), col("parent_id"), col("cached_prompt_tokens"));
    let admitted_hits: u64 = rows
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[cache] == "paged" && f[parent].is_empty())
        .map(|f| f[cached].parse::<u64>().expect("cached_prompt_tokens"))
        .sum();
    assert_eq!(num(&pc["request_hit_tokens"]), admitted_hits, "{pc}");
    let achieved = pc["achieved_hit_rate"].as_f64().expect("achieved_hit_rate");
    let lookup = num(&ceiling["lookup_tokens"]) as f64;
    assert!(
        (achieved - admitted_hits as f64 / lookup).abs() < 1e-12,
        "{pc}"
    );
    assert!(admitted_hits <= num(&ceiling["ceiling_hit_tokens"]), "{pc}");
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
/// as `results::reference` checks the others; its recurrent states show as live bytes.
#[test]
fn the_qwen3_next_scenario_matches_its_committed_reference() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("qwen3-next-80b-h200");
    let (_, s) = run_sim(
        "scenarios/qwen3-next-80b-h200.toml",
        &out,
        &["--check-every", "0"],
    );
    let reference =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("results/reference/sim/qwen3-next-80b-h200");
    for file in ["summary.json", "report.md"] {
        let want = std::fs::read_to_string(reference.join(file)).expect("reference file");
        let got = std::fs::read_to_string(out.join(file)).expect("fresh result");
        assert!(want == got, "{file} differs from the committed reference");
    }
    assert_eq!(s["cache_manager"], "hybrid");
    // A sequence's state is 37.7 MiB: at its peak of 163 sequences the paged run's live bytes
    // are mostly states.
    let paged = run_of(&s, "paged");
    let state: u64 = 36 * (32 * 128 * 128 + 3 * 8192) * 2;
    let peak = num(&paged["peak_running_sequences"]);
    assert!(num(&paged["memory"]["kv_peak_live_bytes"]) >= peak * state);
}
