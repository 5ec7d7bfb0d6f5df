//! Trace replay: each format's committed fixture (scenarios/traces/) replays with its request
//! count, arrival times and lengths read back exactly from requests.csv; the trace's identity
//! reaches summary.json; Mooncake hash ids give real, cache-found prefix reuse.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kvbench::experiment::{self, RunOptions};
use kvbench::results;
use kvbench::scenario::{ArrivalSpec, Scenario};
use kvbench::workload::{self, trace};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn scenario(name: &str) -> Scenario {
    kvbench::scenario::load(&root().join(format!("scenarios/{name}.toml")), &[])
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A row of requests.csv by column name.
struct Row(BTreeMap<String, String>);
impl Row {
    fn get(&self, k: &str) -> &str {
        &self.0[k]
    }
}

fn run_rows(s: &Scenario) -> (Vec<Row>, serde_json::Value) {
    let exp = experiment::run_scenario(s, &RunOptions::default()).expect("run");
    assert!(exp.failures().is_empty(), "{:?}", exp.failures());
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("out");
    results::write(&exp, &dir, false, false).expect("write");
    let text = std::fs::read_to_string(dir.join("requests.csv")).expect("requests.csv");
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    let rows = lines
        .map(|l| {
            Row(header
                .iter()
                .cloned()
                .zip(l.split(',').map(String::from))
                .collect())
        })
        .collect();
    let summary = serde_json::from_str(
        &std::fs::read_to_string(dir.join("summary.json")).expect("summary.json"),
    )
    .expect("json");
    (rows, summary)
}

/// Integer ns as requests.csv writes ms (six decimals).
fn ms(ns: u64) -> String {
    format!("{}.{:06}", ns / 1_000_000, ns % 1_000_000)
}

/// What each replayed row should read back as: arrival (ns after the first row), prompt,
/// output, and whether it is too long for max_seq_len (rejected, no output).
struct Expect {
    arrival_ns: u64,
    prompt: u32,
    output: u32,
}

fn check_readback(s: &Scenario, expect: &[Expect], cancelled_outputs: &[usize]) {
    let msl = s.cache.max_seq_len;
    let (rows, summary) = run_rows(s);
    for cache in ["paged", "contiguous"] {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.get("cache") == cache).collect();
        assert_eq!(
            mine.len(),
            expect.len(),
            "{cache}: one row per replayed request"
        );
        for (i, (r, e)) in mine.iter().zip(expect).enumerate() {
            assert_eq!(r.get("request_id"), i.to_string());
            assert_eq!(
                r.get("intended_arrival_ms"),
                ms(e.arrival_ns),
                "{cache} request {i}"
            );
            assert_eq!(
                r.get("prompt_tokens"),
                e.prompt.to_string(),
                "{cache} request {i}"
            );
            let too_long = e.prompt as u64 + e.output.max(1) as u64 > msl as u64;
            let status = r.get("status");
            if too_long {
                assert_eq!(status, "rejected", "{cache} request {i}");
            } else if cancelled_outputs.contains(&i) {
                assert_eq!(status, "cancelled", "{cache} request {i}");
                assert_eq!(r.get("output_tokens"), "1", "{cache} request {i}");
            } else {
                assert_eq!(status, "completed", "{cache} request {i}");
                assert_eq!(r.get("output_tokens"), e.output.max(1).to_string());
            }
        }
    }
    let t = &summary["trace"];
    assert_eq!(t["replayed"].as_u64(), Some(expect.len() as u64));
    let ArrivalSpec::Trace(spec) = &s.traffic.arrival else {
        panic!("not a trace")
    };
    let bytes = std::fs::read(s.resolve_path(&spec.path)).expect("fixture");
    assert_eq!(
        t["blake3"].as_str(),
        Some(blake3::hash(&bytes).to_hex().as_str())
    );
}

/// `HH:MM:SS.fffffff` of an Azure timestamp as ns since midnight (the fixture is one day).
fn azure_clock_ns(ts: &str) -> u64 {
    let time = ts.split(' ').nth(1).unwrap();
    let (hms, frac) = time.split_once('.').unwrap();
    let p: Vec<u64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
    let frac_ns: u64 = format!("{frac:0<9}").parse().unwrap();
    ((p[0] * 60 + p[1]) * 60 + p[2]) * 1_000_000_000 + frac_ns
}

