//! Duration ends at the last real event: a cancellation timer whose request already finished (or
//! was admitted, for a queued-only cancellation) never advances the clock — in every mode
//! (synchronous and pipelined steps, recompute and swap, open and closed loop). Every throughput
//! figure divides by this duration.

use crate::support::engine as engine_support;

use engine_support::*;
use kvbench::engine::{RunRecord, StreamStatus};
use kvbench::scenario::{PreemptionMode, SchedulerSpec};
use kvbench::workload::{CancelPoint, ClosedLoop, Request};

/// The latest moment anything happened to a stream: a token, a finish or cancel, an arrival.
fn last_event_ns(r: &RunRecord) -> u64 {
    let streams = r.streams.iter().map(|s| {
        let last_token = s.token_ns.last().copied().unwrap_or(0);
        last_token.max(s.finish_ns).max(s.arrival_ns)
    });
    let steps = r.steps.iter().map(|s| s.end_ns);
    streams.chain(steps).max().unwrap_or(0)
}

fn requests_with_dead_timers() -> Vec<Request> {
    (0..40)
        .map(|i| {
            let mut r = req(i, i as f64 * 0.5, 32 + (i as u32 % 5) * 8, 12);
            r.cancel = match i % 3 {
                // 60 s after arrival: every request is long finished by then.
                0 => Some(CancelPoint::AfterDelay { after_ms: 60_000.0 }),
                // Queued-only, due long after admission.
                1 => Some(CancelPoint::Queued { after_ms: 90_000.0 }),
                _ => None,
            };
            r
        })
        .collect()
}

fn modes() -> Vec<SchedulerSpec> {
    let mut out = Vec::new();
    for async_steps in [false, true] {
        for preemption in [PreemptionMode::Recompute, PreemptionMode::Swap] {
            out.push(SchedulerSpec {
                async_steps,
                preemption,
                max_tokens_per_step: 128,
                ..sched()
            });
        }
    }
    out
}

fn assert_duration_is_last_event(r: &RunRecord, what: &str) {
    assert_eq!(
        count(r, StreamStatus::Completed),
        r.streams.len(),
        "{what}: no timer may fire"
    );
    let last = last_event_ns(r);
    assert_eq!(
        r.end.end_ns, last,
        "{what}: duration must end at the last event"
    );
    assert!(
        r.end.end_ns < 30_000_000_000,
        "{what}: end {} ns",
        r.end.end_ns
    );
}

#[test]
fn dead_cancellation_timers_never_extend_the_run() {
    for s in modes() {
        let w = workload(requests_with_dead_timers());
        for r in both(s.clone(), &w, 4096) {
            assert_duration_is_last_event(&r, &format!("{:?} {s:?}", r.end.mode));
        }
    }
}

#[test]
fn dead_timers_in_a_closed_loop_never_extend_the_run() {
    for s in modes() {
        let mut w = workload(requests_with_dead_timers());
        w.closed_loop = Some(ClosedLoop {
            clients: 4,
            think_ms: 1.0,
        });
        for r in both(s.clone(), &w, 4096) {
            assert_duration_is_last_event(&r, &format!("closed loop {:?} {s:?}", r.end.mode));
        }
    }
}

#[test]
fn a_live_timer_still_ends_the_run_at_its_cancellation() {
    // One request whose prompt never fits alongside nothing else is irrelevant here: a queued
    // request behind a full pool is cancelled by its timer, and that cancellation is the run's
    // last event when it comes after the last step.
    let mut reqs: Vec<Request> = (0..3).map(|i| req(i, 0.0, 200, 200)).collect();
    reqs[2].cancel = Some(CancelPoint::Queued { after_ms: 1.0 });
    let w = workload(reqs);
    let s = SchedulerSpec {
        max_seqs_per_step: 1,
        ..sched()
    };
    for r in both(s, &w, 1024) {
        assert_eq!(
            r.streams[2].status,
            StreamStatus::Cancelled,
            "{:?}",
            r.end.mode
        );
        assert_eq!(r.end.end_ns, last_event_ns(&r), "{:?}", r.end.mode);
    }
}
