//! `scenario::load`: errors name file, line, column and key; overrides are applied and checked
//! like the file; scenarios that cannot run are refused before any work.

use std::path::{Path, PathBuf};

use kvbench::scenario::{self, Origin, Scenario, ScenarioError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/scenarios")
        .join(name)
}

/// A small valid scenario; tests change one thing at a time.
const BASE: &str = r#"
name = "base"
device = "cpu"

[model]
preset = "tiny"

[memory]
kv_budget = "1 MiB"

[cache]
block_size = 16
max_seq_len = 128

[traffic]
requests = 10
arrival = { kind = "poisson", rate_per_s = 10.0 }
prompt_tokens = { dist = "uniform", min = 4, max = 32 }
output_tokens = { dist = "fixed", value = 8 }
"#;

fn parse(text: &str, overrides: &[&str]) -> Result<Scenario, ScenarioError> {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    scenario::parse_str(text, Some(Path::new("mem.toml")), &o)
}

fn only_error(r: Result<Scenario, ScenarioError>) -> (Origin, String, String) {
    let e = match r {
        Ok(s) => panic!("expected an error, got a scenario named {}", s.name),
        Err(e) => e,
    };
    let d = e.diagnostics();
    assert!(!d.is_empty(), "no diagnostics in {e}");
    (d[0].origin.clone(), d[0].key.clone(), d[0].message.clone())
}

fn line_of(origin: &Origin) -> Option<usize> {
    match origin {
        Origin::File { line, .. } => Some(*line),
        _ => None,
    }
}

#[test]
fn base_scenario_is_valid() {
    let s = parse(BASE, &[]).expect("BASE is valid");
    assert_eq!(s.block_size(), 16);
    assert_eq!(s.source.as_deref(), Some(Path::new("mem.toml")));
}

#[test]
fn unknown_key_names_its_line_and_key() {
    let path = fixture("unknown_key.toml");
    let err = scenario::load(&path, &[]).expect_err("typo must be refused");
    let text = err.to_string();
    let d = &err.diagnostics()[0];
    assert_eq!(d.key, "cache.blok_size");
    assert_eq!(line_of(&d.origin), Some(12), "{text}");
    assert!(
        text.starts_with(&format!(
            "{}:12:1: cache.blok_size: unknown field",
            path.display()
        )),
        "{text}"
    );
}

#[test]
fn unknown_key_inside_a_tagged_table_is_located() {
    let text = BASE.replace("value = 8 }", "value = 8, median = 3 }");
    let (origin, key, _) = only_error(parse(&text, &[]));
    assert_eq!(key, "traffic.output_tokens.median");
    assert_eq!(line_of(&origin), Some(19));
}

#[test]
fn min_greater_than_max_is_refused() {
    let err = scenario::load(&fixture("min_gt_max.toml"), &[]).expect_err("min > max");
    let d = &err.diagnostics()[0];
    assert_eq!(d.key, "traffic.prompt_tokens.min");
    assert_eq!(line_of(&d.origin), Some(20));
    assert!(d.message.contains("64 > max 32"), "{}", d.message);
}

#[test]
fn impossible_budget_is_refused_with_what_one_request_needs() {
    let err = scenario::load(&fixture("impossible_budget.toml"), &[]).expect_err("budget");
    let d = &err.diagnostics()[0];
    assert_eq!(d.key, "memory.kv_budget");
    // tiny: 1024 bytes per token; a 128-token reservation needs 131072 bytes.
    assert!(d.message.contains("131072 bytes"), "{}", d.message);
}

#[test]
fn override_is_applied() {
    let s = parse(
        BASE,
        &[
            "traffic.requests=3",
            "memory.kv_budget=2 MiB",
            "device=h200",
        ],
    )
    .expect("valid overrides");
    assert_eq!(s.traffic.requests, Some(3));
    assert_eq!(s.memory.kv_budget, "2 MiB");
    assert_eq!(s.device, "h200");
}