fn fixture_lines(name: &str) -> Vec<String> {
    std::fs::read_to_string(root().join("scenarios/traces").join(name))
        .expect("fixture")
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn azure_fixture_reads_back_exactly() {
    let lines = fixture_lines("azure-mini.csv");
    let first = azure_clock_ns(lines[1].split(',').next().unwrap());
    let expect: Vec<Expect> = lines[1..]
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Expect {
                arrival_ns: azure_clock_ns(f[0]) - first,
                prompt: f[1].parse().unwrap(),
                output: f[2].parse().unwrap(),
            }
        })
        .collect();
    assert_eq!(expect.len(), 12);
    check_readback(&scenario("trace-azure"), &expect, &[]);
}

#[test]
fn burstgpt_fixture_filters_and_replays_failures_as_cancellations() {
    let lines = fixture_lines("burstgpt-mini.csv");
    let mut expect = Vec::new();
    let mut cancelled = Vec::new();
    for l in &lines[1..] {
        let f: Vec<&str> = l.split(',').collect();
        if f[1] != "ChatGPT" || f[5] != "Conversation log" {
            continue;
        }
        let output: u32 = f[3].parse().unwrap();
        if output == 0 {
            cancelled.push(expect.len());
        }
        expect.push(Expect {
            arrival_ns: f[0].parse::<u64>().unwrap() * 1_000_000_000,
            prompt: f[2].parse().unwrap(),
            output: if output == 0 { 2 } else { output },
        });
    }
    assert_eq!((expect.len(), cancelled.len()), (8, 2));
    check_readback(&scenario("trace-burstgpt"), &expect, &cancelled);

    // With failures skipped (the default) they are left out and counted.
    let mut s = scenario("trace-burstgpt");
    if let ArrivalSpec::Trace(t) = &mut s.traffic.arrival {
        t.failed = kvbench::scenario::FailedRows::Skip;
    }
    let w = workload::generate(&s, 1).expect("workload");
    let info = w.trace.expect("trace info");
    assert_eq!(
        (info.replayed, info.failed_skipped, info.filtered_rows),
        (6, 2, 4)
    );
}

#[test]
fn mooncake_fixture_reads_back_exactly_and_reuses_prefixes() {
    let lines = fixture_lines("mooncake-mini.jsonl");
    let expect: Vec<Expect> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Expect {
                arrival_ns: v["timestamp"].as_u64().unwrap() * 1_000_000,
                prompt: v["input_length"].as_u64().unwrap() as u32,
                output: v["output_length"].as_u64().unwrap() as u32,
            }
        })
        .collect();
    let s = scenario("trace-mooncake");
    check_readback(&s, &expect, &[]);
    // The cache finds the reuse by its own keys: with a budget that never evicts, the paged
    // run's hit tokens equal the infinite-cache ceiling.
    let (_, summary) = run_rows(&s);
    let paged = &summary["runs"][0];
    let ceiling = summary["trace"]["ideal_prefix_hit_rate"].as_f64().unwrap();
    assert!(ceiling > 0.3, "{ceiling}");
    assert_eq!(paged["prefix_cache"]["evictions"].as_u64(), Some(0));
    assert_eq!(paged["prefix_cache"]["hit_rate"].as_f64(), Some(ceiling));
}

