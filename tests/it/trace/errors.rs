//! Bad trace input: a corrupted row is an error naming file, line and column (exit 2, no
//! results); `--skip-bad-rows` skips and counts it; an unknown header names the formats; and
//! `kvbench trace stats` computes the ideal prefix reuse of a hand-made trace exactly.

use crate::support;

use std::path::Path;

use support::kvbench;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write fixture");
    p.display().to_string()
}

const GOOD: &str = "arrival_ms,prompt_tokens,output_tokens\n0,100,10\n5,120,12\n";

#[test]
fn a_corrupted_row_names_file_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let f = write(
        tmp.path(),
        "bad.csv",
        "arrival_ms,prompt_tokens,output_tokens\n0,100,10\n5,120,12\n9,12x,4\n10,50,5\n",
    );
    let out = tmp.path().join("out");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/trace-csv.toml",
        "--backend",
        "sim",
        "--trace",
        &f,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains(&format!("{f}:4:3:")), "{text}");
    assert!(text.contains("12x"), "{text}");
    assert!(!out.exists(), "no half-written results");

    // JSONL: the column comes from the JSON parser.
    let j = write(
        tmp.path(),
        "bad.jsonl",
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\n\
         {\"timestamp\": 5, \"input_length\": \"ten\", \"output_length\": 2}\n",
    );
    let (code, text) = kvbench(&["trace", "stats", &j]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains(&format!("{j}:2:")), "{text}");

    // A wrong field count names the line too.
    let c = write(
        tmp.path(),
        "short.csv",
        "arrival_ms,prompt_tokens,output_tokens\n0,1\n",
    );
    let (code, text) = kvbench(&["trace", "stats", &c]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(&format!("{c}:2:1: 2 fields, the header has 3")),
        "{text}"
    );
}

#[test]
fn skip_bad_rows_skips_and_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let long = "9".repeat(kvbench::workload::trace::MAX_LINE_BYTES + 10);
    let f = write(
        tmp.path(),
        "bad.csv",
        &format!("{GOOD}7,-3,4\n{long}\n8,abc,1\n11,60,6\n"),
    );
    let out = tmp.path().join("out");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/trace-csv.toml",
        "--backend",
        "sim",
        "--trace",
        &f,
        "--skip-bad-rows",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let t = &summary["trace"];
    assert_eq!(t["rows"].as_u64(), Some(6), "{t}");
    assert_eq!(t["skipped_bad_rows"].as_u64(), Some(3), "{t}");
    assert_eq!(t["replayed"].as_u64(), Some(3), "{t}");
    assert_eq!(summary["runs"][0]["requests"]["total"].as_u64(), Some(3));
}

#[test]
fn an_unknown_header_names_the_formats_and_a_named_format_checks_its_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let f = write(tmp.path(), "x.csv", "when,how_long\n1,2\n");
    let (code, text) = kvbench(&["trace", "stats", &f]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains(":1:1: unknown trace header"), "{text}");
    assert!(text.contains("--trace-format"), "{text}");
    let g = write(tmp.path(), "g.csv", GOOD);
    let (code, text) = kvbench(&["trace", "stats", &g, "--format", "azure"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("lacks column(s) timestamp, contexttokens, generatedtokens"),
        "{text}"
    );
}

#[test]
fn trace_stats_computes_the_ideal_reuse_of_a_hand_made_trace_exactly() {
    // 16 tokens per hash id. At 16-token blocks, with at most (len - 1) / 16 blocks a hit:
    //   r0  48 tokens [1,2,3]    first sight                      0
    //   r1  64 tokens [1,2,4,5]  ids 1,2 seen                    32
    //   r2  33 tokens [1,2,3]    two full blocks, both seen      32
    //   r3  32 tokens [1,2]      (32-1)/16 = 1 block at most     16
    //   r4  40 tokens [9,1,2]    differs at the first block       0
    // 80 of 217 prompt tokens. At 32-token blocks: r1 32, r2 32, r3 0: 64 of 217.
    let tmp = tempfile::tempdir().unwrap();
    let f = support::hand_mooncake_trace(tmp.path());
    let stats = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "trace",
            "stats",
            f.as_str(),
            "--json",
            "--hash-block-tokens",
            "16",
        ];
        args.extend_from_slice(extra);
        let (code, out) = kvbench(&args);
        assert_eq!(code, 0, "{out}");
        serde_json::from_str(&out).unwrap()
    };
    for (block, hit) in [("16", 80u64), ("32", 64)] {
        let v = stats(&["--block-size", block]);
        let r = &v["ideal_prefix_reuse"];
        assert_eq!(r["lookup_tokens"].as_u64(), Some(217), "{v}");
        assert_eq!(r["hit_tokens"].as_u64(), Some(hit), "{v}");
        assert_eq!(v["rows"].as_u64(), Some(5));
        // Five rows 1 ms apart: 4 gaps over 4 ms, all equal.
        assert_eq!(v["mean_rate_per_s"].as_f64(), Some(1000.0));
        assert_eq!(v["gap_cv"].as_f64(), Some(0.0));
    }
    // Over max_seq_len 60: r1 (64 + 4 tokens) only, 1 row in 5. A run rejects it unseen, so it
    // publishes nothing: r2 hits 32 (ids 1,2 from r0), r3 16; 48 of the 153 tokens left.
    let v = stats(&["--max-seq-len", "60"]);
    assert_eq!(v["over_max_seq_len_share"].as_f64(), Some(0.2));
    let r = &v["ideal_prefix_reuse"];
    assert_eq!(
        (r["lookup_tokens"].as_u64(), r["hit_tokens"].as_u64()),
        (Some(153), Some(48))
    );
}

