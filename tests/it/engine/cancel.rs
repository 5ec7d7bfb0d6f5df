//! Cancellation at every lifecycle point — queued, mid-prefill, mid-decode, preempted, swapped,
//! before a continuation forks — in both cache modes, synchronous and pipelined: everything a
//! cancelled stream held comes back, and no token is emitted after its cancel.

use crate::support::engine as engine_support;

use engine_support::*;
use kvbench::engine::{StreamStatus, TraceKind};
use kvbench::scenario::{PreemptionMode, SchedulerSpec};
use kvbench::workload::{CancelPoint, Request};

#[test]
fn cancellation_at_every_lifecycle_point_releases_everything() {
    for async_steps in [false, true] {
        for preemption in [PreemptionMode::Recompute, PreemptionMode::Swap] {
            let s = SchedulerSpec {
                async_steps,
                preemption,
                max_tokens_per_step: 64,
                ..sched()
            };
            let mut reqs: Vec<Request> = (0..24)
                .map(|i| req(i, (i / 4) as f64, 60 + 10 * (i as u32 % 4), 40))
                .collect();
            for (i, r) in reqs.iter_mut().enumerate() {
                r.cancel = match i % 4 {
                    0 => Some(CancelPoint::Queued { after_ms: 0.5 }),
                    1 => Some(CancelPoint::AfterDelay {
                        after_ms: 0.2 + i as f64 * 0.3,
                    }),
                    2 => Some(CancelPoint::AfterTokens { tokens: 3 }),
                    _ => None,
                };
            }
            let w = workload(reqs);
            for r in both(s.clone(), &w, 700) {
                let cancelled = count(&r, StreamStatus::Cancelled);
                assert!(
                    cancelled >= 6,
                    "{:?} async={async_steps}: {cancelled} cancelled",
                    r.end.mode
                );
                for (st, q) in r.streams.iter().zip(&w.requests) {
                    match q.cancel {
                        Some(CancelPoint::AfterTokens { tokens }) => {
                            assert_eq!(st.status, StreamStatus::Cancelled);
                            assert_eq!(st.token_ns.len() as u32, tokens);
                        }
                        None => assert_eq!(st.status, StreamStatus::Completed),
                        _ => {}
                    }
                    if st.status == StreamStatus::Cancelled {
                        assert!(
                            st.token_ns.iter().all(|&t| t <= st.finish_ns),
                            "no token after the cancel"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn cancellations_land_at_every_lifecycle_point_and_release_everything() {
    let mut seen = std::collections::BTreeSet::new();
    for preemption in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        for (async_steps, k) in [
            (false, 1.37),
            (true, 1.37),
            (false, 0.53),
            (true, 2.9),
            (false, 4.1),
        ] {
            let s = SchedulerSpec {
                async_steps,
                preemption,
                max_tokens_per_step: 48,
                max_seqs_per_step: 16,
                ..sched()
            };
            // A tight pool (preemptions), long prompts in small chunks (mid-prefill), forks.
            let reqs: Vec<Request> = (0..40)
                .map(|i| {
                    let mut r = req(i, (i / 20) as f64 * 2.0, 40 + 23 * (i as u32 % 5), 80);
                    r.samples = if i % 7 == 0 { 3 } else { 1 };
                    r.cancel = Some(CancelPoint::AfterDelay {
                        after_ms: 0.05 + (i as f64 * k) % 30.0,
                    });
                    r
                })
                .collect();
            let w = workload(reqs);
            for r in both(s.clone(), &w, 700) {
                for e in &r.events {
                    if let TraceKind::Cancel { during } = e.kind {
                        seen.insert(during);
                    }
                }
            }
        }
    }
    for point in [
        "queued",
        "prefill",
        "decode",
        "preempted",
        "swapped",
        "pending",
    ] {
        assert!(
            seen.contains(point),
            "no cancellation while {point}: saw {seen:?}"
        );
    }
}
