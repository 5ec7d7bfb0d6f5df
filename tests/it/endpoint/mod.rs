//! `kvbench run --endpoint`: the client against an in-process mock server (`mock.rs`) that
//! misbehaves on request. Every figure checked here is recomputed from the folder's files.

mod mock;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvbench::endpoint::{self, EndpointOptions};
use kvbench::workload::CancelPoint;
use mock::{Config, Misbehave};

use crate::support::kvbench;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// quick-mixed (forks, shared prefixes, cancellations, two tenants) made small and slow
/// enough for a loaded machine to keep its schedule.
fn scenario(extra: &[&str]) -> kvbench::scenario::Scenario {
    let mut sets = vec![
        "traffic.requests=24".to_string(),
        "traffic.arrival.rate_per_s=50".to_string(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    kvbench::scenario::load(&Path::new(ROOT).join("scenarios/quick-mixed.toml"), &sets).unwrap()
}

fn opts(url: &str) -> EndpointOptions {
    let mut o = EndpointOptions::new(url);
    o.request_timeout = Duration::from_secs(20);
    o.idle_timeout = Duration::from_secs(10);
    o.scrape_interval = Duration::from_millis(50);
    o.worker_threads = Some(2);
    o
}

fn csv_rows(path: &Path) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut r = csv::Reader::from_path(path).unwrap();
    let h = r.headers().unwrap().clone();
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            h.iter()
                .zip(rec.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn ms(s: &str) -> f64 {
    s.parse().unwrap()
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn multi_token_chunks_count_as_tokens_and_as_one_gap_each() {
    let server = mock::start(Config {
        chunk_tokens: 3,
        ..Config::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let s = scenario(&[]);
    let r = endpoint::run(&s, &opts(&server.url()), &out, false).unwrap();
    assert!(r.failures().is_empty(), "{:?}", r.failures());
    let req = csv_rows(&out.join("requests.csv"));
    let ep = csv_rows(&out.join("endpoint.csv"));
    assert_eq!(req.len(), ep.len());
    let w = kvbench::workload::generate(&s, s.seed).unwrap();
    let mut gaps = 0u64;
    let mut ttft_max: f64 = 0.0;
    for (row, e) in req.iter().zip(&ep) {
        assert_eq!(row["cache"], "endpoint");
        assert_eq!(row["request_id"], e["request_id"]);
        let id: u64 = row["request_id"]
            .split('.')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let wr = &w.requests[id as usize];
        let tokens: u32 = row["output_tokens"].parse().unwrap();
        let chunks: u32 = e["chunks"].parse().unwrap();
        match (row["status"].as_str(), wr.cancel) {
            ("completed", _) => {
                assert_eq!(tokens, wr.output_tokens, "request {}", row["request_id"]);
                assert_eq!(chunks, tokens.div_ceil(3), "request {}", row["request_id"]);
            }
            ("cancelled", Some(_)) => {}
            other => panic!("request {}: {other:?}", row["request_id"]),
        }
        if row["status"] != "rejected" && chunks > 0 {
            gaps += u64::from(chunks - 1);
            // TTFT from the file alone: first token − arrival.
            ttft_max = ttft_max.max(ms(&row["first_token_ms"]) - ms(&row["arrival_ms"]));
        }
    }
    let j = summary(&out);
    let run = &j["runs"][0];
    assert_eq!(run["cache"], "endpoint");
    assert_eq!(j["backend"], "endpoint");
    // One gap per arrival after a stream's first: never a zero gap inside a chunk.
    assert_eq!(run["itl_ms"]["count"].as_u64().unwrap(), gaps);
    assert!((run["ttft_ms"]["max"].as_f64().unwrap() - ttft_max).abs() < 1e-6);
    assert_eq!(j["endpoint"]["model"], "mock-model");
    assert_eq!(j["endpoint"]["models"]["data"][0]["id"], "mock-model");
    assert_eq!(j["endpoint"]["partial"], false);
    assert_eq!(j["workload_hash"], w.workload_hash.as_str());
    // Every request reached the server with its prompt and its n.
    let seen = server.seen();
    assert_eq!(seen.len(), w.requests.len());
    for (s, wr) in seen.iter().zip(&w.requests) {
        assert_eq!(s.request_id, wr.id);
        assert_eq!(s.prompt_len as u32, wr.prompt.len_tokens());
        assert_eq!(s.n, wr.samples.max(1));
        assert_eq!(s.max_tokens, wr.output_tokens);
    }
}

#[test]
fn cancellations_close_the_stream_at_the_scheduled_point() {
    let s = scenario(&["traffic.cancellation.share=0.6"]);
    let w = kvbench::workload::generate(&s, s.seed).unwrap();
    // Streams cancelled after some tokens never end on their own: only the client's close ends
    // them, so the server's record of the close is no race with the stream's natural end.
    let endless: std::collections::BTreeSet<u64> = w
        .requests
        .iter()
        .filter(|r| matches!(r.cancel, Some(CancelPoint::AfterTokens { tokens }) if tokens < r.output_tokens))
        .map(|r| r.id)
        .collect();
    let server = mock::start(Config {
        chunk_delay: Duration::from_millis(2),
        misbehave: Arc::new(move |id| {
            if endless.contains(&id) {
                Misbehave::Endless
            } else {
                Misbehave::None
            }
        }),
        ..Config::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    assert!(w
        .requests
        .iter()
        .any(|r| matches!(r.cancel, Some(CancelPoint::AfterTokens { .. }))));
    assert!(w
        .requests
        .iter()
        .any(|r| matches!(r.cancel, Some(CancelPoint::AfterDelay { .. }))));
    let r = endpoint::run(&s, &opts(&server.url()), &out, false).unwrap();
    assert!(r.failures().is_empty(), "{:?}", r.failures());
    let req = csv_rows(&out.join("requests.csv"));
    let seen = server.seen();
    let mut checked = 0;
    for row in &req {
        let label = &row["request_id"];
        let id: u64 = label.split('.').next().unwrap().parse().unwrap();
        let wr = &w.requests[id as usize];
        let tokens: u32 = row["output_tokens"].parse().unwrap();
        let on_server = seen.iter().find(|s| s.request_id == id).unwrap();
        match wr.cancel {
            Some(CancelPoint::AfterTokens { tokens: at }) if at < wr.output_tokens => {
                assert_eq!(row["status"], "cancelled", "request {label}");
                assert_eq!(
                    tokens, at,
                    "request {label}: tokens kept past the cancellation"
                );
                // The server saw the connection close (its stream has no end of its own).
                let closed = on_server.closed_after_tokens;
                assert!(
                    closed.is_some_and(|c| c >= at),
                    "request {label}: closed after {closed:?} tokens, scheduled {at}"
                );
                checked += 1;
            }
            Some(CancelPoint::AfterDelay { after_ms }) => {
                let lived = ms(&row["finish_ms"]) - ms(&row["arrival_ms"]);
                if row["status"] == "cancelled" {
                    assert!(
                        lived >= after_ms - 1e-3,
                        "request {label}: closed after {lived} ms, scheduled {after_ms}"
                    );
                    assert!(tokens < wr.output_tokens);
                    checked += 1;
                } else {
                    assert_eq!(row["status"], "completed");
                    assert!(
                        lived <= after_ms + 1e-3,
                        "request {label}: outlived its cancellation"
                    );
                }
            }
            _ => {}
        }
    }
    assert!(checked >= 3, "only {checked} cancellations checked");
}

#[test]
fn a_refused_connection_names_the_url_and_writes_nothing() {
    // A port that was free a moment ago.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let url = format!("http://127.0.0.1:{port}");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--endpoint",
        &url,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains(&url), "{text}");
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "a temporary folder was left"
    );
    // https is refused by name.
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--endpoint",
        "https://127.0.0.1:1",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("https is not supported"), "{text}");
}

#[test]
fn a_server_that_dies_mid_run_leaves_a_partial_folder_and_exit_1() {
    let server = mock::start(Config {
        die_after: Some(8),
        chunk_delay: Duration::from_millis(2),
        ..Config::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-mixed.toml",
        "--set",
        "traffic.requests=24",
        "--set",
        "traffic.arrival.rate_per_s=50",
        "--endpoint",
        &server.url(),
        "--request-timeout-s",
        "10",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("partial"), "{text}");
    let j = summary(&out);
    assert_eq!(j["endpoint"]["partial"], true);
    assert_eq!(j["checks"]["ok"], false);
    let sent = j["endpoint"]["requests_sent"].as_u64().unwrap();
    assert!(sent < 24, "{sent} requests sent to a dead server");
    assert!(j["endpoint"]["stopped_because"].as_str().is_some());
    let ep = csv_rows(&out.join("endpoint.csv"));
    assert!(ep.iter().any(|r| r["flags"].contains("transport")));
    assert!(ep.iter().any(|r| r["outcome"] == "completed"));
    drop(server);
}

#[test]
fn malformed_events_and_wrong_token_counts_are_flagged_not_fatal() {
    let server = mock::start(Config {
        misbehave: Arc::new(|id| match id {
            2 => Misbehave::Malformed,
            5 => Misbehave::ShortBy(2),
            _ => Misbehave::None,
        }),
        ..Config::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let s = scenario(&[
        "traffic.cancellation.share=0",
        "traffic.parallel_sampling.share=0",
    ]);
    let r = endpoint::run(&s, &opts(&server.url()), &out, false).unwrap();
    let ep = csv_rows(&out.join("endpoint.csv"));
    let row = |id: &str| ep.iter().find(|r| r["request_id"] == id).unwrap().clone();
    assert!(row("2")["flags"].contains("malformed"), "{:?}", row("2"));
    assert_eq!(row("2")["outcome"], "completed");
    let five = row("5");
    assert!(five["flags"].contains("token_count"), "{five:?}");
    let max: u32 = five["max_tokens"].parse().unwrap();
    assert_eq!(five["output_tokens"].parse::<u32>().unwrap(), max - 2);
    assert_eq!(row("3")["flags"], "");
    assert_eq!(r.summary.endpoint.flagged_requests, 2);
    assert!(!r.summary.checks.ok);
}

#[test]
fn a_slow_loris_stream_times_out_flagged() {
    let server = mock::start(Config {
        misbehave: Arc::new(|id| {
            if id == 1 {
                Misbehave::SlowLoris(Duration::from_millis(20))
            } else {
                Misbehave::None
            }
        }),
        ..Config::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let s = scenario(&[
        "traffic.requests=4",
        "traffic.cancellation.share=0",
        "traffic.parallel_sampling.share=0",
    ]);
    let mut o = opts(&server.url());
    o.idle_timeout = Duration::from_millis(400);
    let r = endpoint::run(&s, &o, &out, false).unwrap();
    let ep = csv_rows(&out.join("endpoint.csv"));
    let one = ep.iter().find(|r| r["request_id"] == "1").unwrap();
    assert_eq!(one["flags"], "idle_timeout", "{one:?}");
    assert_eq!(one["outcome"], "failed");
    assert_eq!(r.summary.endpoint.flagged_requests, 1);
    assert_eq!(r.summary.runs[0].requests.completed, 3);
}

#[test]
fn the_prefix_hit_share_comes_from_metric_deltas_beside_the_bounds() {
    let server = mock::start(Config::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let s = scenario(&["traffic.cancellation.share=0"]);
    let mut o = opts(&server.url());
    o.predict = Some("h100".into());
    endpoint::run(&s, &o, &out, false).unwrap();
    let j = summary(&out);
    // sim's prediction of the same list on the profile, beside the measurement with the ratio.
    let p = &j["predict"];
    assert_eq!(p["device"], "h100");
    let measured = j["runs"][0]["ttft_ms"]["p99"].as_f64().unwrap();
    let predicted = p["ttft_p99_ms"].as_f64().unwrap();
    assert!((p["ratio"]["ttft_p99"].as_f64().unwrap() - measured / predicted).abs() < 1e-9);
    let sm = &j["endpoint"]["server_metrics"];
    let seen = server.seen();
    let queries: u64 = seen.iter().map(|s| s.prompt_len as u64).sum();
    let hits: u64 = seen.iter().map(|s| s.prompt_len as u64 / 4).sum();
    assert_eq!(sm["prefix_query_tokens"].as_f64().unwrap(), queries as f64);
    assert_eq!(sm["prefix_hit_tokens"].as_f64().unwrap(), hits as f64);
    let share = j["prefix_cache"]["server_hit_share"].as_f64().unwrap();
    assert!((share - hits as f64 / queries as f64).abs() < 1e-12);
    let b = &j["prefix_cache"]["bounds"];
    for k in [
        "replayed_lru_hit_rate",
        "optimum_hit_rate",
        "ceiling_hit_rate",
    ] {
        let v = b[k].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&v), "{k} = {v}");
    }
    assert!(sm["scrapes"].as_u64().unwrap() >= 2);
}

#[test]
fn the_gate_compares_endpoint_runs_and_refuses_two_models() {
    let a = mock::start(Config::default());
    let b = mock::start(Config {
        model: "other-model".into(),
        ..Config::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(&["traffic.cancellation.share=0"]);
    let dirs: Vec<_> = ["a1", "a2", "b"]
        .iter()
        .map(|n| tmp.path().join(n))
        .collect();
    endpoint::run(&s, &opts(&a.url()), &dirs[0], false).unwrap();
    endpoint::run(&s, &opts(&a.url()), &dirs[1], false).unwrap();
    endpoint::run(&s, &opts(&b.url()), &dirs[2], false).unwrap();
    let gate = |x: &Path, y: &Path| {
        kvbench(&[
            "gate",
            "--baseline",
            x.to_str().unwrap(),
            "--current",
            y.to_str().unwrap(),
            "--max-regression",
            "1000",
        ])
    };
    let (code, text) = gate(&dirs[0], &dirs[1]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("endpoint ttft_p99_ms"), "{text}");
    let (code, text) = gate(&dirs[0], &dirs[2]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("mock-model") && text.contains("other-model"),
        "{text}"
    );
}
