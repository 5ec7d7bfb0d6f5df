//! The results contract: two `sim` runs with one seed are byte-identical (all files but
//! environment.json), and the percentiles in summary.json recompute from requests.csv and
//! trace.jsonl alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use kvbench::experiment::{self, RunOptions};
use kvbench::results;
use serde_json::Value;

fn scenario(name: &str, overrides: &[&str]) -> kvbench::scenario::Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    kvbench::scenario::load(&path, &o).expect("scenario loads")
}

fn run_into(dir: &Path, name: &str, overrides: &[&str]) {
    let exp =
        experiment::run_scenario(&scenario(name, overrides), &RunOptions::default()).expect("run");
    assert!(exp.failures().is_empty(), "{:?}", exp.failures());
    results::write(&exp, dir, false, true).expect("write");
}

const FILES: [&str; 6] = [
    "summary.json",
    "requests.csv",
    "trace.jsonl",
    "report.md",
    "memory.csv",
    "trace.perfetto.json",
];

#[test]
fn two_sim_runs_with_one_seed_are_byte_identical() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, &[&str]); 2] = [
        ("chat-8b-h200", &["traffic.requests=60"]),
        (
            "parallel-sampling-8b-h200",
            &[
                "traffic.requests=40",
                "scheduler.async_steps=true",
                "memory.kv_budget=2GiB",
                "scheduler.preemption=swap",
            ],
        ),
    ];
    for (name, o) in cases {
        let (a, b) = (
            tmp.path().join(format!("{name}-a")),
            tmp.path().join(format!("{name}-b")),
        );
        run_into(&a, name, o);
        run_into(&b, name, o);
        for f in FILES {
            let (x, y) = (
                std::fs::read(a.join(f)).expect("a"),
                std::fs::read(b.join(f)).expect("b"),
            );
            assert!(!x.is_empty(), "{name}/{f} is empty");
            assert!(x == y, "{name}/{f} differs between two runs with one seed");
        }
        assert!(a.join("environment.json").is_file());
    }
}

/// The histogram's quantiles, never above the largest value recorded (a bucket's highest value
/// can lie past every value in it).
fn hdr_ms(values_ns: &[u64]) -> [f64; 3] {
    let mut h = Histogram::<u64>::new_with_bounds(1, 1 << 46, 3).expect("histogram");
    for &v in values_ns {
        h.record(v).expect("record");
    }
    let max = values_ns.iter().max().copied().unwrap_or(0);
    [0.5, 0.9, 0.99].map(|q| h.value_at_quantile(q).min(max) as f64 / 1e6)
}

/// Nearest-rank percentile, exact.
fn exact_ms(values_ns: &[u64], q: f64) -> f64 {
    let mut v = values_ns.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1] as f64 / 1e6
}

fn ns(ms: &str) -> u64 {
    let (a, b) = ms.split_once('.').expect("ms with decimals");
    a.parse::<u64>().expect("int") * 1_000_000 + b.parse::<u64>().expect("frac")
}

fn check(dist: &Value, values: &[u64], what: &str) {
    assert!(!values.is_empty(), "{what}: nothing to recompute");
    let hdr = hdr_ms(values);
    for (i, key) in ["p50", "p90", "p99"].iter().enumerate() {
        let reported = dist[key].as_f64().expect("number");
        assert_eq!(
            reported, hdr[i],
            "{what}.{key}: summary vs recomputed histogram"
        );
        let exact = exact_ms(values, [0.5, 0.9, 0.99][i]);
        assert!(
            (reported - exact).abs() <= exact * 1e-3 + 1e-6,
            "{what}.{key}: {reported} vs exact {exact}"
        );
    }
    let max = values.iter().max().copied().unwrap_or(0) as f64 / 1e6;
    assert_eq!(dist["max"].as_f64(), Some(max), "{what}.max");
    for key in ["p50", "p90", "p99"] {
        let q = dist[key].as_f64().expect("number");
        assert!(q <= max, "{what}.{key} {q} above the max {max}");
    }
    assert_eq!(
        dist["count"].as_u64(),
        Some(values.len() as u64),
        "{what}.count"
    );
}

