//! `kvbench tune` end to end on `sim`: a scenario whose optimum is known, `tune.md` recomputed
//! from `tune.json`, the best reproduced by `sweep` with the printed `--set` line, a spent
//! budget reported, and bad `--space` files refused (exit 2, located, nothing written).

mod support;

use std::path::Path;

use kvbench::tune::write::{markdown, TuneJson};
use serde_json::Value;
use support::kvbench;

/// Short requests on one H200 with an 8B model and no memory pressure: every step is bound by
/// reading the weights, so the rate at target is proportional to `max_seqs_per_step` — the
/// largest value is the known optimum, in both cache modes.
const SMALL: &str = r#"name = "tune-small"
seed = 3
device = "h200"

[model]
preset = "llama3-8b"

[memory]
kv_budget = "20 GiB"

[cache]
block_size = 16
contiguous_reservation = "max_seq_len"
max_seq_len = 256

[traffic]
requests = 400

[traffic.arrival]
kind = "poisson"
rate_per_s = 5.0

[traffic.prompt_tokens]
dist = "uniform"
min = 64
max = 128

[traffic.output_tokens]
dist = "uniform"
min = 16
max = 32

[scheduler]
policy = "decode_first"
max_tokens_per_step = 2048
max_seqs_per_step = 2

[slo]
ttft_p99_ms = 2000.0
itl_p99_ms = 100.0
"#;

fn files(dir: &Path, space: &str) -> (String, String) {
    let s = dir.join("small.toml");
    std::fs::write(&s, SMALL).unwrap();
    let sp = dir.join("space.toml");
    std::fs::write(&sp, space).unwrap();
    (s.display().to_string(), sp.display().to_string())
}

fn read_json(out: &Path) -> (TuneJson, Value) {
    let text = std::fs::read_to_string(out.join("tune.json")).unwrap();
    (
        serde_json::from_str(&text).unwrap(),
        serde_json::from_str(&text).unwrap(),
    )
}

/// The best per mode recomputed from the rows alone: the highest rate, the rows whose
/// interval overlaps it, and among those the fewest knobs moved, then the smaller block size,
/// then the higher rate.
fn recomputed_best(j: &TuneJson, cache: &str) -> Option<usize> {
    let rows: Vec<usize> = (0..j.configurations.len())
        .filter(|&i| j.configurations[i].cache == cache)
        .filter(|&i| j.configurations[i].rate_at_target_rps.is_some())
        .collect();
    let lo = |i: usize| j.configurations[i].rate_at_target_rps.unwrap();
    let hi = |i: usize| {
        j.configurations[i]
            .lowest_failing_rps
            .unwrap_or(f64::INFINITY)
    };
    let top = rows
        .iter()
        .copied()
        .max_by(|&x, &y| lo(x).total_cmp(&lo(y)))?;
    rows.iter()
        .copied()
        .filter(|&i| hi(i) > lo(top) && hi(top) > lo(i))
        .min_by(|&x, &y| {
            let c = |i: usize| &j.configurations[i];
            c(x).knobs_away
                .cmp(&c(y).knobs_away)
                .then(
                    c(x).block_size
                        .unwrap_or(0.0)
                        .total_cmp(&c(y).block_size.unwrap_or(0.0)),
                )
                .then(lo(y).total_cmp(&lo(x)))
        })
}

