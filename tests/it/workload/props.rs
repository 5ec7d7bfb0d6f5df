//! The workload generator's distributions, clamps, shares and determinism.
//!
//! Statistical checks draw 10k requests and allow at least four standard errors, so they pass for
//! any seed with overwhelming probability. The seed is printed; replay one with KVBENCH_SEED=N.

use std::path::Path;

use kvbench::scenario::{self, Scenario};
use kvbench::workload::{self, CancelPoint, Summary, Workload, WorkloadError};

fn seed() -> u64 {
    let s = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_261_129);
    eprintln!("seed {s} (replay with KVBENCH_SEED={s})");
    s
}

const BASE: &str = r#"
name = "props"
device = "cpu"

[model]
preset = "tiny"

[memory]
kv_budget = "1 GiB"

[cache]
block_size = 16
max_seq_len = 100000

[traffic]
requests = 10000
arrival = { kind = "poisson", rate_per_s = 50.0 }
prompt_tokens = { dist = "fixed", value = 1 }
output_tokens = { dist = "fixed", value = 1 }
"#;

fn scenario(overrides: &[&str]) -> Scenario {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    scenario::parse_str(BASE, None, &o).unwrap_or_else(|e| panic!("{e}"))
}

fn gen(s: &Scenario, seed: u64) -> Workload {
    workload::generate(s, seed).unwrap_or_else(|e| panic!("{e}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn gaps(w: &Workload) -> Vec<f64> {
    w.requests
        .windows(2)
        .map(|p| p[1].arrival_ms - p[0].arrival_ms)
        .collect()
}

fn mean_cv(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64;
    (m, var.sqrt() / m)
}

#[test]
fn lognormal_median_within_tolerance() {
    let s =
        scenario(&["traffic.prompt_tokens={ dist = \"lognormal\", median = 600.0, sigma = 0.8 }"]);
    let w = gen(&s, seed());
    let m = median(
        w.requests
            .iter()
            .map(|r| r.prompt.len_tokens() as f64)
            .collect(),
    );
    assert!((m / 600.0 - 1.0).abs() < 0.05, "median {m}");
}

#[test]
fn poisson_mean_gap_and_cv() {
    let w = gen(&scenario(&[]), seed());
    let (mean, cv) = mean_cv(&gaps(&w));
    // 50 req/s → 20 ms mean gap; exponential gaps have CV 1.
    assert!((mean / 20.0 - 1.0).abs() < 0.05, "mean gap {mean}");
    assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
    assert_eq!(w.requests[0].arrival_ms, 0.0);
    assert!(w
        .requests
        .windows(2)
        .all(|p| p[0].arrival_ms <= p[1].arrival_ms));
}

#[test]
fn gamma_shape_sets_the_cv() {
    let w = gen(
        &scenario(&["traffic.arrival={ kind = \"gamma\", rate_per_s = 50.0, shape = 0.25 }"]),
        seed(),
    );
    let (mean, cv) = mean_cv(&gaps(&w));
    // Shape k: CV = 1/sqrt(k) = 2 at k = 0.25; the mean stays 1/rate.
    assert!((mean / 20.0 - 1.0).abs() < 0.1, "mean gap {mean}");
    assert!((cv / 2.0 - 1.0).abs() < 0.1, "cv {cv}");
}

#[test]
fn clamps_are_respected() {
    for dist in [
        "{ dist = \"lognormal\", median = 50.0, sigma = 2.0, min = 10, max = 90 }",
        "{ dist = \"normal\", mean = 50.0, std = 100.0, min = 10, max = 90 }",
        "{ dist = \"zipf\", n = 1000, s = 1.2, scale = 3.0, min = 10, max = 90 }",
        "{ dist = \"uniform\", min = 10, max = 90 }",
    ] {
        let s = scenario(&[
            "traffic.requests=2000",
            &format!("traffic.prompt_tokens={dist}"),
            &format!("traffic.output_tokens={dist}"),
        ]);
        let w = gen(&s, seed());
        let lens: Vec<u32> = w.requests.iter().map(|r| r.prompt.len_tokens()).collect();
        let outs: Vec<u32> = w.requests.iter().map(|r| r.output_tokens).collect();
        for v in lens.iter().chain(&outs) {
            assert!((10..=90).contains(v), "{dist}: {v}");
        }
        // Both clamps are reached by these wide distributions (uniform reaches them exactly).
        assert!(
            lens.iter().any(|&v| v <= 12),
            "{dist}: low end never reached"
        );
        assert!(
            lens.iter().any(|&v| v >= 88),
            "{dist}: high end never reached"
        );
    }
}

#[test]
fn sequences_fit_max_seq_len() {
    let s = scenario(&[
        "cache.max_seq_len=64",
        "traffic.requests=2000",
        "traffic.prompt_tokens={ dist = \"uniform\", min = 1, max = 64 }",
        "traffic.output_tokens={ dist = \"uniform\", min = 1, max = 64 }",
        "traffic.shared_prefix={ groups = 3, prefix_tokens = 20, share = 0.5 }",
    ]);
    let w = gen(&s, seed());
    for r in &w.requests {
        assert!(r.output_tokens >= 1);
        assert!(
            r.prompt.len_tokens() + r.output_tokens <= 64,
            "request {}",
            r.id
        );
    }
}

#[test]
fn shares_are_respected() {
    let s = scenario(&[
        "traffic.shared_prefix={ groups = 4, prefix_tokens = 16, share = 0.3 }",
        "traffic.parallel_sampling={ n = 4, share = 0.2 }",
        "traffic.cancellation={ share = 0.4, when = \"mixed\", delay = { dist = \"fixed\", ms = 5.0 }, after_tokens = { dist = \"fixed\", value = 3 } }",
        "traffic.tenants={ count = 3, shares = [0.5, 0.3, 0.2] }",
        "traffic.output_tokens={ dist = \"fixed\", value = 10 }",
    ]);
    let w = gen(&s, seed());
    let n = w.requests.len() as f64;
    let share = |f: &dyn Fn(&workload::Request) -> bool| {
        w.requests.iter().filter(|r| f(r)).count() as f64 / n
    };
    let close = |got: f64, want: f64, what: &str| {
        assert!((got - want).abs() < 0.02, "{what}: {got} vs {want}");
    };
    close(share(&|r| r.prefix_group.is_some()), 0.3, "prefix");
    close(share(&|r| r.samples == 4), 0.2, "parallel sampling");
    assert!(w.requests.iter().all(|r| r.samples == 1 || r.samples == 4));
    close(share(&|r| r.cancel.is_some()), 0.4, "cancellation");
    for kind in 0..3 {
        let got = share(&|r| match r.cancel {
            Some(CancelPoint::Queued { .. }) => kind == 0,
            Some(CancelPoint::AfterDelay { .. }) => kind == 1,
            Some(CancelPoint::AfterTokens { tokens }) => kind == 2 && tokens == 3,
            None => false,
        });
        close(got, 0.4 / 3.0, "cancel kind");
    }
    for (t, want) in [0.5, 0.3, 0.2].into_iter().enumerate() {
        close(share(&|r| r.tenant == t as u32), want, "tenant");
    }
    for g in 0..4 {
        close(
            share(&|r| r.prefix_group == Some(g)),
            0.3 / 4.0,
            "prefix group",
        );
    }
}

#[test]
fn prefix_groups_share_actual_token_ids_across_tenants() {
    let s = scenario(&[
        "traffic.requests=500",
        "traffic.shared_prefix={ groups = 2, prefix_tokens = 24, share = 1.0 }",
        "traffic.prompt_tokens={ dist = \"fixed\", value = 8 }",
        "traffic.tenants={ count = 2 }",
    ]);
    let seed = seed();
    let w = gen(&s, seed);
    for r in &w.requests {
        let g = r.prefix_group.expect("share 1.0");
        assert_eq!(r.prompt.len_tokens() as usize, 32);
        assert_eq!(
            &r.prompt.tokens()[..24],
            &workload::prefix_tokens(seed, g, 24, 512)[..]
        );
    }
    let a = workload::prefix_tokens(seed, 0, 24, 512);
    let b = workload::prefix_tokens(seed, 1, 24, 512);
    assert_ne!(a, b, "groups must differ");
    // Both tenants use both groups (the cache, not the generator, scopes reuse).
    for t in 0..2 {
        for g in 0..2 {
            assert!(w
                .requests
                .iter()
                .any(|r| r.tenant == t && r.prefix_group == Some(g)));
        }
    }
}

#[test]
fn token_ids_are_below_vocab_and_ids_are_dense() {
    let s = scenario(&["traffic.prompt_tokens={ dist = \"uniform\", min = 1, max = 64 }"]);
    let w = gen(&s, seed());
    for (i, r) in w.requests.iter().enumerate() {
        assert_eq!(r.id, i as u64);
        assert!(r.prompt.tokens().iter().all(|&t| t < 512), "request {i}");
    }
}

#[test]
fn same_seed_same_hash_different_seed_different_hash() {
    let s = scenario(&[
        "traffic.requests=300",
        "traffic.prompt_tokens={ dist = \"lognormal\", median = 20.0, sigma = 1.0 }",
        "traffic.cancellation={ share = 0.3, when = \"after_delay\", delay = { dist = \"exponential\", mean_ms = 10.0 } }",
    ]);
    let seed = seed();
    let a = gen(&s, seed);
    let b = gen(&s, seed);
    assert_eq!(a, b);
    assert_eq!(a.workload_hash, b.workload_hash);
    assert_eq!(a.workload_hash.len(), 64);
    let c = gen(&s, seed.wrapping_add(1));
    assert_ne!(a.workload_hash, c.workload_hash);
    // The hash covers the list: change one token, the hash changes.
    let mut d = a.clone();
    match &mut d.requests[7].prompt {
        workload::Prompt::Explicit(t) => t[0] = (t[0] + 1) % 512,
        other => panic!("a synthetic prompt is explicit, got {other:?}"),
    }
    assert_ne!(
        workload::workload_hash(&d.requests, d.closed_loop.as_ref()),
        a.workload_hash
    );
}

#[test]
fn one_knob_leaves_the_other_streams_alone() {
    let seed = seed();
    let a = gen(&scenario(&["traffic.requests=200"]), seed);
    let b = gen(
        &scenario(&[
            "traffic.requests=200",
            "traffic.cancellation={ share = 0.5, when = \"queued\", delay = { dist = \"fixed\", ms = 1.0 } }",
        ]),
        seed,
    );
    let arrivals = |w: &Workload| w.requests.iter().map(|r| r.arrival_ms).collect::<Vec<_>>();
    assert_eq!(arrivals(&a), arrivals(&b));
    assert_ne!(a.workload_hash, b.workload_hash);
}

#[test]
fn closed_loop_burst_and_duration() {
    let w = gen(
        &scenario(&[
            "traffic.requests=50",
            "traffic.arrival={ kind = \"closed_loop\", clients = 4, think_ms = 2.5 }",
        ]),
        seed(),
    );
    assert_eq!(w.requests.len(), 50);
    assert!(w.requests.iter().all(|r| r.arrival_ms == 0.0));
    let c = w.closed_loop.expect("closed loop");
    assert_eq!((c.clients, c.think_ms), (4, 2.5));

    let w = gen(
        &scenario(&[
            "traffic.requests=20",
            "traffic.arrival={ kind = \"burst\" }",
        ]),
        seed(),
    );
    assert!(w.closed_loop.is_none() && w.requests.iter().all(|r| r.arrival_ms == 0.0));

    // 2 s at 50 req/s: about 100 arrivals, all before 2000 ms.
    let s = scenario(&["traffic.duration_s=2.0"]);
    let mut s = s;
    s.traffic.requests = None;
    let w = gen(&s, seed());
    assert!(w.requests.iter().all(|r| r.arrival_ms < 2000.0));
    assert!(
        (60..=140).contains(&w.requests.len()),
        "{}",
        w.requests.len()
    );
}

#[test]
fn a_missing_trace_file_is_a_clear_error() {
    let mut s = scenario(&[]);
    s.traffic.arrival =
        kvbench::scenario::ArrivalSpec::Trace(kvbench::scenario::TraceSpec::new("t.jsonl"));
    match workload::generate(&s, 1) {
        Err(e @ WorkloadError::Scenario(_)) => {
            let m = e.to_string();
            assert!(
                m.contains("traffic.arrival.path") && m.contains("t.jsonl"),
                "{m}"
            )
        }
        other => panic!("expected a scenario error naming the path, got {other:?}"),
    }
}

#[test]
fn empirical_lengths_come_from_the_csv() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/scenarios/empirical.toml");
    let s = scenario::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
    let w = gen(&s, seed());
    let prompts: std::collections::BTreeSet<usize> = w
        .requests
        .iter()
        .map(|r| r.prompt.len_tokens() as usize)
        .collect();
    let outputs: std::collections::BTreeSet<u32> =
        w.requests.iter().map(|r| r.output_tokens).collect();
    assert_eq!(prompts.into_iter().collect::<Vec<_>>(), vec![10, 20, 30]);
    assert_eq!(outputs.into_iter().collect::<Vec<_>>(), vec![5, 7]);
}

#[test]
fn summary_counts_what_was_generated() {
    let s = scenario(&[
        "traffic.requests=1000",
        "traffic.shared_prefix={ groups = 2, prefix_tokens = 10, share = 1.0 }",
        "traffic.prompt_tokens={ dist = \"fixed\", value = 10 }",
        "traffic.parallel_sampling={ n = 2, share = 1.0 }",
    ]);
    let w = gen(&s, seed());
    let sum = Summary::of(&w, 10);
    assert_eq!(sum.requests, 1000);
    assert_eq!(sum.continuations, 2000);
    assert_eq!(sum.forked_requests, 1000);
    assert_eq!(sum.prefix_groups, 2);
    assert!((sum.shared_prompt_token_share - 0.5).abs() < 1e-12);
    assert_eq!(sum.prompt_tokens.p50, 20);
    let rate = sum.offered_rate_per_s.expect("open loop");
    assert!((rate / 50.0 - 1.0).abs() < 0.1, "{rate}");
}

mod clamp_props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // PROPTEST_CASES sets the number of cases; failures print a replayable seed.
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        fn any_lognormal_respects_its_clamps(
            median in 1.0f64..500.0,
            sigma in 0.0f64..3.0,
            lo in 1u32..50,
            span in 0u32..200,
            seed in any::<u64>(),
        ) {
            let hi = lo + span;
            let s = scenario(&[
                "traffic.requests=200",
                &format!("traffic.prompt_tokens={{ dist = \"lognormal\", median = {median:?}, sigma = {sigma:?}, min = {lo}, max = {hi} }}"),
            ]);
            let w = gen(&s, seed);
            for r in &w.requests {
                prop_assert!((lo..=hi).contains(&(r.prompt.len_tokens())));
            }
        }
    }
}
