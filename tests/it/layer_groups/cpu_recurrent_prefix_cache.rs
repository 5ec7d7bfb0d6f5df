//! A recurrent model with the prefix cache on, on `cpu`: under the summed managers (which keep
//! no state checkpoints) it is refused at set-up, exit 2, the scenario file and
//! `scheduler.prefix_cache` named with the recurrent group, before any request runs and with
//! nothing written; by default it runs the hybrid manager, whose prefix hits resume from state
//! checkpoints and pass the oracle, and the planted `checkpoint-off-by-one` fails the oracle
//! check. `sim` runs it either way; `cuda` refuses the recurrent group itself. `sim` on
//! `qwen3-next-80b-h200` with shared prompts hits through checkpoints and prices them.

use crate::support;
use support::kvbench;

const GROUP: &str = "model.layer_groups.1 (attention = \"recurrent\")";

/// The 1-based line of the first line of `scenario` that is `text` once trimmed.
fn line_of(scenario: &str, text: &str) -> usize {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(scenario);
    let body = std::fs::read_to_string(&path).expect("scenario");
    body.lines()
        .position(|l| l.trim() == text)
        .unwrap_or_else(|| panic!("{scenario}: no line {text:?}"))
        + 1
}

/// Runs `scenario` with tiny-hybrid on `backend` into a fresh folder; returns the exit code,
/// the output and whether the temporary folder holding `--out` is still empty.
fn run(scenario: &str, backend: &str, sets: &[&str]) -> (i32, String, bool) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let mut args = vec![
        "run",
        scenario,
        "--backend",
        backend,
        "--set",
        "model.preset=tiny-hybrid",
        "--set",
        "model.kv_dtype=bf16",
        "--set",
        "traffic.requests=8",
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let (code, text) = kvbench(&args);
    let empty = std::fs::read_dir(tmp.path())
        .expect("tempdir")
        .next()
        .is_none();
    (code, text, empty)
}

