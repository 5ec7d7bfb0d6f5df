//! The tier lifecycle through the paged manager's API: an evicted device block is offloaded
//! before its reuse, a later start finds it in the host tier (verified like a device hit),
//! onloads it into a fresh device block and pins the slot until the step retires.

use kvbench_cache_api::{
    BlockLoc, KvCacheManager, OffloadMode, ReleaseReason, ReuseScope, ScopeKey, StartRequest, Tier,
    TierOp,
};

use super::TierConfig;
use crate::cache::{EvictionPolicy, PagedCache, PagedConfig, Placement};

const BS: u32 = 4;

fn scope(tenant: u32) -> ScopeKey {
    ScopeKey {
        model: "m".into(),
        tokenizer: "t".into(),
        reuse: ReuseScope::Tenant(tenant),
    }
}

fn cache(device_blocks: u32, host: u32, disk: u32, offload: OffloadMode) -> PagedCache {
    PagedCache::with_tiers(
        PagedConfig {
            total_blocks: device_blocks,
            block_size: BS,
            prefix_cache: true,
            placement: Placement::Lifo,
        },
        EvictionPolicy::Lru,
        TierConfig {
            host_blocks: host,
            disk_blocks: disk,
            offload,
            ..TierConfig::default()
        },
    )
}

/// Start, fully fill and finish `seq` with prompt `tokens` in one step; returns the ops drained
/// for that step.
fn serve(c: &mut PagedCache, seq: u64, tokens: &[u32], s: &ScopeKey) -> (Vec<TierOp>, u32) {
    let started = c
        .start(&StartRequest {
            seq,
            tokens,
            scope: Some(s),
            reserve_tokens: tokens.len() as u32,
        })
        .expect("fits");
    let rest = tokens.len() as u32 - started.cached_tokens;
    c.fill(seq, rest).expect("fill");
    let mut ops = Vec::new();
    c.drain_tier_ops(&mut ops);
    let step = c.begin_step();
    c.release(seq, ReleaseReason::Finish).expect("release");
    c.retire_step(step);
    c.check_invariants().expect("invariants");
    (
        ops,
        started.tier_hits.host_tokens + started.tier_hits.disk_tokens,
    )
}

fn dev(slot: u32) -> BlockLoc {
    BlockLoc {
        tier: Tier::Device,
        slot,
    }
}
fn host(slot: u32) -> BlockLoc {
    BlockLoc {
        tier: Tier::Host,
        slot,
    }
}

#[test]
fn an_evicted_block_is_offloaded_then_onloaded_from_the_host() {
    let s = scope(0);
    let mut c = cache(3, 4, 0, OffloadMode::OnEvict);
    let a: Vec<u32> = (0..9).collect(); // two full blocks + 1 (the last is recomputed)
    let b: Vec<u32> = (100..109).collect();
    let (ops, onloaded) = serve(&mut c, 1, &a, &s);
    assert!(ops.is_empty());
    assert_eq!(onloaded, 0);
    // b needs all three device blocks: a's two cached blocks are evicted and offloaded, each
    // before the block is reused (the only reuse here is the step's writes: ops come first).
    let (ops, _) = serve(&mut c, 2, &b, &s);
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(ops
        .iter()
        .all(|o| o.to.tier == Tier::Host && o.seq.is_none()));
    let host_stats = c.tier_stats()[0];
    assert_eq!(host_stats.offloaded_blocks, 2);
    assert_eq!(host_stats.used_blocks, 2);
    // a again: both of its blocks come back from the host into fresh device blocks.
    let probe = c.probe_start(&StartRequest {
        seq: 3,
        tokens: &a,
        scope: Some(&s),
        reserve_tokens: 9,
    });
    assert_eq!((probe.cached_tokens, probe.onload_tokens), (8, 8));
    assert_eq!(probe.new_slots, 12, "onloads need fresh device blocks");
    let (ops, onloaded) = serve(&mut c, 3, &a, &s);
    assert_eq!(onloaded, 8);
    let onloads: Vec<&TierOp> = ops.iter().filter(|o| o.is_onload()).collect();
    assert_eq!(onloads.len(), 2);
    assert!(onloads.iter().all(|o| o.seq == Some(3) && o.tokens == BS));
    // The onloads read the slots the offloads wrote, in chain order.
    let first_offloads: Vec<BlockLoc> = vec![host(0), host(1)];
    let mut read: Vec<BlockLoc> = onloads.iter().map(|o| o.from).collect();
    read.sort_by_key(|l| l.slot);
    assert_eq!(read, first_offloads);
    // Every device block an onload writes was offloaded (if evicted) earlier in the batch.
    for (i, o) in ops.iter().enumerate() {
        if o.is_onload() {
            assert!(
                ops[i + 1..].iter().all(|later| later.from != o.to),
                "an offload of {:?} after its onload",
                o.to
            );
        }
    }
    let st = c.tier_stats()[0];
    assert_eq!((st.hit_blocks, st.onloaded_blocks), (2, 2));
    assert!(st.lookup_blocks >= 2);
    c.assert_quiescent().expect("quiescent");
}

