//! `[cache.host_tier]` and `[cache.disk_tier]` are checked like every other key: each problem is
//! `FILE:LINE:COL: KEY: message` at the key that states it, or `--set KEY: message` for an
//! override, and a sound tier loads (from the file or from `--set`).

use std::path::Path;

use kvbench::scenario::{parse_str, tier_capacity_blocks, ScenarioError};
use kvbench_cache_api::{OffloadMode, OnloadMode};

/// An 8B scenario (2 MiB blocks at 16 tokens) with a tier section appended after `[cache]`.
fn scenario(cache_extra: &str, tiers: &str) -> String {
    format!(
        r#"name = "t"
device = "h200"

[model]
preset = "llama3-8b"

[memory]
kv_budget = "20 GiB"

[cache]
block_size = 16
max_seq_len = 4096
{cache_extra}
{tiers}
[traffic]
requests = 10

[traffic.arrival]
kind = "poisson"
rate_per_s = 5.0

[traffic.prompt_tokens]
dist = "fixed"
value = 100

[traffic.output_tokens]
dist = "fixed"
value = 10
"#
    )
}

const HOST: &str = "[cache.host_tier]\ncapacity = \"64 GiB\"\n";
const DISK: &str = "[cache.disk_tier]\ncapacity = \"1 TiB\"\nread_bytes_per_s = 7e9\nwrite_bytes_per_s = 5e9\nlatency_us = 80.0\n";

fn refusal(text: &str, overrides: &[&str]) -> Vec<String> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    match parse_str(text, Some(Path::new("t.toml")), &overrides) {
        Ok(_) => panic!("accepted:\n{text}\n{overrides:?}"),
        Err(e @ ScenarioError::Io { .. }) => panic!("{e}"),
        Err(ScenarioError::Invalid(d)) => d.iter().map(ToString::to_string).collect(),
    }
}

/// The 1-based line of the first line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str) -> usize {
    text.lines()
        .position(|l| l.starts_with(prefix))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("`{prefix}` not in\n{text}"))
}

/// One diagnostic, at `key`'s line, with `needle` in it.
fn assert_refused_at(text: &str, written: &str, key: &str, needle: &str) {
    let lines = refusal(text, &[]);
    let line = line_of(text, written);
    let want = format!("t.toml:{line}:");
    assert!(
        lines.iter().any(|l| l.starts_with(&want)
            && l.contains(&format!(": {key}: "))
            && l.contains(needle)),
        "want {want}COL: {key}: ...{needle}...; got {lines:#?}"
    );
}

#[test]
fn a_sound_host_and_disk_tier_load_with_their_defaults() {
    let s = parse_str(
        &scenario("", &format!("{HOST}{DISK}")),
        Some(Path::new("t.toml")),
        &[],
    )
    .expect("loads");
    let h = s.cache.host_tier.as_ref().expect("host tier");
    assert_eq!(h.capacity.as_slice(), ["64 GiB"]);
    assert_eq!(h.offload, OffloadMode::OnEvict);
    assert_eq!(h.onload, OnloadMode::Blocking);
    let shape = s.model_shape().expect("shape");
    // 64 GiB of 2 MiB blocks; 1 TiB of them.
    assert_eq!(s.tier_slots(&shape), (32_768, 524_288));
    assert_eq!(tier_capacity_blocks(&shape, 16, 64 << 30), Ok(32_768));
}

#[test]
fn every_capacity_in_a_list_is_checked_and_named() {
    let text = scenario(
        "",
        "[cache.host_tier]\ncapacity = [\"16 GiB\", \"64 gallons\"]\n",
    );
    assert_refused_at(&text, "capacity", "cache.host_tier.capacity", "gallons");
    let text = scenario("", "[cache.host_tier]\ncapacity = []\n");
    assert_refused_at(&text, "capacity", "cache.host_tier.capacity", "empty");
    let text = scenario("", "[cache.host_tier]\ncapacity = [\"16 GiB\", \"0 B\"]\n");
    assert_refused_at(&text, "capacity", "cache.host_tier.capacity", "0 bytes");
}

#[test]
fn a_capacity_must_hold_a_block_at_every_listed_block_size() {
    // 3 MiB holds one 2 MiB block of 16 tokens but no 8 MiB block of 64.
    let one = scenario("", "[cache.host_tier]\ncapacity = \"3 MiB\"\n");
    parse_str(&one, Some(Path::new("t.toml")), &[]).expect("one block at 16 tokens");
    let text = one.replace("block_size = 16", "block_size = [16, 64]");
    assert_refused_at(
        &text,
        "capacity",
        "cache.host_tier.capacity",
        "holds no block of 64 tokens",
    );
    let text = scenario("", "[cache.host_tier]\ncapacity = \"1 MiB\"\n");
    assert_refused_at(
        &text,
        "capacity",
        "cache.host_tier.capacity",
        "holds no block",
    );
}

#[test]
fn more_slots_than_32_bits_number_are_refused() {
    // 2^32 blocks of 2 MiB are 8 PiB.
    let text = scenario("", "[cache.host_tier]\ncapacity = \"8 PiB\"\n");
    assert_refused_at(
        &text,
        "capacity",
        "cache.host_tier.capacity",
        "at most 4294967295",
    );
    let text = scenario("", &format!("{HOST}{}", DISK.replace("1 TiB", "9 PiB")));
    assert_refused_at(
        &text,
        "capacity = \"9",
        "cache.disk_tier.capacity",
        "at most",
    );
}