/// A Mooncake trace whose ids are 512 tokens each (the published release's block), three rows.
fn mooncake_512(dir: &Path) -> String {
    write(
        dir,
        "m512.jsonl",
        "{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 4, \"hash_ids\": [0, 1, 2]}\n\
         {\"timestamp\": 10, \"input_length\": 2049, \"output_length\": 4, \"hash_ids\": [0, 1, 3, 4, 5]}\n\
         {\"timestamp\": 20, \"input_length\": 700, \"output_length\": 4, \"hash_ids\": [0, 6]}\n",
    )
}

#[test]
fn a_stated_hash_block_the_rows_contradict_is_refused_with_both_numbers() {
    // trace-mooncake.toml's fixture has 64 tokens per id; this trace has 512. A stated 64 would
    // cover an eighth of each prompt and make the rest unique, silently.
    let tmp = tempfile::tempdir().unwrap();
    let f = mooncake_512(tmp.path());
    let out = tmp.path().join("out");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/trace-mooncake.toml",
        "--backend",
        "sim",
        "--trace",
        &f,
        "--set",
        "traffic.arrival.hash_block_tokens=64",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    // Line 1: 1,500 tokens in 3 ids allows 500..=749; line 2 (2,049 in 5) 410..=512, line 3
    // (700 in 2) 350..=699: 500..=512 in all.
    assert!(text.contains(&format!("{f}:1:1:")), "{text}");
    assert!(text.contains("hash_block_tokens = 64"), "{text}");
    assert!(
        text.contains("input_length 1500 with 3 hash ids allows 500..=749"),
        "{text}"
    );
    assert!(text.contains("3 ids × 64 = 192 tokens"), "{text}");
    assert!(text.contains("the whole trace allows 500..=512"), "{text}");
    assert!(!out.exists(), "no half-written results");

    // trace stats refuses it the same way, and infers 512 when it is left out.
    let (code, text) = kvbench(&["trace", "stats", &f, "--hash-block-tokens", "64"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("hash_block_tokens = 64"), "{text}");
    let (code, text) = kvbench(&["trace", "stats", &f, "--json"]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let h = &v["hash_block"];
    assert_eq!(h["tokens"].as_u64(), Some(512), "{v}");
    assert_eq!(h["stated"].as_bool(), Some(false), "{v}");
    assert_eq!(
        (h["allowed_min"].as_u64(), h["allowed_max"].as_u64()),
        (Some(500), Some(512)),
        "{v}"
    );
    // 10 ids × 512 = 5,120 tokens for 4,249 input tokens.
    assert_eq!(
        (
            h["ids"].as_u64(),
            h["covered_tokens"].as_u64(),
            h["input_tokens"].as_u64()
        ),
        (Some(10), Some(5120), Some(4249)),
        "{v}"
    );
    let (code, text) = kvbench(&["trace", "stats", &f]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("hash ids     512 tokens per id (inferred; the rows allow 500..=512)"),
        "{text}"
    );
}

#[test]
fn ids_no_block_can_cover_are_refused_naming_the_rows() {
    let tmp = tempfile::tempdir().unwrap();
    // Line 1 needs 16 tokens per id exactly (64 in 4), line 2 at least 32 (64 in 2).
    let f = write(
        tmp.path(),
        "clash.jsonl",
        "{\"timestamp\": 0, \"input_length\": 64, \"output_length\": 4, \"hash_ids\": [0, 1, 2, 3]}\n\
         {\"timestamp\": 1, \"input_length\": 64, \"output_length\": 4, \"hash_ids\": [0, 1]}\n",
    );
    let (code, text) = kvbench(&["trace", "stats", &f]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("no one block of tokens per id fits every row"),
        "{text}"
    );
    assert!(text.contains("line 2"), "{text}");
}