#[test]
fn a_pinned_slot_is_not_reused_until_its_step_retires() {
    let s = scope(0);
    // One host slot: the onload's pin must stop the next offload from overwriting it.
    let mut c = cache(2, 1, 0, OffloadMode::OnEvict);
    let a: Vec<u32> = (0..5).collect();
    let b: Vec<u32> = (100..105).collect();
    serve(&mut c, 1, &a, &s);
    serve(&mut c, 2, &b, &s); // evicts a's block into host slot 0
                              // Keep step S in flight while a's block is onloaded; then start d, which evicts b's
                              // device block: the host's only slot is pinned, so b's block is dropped, not written there.
    let started = c
        .start(&StartRequest {
            seq: 3,
            tokens: &a,
            scope: Some(&s),
            reserve_tokens: 5,
        })
        .expect("fits");
    assert_eq!(started.tier_hits.host_tokens, 4);
    c.fill(3, 1).expect("fill");
    let mut ops = Vec::new();
    c.drain_tier_ops(&mut ops);
    // Starting a took both device blocks: b's cached one was evicted, but the host's only slot
    // is pinned by a's onload, so b's block is dropped instead of overwriting it.
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(ops[0].from, host(0));
    assert!(ops[0].is_onload());
    assert_eq!(c.tier_stats()[0].evicted_blocks, 0);
    let step = c.begin_step();
    c.release(3, ReleaseReason::Finish).expect("release");
    c.check_invariants().expect("invariants");
    assert!(c
        .tiers
        .as_ref()
        .expect("tiers")
        .host
        .eviction_order()
        .is_empty());
    c.retire_step(step);
    // Retired: the slot is evictable again.
    assert_eq!(
        c.tiers.as_ref().expect("tiers").host.eviction_order(),
        vec![0]
    );
    c.assert_quiescent().expect("quiescent");
}

#[test]
fn no_tiers_means_no_ops_and_no_stats() {
    let s = scope(0);
    let mut c = cache(2, 0, 0, OffloadMode::OnEvict);
    for seq in 0..6u64 {
        let t: Vec<u32> = (0..5).map(|i| i + 10 * seq as u32).collect();
        let (ops, onloaded) = serve(&mut c, seq, &t, &s);
        assert!(ops.is_empty());
        assert_eq!(onloaded, 0);
    }
    assert!(c.tier_stats().is_empty());
}

fn disk(slot: u32) -> BlockLoc {
    BlockLoc {
        tier: Tier::Disk,
        slot,
    }
}

