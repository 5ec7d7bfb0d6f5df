//! The served binary over HTTP: the same tokens as an in-process run, `/metrics` agreeing with
//! the results folder, a cancellation storm reclaimed, bad requests refused while it keeps
//! serving.

use std::collections::BTreeMap;

use kvbench::backend::BackendKind;
use kvbench::experiment::{self, RunOptions};
use kvbench::serve::wire;

use super::client::{metric, metrics, read_answer, request, send, tokens_of, Served, DEADLINE};

const SCENARIO: &str = "scenarios/quick-basic.toml";

fn scenario(requests: u32) -> kvbench::scenario::Scenario {
    kvbench::scenario::load(
        &super::client::repo().join(SCENARIO),
        &[format!("traffic.requests={requests}")],
    )
    .expect("quick-basic loads")
}

#[test]
fn served_tokens_equal_an_in_process_run_of_the_same_requests() {
    let s = scenario(6);
    let opts = RunOptions {
        backend: BackendKind::Cpu,
        ..RunOptions::default()
    };
    let exp = experiment::run_scenario(&s, &opts).expect("in-process run");
    let record = exp.runs[0].record.as_ref().expect("collected");
    let mut expected = BTreeMap::new();
    for st in &record.streams {
        expected.insert((st.request, st.rank), st.token_ids.clone());
    }
    let model = s.model_shape().expect("shape").name;
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Served::start(SCENARIO, &tmp.path().join("served"), &[]);
    // Sent concurrently, half of them streamed: batching and the answer's form change no token.
    let handles: Vec<_> = exp
        .workload
        .requests
        .iter()
        .map(|r| {
            let body = wire::completion_body(r, &model, r.id % 2 == 0).to_string();
            let (addr, id, samples) = (server.addr.clone(), r.id, r.samples.max(1));
            std::thread::spawn(move || {
                let a = request(&addr, "POST", "/v1/completions", body.as_bytes());
                assert_eq!(a.status, 200, "request {id}: {}", a.body);
                (id, tokens_of(&a, samples as usize))
            })
        })
        .collect();
    for h in handles {
        let (id, (tokens, finish)) = h.join().expect("client thread");
        for (rank, t) in tokens.iter().enumerate() {
            let want = &expected[&(id, rank as u32)];
            assert!(!want.is_empty(), "request {id} produced tokens in-process");
            assert_eq!(
                t, want,
                "request {id} choice {rank}: served vs in-process tokens"
            );
            assert_eq!(finish[rank], "length", "request {id} choice {rank}");
        }
    }
    let (code, err) = server.stop();
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn metrics_prefix_hit_share_equals_the_results_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Served::start(SCENARIO, &tmp.path().join("served"), &[]);
    // Three requests on one 48-token prompt (3 blocks of 16: the later two hit), one other.
    let shared: Vec<u32> = (1..=48).collect();
    let other: Vec<u32> = (100..140).collect();
    let mut cached = 0;
    for prompt in [&shared, &shared, &other, &shared] {
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 4}).to_string();
        let a = request(&server.addr, "POST", "/v1/completions", body.as_bytes());
        assert_eq!(a.status, 200, "{}", a.body);
        let v: serde_json::Value = serde_json::from_str(&a.body).expect("JSON");
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached tokens reported");
    }
    let m = metrics(&server.addr);
    let queries = metric(&m, "vllm:prefix_cache_queries_total");
    let hits = metric(&m, "vllm:prefix_cache_hits_total");
    assert!(hits > 0.0, "a repeated prompt hits: {hits} of {queries}");
    assert_eq!(metric(&m, "vllm:request_success_total"), 4.0);
    assert_eq!(metric(&m, "vllm:num_requests_running"), 0.0);
    assert_eq!(metric(&m, "vllm:time_to_first_token_seconds_count"), 4.0);
    let (code, err) = server.stop();
    assert_eq!(code, Some(0), "{err}");
    let s = server.summary();
    let p = &s["runs"][0]["prefix_cache"];
    assert_eq!(p["lookup_tokens"].as_f64(), Some(queries), "{p}");
    assert_eq!(p["hit_tokens"].as_f64(), Some(hits), "{p}");
    assert_eq!(p["hit_rate"].as_f64(), Some(hits / queries), "{p}");
    // Each answer's cached tokens are its request's hit at admission, as requests.csv says.
    assert_eq!(p["request_hit_tokens"].as_u64(), Some(cached), "{p}");
    assert!(cached > 0, "the repeated prompt's answers report their hit");
    assert_eq!(s["served"]["requests"], 4);
    assert_eq!(s["runs"][0]["cache"], "paged");
}