#[test]
fn csv_fixture_reads_back_exactly_with_sessions_tenants_and_groups() {
    let lines = fixture_lines("plain-mini.csv");
    let mut rows: Vec<(u64, usize, Vec<String>)> = lines[1..]
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let f: Vec<String> = l.split(',').map(String::from).collect();
            let (a, b) = f[0].split_once('.').unwrap_or((&f[0], ""));
            let ns =
                a.parse::<u64>().unwrap() * 1_000_000 + format!("{b:0<6}").parse::<u64>().unwrap();
            (ns, i, f)
        })
        .collect();
    rows.sort();
    let expect: Vec<Expect> = rows
        .iter()
        .map(|(ns, _, f)| Expect {
            arrival_ns: *ns,
            prompt: f[1].parse().unwrap(),
            output: f[2].parse().unwrap(),
        })
        .collect();
    let s = scenario("trace-csv");
    check_readback(&s, &expect, &[]);

    let w = workload::generate(&s, s.seed).expect("workload");
    let r = &w.requests;
    // Session `a`: rows 0, 2, 6 of the file; each later prompt starts with the previous one.
    let a: Vec<&kvbench::workload::Request> = rows
        .iter()
        .zip(r)
        .filter(|((_, _, f), _)| f[3] == "a")
        .map(|(_, q)| q)
        .collect();
    assert_eq!(a.len(), 3);
    for k in 1..a.len() {
        assert_eq!(
            a[k].prompt.tokens()[..a[k - 1].prompt.len_tokens() as usize],
            a[k - 1].prompt.tokens()[..]
        );
    }
    // Group 1: the first 64 tokens agree across tenants (the cache's scope keeps them apart).
    let g: Vec<&kvbench::workload::Request> =
        r.iter().filter(|q| q.prefix_group == Some(1)).collect();
    assert_eq!(g.len(), 3);
    assert!(g
        .iter()
        .all(|q| q.prompt.tokens()[..64] == g[0].prompt.tokens()[..64]));
    let n = g[0].prompt.len_tokens().min(g[1].prompt.len_tokens()) as usize;
    assert_ne!(
        g[1].prompt.tokens()[64..n],
        g[0].prompt.tokens()[64..n],
        "fresh tokens after the prefix"
    );
    assert_eq!(
        r.iter().map(|q| q.tenant).collect::<Vec<_>>(),
        rows.iter()
            .map(|(_, _, f)| f[4].parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    );
}

#[test]
fn equal_hash_ids_give_equal_tokens_and_unequal_ones_differ() {
    let vocab = 128_256;
    for seed in [0u64, 1, 99] {
        let a = trace::hash_block_tokens(seed, 7, 512, vocab);
        assert_eq!(a, trace::hash_block_tokens(seed, 7, 512, vocab));
        assert_ne!(a, trace::hash_block_tokens(seed, 8, 512, vocab));
        assert_ne!(a, trace::hash_block_tokens(seed + 1, 7, 512, vocab));
        // A partial block is a prefix of the full one (a prompt ending mid-block).
        assert_eq!(trace::hash_block_tokens(seed, 7, 100, vocab)[..], a[..100]);
    }
    // In a replay: requests 0 and 2 of the fixture share ids 0, 1, 2 (192 tokens at 64 per id)
    // and then differ (3 vs 4).
    let s = scenario("trace-mooncake");
    let w = workload::generate(&s, s.seed).expect("workload");
    let (r0, r2) = (w.requests[0].prompt.tokens(), w.requests[2].prompt.tokens());
    assert_eq!(r0[..192], r2[..192]);
    assert_ne!(r0[192..200], r2[192..200]);
    assert_ne!(w.requests[1].prompt.tokens()[..64], r0[..64]);
}

#[test]
fn tokens_per_hash_id_are_inferred_from_the_rows() {
    // The fixture's rows allow 64..=65 tokens per id and the scenario states none: 64, and the
    // very prompts a stated 64 gives.
    let s = scenario("trace-mooncake");
    let ArrivalSpec::Trace(spec) = &s.traffic.arrival else {
        panic!("a trace scenario")
    };
    assert_eq!(spec.hash_block_tokens, None);
    let w = workload::generate(&s, s.seed).expect("workload");
    assert_eq!(w.trace.as_ref().unwrap().hash_block_tokens, Some(64));
    let mut stated = s.clone();
    if let ArrivalSpec::Trace(t) = &mut stated.traffic.arrival {
        t.hash_block_tokens = Some(64);
    }
    let v = workload::generate(&stated, s.seed).expect("workload");
    assert_eq!(v.workload_hash, w.workload_hash);
    // 65 is allowed too, and gives other prompts; 66 is refused.
    if let ArrivalSpec::Trace(t) = &mut stated.traffic.arrival {
        t.hash_block_tokens = Some(65);
    }
    let v = workload::generate(&stated, s.seed).expect("workload");
    assert_ne!(v.workload_hash, w.workload_hash);
    if let ArrivalSpec::Trace(t) = &mut stated.traffic.arrival {
        t.hash_block_tokens = Some(66);
    }
    let Err(e) = workload::generate(&stated, s.seed) else {
        panic!("66 tokens per id must be refused")
    };
    assert!(e.to_string().contains("hash_block_tokens = 66"), "{e}");
}