#[test]
fn a_host_victim_moves_to_disk_before_its_slot_is_overwritten_and_comes_back_from_there() {
    let s = scope(0);
    let mut c = cache(2, 1, 2, OffloadMode::OnEvict);
    let a: Vec<u32> = (0..5).collect();
    let b: Vec<u32> = (100..105).collect();
    let x: Vec<u32> = (200..205).collect();
    serve(&mut c, 1, &a, &s);
    let (ops, _) = serve(&mut c, 2, &b, &s);
    assert_eq!(ops.len(), 1);
    assert_eq!((ops[0].from.tier, ops[0].to), (Tier::Device, host(0)));
    // b's block evicted: the host's only slot (a) moves to disk first, then is overwritten.
    let (ops, _) = serve(&mut c, 3, &x, &s);
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert_eq!((ops[0].from, ops[0].to), (host(0), disk(0)));
    assert_eq!((ops[1].from.tier, ops[1].to), (Tier::Device, host(0)));
    // a again: found on disk (after a host lookup), onloaded; x's evicted block pushes b down.
    let started = c
        .start(&StartRequest {
            seq: 4,
            tokens: &a,
            scope: Some(&s),
            reserve_tokens: 5,
        })
        .expect("fits");
    assert_eq!(started.tier_hits.disk_tokens, 4);
    assert_eq!(started.cached_tokens, 4);
    let mut ops = Vec::new();
    c.drain_tier_ops(&mut ops);
    // The onload's block came off the free list; the second fresh block was x's, whose offload
    // first moves b (in the host's only slot, not pinned) down to disk.
    let moves: Vec<(BlockLoc, Tier)> = ops.iter().map(|o| (o.from, o.to.tier)).collect();
    assert_eq!(
        moves,
        vec![
            (disk(0), Tier::Device),
            (host(0), Tier::Disk),
            (moves[2].0, Tier::Host)
        ]
    );
    assert_eq!(ops[1].to, disk(1), "disk slot 0 is pinned by the onload");
    assert_eq!(ops[2].to, host(0));
    assert_eq!(ops[0].seq, Some(4));
    let stats = c.tier_stats();
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[1].tier, Some(Tier::Disk));
    assert_eq!((stats[1].hit_blocks, stats[1].onloaded_blocks), (1, 1));
    assert_eq!(stats[1].offloaded_blocks, 2);
    assert!(stats[0].lookup_blocks >= 1 && stats[0].evicted_blocks == 2);
    c.fill(4, 1).expect("fill");
    let step = c.begin_step();
    c.release(4, ReleaseReason::Finish).expect("release");
    c.retire_step(step);
    c.check_invariants().expect("invariants");
    c.assert_quiescent().expect("quiescent");
}

#[test]
fn write_through_offloads_the_step_after_publishing_and_eviction_then_costs_nothing() {
    let s = scope(0);
    let mut c = cache(2, 4, 0, OffloadMode::WriteThrough);
    let a: Vec<u32> = (0..5).collect();
    c.start(&StartRequest {
        seq: 1,
        tokens: &a,
        scope: Some(&s),
        reserve_tokens: 5,
    })
    .expect("fits");
    c.fill(1, 5).expect("fill");
    let mut ops = Vec::new();
    c.drain_tier_ops(&mut ops);
    assert!(
        ops.is_empty(),
        "the step that writes the block cannot offload it"
    );
    let written = c.block_table(1).expect("table")[0];
    let step = c.begin_step();
    c.drain_tier_ops(&mut ops);
    assert_eq!(ops.len(), 1);
    assert_eq!((ops[0].from, ops[0].to), (dev(written), host(0)));
    c.release(1, ReleaseReason::Finish).expect("release");
    c.retire_step(step);
    // Evicting a's block now costs no transfer: the host holds it.
    let b: Vec<u32> = (100..105).collect();
    let (ops, _) = serve(&mut c, 2, &b, &s);
    assert!(ops.is_empty(), "{ops:?}");
    // b's block was published while planning the step serve() began: its offload was emitted
    // then, for the step planned next.
    let mut later = Vec::new();
    c.drain_tier_ops(&mut later);
    assert_eq!(later.len(), 1, "{later:?}");
    assert_eq!((later[0].from.tier, later[0].to), (Tier::Device, host(1)));
    let step = c.begin_step();
    c.retire_step(step);
    assert_eq!(c.tier_stats()[0].offloaded_blocks, 2);
    c.assert_quiescent().expect("quiescent");
}