#[test]
fn summary_percentiles_recompute_from_requests_csv_and_trace_jsonl() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("out");
    run_into(
        &dir,
        "cancel-storm-8b-h200",
        &["traffic.requests=80", "scheduler.async_steps=true"],
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).expect("summary"))
            .expect("json");
    let csv = std::fs::read_to_string(dir.join("requests.csv")).expect("csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("column {name}"))
    };
    let (c_cache, c_arr, c_first, c_fin, c_status) = (
        col("cache"),
        col("arrival_ms"),
        col("first_token_ms"),
        col("finish_ms"),
        col("status"),
    );
    let mut ttft: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut e2e: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        if f[c_status] == "rejected" {
            continue;
        }
        if !f[c_first].is_empty() {
            ttft.entry(f[c_cache].into())
                .or_default()
                .push(ns(f[c_first]) - ns(f[c_arr]));
        }
        if f[c_status] == "completed" {
            e2e.entry(f[c_cache].into())
                .or_default()
                .push(ns(f[c_fin]) - ns(f[c_arr]));
        }
    }
    // Inter-token gaps from trace.jsonl alone.
    let mut last: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut itl: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let text = std::fs::read_to_string(dir.join("trace.jsonl")).expect("trace");
    let mut times: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("json line");
        let ev = v["event"].as_str().expect("event");
        if ev == "first_token" || ev == "token" {
            let key = (
                v["cache"].as_str().expect("cache").to_string(),
                v["request"].as_str().expect("request").to_string(),
            );
            // t_ms is written with six decimals: recover exact nanoseconds from the text.
            let raw = line
                .split("\"t_ms\":")
                .nth(1)
                .and_then(|s| s.split(',').next())
                .expect("t_ms");
            times.entry(key).or_default().push(ns(raw));
        }
    }
    for ((cache, request), mut ts) in times {
        ts.sort_unstable();
        for w in ts.windows(2) {
            itl.entry(cache.clone()).or_default().push(w[1] - w[0]);
        }
        last.insert((cache, request), ts[ts.len() - 1]);
    }
    let runs = summary["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for run in runs {
        let cache = run["cache"].as_str().expect("cache").to_string();
        check(&run["ttft_ms"], &ttft[&cache], &format!("{cache}.ttft_ms"));
        check(&run["e2e_ms"], &e2e[&cache], &format!("{cache}.e2e_ms"));
        check(&run["itl_ms"], &itl[&cache], &format!("{cache}.itl_ms"));
        assert!(run["requests"]["cancelled"].as_u64().expect("cancelled") > 0);
    }
}

#[test]
fn the_results_folder_has_every_contract_field() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("out");
    run_into(&dir, "shared-prompts-8b-h200", &["traffic.requests=30"]);
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).expect("summary"))
            .expect("json");
    for k in ["scenario", "backend", "seed", "workload_hash", "runs"] {
        assert!(!s[k].is_null(), "summary.{k}");
    }
    assert_eq!(s["backend"], "sim");
    for run in s["runs"].as_array().expect("runs") {
        for k in [
            "cache",
            "block_size",
            "requests",
            "output_tokens",
            "duration_s",
            "throughput_tokens_per_s",
            "goodput_requests_per_s",
            "ttft_ms",
            "itl_ms",
            "e2e_ms",
            "peak_running_sequences",
            "preemptions",
            "prefix_cache",
            "memory",
            "reclamation",
        ] {
            assert!(!run[k].is_null(), "runs[].{k}");
        }
        assert!(
            run.get("numerics").is_some_and(Value::is_null),
            "sim computes nothing: numerics null"
        );
        for k in ["total", "completed", "cancelled", "rejected"] {
            assert!(run["requests"][k].is_u64(), "requests.{k}");
        }
        for d in ["ttft_ms", "itl_ms", "e2e_ms"] {
            for k in ["p50", "p90", "p99", "max", "mean"] {
                assert!(run[d][k].is_f64(), "{d}.{k}");
            }
        }
        for k in ["hit_tokens", "lookup_tokens"] {
            assert!(run["prefix_cache"][k].is_u64(), "prefix_cache.{k}");
        }
        for k in [
            "kv_budget_bytes",
            "weights_bytes",
            "kv_peak_live_bytes",
            "kv_peak_allocated_bytes",
            "workspace_peak_bytes",
            "other_bytes",
        ] {
            assert!(run["memory"][k].is_u64(), "memory.{k}");
        }
        assert!(run["memory"]["kv_waste_fraction"].is_f64());
        for k in ["ok", "leaked_blocks", "leaked_bytes", "detail"] {
            assert!(!run["reclamation"][k].is_null(), "reclamation.{k}");
        }
    }
    let paged = &s["runs"][0];
    assert_eq!(paged["cache"], "paged");
    assert!(
        paged["prefix_cache"]["hit_tokens"].as_u64().expect("hits") > 0,
        "shared prompts must hit"
    );
    let header = std::fs::read_to_string(dir.join("requests.csv")).expect("csv");
    assert!(header.starts_with(
        "cache,request_id,parent_id,tenant,arrival_ms,admitted_ms,first_token_ms,finish_ms,prompt_tokens,cached_prompt_tokens,output_tokens,status,preemptions"
    ));
    let trace = std::fs::read_to_string(dir.join("trace.jsonl")).expect("trace");
    let first: Value = serde_json::from_str(trace.lines().next().expect("line")).expect("json");
    for k in ["cache", "t_ms", "request", "event"] {
        assert!(!first[k].is_null(), "trace.{k}");
    }
    assert!(trace.contains("\"event\":\"prefix_hit\""));
    let perfetto: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("trace.perfetto.json")).expect("perfetto"),
    )
    .expect("json");
    assert!(perfetto["traceEvents"].as_array().expect("events").len() > 10);
    let env: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("environment.json")).expect("env"))
            .expect("json");
    for k in [
        "git_revision",
        "cpu",
        "gpu",
        "driver",
        "toolchain",
        "date_utc",
    ] {
        assert!(env.get(k).is_some(), "environment.{k}");
    }
}