#[test]
fn tiers_need_the_prefix_cache_and_a_disk_needs_a_host_tier() {
    let text = format!(
        "{}\n[scheduler]\nprefix_cache = false\n",
        scenario("", HOST)
    );
    assert_refused_at(
        &text,
        "[cache.host_tier]",
        "cache.host_tier",
        "needs scheduler.prefix_cache = true",
    );
    let text = scenario("", DISK);
    assert_refused_at(
        &text,
        "[cache.disk_tier]",
        "cache.disk_tier",
        "give [cache.host_tier] too",
    );
}

#[test]
fn disk_rates_and_latency_are_in_their_ranges() {
    for (written, bad, key) in [
        (
            "read_bytes_per_s = 7e9",
            "read_bytes_per_s = 0.0",
            "read_bytes_per_s",
        ),
        (
            "read_bytes_per_s = 7e9",
            "read_bytes_per_s = nan",
            "read_bytes_per_s",
        ),
        (
            "write_bytes_per_s = 5e9",
            "write_bytes_per_s = inf",
            "write_bytes_per_s",
        ),
        (
            "write_bytes_per_s = 5e9",
            "write_bytes_per_s = 1e-320",
            "write_bytes_per_s",
        ),
        (
            "write_bytes_per_s = 5e9",
            "write_bytes_per_s = -1.0",
            "write_bytes_per_s",
        ),
        ("latency_us = 80.0", "latency_us = -1.0", "latency_us"),
        ("latency_us = 80.0", "latency_us = nan", "latency_us"),
        ("latency_us = 80.0", "latency_us = 1e300", "latency_us"),
    ] {
        let text = scenario("", &format!("{HOST}{}", DISK.replace(written, bad)));
        assert_refused_at(&text, bad, &format!("cache.disk_tier.{key}"), "must be in");
    }
    // Zero latency is a disk that answers at once: allowed.
    let text = scenario("", &format!("{HOST}{}", DISK.replace("80.0", "0.0")));
    parse_str(&text, Some(Path::new("t.toml")), &[]).expect("zero latency");
}

#[test]
fn unknown_and_mistyped_tier_keys_are_named_at_their_line() {
    let text = scenario(
        "",
        "[cache.host_tier]\ncapacity = \"1 GiB\"\nonlaod = \"overlap\"\n",
    );
    assert_refused_at(&text, "onlaod", "cache.host_tier.onlaod", "unknown field");
    let text = scenario(
        "",
        "[cache.host_tier]\ncapacity = \"1 GiB\"\nonload = \"later\"\n",
    );
    assert_refused_at(&text, "onload", "cache.host_tier.onload", "unknown variant");
    let text = scenario("", "[cache.host_tier]\ncapacity = \"1 GiB\"\noffload = 3\n");
    assert_refused_at(&text, "offload", "cache.host_tier.offload", "wanted string");
    let text = scenario("", "[cache.host_tier]\ncapacity = 3\n");
    assert_refused_at(&text, "capacity", "cache.host_tier.capacity", "");
    let text = scenario("", "[cache.host_tier]\noffload = \"write_through\"\n");
    assert_refused_at(
        &text,
        "[cache.host_tier]",
        "cache.host_tier.capacity",
        "missing field",
    );
}

#[test]
fn set_gives_a_tier_its_capacity_and_names_itself_when_wrong() {
    let base = scenario("", "");
    let s = parse_str(
        &base,
        Some(Path::new("t.toml")),
        &["cache.host_tier.capacity=16 GiB".to_string()],
    )
    .expect("--set makes the tier");
    let h = s.cache.host_tier.expect("host tier");
    assert_eq!(h.capacity.as_slice(), ["16 GiB"]);
    let s = parse_str(
        &scenario("", HOST),
        Some(Path::new("t.toml")),
        &[
            r#"cache.host_tier.capacity=["16 GiB", "256 GiB"]"#.to_string(),
            "cache.host_tier.onload=overlap".to_string(),
        ],
    )
    .expect("a list and a mode by --set");
    let h = s.cache.host_tier.expect("host tier");
    assert_eq!(h.capacity.as_slice(), ["16 GiB", "256 GiB"]);
    assert_eq!(h.onload, OnloadMode::Overlap);
    let lines = refusal(&scenario("", HOST), &["cache.host_tier.capacity=0 B"]);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("--set cache.host_tier.capacity: ") && l.contains("0 bytes")),
        "{lines:#?}"
    );
}

#[test]
fn an_fp8_per_block_model_prices_its_blocks_with_their_scales() {
    // Each block size carries its own per-block scale bytes, so the slot count follows it.
    let text = scenario("", "[cache.host_tier]\ncapacity = \"64 GiB\"\n")
        .replace(
            "preset = \"llama3-8b\"",
            "preset = \"llama3-8b\"\nkv_dtype = \"fp8_e4m3\"\nkv_scale = \"per_block\"",
        )
        .replace("block_size = 16", "block_size = [16, 32]");
    let s = parse_str(&text, Some(Path::new("t.toml")), &[]).expect("fp8 loads");
    let shape = s.model_shape().expect("shape");
    let per_block = |b: u32| kvbench::scenario::tier_block_bytes(&shape, b).expect("bytes");
    // 65,536 bytes of K/V per token at FP8, plus 2 × 32 layers × 8 heads × 4 bytes per block.
    assert_eq!(per_block(16), 16 * 65_536 + 2048);
    assert_eq!(per_block(32), 32 * 65_536 + 2048);
    assert_eq!(s.tier_slots(&shape).0, (64u64 << 30) / per_block(16));
}