#[test]
fn override_is_validated_like_the_file() {
    let (origin, key, msg) = only_error(parse(BASE, &["traffic.prompt_tokens.min=64"]));
    assert_eq!(origin, Origin::Override);
    assert_eq!(key, "traffic.prompt_tokens.min");
    assert!(msg.contains("64 > max 32"), "{msg}");

    let (origin, key, _) = only_error(parse(BASE, &["traffic.bogus=1"]));
    assert_eq!((origin, key.as_str()), (Origin::Override, "traffic.bogus"));

    let (origin, key, _) = only_error(parse(BASE, &["traffic.requests=many"]));
    assert_eq!(
        (origin, key.as_str()),
        (Origin::Override, "traffic.requests")
    );

    let (origin, key, _) = only_error(parse(BASE, &["memory.kv_budget=1 KiB"]));
    assert_eq!(
        (origin, key.as_str()),
        (Origin::Override, "memory.kv_budget")
    );

    let (_, key, msg) = only_error(parse(BASE, &["no_equals_sign"]));
    assert_eq!(key, "no_equals_sign");
    assert!(msg.contains("KEY=VALUE"), "{msg}");
}

#[test]
fn error_display_is_file_line_col_key_message() {
    let err = parse(&BASE.replace("block_size = 16", "block_size = 12"), &[]).expect_err("12");
    assert_eq!(
        err.to_string(),
        "mem.toml:12:1: cache.block_size: 12 is not a power of two (1, 2, 4, ..., 16, 32, ...)"
    );
    let err = parse(BASE, &["cache.block_size=0"]).expect_err("0");
    assert!(err
        .to_string()
        .starts_with("--set cache.block_size: 0 is not a power of two"));
}

#[test]
fn syntax_error_names_the_line() {
    let (origin, key, _) = only_error(parse("name = \"x\"\n[model\n", &[]));
    assert_eq!(key, "(syntax)");
    assert_eq!(line_of(&origin), Some(2));
}

#[test]
fn missing_section_is_named() {
    let text = BASE.replace("[memory]\nkv_budget = \"1 MiB\"\n", "");
    let (_, key, msg) = only_error(parse(&text, &[]));
    assert_eq!(key, "memory", "{msg}");
}

#[test]
fn refuses_each_infeasible_setting() {
    let cases: &[(&str, &str)] = &[
        ("traffic.arrival.rate_per_s=0", "traffic.arrival.rate_per_s"),
        (
            "traffic.prompt_tokens={ dist = \"normal\", mean = 10.0, std = -1.0 }",
            "traffic.prompt_tokens.std",
        ),
        (
            "traffic.prompt_tokens={ dist = \"fixed\", value = 0 }",
            "traffic.prompt_tokens.value",
        ),
        (
            "traffic.prompt_tokens={ dist = \"fixed\", value = 500 }",
            "traffic.prompt_tokens.value",
        ),
        (
            "traffic.shared_prefix={ groups = 2, prefix_tokens = 8, share = 1.5 }",
            "traffic.shared_prefix.share",
        ),
        (
            "traffic.parallel_sampling={ n = 2, share = -0.1 }",
            "traffic.parallel_sampling.share",
        ),
        (
            "traffic.cancellation={ share = 0.5, when = \"queued\" }",
            "traffic.cancellation.delay",
        ),
        (
            "traffic.tenants={ count = 2, shares = [0.5, 0.4] }",
            "traffic.tenants.shares",
        ),
        (
            "traffic.tenants={ count = 3, shares = [0.5, 0.5] }",
            "traffic.tenants.shares",
        ),
        ("cache.block_size=[16, 24]", "cache.block_size"),
        ("model.preset=gpt-9", "model.preset"),
        ("model.tp=3", "model.tp"),
        ("memory.kv_budget=lots", "memory.kv_budget"),
        ("scheduler.watermark=1.0", "scheduler.watermark"),
        ("slo.attainment=0", "slo.attainment"),
        ("traffic.duration_s=5", "traffic.duration_s"),
    ];
    for (o, want) in cases {
        let text = if o.starts_with("traffic.duration_s") {
            // Duration is fine for open loop; refused for closed loop.
            BASE.replace(
                "{ kind = \"poisson\", rate_per_s = 10.0 }",
                "{ kind = \"closed_loop\", clients = 2 }",
            )
        } else {
            BASE.to_string()
        };
        let (origin, key, msg) = only_error(parse(&text, &[o]));
        assert_eq!(key, *want, "override {o}: {msg}");
        assert_eq!(origin, Origin::Override, "override {o}");
    }
}