#[test]
fn the_trace_is_part_of_the_workload_hash() {
    let s = scenario("trace-azure");
    let a = workload::generate(&s, 1).unwrap().workload_hash;
    let mut t = s.clone();
    if let ArrivalSpec::Trace(spec) = &mut t.traffic.arrival {
        spec.time_scale = 2.0;
    }
    let w = workload::generate(&t, 1).unwrap();
    assert_ne!(a, w.workload_hash);
    // Time scale 2 doubles every arrival.
    let base = workload::generate(&s, 1).unwrap();
    for (x, y) in base.requests.iter().zip(&w.requests) {
        assert_eq!((x.arrival_ms * 2e6).round(), (y.arrival_ms * 1e6).round());
    }
}

/// The hash names the trace by what it holds, not by how a scenario spells its path: the same
/// file from another folder, by another spelling, is the same workload (runs of it compare and
/// gate); one more row is another.
#[test]
fn the_workload_hash_follows_the_traces_bytes_not_its_path() {
    let s = scenario("trace-azure");
    let a = workload::generate(&s, 1).unwrap();
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(tmp.path().join("elsewhere/data")).expect("mkdir");
    let text = std::fs::read_to_string(root().join("scenarios/trace-azure.toml")).expect("read");
    let spelled = "./data/../data/azure copy.csv";
    let moved = text.replace("traces/azure-mini.csv", spelled);
    assert_ne!(moved, text, "the scenario names traces/azure-mini.csv");
    let toml = tmp.path().join("elsewhere/s.toml");
    std::fs::write(&toml, &moved).expect("write scenario");
    let rows =
        std::fs::read_to_string(root().join("scenarios/traces/azure-mini.csv")).expect("fixture");
    std::fs::write(tmp.path().join("elsewhere/data/azure copy.csv"), &rows).expect("copy");
    let load = || kvbench::scenario::load(&toml, &[]).unwrap_or_else(|e| panic!("{e}"));
    let b = workload::generate(&load(), 1).unwrap();
    assert_ne!(
        a.trace.as_ref().unwrap().path,
        b.trace.as_ref().unwrap().path
    );
    assert_eq!(a.workload_hash, b.workload_hash, "same bytes, another path");
    // One more row is another file.
    let last = rows.lines().last().expect("a row").to_string();
    std::fs::write(
        tmp.path().join("elsewhere/data/azure copy.csv"),
        format!("{rows}{last}\n"),
    )
    .expect("append");
    let c = workload::generate(&load(), 1).unwrap();
    assert_ne!(a.workload_hash, c.workload_hash, "other bytes");
}

#[test]
fn windows_by_count_and_time_and_rate_scaling() {
    let base = scenario("trace-azure");
    let all = workload::generate(&base, 1).unwrap().requests;
    let gen = |f: &dyn Fn(&mut Scenario)| {
        let mut s = base.clone();
        f(&mut s);
        let w = workload::generate(&s, 1).unwrap();
        (w.requests, w.trace.unwrap())
    };
    let ns = |ms: f64| (ms * 1e6).round() as i64;
    // By count: the first five rows.
    let (r, info) = gen(&|s| s.traffic.requests = Some(5));
    assert_eq!((r.len(), info.outside_window), (5, 7));
    assert_eq!(r[4].prompt, all[4].prompt);
    // By time: rows from 5 s after the first, for 3 s, on a clock starting at the window.
    let (r, info) = gen(&|s| {
        s.traffic.duration_s = Some(3.0);
        if let ArrivalSpec::Trace(t) = &mut s.traffic.arrival {
            t.start_s = 5.0;
        }
    });
    let start = ns(all[0].arrival_ms) + 5_000_000_000;
    let want: Vec<i64> = all
        .iter()
        .map(|q| ns(q.arrival_ms) - start)
        .filter(|&t| (0..3_000_000_000).contains(&t))
        .collect();
    assert!(!want.is_empty() && want.len() < all.len());
    assert_eq!(r.iter().map(|q| ns(q.arrival_ms)).collect::<Vec<_>>(), want);
    assert_eq!(info.outside_window as usize, all.len() - want.len());
    // Rate x2: every arrival at half the time.
    let (r, _) = gen(&|s| {
        if let ArrivalSpec::Trace(t) = &mut s.traffic.arrival {
            t.rate_scale = 2.0;
        }
    });
    for (x, y) in all.iter().zip(&r) {
        assert_eq!(
            ns(x.arrival_ms),
            2 * ns(y.arrival_ms) - (ns(x.arrival_ms) % 2)
        );
    }
}
