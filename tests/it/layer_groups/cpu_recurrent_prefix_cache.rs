//! A recurrent model with the prefix cache on is refused by `cpu` at set-up: exit 2, the
//! scenario file and `scheduler.prefix_cache` named with the recurrent group, before any
//! request runs and with nothing written. `sim` prices the hit and runs it; `cuda` refuses the
//! recurrent group itself.

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
    let (code, text, empty) = run(scenario, "cpu", &[]);
    assert_eq!(code, 2, "{text}");
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
    let (code, text, empty) = run(scenario, "cpu", &[]);
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
