//! The engine on hand-built request lists: completion, rejection, preemption (recompute and swap),
//! asynchronous steps, parallel sampling, closed loop, policies and tenant fairness. Every run ends
//! with the reclamation check.

use crate::support::engine as engine_support;

use engine_support::*;
use kvbench::engine::{RunRecord, StreamStatus, TraceKind};
use kvbench::model::ModelShape;
use kvbench::scenario::{PolicyName, PreemptionMode, SchedulerSpec};
use kvbench::workload::{ClosedLoop, Request};
use kvbench_cache_api::CacheMode;

#[test]
fn every_request_completes_with_its_exact_output_and_ordered_times() {
    let w = workload(
        (0..12)
            .map(|i| req(i, i as f64 * 3.0, 20 + 9 * i as u32, 5 + i as u32))
            .collect(),
    );
    for r in both(sched(), &w, 8192) {
        assert_eq!(count(&r, StreamStatus::Completed), 12);
        for (s, q) in r.streams.iter().zip(&w.requests) {
            assert_eq!(s.token_ns.len() as u32, q.output_tokens, "request {}", q.id);
            assert!(
                s.token_ns.windows(2).all(|p| p[0] < p[1]),
                "token times must increase"
            );
            let admitted = s.admitted_ns.expect("admitted");
            assert!(s.arrival_ns <= admitted && admitted < s.token_ns[0]);
            assert_eq!(s.finish_ns, *s.token_ns.last().expect("tokens"));
            assert_eq!(
                s.intended_arrival_ns, s.arrival_ns,
                "open loop: no coordinated omission"
            );
        }
    }
}

#[test]
fn too_long_requests_are_rejected_identically_in_both_modes() {
    let w = workload(vec![
        req(0, 0.0, 100, 10),
        req(1, 1.0, 1000, 100),
        req(2, 2.0, 50, 10),
    ]);
    let runs = both(sched(), &w, 8192);
    for r in &runs {
        let statuses: Vec<_> = r.streams.iter().map(|s| s.status).collect();
        assert_eq!(
            statuses,
            [
                StreamStatus::Completed,
                StreamStatus::Rejected,
                StreamStatus::Completed
            ]
        );
        assert!(r.streams[1].token_ns.is_empty() && r.streams[1].admitted_ns.is_none());
        assert_eq!(events(r, "reject"), 1);
    }
}

#[test]
fn recompute_preemption_under_pressure_completes_everything() {
    // 8 sequences of up to 220 tokens against 640 slots: they cannot all grow at once.
    let w = workload((0..8).map(|i| req(i, 0.0, 100, 120)).collect());
    let r = run(&config(CacheMode::Paged, sched()), &w, 640);
    assert_eq!(count(&r, StreamStatus::Completed), 8);
    let preemptions: u32 = r.streams.iter().map(|s| s.preemptions).sum();
    assert!(
        preemptions > 0,
        "the pool is too small for all eight: expected preemptions"
    );
    assert!(r.streams.iter().map(|s| s.recomputed_tokens).sum::<u64>() > 0);
    assert_eq!(events(&r, "preempt"), preemptions as usize);
    for s in &r.streams {
        assert_eq!(s.token_ns.len(), 120);
    }
}

#[test]
fn the_victim_is_the_newest_admitted_sequence() {
    let w = workload((0..8).map(|i| req(i, i as f64 * 0.001, 100, 120)).collect());
    let r = run(&config(CacheMode::Paged, sched()), &w, 640);
    let first = r
        .events
        .iter()
        .find(|e| e.kind.name() == "preempt")
        .expect("a preemption");
    let victim = &r.streams[first.stream as usize];
    let running_then: Vec<_> = r
        .streams
        .iter()
        .filter(|s| s.admitted_ns.is_some_and(|a| a <= first.t_ns) && s.finish_ns > first.t_ns)
        .collect();
    let newest = running_then
        .iter()
        .map(|s| s.admitted_ns)
        .max()
        .expect("running");
    assert_eq!(
        victim.admitted_ns, newest,
        "victim must be the newest admitted"
    );
}

#[test]
fn swap_preemption_moves_bytes_out_and_back() {
    let s = SchedulerSpec {
        preemption: PreemptionMode::Swap,
        ..sched()
    };
    let w = workload((0..8).map(|i| req(i, 0.0, 100, 120)).collect());
    let r = run(&config(CacheMode::Paged, s), &w, 640);
    assert_eq!(count(&r, StreamStatus::Completed), 8);
    let outs = events(&r, "swap_out");
    assert!(outs > 0, "expected swaps");
    assert_eq!(
        outs,
        events(&r, "swap_in"),
        "every swapped sequence comes back"
    );
    let swapped: u64 = r.streams.iter().map(|s| s.swapped_bytes).sum();
    let kvb = ModelShape::tiny().kv_bytes_per_token();
    assert_eq!(swapped % kvb, 0);
    assert!(swapped > 0);
}

