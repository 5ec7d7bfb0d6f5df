//! Directed behaviour of the contiguous baseline (first fit, coalescing, fork by copy, fences,
//! planted faults) and of the factory that builds either mode.

use kvbench::cache::{build, CacheSpec};
use kvbench_baselines::manager::ContiguousCache;
use kvbench_cache_api::{
    AllocError, CacheMode, CopyOp, Fault, KvCacheManager, ReleaseReason, SeqLayout, StartRequest,
};

fn ok(m: &dyn KvCacheManager) {
    if let Err(e) = m.check_invariants() {
        panic!("invariants: {e}");
    }
}

#[test]
fn contiguous_first_fit_coalescing_and_fragmentation() {
    let mut m = ContiguousCache::new(100);
    for (seq, reserve) in [(1u64, 30u32), (2, 20), (3, 30)] {
        m.start(&StartRequest {
            seq,
            tokens: &[1, 2],
            scope: None,
            reserve_tokens: reserve,
        })
        .unwrap();
    }
    m.release(2, ReleaseReason::Finish).unwrap();
    assert_eq!(
        m.largest_free_extent(),
        20,
        "the hole and the tail are both 20"
    );
    m.release(1, ReleaseReason::Finish).unwrap();
    assert_eq!(m.largest_free_extent(), 50, "the freed neighbours coalesce");
    m.start(&StartRequest {
        seq: 4,
        tokens: &[1],
        scope: None,
        reserve_tokens: 45,
    })
    .unwrap();
    assert_eq!(
        m.layout(4),
        Some(SeqLayout::Contiguous {
            base_slot: 0,
            capacity_tokens: 45
        })
    );
    let err = m
        .start(&StartRequest {
            seq: 5,
            tokens: &[1],
            scope: None,
            reserve_tokens: 30,
        })
        .unwrap_err();
    assert_eq!(
        err,
        AllocError::NoSpace {
            needed_slots: 30,
            available_slots: 20
        }
    );
    assert_eq!(m.reservation(4), Some(45));
    ok(&m);
}

#[test]
fn contiguous_fork_copies_and_append_stops_at_the_reservation() {
    let mut m = ContiguousCache::new(20);
    m.start(&StartRequest {
        seq: 1,
        tokens: &[1, 2, 3],
        scope: None,
        reserve_tokens: 4,
    })
    .unwrap();
    m.fill(1, 3).unwrap();
    assert_eq!(
        m.fork(1, 2).unwrap(),
        vec![CopyOp {
            src_slot: 0,
            dst_slot: 4,
            len_tokens: 3
        }]
    );
    assert_eq!(m.append(1).unwrap(), vec![]);
    assert_eq!(m.append_cost(1), 1);
    assert!(matches!(m.append(1), Err(AllocError::NoSpace { .. })));
    let acc = m.accounting();
    assert_eq!(
        (acc.live_slots, acc.allocated_unfilled_slots, acc.free_slots),
        (7, 1, 12)
    );
    let step = m.begin_step();
    m.release(1, ReleaseReason::Cancel).unwrap();
    m.release(2, ReleaseReason::Cancel).unwrap();
    assert_eq!(m.accounting().pending_free_slots, 8);
    assert!(m.assert_quiescent().is_err());
    m.retire_step(step);
    ok(&m);
    m.assert_quiescent().unwrap();
    assert_eq!(m.largest_free_extent(), 20);
}

#[test]
fn planted_faults_are_caught_contiguous() {
    let mut m = ContiguousCache::new(10);
    m.inject_fault(Fault::Leak);
    m.start(&StartRequest {
        seq: 1,
        tokens: &[1],
        scope: None,
        reserve_tokens: 4,
    })
    .unwrap();
    m.release(1, ReleaseReason::Finish).unwrap();
    assert!(m
        .check_invariants()
        .unwrap_err()
        .contains("belong to nothing"));
    assert!(m.assert_quiescent().is_err());

    let mut m = ContiguousCache::new(4);
    m.inject_fault(Fault::EarlyReuse);
    m.start(&StartRequest {
        seq: 1,
        tokens: &[1],
        scope: None,
        reserve_tokens: 4,
    })
    .unwrap();
    let _step = m.begin_step();
    m.release(1, ReleaseReason::Cancel).unwrap();
    m.start(&StartRequest {
        seq: 2,
        tokens: &[1],
        scope: None,
        reserve_tokens: 4,
    })
    .unwrap();
    assert!(m.check_invariants().unwrap_err().contains("fenced"));

    let mut m = ContiguousCache::new(8);
    m.inject_fault(Fault::BadBlockTable);
    m.start(&StartRequest {
        seq: 1,
        tokens: &[1],
        scope: None,
        reserve_tokens: 4,
    })
    .unwrap();
    assert!(m.check_invariants().unwrap_err().contains("layout"));
}

#[test]
fn factory_builds_both_modes() {
    let p = build(&CacheSpec::new(CacheMode::Paged, 100, 16, true));
    assert_eq!(
        (p.mode(), p.block_size(), p.accounting().total_slots),
        (CacheMode::Paged, 16, 96)
    );
    let c = build(&CacheSpec::new(CacheMode::Contiguous, 100, 16, true));
    assert_eq!(
        (c.mode(), c.block_size(), c.accounting().total_slots),
        (CacheMode::Contiguous, 1, 100)
    );
}
