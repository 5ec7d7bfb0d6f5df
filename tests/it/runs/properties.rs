//! Properties of every run's figures over random scenarios on `sim` (the fuzz generator's
//! small scenarios: bursts, closed loops, cancellations at every point, forks, prefixes, swap,
//! pipelined steps), recomputed from the files the run writes:
//!
//! - `duration_s` ends at the last event (the latest step end in `memory.csv`, event in
//!   `trace.jsonl` or finish in `requests.csv`), not later;
//! - `throughput_tokens_per_s × duration_s = output_tokens`, and `output_tokens` is the sum of
//!   `requests.csv`'s column;
//! - in `requests.csv`, intended arrival ≤ arrival ≤ admitted ≤ first token ≤ finish.
//!
//! Seeds are printed; `KVBENCH_SEED` replays one, `KVBENCH_PROP_CASES` widens (default 30).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use kvbench::experiment::fuzz::case_toml;

/// `t_ms` of every line of `trace.jsonl`, per cache mode.
fn trace_last_ms(dir: &Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(dir.join("trace.jsonl")).expect("trace.jsonl");
    let mut last = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("trace line is JSON");
        let cache = v["cache"].as_str().unwrap_or_default().to_string();
        let t = v["t_ms"].as_f64().expect("t_ms");
        let e = last.entry(cache).or_insert(0.0f64);
        *e = e.max(t);
    }
    last
}

/// Rows of a CSV as header → cell maps.
fn csv_rows(path: &Path) -> Vec<BTreeMap<String, String>> {
    let mut r = csv::Reader::from_path(path).expect("csv");
    let headers = r.headers().expect("headers").clone();
    r.records()
        .map(|rec| {
            let rec = rec.expect("record");
            headers
                .iter()
                .zip(rec.iter())
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect()
        })
        .collect()
}

fn ms(row: &BTreeMap<String, String>, col: &str) -> Option<f64> {
    row.get(col).filter(|c| !c.is_empty()).map(|c| {
        c.parse()
            .unwrap_or_else(|_| panic!("{col} = {c:?} is not a number"))
    })
}

/// Half a nanosecond of printing (6 decimals of ms) on each side, plus float slack.
const TOL_MS: f64 = 2e-6;

fn check_case(seed: u64, dir: &Path) -> bool {
    let text = case_toml(seed);
    let file = dir.join(format!("case-{seed}.toml"));
    std::fs::write(&file, &text).expect("write case");
    let out = dir.join(format!("out-{seed}"));
    let o = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .arg("run")
        .arg(&file)
        .args(["--backend", "sim", "--out"])
        .arg(&out)
        .output()
        .expect("run kvbench");
    let stderr = String::from_utf8_lossy(&o.stderr);
    match o.status.code() {
        Some(0) => {}
        // The generator can make a scenario the validator refuses; that is not a run.
        Some(2) => return false,
        c => panic!("seed {seed}: exit {c:?}\n{stderr}\n{text}"),
    }
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).expect("summary.json"),
    )
    .expect("summary is JSON");
    let rows = csv_rows(&out.join("requests.csv"));
    let steps = csv_rows(&out.join("memory.csv"));
    let trace_last = trace_last_ms(&out);
    let runs = summary["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "seed {seed}: two cache modes");
    for run in runs {
        let cache = run["cache"].as_str().expect("cache").to_string();
        let what = format!("seed {seed} ({cache}; KVBENCH_SEED={seed} replays)");
        let mine: Vec<_> = rows.iter().filter(|r| r["cache"] == cache).collect();
        let last_finish = mine
            .iter()
            .filter_map(|r| ms(r, "finish_ms"))
            .fold(0.0f64, f64::max);
        let last_step = steps
            .iter()
            .filter(|r| r["cache"] == cache)
            .filter_map(|r| ms(r, "t_ms"))
            .fold(0.0f64, f64::max);
        let last_event = last_finish
            .max(last_step)
            .max(trace_last.get(&cache).copied().unwrap_or(0.0));
        let duration_ms = run["duration_s"].as_f64().expect("duration_s") * 1000.0;
        assert!(
            (duration_ms - last_event).abs() <= TOL_MS,
            "{what}: duration {duration_ms} ms, last event at {last_event} ms (step \
             {last_step}, finish {last_finish})"
        );

        let tokens = run["output_tokens"].as_u64().expect("output_tokens");
        let column: u64 = mine
            .iter()
            .map(|r| {
                r["output_tokens"]
                    .parse::<u64>()
                    .expect("output_tokens cell")
            })
            .sum();
        assert_eq!(
            tokens, column,
            "{what}: summary vs requests.csv output tokens"
        );
        let throughput = run["throughput_tokens_per_s"].as_f64().expect("throughput");
        let recomputed = throughput * duration_ms / 1000.0;
        assert!(
            (recomputed - tokens as f64).abs() <= 1e-6 * (tokens as f64).max(1.0),
            "{what}: throughput {throughput} x duration {duration_ms} ms = {recomputed}, \
             output tokens {tokens}"
        );

        for r in &mine {
            let chain = [
                "intended_arrival_ms",
                "arrival_ms",
                "admitted_ms",
                "first_token_ms",
                "finish_ms",
            ];
            let mut prev: Option<(&str, f64)> = None;
            for col in chain {
                let Some(t) = ms(r, col) else {
                    continue;
                };
                if let Some((p, pt)) = prev {
                    assert!(
                        pt <= t + TOL_MS,
                        "{what}: request {}: {p} {pt} > {col} {t}",
                        r["request_id"]
                    );
                }
                prev = Some((col, t));
            }
        }
    }
    true
}

#[test]
fn random_sim_runs_keep_their_figures_consistent() {
    let (seeds, fixed): (Vec<u64>, bool) = match std::env::var("KVBENCH_SEED") {
        Ok(s) => (vec![s.parse().expect("KVBENCH_SEED is a u64")], true),
        Err(_) => {
            let n: u64 = std::env::var("KVBENCH_PROP_CASES")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(30);
            ((0..n).map(|i| 9_000 + i).collect(), false)
        }
    };
    println!("seeds {seeds:?} (KVBENCH_SEED=S replays one)");
    let dir = tempfile::tempdir().expect("tempdir");
    let ran = seeds.iter().filter(|&&s| check_case(s, dir.path())).count();
    println!("{ran} of {} seeds ran", seeds.len());
    assert!(
        fixed || ran * 2 >= seeds.len(),
        "most random cases must run"
    );
}