#[test]
fn a_cancellation_storm_leaves_the_server_reclaimed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Served::start(SCENARIO, &tmp.path().join("served"), &[]);
    let prompt: Vec<u32> = (1..=32).collect();
    let body = serde_json::json!({
        "prompt": prompt, "max_tokens": 200, "stream": true,
    })
    .to_string();
    // Twelve clients hang up after their first bytes of stream, four before any.
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let (addr, body) = (server.addr.clone(), body.clone());
            std::thread::spawn(move || {
                let mut s = send(&addr, "POST", "/v1/completions", body.as_bytes());
                if i % 4 != 0 {
                    let mut buf = [0u8; 512];
                    let n = std::io::Read::read(&mut s, &mut buf).expect("first bytes");
                    assert!(n > 0, "the stream began");
                }
                drop(s);
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    // The server notices every hang-up; bounded wait for the gauges to drain.
    let t0 = std::time::Instant::now();
    loop {
        let m = metrics(&server.addr);
        if metric(&m, "vllm:num_requests_running") == 0.0
            && metric(&m, "vllm:num_requests_waiting") == 0.0
        {
            break;
        }
        assert!(t0.elapsed() < DEADLINE, "requests still held: {m:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Still serving after the storm.
    let ok = serde_json::json!({"prompt": [1, 2, 3], "max_tokens": 2}).to_string();
    assert_eq!(
        request(&server.addr, "POST", "/v1/completions", ok.as_bytes()).status,
        200
    );
    let (code, err) = server.stop();
    assert_eq!(code, Some(0), "{err}");
    let s = server.summary();
    let run = &s["runs"][0];
    assert_eq!(run["reclamation"]["ok"], true, "{run}");
    assert_eq!(run["invariants"]["ok"], true, "{run}");
    assert_eq!(s["checks"]["ok"], true, "{}", s["checks"]);
    let cancelled = run["requests"]["cancelled"].as_u64().expect("count");
    assert!(
        cancelled >= 12,
        "the hung-up streams were cancelled: {}",
        run["requests"]
    );
    assert!(
        s["served"]["client_cancels"].as_u64() >= Some(12),
        "{}",
        s["served"]
    );
    assert!(run["requests"]["completed"].as_u64() >= Some(1));
    assert_eq!(s["served"]["shutdown"], "drained");
}

#[test]
fn a_shutdown_past_its_drain_timeout_cancels_running_requests_and_reclaims() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Served::start(
        SCENARIO,
        &tmp.path().join("served"),
        &["--drain-timeout-s", "0"],
    );
    let body = serde_json::json!({
        "prompt": (1..=16).collect::<Vec<u32>>(), "max_tokens": 240, "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let s = send(&server.addr, "POST", "/v1/completions", body.as_bytes());
    // The stream's first bytes came: the request runs when the signal lands.
    let mut r = std::io::BufReader::new(s);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut r, &mut line).expect("status line");
    assert!(line.contains("200"), "{line}");
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut r, &mut rest);
        rest
    });
    let (code, err) = server.stop();
    assert_eq!(code, Some(0), "{err}");
    let rest = reader.join().expect("reader");
    assert!(
        rest.contains("\"finish_reason\":\"abort\""),
        "cut by the shutdown: {rest}"
    );
    assert!(rest.contains("data: [DONE]"), "{rest}");
    let s = server.summary();
    assert_eq!(s["served"]["shutdown"], "cancelled", "{}", s["served"]);
    assert_eq!(s["runs"][0]["requests"]["cancelled"], 1);
    assert_eq!(s["runs"][0]["reclamation"]["ok"], true);
    assert_eq!(s["checks"]["ok"], true, "{}", s["checks"]);
}