#[test]
fn share_budget_needs_a_known_device() {
    let s = parse(BASE, &["memory.kv_budget=50%"]).expect("cpu is a known device");
    let cpu = scenario::device_memory_bytes("cpu");
    let weights = s
        .model_shape()
        .map(|m| m.weight_bytes_per_device())
        .unwrap_or(0);
    let want = ((16u64 << 30) - weights) / 2;
    let got = s.kv_budget_bytes(cpu).expect("resolves");
    assert!(got.abs_diff(want) <= 1, "{got} vs {want}");
    let err = s.kv_budget_bytes(None).expect_err("no device figure");
    assert!(err.to_string().contains("memory.kv_budget"), "{err}");

    let (_, key, msg) = only_error(parse(BASE, &["memory.kv_budget=50%", "device=tpu-v9"]));
    assert_eq!(key, "memory.kv_budget");
    assert!(msg.contains("tpu-v9"), "{msg}");
}

#[test]
fn relative_paths_resolve_next_to_the_scenario() {
    let s = scenario::load(&fixture("empirical.toml"), &[]).expect("valid");
    assert_eq!(s.resolve_path("lengths.csv"), fixture("lengths.csv"));
    let err = scenario::load(
        &fixture("empirical.toml"),
        &["traffic.prompt_tokens.column=nope".into()],
    )
    .expect_err("missing column");
    assert!(err.to_string().contains("no column `nope`"), "{err}");
}

#[test]
fn every_shipped_scenario_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("scenarios/ exists") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            scenario::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 8, "only {n} scenarios");
}

#[test]
fn a_wrong_type_inside_a_tagged_table_names_its_own_key_and_line() {
    let text = BASE.replace("min = 4, max = 32", "min = \"four\", max = 32");
    let (origin, key, message) = only_error(parse(&text, &[]));
    assert_eq!(key, "traffic.prompt_tokens.min");
    assert_eq!(line_of(&origin), Some(18));
    assert!(message.contains("invalid type"), "{message}");
}

#[test]
fn a_key_the_chosen_variant_does_not_use_is_unknown() {
    let text = BASE.replace(
        "arrival = { kind = \"poisson\", rate_per_s = 10.0 }",
        "arrival = { kind = \"burst\", rate_per_s = 10.0 }",
    );
    let (origin, key, message) = only_error(parse(&text, &[]));
    assert_eq!(key, "traffic.arrival.rate_per_s");
    assert_eq!(line_of(&origin), Some(17));
    assert!(message.starts_with("unknown field"), "{message}");
}

#[test]
fn a_missing_required_key_names_its_full_path() {
    let text = BASE.replace("kv_budget = \"1 MiB\"", "");
    let (_, key, message) = only_error(parse(&text, &[]));
    assert_eq!(key, "memory.kv_budget");
    assert!(message.contains("missing field"), "{message}");
}

#[test]
fn values_outside_the_stated_ranges_are_refused_at_their_key() {
    let cases = [
        (
            "rate_per_s = 10.0",
            "rate_per_s = 1e-9",
            "traffic.arrival.rate_per_s",
        ),
        (
            "rate_per_s = 10.0",
            "rate_per_s = 1e-320",
            "traffic.arrival.rate_per_s",
        ),
        ("name = \"base\"", "name = \"../../x\"", "name"),
        ("device = \"cpu\"", "device = \"../cpu\"", "device"),
        (
            "max_seq_len = 128",
            "max_seq_len = 4294967295",
            "cache.max_seq_len",
        ),
    ];
    for (old, new, want) in cases {
        let (origin, key, _) = only_error(parse(&BASE.replace(old, new), &[]));
        assert_eq!(key, want, "{new}");
        assert!(line_of(&origin).is_some(), "{new}: {origin:?}");
    }
    // A thousand requests at one per ~11.6 days span 1e9 s: past the 1e8 s horizon.
    let text = BASE
        .replace("requests = 10", "requests = 1000")
        .replace("rate_per_s = 10.0", "rate_per_s = 1e-6");
    let (_, key, message) = only_error(parse(&text, &[]));
    assert_eq!(key, "traffic.arrival.rate_per_s");
    assert!(message.contains("virtual time"), "{message}");
}

#[test]
fn a_fixed_budget_must_fit_the_device_with_the_weights() {
    let text = BASE.replace("kv_budget = \"1 MiB\"", "kv_budget = \"1 EiB\"");
    let (_, key, message) = only_error(parse(&text, &[]));
    assert_eq!(key, "memory.kv_budget");
    assert!(
        message.contains("weights") && message.contains("1 EiB") && message.contains("16 GiB"),
        "{message}"
    );
}
