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