#[test]
fn async_steps_defer_releases_past_the_in_flight_step() {
    let s = SchedulerSpec {
        async_steps: true,
        ..sched()
    };
    let w = workload(
        (0..16)
            .map(|i| req(i, i as f64 * 0.5, 40, 10 + (i as u32 % 5)))
            .collect(),
    );
    for r in both(s, &w, 4096) {
        assert_eq!(count(&r, StreamStatus::Completed), 16);
        assert!(
            r.steps.iter().any(|s| s.accounting.pending_free_slots > 0),
            "{:?}: some release should wait for its fence",
            r.end.mode
        );
    }
}

#[test]
fn parallel_sampling_forks_continuations_that_share_the_first_token_time() {
    let mut q = req(0, 0.0, 64, 12);
    q.samples = 3;
    let w = workload(vec![q, req(1, 0.0, 30, 5)]);
    for r in both(sched(), &w, 4096) {
        let fam: Vec<_> = r.streams.iter().filter(|s| s.request == 0).collect();
        assert_eq!(fam.len(), 3);
        for s in &fam {
            assert_eq!(s.status, StreamStatus::Completed);
            assert_eq!(s.token_ns.len(), 12);
            assert_eq!(
                s.token_ns[0], fam[0].token_ns[0],
                "continuations fork at the first token"
            );
        }
        assert_eq!(fam[2].request_label(), "0.2");
    }
}

#[test]
fn closed_loop_keeps_at_most_clients_requests_in_the_system() {
    let mut w = workload((0..10).map(|i| req(i, 0.0, 30, 6)).collect());
    w.closed_loop = Some(ClosedLoop {
        clients: 2,
        think_ms: 5.0,
    });
    for r in both(sched(), &w, 4096) {
        assert_eq!(count(&r, StreamStatus::Completed), 10);
        for s in &r.streams {
            let overlapping = r
                .streams
                .iter()
                .filter(|o| o.arrival_ns <= s.arrival_ns && o.finish_ns > s.arrival_ns)
                .count();
            assert!(
                overlapping <= 2,
                "{overlapping} requests in flight at {}",
                s.arrival_ns
            );
        }
        let mut finishes: Vec<u64> = r.streams.iter().map(|s| s.finish_ns).collect();
        finishes.sort_unstable();
        for s in r.streams.iter().skip(2) {
            assert!(
                finishes.contains(&(s.arrival_ns - 5_000_000)),
                "arrival {} is not a finish + think",
                s.arrival_ns
            );
        }
    }
}

#[test]
fn decode_first_chunks_long_prompts_and_prefill_first_runs_them_whole() {
    let w = workload(vec![req(0, 0.0, 40, 30), req(1, 1.0, 300, 4)]);
    let chunks = |r: &RunRecord, s: usize| {
        r.events
            .iter()
            .filter(|e| e.stream == s as u32 && matches!(e.kind, TraceKind::PrefillChunk { .. }))
            .count()
    };
    let decode_first = run(
        &config(
            CacheMode::Paged,
            SchedulerSpec {
                max_tokens_per_step: 128,
                ..sched()
            },
        ),
        &w,
        4096,
    );
    assert_eq!(
        chunks(&decode_first, 1),
        3,
        "300 tokens at most 127 a step beside one decode"
    );
    let pf = SchedulerSpec {
        policy: PolicyName::PrefillFirst,
        max_tokens_per_step: 128,
        ..sched()
    };
    let prefill_first = run(&config(CacheMode::Paged, pf), &w, 4096);
    assert_eq!(chunks(&prefill_first, 1), 1);
    // The whole prompt stalls request 0's decodes: its largest gap grows.
    let max_gap = |r: &RunRecord| {
        r.streams[0]
            .token_ns
            .windows(2)
            .map(|p| p[1] - p[0])
            .max()
            .unwrap_or(0)
    };
    assert!(max_gap(&prefill_first) > max_gap(&decode_first));
}

#[test]
fn tenant_fairness_admits_round_robin() {
    let mut reqs: Vec<Request> = (0..6).map(|i| req(i, 0.0, 20, 3)).collect();
    for r in reqs.iter_mut().skip(4) {
        r.tenant = 1;
    }
    let w = workload(reqs);
    let order = |fair: bool| {
        let s = SchedulerSpec {
            tenant_fairness: fair,
            max_seqs_per_step: 1,
            ..sched()
        };
        let r = run(&config(CacheMode::Paged, s), &w, 4096);
        let mut by: Vec<(u64, u64)> = r
            .streams
            .iter()
            .map(|s| (s.admitted_ns.expect("admitted"), s.request))
            .collect();
        by.sort_unstable();
        by.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
    };
    assert_eq!(order(false), [0, 1, 2, 3, 4, 5]);
    assert_eq!(order(true), [0, 4, 1, 5, 2, 3]);
}
