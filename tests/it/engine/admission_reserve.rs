//! The admission controller is handed the decode reserve: a new arrival waits while the running
//! sequences need their next blocks, even when the pool could hold its prompt right now.
//!
//! Tight pool: 4 blocks of 16 slots. A (prompt 15, 10 outputs) decodes; in the step where its append fills its
//! first block, its next append needs a fresh block, so the reserve is one block. B (prompt 48,
//! three blocks; 4 outputs) is waiting then: taking the three free blocks would leave A nothing to grow into,
//! so B must wait until A finishes, and nothing is preempted. With a reserve of 0 passed to the
//! controller, B is admitted at once and A's next append preempts it.
//!
//! B's arrival is derived from a run of A alone (sim is deterministic): halfway through A's first
//! step, so B is first considered exactly when that step completes and the next is planned.

use crate::support::engine as engine_support;
use engine_support::{config, req, run, sched, workload};
use kvbench::engine::RunRecord;
use kvbench::scenario::SchedulerSpec;
use kvbench_cache_api::CacheMode;

const BLOCK_SLOTS: u64 = 16;

fn scheduler() -> SchedulerSpec {
    SchedulerSpec {
        watermark: 0.0,
        prefix_cache: false,
        ..sched()
    }
}

/// A alone: the completion time of its first step (its first token), in ns.
fn first_step_end_ns() -> u64 {
    let cfg = config(CacheMode::Paged, scheduler());
    let alone = run(&cfg, &workload(vec![req(0, 0.0, 15, 10)]), 4 * BLOCK_SLOTS);
    alone.streams[0].token_ns[0]
}

fn run_with_b(pool_blocks: u64) -> (RunRecord, u64) {
    let t1_ns = first_step_end_ns();
    assert!(t1_ns > 0, "a step takes time on sim");
    let b_arrival_ms = t1_ns as f64 / 2.0 / 1e6;
    let w = workload(vec![req(0, 0.0, 15, 10), req(1, b_arrival_ms, 48, 4)]);
    let cfg = config(CacheMode::Paged, scheduler());
    (run(&cfg, &w, pool_blocks * BLOCK_SLOTS), t1_ns)
}

#[test]
fn an_arrival_waits_while_a_running_decode_needs_its_next_block() {
    let (r, t1_ns) = run_with_b(4);
    let (a, b) = (&r.streams[0], &r.streams[1]);
    assert_eq!((a.request, b.request), (0, 1));
    assert_eq!(
        a.preemptions + b.preemptions,
        0,
        "the reserve kept A's next block free"
    );
    let b_admitted = b.admitted_ns.expect("B ran");
    assert!(
        b_admitted >= a.finish_ns,
        "B admitted at {b_admitted} ns, before A finished at {} ns (first considered at {t1_ns} ns)",
        a.finish_ns
    );
}

#[test]
fn with_room_for_both_the_same_arrival_is_admitted_at_once() {
    // Control: the wait above is the reserve's doing. With 6 blocks, A (2 blocks at most) and B
    // (4: a 48-token prompt and 4 outputs) both fit, so B starts when first considered.
    let (r, t1_ns) = run_with_b(6);
    let b = &r.streams[1];
    assert_eq!(b.admitted_ns, Some(t1_ns));
    assert!(r.streams.iter().all(|s| s.preemptions == 0));
}