#[test]
fn bad_requests_get_a_4xx_with_a_message_and_the_server_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Served::start(SCENARIO, &tmp.path().join("served"), &[]);
    let long: Vec<u32> = vec![1; 300];
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "malformed JSON",
            b"{\"prompt\": [1, 2".to_vec(),
            400,
            "not a completions request",
        ),
        (
            "too-long prompt",
            serde_json::json!({"prompt": long, "max_tokens": 4})
                .to_string()
                .into_bytes(),
            400,
            "maximum context length",
        ),
        (
            "max_tokens 0",
            br#"{"prompt": [1, 2], "max_tokens": 0}"#.to_vec(),
            400,
            "max_tokens",
        ),
        (
            "a token outside the vocabulary",
            br#"{"prompt": [1, 99999]}"#.to_vec(),
            400,
            "prompt[1]",
        ),
        (
            "unknown model",
            br#"{"prompt": [1], "model": "x"}"#.to_vec(),
            400,
            "model",
        ),
    ];
    for (what, body, status, needle) in cases {
        let a = request(&server.addr, "POST", "/v1/completions", &body);
        assert_eq!(a.status, status, "{what}: {}", a.body);
        let v: serde_json::Value = serde_json::from_str(&a.body).expect("JSON error body");
        let msg = v["error"]["message"].as_str().expect("a message");
        assert!(msg.contains(needle), "{what}: {msg}");
    }
    // A body declared over the cap is refused before it is read (only the head is sent: a
    // server that closes on unread bytes would reset the connection under the answer).
    let mut s = std::net::TcpStream::connect(&server.addr).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    std::io::Write::write_all(
        &mut s,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n",
    )
    .expect("write");
    let a = read_answer(s);
    assert_eq!(a.status, 413, "{}", a.body);
    assert!(a.body.contains("request body over"), "{}", a.body);
    let a = request(&server.addr, "GET", "/nowhere", b"");
    assert_eq!(a.status, 404);
    let a = request(&server.addr, "GET", "/v1/models", b"");
    let v: serde_json::Value = serde_json::from_str(&a.body).expect("models JSON");
    assert_eq!(v["data"][0]["max_model_len"], 256);
    assert_eq!(request(&server.addr, "GET", "/health", b"").status, 200);
    let ok = br#"{"prompt": [1, 2, 3], "max_tokens": 3}"#;
    let a = request(&server.addr, "POST", "/v1/completions", ok);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(tokens_of(&a, 1).0[0].len(), 3);
    let m = metrics(&server.addr);
    assert_eq!(metric(&m, "kvbench:requests_refused_total"), 7.0);
    let (code, err) = server.stop();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(server.summary()["served"]["refused"], 7);
}

#[test]
fn a_slow_body_is_answered_not_waited_for_forever() {
    // Headers promise a body that never comes: the server answers (408) within its body
    // deadline instead of holding the connection; the test's own deadline bounds the wait.
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Served::start(
        SCENARIO,
        &tmp.path().join("served"),
        &["--read-timeout-s", "0.5"],
    );
    let mut s = std::net::TcpStream::connect(&server.addr).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    std::io::Write::write_all(
        &mut s,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
    )
    .expect("write");
    let a = read_answer(s);
    assert_eq!(a.status, 408, "{}", a.body);
    let (code, err) = server.stop();
    assert_eq!(code, Some(0), "{err}");
}