#[test]
fn stale_onload_lets_a_pending_onloads_slot_be_reused_and_the_checks_say_so() {
    let s = scope(0);
    let mut c = cache(2, 1, 0, OffloadMode::OnEvict);
    c.inject_fault(kvbench_cache_api::Fault::StaleOnload);
    let a: Vec<u32> = (0..5).collect();
    let b: Vec<u32> = (100..105).collect();
    serve(&mut c, 1, &a, &s);
    serve(&mut c, 2, &b, &s);
    // Checked clean first, so the check below is an incremental one (the tiers' counters, not
    // a walk of their slots) and must still see the reuse.
    c.check_invariants().expect("clean so far");
    c.check_invariants().expect("clean so far, incrementally");
    let walks = c.invariant_full_walks();
    // a's start evicts b's block; without the pin the host's only slot (a, being onloaded) is
    // handed to b's offload while the onload may still be reading it.
    c.start(&StartRequest {
        seq: 3,
        tokens: &a,
        scope: Some(&s),
        reserve_tokens: 5,
    })
    .expect("fits");
    let mut ops = Vec::new();
    c.drain_tier_ops(&mut ops);
    // The onload's block came off the free list; the second take evicted b's block, whose
    // offload overwrites the slot the onload reads, in the same step.
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert_eq!(ops[0].from, host(0));
    assert!(ops[0].is_onload());
    assert_eq!(ops[1].to, host(0));
    assert!(c.fault_fired() > 0);
    let err = c.check_invariants().expect_err("the reuse is reported");
    assert!(err.contains("reused while an onload"), "{err}");
    assert_eq!(
        c.invariant_full_walks(),
        walks + 1,
        "worded by the full walk"
    );
}

#[test]
fn build_gives_the_paged_cache_its_tiers_and_contiguous_none() {
    use crate::cache::{build, CacheMode, CacheSpec};
    let tiers = TierConfig {
        host_blocks: 3,
        disk_blocks: 2,
        ..TierConfig::default()
    };
    let make = |mode| build(&CacheSpec::new(mode, 64, BS, true).with_tiers(tiers));
    let paged = make(CacheMode::Paged).tier_stats();
    let caps: Vec<(Option<Tier>, u64)> =
        paged.iter().map(|s| (s.tier, s.capacity_blocks)).collect();
    assert_eq!(caps, vec![(Some(Tier::Host), 3), (Some(Tier::Disk), 2)]);
    assert!(make(CacheMode::Contiguous).tier_stats().is_empty());
    // A disk tier needs a host tier above it.
    let no_host = TierConfig {
        host_blocks: 0,
        disk_blocks: 2,
        ..TierConfig::default()
    };
    let c = build(&CacheSpec::new(CacheMode::Paged, 64, BS, true).with_tiers(no_host));
    assert!(c.tier_stats().is_empty());
}

/// A tier's slot records grow with use: a pool of `u32::MAX` slots (a 600 GiB disk tier of
/// small blocks is tens of millions) allocates nothing up front, its slots come out lowest
/// first as a full free list would give them, and the counters count the untouched as free.
#[test]
fn tier_slot_metadata_grows_with_use() {
    use super::pool::TierPool;
    for policy in [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Priority,
    ] {
        let mut pool = TierPool::new(Tier::Disk, u32::MAX, policy);
        assert_eq!(pool.slots.len(), 0);
        assert_eq!(pool.free_slots(), u64::from(u32::MAX));
        let taken: Vec<u32> = (0..3).map(|_| pool.take_slot().expect("slot").0).collect();
        assert_eq!(taken, vec![0, 1, 2]);
        assert_eq!(pool.slots.len(), 3);
        assert_eq!(pool.free_slots(), u64::from(u32::MAX) - 3);
    }
}
