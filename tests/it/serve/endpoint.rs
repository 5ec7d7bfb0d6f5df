//! The two ends together: `kvbench serve` driven by `run --endpoint` (the library's
//! `endpoint::run`), the scenario with forks, shared prefixes, cancellations and two tenants.
//! Every stream that completed on both sides carries the tokens of an in-process run of the
//! same request list; a cancelled one a prefix of them; the server's prefix counters as the
//! client scraped them equal the server's own results folder; the server ends reclaimed.

use std::collections::BTreeMap;

use kvbench::backend::BackendKind;
use kvbench::endpoint::{self, EndpointOptions};
use kvbench::experiment::{self, RunOptions};

use super::client::{repo, Served};

const SCENARIO: &str = "scenarios/quick-mixed.toml";

#[test]
fn run_endpoint_against_serve_gives_the_in_process_tokens_and_the_servers_own_counters() {
    let s = kvbench::scenario::load(&repo().join(SCENARIO), &["traffic.requests=16".into()])
        .expect("quick-mixed loads");
    let opts = RunOptions {
        backend: BackendKind::Cpu,
        ..RunOptions::default()
    };
    let exp = experiment::run_scenario(&s, &opts).expect("in-process run");
    let record = exp.runs[0].record.as_ref().expect("collected");
    let expected: BTreeMap<(u64, u32), Vec<u32>> = record
        .streams
        .iter()
        .map(|st| ((st.request, st.rank), st.token_ids.clone()))
        .collect();

    let tmp = tempfile::tempdir().expect("tempdir");
    let mut server = Served::start(SCENARIO, &tmp.path().join("served"), &[]);
    let out = tmp.path().join("endpoint");
    let run = endpoint::run(
        &s,
        &EndpointOptions::new(&format!("http://{}", server.addr)),
        &out,
        false,
    )
    .expect("endpoint run");
    let (code, err) = server.stop();
    assert_eq!(code, Some(0), "{err}");

    let info = &run.summary.endpoint;
    assert!(!info.partial, "{:?}", info.stopped_because);
    assert_eq!(info.requests_not_sent, 0);
    assert_eq!(info.flagged_requests, 0, "{:?}", info.flags);
    assert_eq!(run.summary.workload_hash, exp.workload.workload_hash);

    let mut compared = 0;
    for ((request, rank), got) in &run.token_ids {
        let want = &expected[&(*request, *rank)];
        let n = got.len().min(want.len());
        assert_eq!(
            got[..n],
            want[..n],
            "request {request} choice {rank}: served vs in-process tokens"
        );
        if got.len() == want.len() && !got.is_empty() {
            compared += 1;
        }
    }
    assert!(
        compared >= 8,
        "{compared} of {} streams carried every token on both sides",
        run.token_ids.len()
    );

    // What the client scraped from /metrics over the run is what the server's folder states.
    let served = server.summary();
    let pc = &served["runs"][0]["prefix_cache"];
    let scraped = info.server_metrics.as_ref().expect("/metrics scraped");
    assert_eq!(
        scraped.prefix_hit_tokens,
        pc["hit_tokens"].as_f64(),
        "{pc} vs {scraped:?}"
    );
    assert_eq!(scraped.prefix_query_tokens, pc["lookup_tokens"].as_f64());
    assert!(
        pc["hit_tokens"].as_f64().unwrap_or(0.0) > 0.0,
        "shared prefixes hit: {pc}"
    );
    // The counters count a preempted request's lookups again; the share at admission (each
    // answer's cached_tokens) is the one the bounds are read against. The client sees every
    // request's hit but those of requests it cancelled before their first chunk, so its sum lies
    // between the server folder's admission hits less its cancelled requests' and all of them.
    let lookup = pc["bounds"]["lookup_tokens"]
        .as_f64()
        .expect("lookup_tokens");
    let admission = run
        .summary
        .prefix_cache
        .admission_hit_share
        .expect("cached_tokens");
    let client_hits = (admission * lookup).round() as u64;
    let served_hits = pc["request_hit_tokens"]
        .as_u64()
        .expect("request_hit_tokens");
    let csv = std::fs::read_to_string(server.out.join("requests.csv")).expect("requests.csv");
    let mut rows = csv.lines();
    let header: Vec<&str> = rows.next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (parent, cached, status) = (col("parent_id"), col("cached_prompt_tokens"), col("status"));
    let cancelled_hits: u64 = rows
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[parent].is_empty() && f[status] == "cancelled")
        .map(|f| f[cached].parse::<u64>().expect("cached_prompt_tokens"))
        .sum();
    assert!(
        served_hits - cancelled_hits.min(served_hits) <= client_hits && client_hits <= served_hits,
        "client {client_hits}, server {served_hits}, of cancelled requests {cancelled_hits}"
    );
    let ceiling = pc["bounds"]["ceiling_hit_rate"].as_f64().expect("ceiling");
    assert!(
        admission <= ceiling + 1e-12,
        "{admission} > ceiling {ceiling}"
    );
    assert_eq!(served["runs"][0]["reclamation"]["ok"], true, "{served}");
    assert_eq!(served["runs"][0]["invariants"]["ok"], true, "{served}");
}