#[test]
fn cpu_refuses_a_written_prefix_cache_at_its_line_before_any_work() {
    let scenario = "scenarios/quick-mixed.toml";
    let line = line_of(scenario, "prefix_cache = true");
    let (code, text, empty) = run(scenario, "cpu", &["cache.manager=summed"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("cache.manager = \"hybrid\""), "{text}");
    assert!(
        text.contains(&format!("{scenario}:{line}:1: scheduler.prefix_cache: ")),
        "{text}"
    );
    assert!(text.contains(GROUP), "{text}");
    assert!(text.contains("scheduler.prefix_cache = false"), "{text}");
    // Not the step's own refusal at the first hit: no request ran.
    assert!(!text.contains("starts at position"), "{text}");
    assert!(empty, "results or a staging folder were left: {text}");
}

#[test]
fn cpu_refuses_a_defaulted_prefix_cache_naming_the_file() {
    // quick-basic does not write the key (its default is on): the error points at the
    // `[scheduler]` table, its nearest written ancestor.
    let scenario = "scenarios/quick-basic.toml";
    let line = line_of(scenario, "[scheduler]");
    let (code, text, empty) = run(scenario, "cpu", &["cache.manager=summed"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(&format!("{scenario}:{line}:")) && text.contains("scheduler.prefix_cache: "),
        "{text}"
    );
    assert!(text.contains(GROUP), "{text}");
    assert!(empty, "results or a staging folder were left: {text}");
}

#[test]
fn with_the_prefix_cache_off_cpu_runs_it_and_sim_runs_it_either_way() {
    let scenario = "scenarios/quick-mixed.toml";
    let (code, text, empty) = run(scenario, "cpu", &["scheduler.prefix_cache=false"]);
    assert_eq!(code, 0, "{text}");
    assert!(!empty);
    // sim holds no recurrent state: it prices a hit as taken, so there is nothing to refuse.
    let (code, text, empty) = run(scenario, "sim", &[]);
    assert_eq!(code, 0, "{text}");
    assert!(!empty);
    // cuda does not run recurrent layers at all and refuses the group itself.
    let (code, text, empty) = run(scenario, "cuda-emu", &[]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains(GROUP), "{text}");
    assert!(!text.contains("scheduler.prefix_cache: "), "{text}");
    assert!(empty, "{text}");
}

/// `summary.json` of the run in `dir`, paged mode.
fn paged_summary(dir: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("summary.json")).expect("summary.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .find(|r| r["cache"] == "paged")
        .expect("a paged run")
        .clone()
}

/// Shared 48-token prefixes on every request with 1 to 4 tokens of its own after them: a hit
/// resumes from the checkpoint at 48 and samples within a few tokens of it, so a wrong state
/// shows in the logits (the recurrence forgets within tens of tokens).
const SHARED: [&str; 8] = [
    "model.preset=tiny-hybrid",
    "model.kv_dtype=bf16",
    "traffic.requests=30",
    "traffic.shared_prefix.prefix_tokens=48",
    "traffic.shared_prefix.share=1.0",
    "traffic.prompt_tokens.min=49",
    "traffic.prompt_tokens.max=52",
    "cache.checkpoint_every_blocks=1",
];

fn run_shared(extra: &[&str]) -> (i32, String, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let mut args = vec![
        "run",
        "scenarios/quick-mixed.toml",
        "--backend",
        "cpu",
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ];
    for s in SHARED {
        args.extend(["--set", s]);
    }
    args.extend(extra);
    let (code, text) = kvbench(&args);
    (code, text, tmp)
}

#[test]
fn cpu_resumes_prefix_hits_from_checkpoints_and_passes_the_oracle() {
    let (code, text, tmp) = run_shared(&[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("cache manager `hybrid`"), "{text}");
    let paged = paged_summary(&tmp.path().join("out"));
    let p = &paged["prefix_cache"];
    assert!(p["hit_rate"].as_f64().unwrap() > 0.0, "{p}");
    let resumes = p["checkpoints"]["resumes"].as_u64().unwrap();
    assert!(resumes > 0, "{p}");
    assert!(p["checkpoints"]["bytes_peak"].as_u64().unwrap() > 0, "{p}");
    assert_eq!(paged["numerics"]["ok"], true, "{paged}");
}

#[test]
fn a_checkpoint_resumed_one_block_off_fails_the_oracle_check() {
    // The model clock fixes the schedule, so which sequences resume, and how soon after their
    // checkpoint they sample, is the same on a loaded machine as on a quiet one.
    let (code, text, _tmp) = run_shared(&[
        "--inject-fault",
        "checkpoint-off-by-one",
        "--check-every",
        "0",
        "--clock",
        "model",
    ]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("planted fault `checkpoint-off-by-one` fired"),
        "{text}"
    );
    assert!(text.contains("caught: paged: numerics"), "{text}");
}

#[test]
fn without_checkpoints_cpu_runs_a_recurrent_model_with_no_hit() {
    let (code, text, tmp) = run_shared(&["--set", "cache.checkpoint_every_blocks=0"]);
    assert_eq!(code, 0, "{text}");
    let paged = paged_summary(&tmp.path().join("out"));
    assert_eq!(paged["prefix_cache"]["hit_tokens"], 0, "{paged}");
    assert!(
        paged["prefix_cache"].get("checkpoints").is_none(),
        "{paged}"
    );
}

#[test]
fn sim_prices_checkpoints_and_qwen3_next_hits_shared_prompts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/qwen3-next-80b-h200.toml",
        "--backend",
        "sim",
        "--set",
        "scheduler.prefix_cache=true",
        "--set",
        "traffic.shared_prefix.groups=8",
        "--set",
        "traffic.shared_prefix.prefix_tokens=1024",
        "--set",
        "traffic.shared_prefix.share=0.8",
        "--set",
        "traffic.requests=120",
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ]);
    assert_eq!(code, 0, "{text}");
    let paged = paged_summary(&out);
    let p = &paged["prefix_cache"];
    assert!(p["hit_rate"].as_f64().unwrap() > 0.2, "{p}");
    let c = &p["checkpoints"];
    assert_eq!(c["every_tokens"], 1024, "the default, 64 blocks of 16: {c}");
    assert!(c["resumes"].as_u64().unwrap() > 0, "{c}");
    // Checkpoints are pool pages: cached-free in the ledger once saved.
    let peak = c["bytes_peak"].as_u64().unwrap();
    assert!(peak > 0, "{c}");
    let cached = paged["memory"]["kv_peak_cached_free_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= peak,
        "cached-free peak {cached} below checkpoints {peak}"
    );
}

/// `cache.checkpoint_every_blocks` where it would change nothing — the summed managers, a model
/// with no recurrent group, the prefix cache off — is refused before any work, naming the key
/// and the reason, with nothing written.
#[test]
fn a_checkpoint_interval_that_would_change_nothing_is_refused_naming_the_key() {
    // (The summed managers on cpu are refused earlier, for the prefix cache itself.)
    let cases: [(&[&str], &str); 2] = [
        (
            &[
                "--set",
                "model.preset=tiny-sliding",
                "--set",
                "cache.manager=hybrid",
            ],
            "no recurrent layer group",
        ),
        (
            &[
                "--set",
                "scheduler.prefix_cache=false",
                "--set",
                "cache.manager=hybrid",
            ],
            "prefix_cache is off",
        ),
    ];
    for (extra, why) in cases {
        let (code, text, tmp) = run_shared(extra);
        assert_eq!(code, 2, "{extra:?}: {text}");
        assert!(
            text.contains("cache.checkpoint_every_blocks") && text.contains(why),
            "{extra:?}: no key or {why:?} in {text}"
        );
        assert!(
            !tmp.path().join("out").exists(),
            "{extra:?}: a folder was written"
        );
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/qwen3-next-80b-h200.toml",
        "--backend",
        "sim",
        "--set",
        "scheduler.prefix_cache=true",
        "--set",
        "cache.manager=summed",
        "--set",
        "cache.checkpoint_every_blocks=8",
        "--out",
        out.to_str().expect("utf-8 temp path"),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("cache.checkpoint_every_blocks") && text.contains("summed managers"),
        "{text}"
    );
    assert!(!out.exists(), "a folder was written");
}