#[test]
fn finds_the_known_optimum_and_every_figure_in_tune_md_comes_from_tune_json() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, space) = files(dir.path(), "scheduler.max_seqs_per_step = [1, 4, 8]\n");
    let out = dir.path().join("out");
    let (code, text) = kvbench(&[
        "tune",
        &scenario,
        "--space",
        &space,
        "--backend",
        "sim",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let (j, raw) = read_json(&out);
    assert_eq!(j.modes.len(), 2);
    for m in &j.modes {
        let best = &j.configurations[m.best.expect("a best")];
        assert_eq!(
            best.values["scheduler.max_seqs_per_step"], "8",
            "{}",
            m.cache
        );
        assert_eq!(m.best, recomputed_best(&j, &m.cache), "{}", m.cache);
        assert_eq!(
            m.best_set.as_deref(),
            Some("--set scheduler.max_seqs_per_step=8")
        );
        assert!(
            text.contains(&format!(
                "reproduce: kvbench sweep {scenario} --set scheduler.max_seqs_per_step=8"
            )),
            "{text}"
        );
        // The rate rises with the knob: each searched value above the one below it.
        let mut searched: Vec<(i64, f64)> = j
            .configurations
            .iter()
            .filter(|c| c.cache == m.cache)
            .filter_map(|c| {
                Some((
                    c.values["scheduler.max_seqs_per_step"].parse().ok()?,
                    c.rate_at_target_rps?,
                ))
            })
            .collect();
        searched.sort_by_key(|x| x.0);
        assert!(searched.len() >= 2, "{searched:?}");
        assert!(searched.windows(2).all(|w| w[1].1 > w[0].1), "{searched:?}");
        let probes: u32 = j
            .configurations
            .iter()
            .filter(|c| c.cache == m.cache)
            .map(|c| c.probes)
            .sum();
        assert_eq!(probes, m.probes);
        // Fewer configurations than the grid: 1 is pruned, below the scenario's own 2.
        assert!(j
            .configurations
            .iter()
            .any(|c| c.cache == m.cache && c.verdict.name() == "pruned"));
    }
    assert_eq!(
        j.probes,
        j.modes.iter().map(|m| m.probes).sum::<u32>(),
        "total probes"
    );
    assert_eq!(raw["budget_hit"], Value::Bool(false));
    // Every figure of tune.md: the page is a function of tune.json alone.
    let md = std::fs::read_to_string(out.join("tune.md")).unwrap();
    assert_eq!(md, markdown(&j));
    assert!(md.contains("Tie rule: "), "the tie rule is stated");

    // The printed line reproduces the best: the sweep of that configuration brackets the same
    // rate.
    let sweep_out = dir.path().join("sweep");
    let (code, text) = kvbench(&[
        "sweep",
        &scenario,
        "--backend",
        "sim",
        "--set",
        "scheduler.max_seqs_per_step=8",
        "--out",
        sweep_out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let sweep: Value =
        serde_json::from_str(&std::fs::read_to_string(sweep_out.join("sweep.json")).unwrap())
            .unwrap();
    for m in &j.modes {
        let run = sweep["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["cache"] == m.cache.as_str())
            .unwrap();
        let (slo, shi) = (
            run["rate_at_target_rps_ci"][0].as_f64().unwrap(),
            run["rate_at_target_rps_ci"][1].as_f64().unwrap(),
        );
        let [tlo, thi] = m.rate_at_target_rps_ci;
        assert!(
            slo < thi && tlo < shi,
            "{}: sweep [{slo}, {shi}] vs tune [{tlo}, {thi}]",
            m.cache
        );
    }

    // An existing tune folder is replaced only with --force.
    let (code, text) = kvbench(&[
        "tune",
        &scenario,
        "--space",
        &space,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--force") || text.contains("exists"),
        "{text}"
    );
}

#[test]
fn a_spent_budget_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, space) = files(dir.path(), "scheduler.max_seqs_per_step = [1, 4]\n");
    let out = dir.path().join("out");
    let (code, text) = kvbench(&[
        "tune",
        &scenario,
        "--space",
        &space,
        "--budget-s",
        "0.000001",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("time budget hit"), "{text}");
    let (j, _) = read_json(&out);
    assert!(j.budget_hit);
    assert!(j
        .configurations
        .iter()
        .all(|c| c.verdict.name() == "unfinished"));
    let md = std::fs::read_to_string(out.join("tune.md")).unwrap();
    assert!(md.contains("time budget of"), "{md}");
    // A tune folder is a results folder: --force replaces it, and nothing else is left beside.
    std::fs::write(out.join("tune.md"), "stale").unwrap();
    let (code, text) = kvbench(&[
        "tune",
        &scenario,
        "--space",
        &space,
        "--budget-s",
        "0.000001",
        "--force",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let md = std::fs::read_to_string(out.join("tune.md")).unwrap();
    assert!(md.starts_with("# kvbench tune: tune-small"), "{md}");
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");
}

#[test]
fn a_bad_space_file_exits_2_naming_file_line_and_key_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 7] = [
        ("cache.nope = [1]", "space.toml:2:7: cache.nope: "),
        (
            "traffic.requests = [10]",
            "space.toml:2:9: traffic.requests: not a knob",
        ),
        (
            "cache.block_size = 16",
            "space.toml:2:7: cache.block_size: expected a list",
        ),
        (
            "scheduler.policy = [\"decode_first\", \"fastest\"]",
            "space.toml:2:11: scheduler.policy: value \"fastest\"",
        ),
        (
            "[scheduler]\nmax_seqs_per_step = [4, 4]",
            "space.toml:3:1: scheduler.max_seqs_per_step: 4 is listed twice",
        ),
        (
            "cache.block_size = []",
            "space.toml:2:7: cache.block_size: an empty list",
        ),
        ("cache.block_size = [", "space.toml:3:1: (syntax)"),
    ];
    for (body, want) in cases {
        let (scenario, space) = files(dir.path(), &format!("# a space\n{body}\n"));
        let out = dir.path().join("out");
        let (code, text) = kvbench(&[
            "tune",
            &scenario,
            "--space",
            &space,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{body}: {text}");
        assert!(text.contains(want), "{body}: want {want:?} in {text}");
        assert!(!out.exists(), "{body}: nothing written");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{body}: {leftovers:?}");
    }
}
