//! The hybrid manager's prefix cache under eviction, through the engine's trait: a logical block
//! is evicted whole (every table's page), deepest first, so the head of an evicted prompt still
//! hits; cached pages are evicted under pressure and never handed out while a step in flight
//! at their release runs; a flush counts no eviction.
//!
//! Seeded operation strings over every mix and every `cache.eviction` policy: the invariants
//! after every operation, each eviction takes the policy's next victims among the blocks no
//! table holds before any page of a held block (a block's pages leave together; each part of the
//! order weighs what the policy says), and the prefix statistics equal a recount from the
//! operations.
//!
//! Prompts are random token ids from a seed printed by each test; `KVBENCH_SEED` replays one.

use crate::support::hybrid_kv as hybrid_kv_support;
use crate::support::hybrid_prefix as cache_hybrid_prefix_support;

use std::collections::BTreeSet;

use cache_hybrid_prefix_support::{
    ok, probe_cached, prompt, run_prompt, seed, start, MLA, RECURRENT, SLIDING,
};
use hybrid_kv_support::{build, mixes, Mix};
use kvbench::cache::evict::Evictable;
use kvbench::cache::hybrid::HybridKv;
use kvbench::cache::EvictionPolicy;
use kvbench_cache_api::{AllocError, KvCacheManager, PrefixStats, ReleaseReason};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn a_logical_block_is_evicted_whole_tail_first_and_the_head_still_hits() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = &mixes()[SLIDING];
    let mut kv = build(m);
    let p = prompt(&mut rng, 24); // 6 full blocks a table, every one published
                                  // Chunks of 4: each sliding table lets go of the blocks behind its window as it goes
                                  // (cached-free, protected while the full table holds the block); the release frees
                                  // the blocks tail first, so the deepest blocks are the oldest.
    start(&mut kv, 1, &p).unwrap();
    for n in [4; 6] {
        kv.fill(1, n).unwrap();
        ok(&kv);
    }
    kv.release(1, ReleaseReason::Finish).unwrap();
    ok(&kv);
    // 6 blocks × 3 tables cached; 48 − 18 = 30 free. Taking 30 + 12 pages evicts 4 logical
    // blocks whole, the deepest first: every table's pages of blocks 2..6.
    let other = prompt(&mut rng, 14 * 4);
    start(&mut kv, 3, &other).unwrap();
    ok(&kv);
    assert_eq!(kv.prefix_stats().evictions, 12);
    let a = kv.accounting();
    assert_eq!(
        a.cached_free_slots,
        6 * u64::from(kv.block_size()),
        "blocks 0 and 1, every table's page"
    );
    // Blocks 0..2 whole: 8 tokens hit (the sliding window at 8 reaches back to block 0).
    assert_eq!(probe_cached(&kv, 2, &p).0, 8);
    let s = start(&mut kv, 2, &p);
    // 12 fresh pages needed past the hit, none left: refused, nothing changed.
    assert!(matches!(s, Err(AllocError::NoSpace { .. })), "{s:?}");
    ok(&kv);
    kv.release(3, ReleaseReason::Finish).unwrap();
    let s = start(&mut kv, 2, &p).unwrap();
    assert_eq!(s.cached_tokens, 8, "the head blocks, whole, still hit");
    ok(&kv);
}

#[test]
fn cached_pages_are_evicted_under_pressure_and_not_handed_out_while_fenced() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = &mixes()[MLA];
    let mut kv = build(m);
    let p = prompt(&mut rng, 61); // 16 full + 9 MLA pages of 40
    run_prompt(&mut kv, 1, &p);
    let step = kv.begin_step();
    kv.release(1, ReleaseReason::Finish).unwrap();
    ok(&kv);
    // Released under a step in flight: cached, but not evictable until it retires.
    let big = prompt(&mut rng, 4 * 21); // 21 full + 12 MLA = 33 pages, 15 free
    let (_, fits) = probe_cached(&kv, 2, &big);
    assert!(!fits, "the fenced cached pages must not count as takeable");
    assert!(matches!(
        start(&mut kv, 2, &big),
        Err(AllocError::NoSpace { .. })
    ));
    ok(&kv);
    // A hit may still share them: their content is what the step reads.
    let s = start(&mut kv, 4, &p).unwrap();
    assert_eq!(s.cached_tokens, 56);
    ok(&kv);
    kv.release(4, ReleaseReason::Finish).unwrap();
    kv.retire_step(step);
    ok(&kv);
    assert!(probe_cached(&kv, 2, &big).1);
    start(&mut kv, 2, &big).unwrap();
    ok(&kv);
    // 15 free + the 2 partial last pages of the first (never published, so freed): 16 evicted.
    assert_eq!(kv.prefix_stats().evictions, 16);
    assert_eq!(probe_cached(&kv, 3, &p).0, 0, "the evicted prefix is gone");
    kv.release(2, ReleaseReason::Finish).unwrap();
    kv.assert_quiescent().unwrap();
}

/// A flush empties the cache without counting evictions: the cached-free pages are flushed,
/// not evicted for new content, and the pages sequences still hold are only unpublished.
#[test]
fn a_flush_counts_no_eviction_and_unpublishes_held_pages() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = &mixes()[SLIDING];
    let mut kv = build(m);
    let held = prompt(&mut rng, 23);
    let released = prompt(&mut rng, 23);
    run_prompt(&mut kv, 1, &held);
    run_prompt(&mut kv, 2, &released);
    kv.release(2, ReleaseReason::Finish).unwrap();
    ok(&kv);
    assert!(kv.accounting().cached_free_slots > 0);
    kv.flush_prefix_cache();
    ok(&kv);
    assert_eq!(kv.prefix_stats().evictions, 0, "{:?}", kv.prefix_stats());
    assert_eq!(kv.accounting().cached_free_slots, 0);
    assert_eq!(probe_cached(&kv, 3, &held).0, 0, "held pages unpublished");
    assert_eq!(probe_cached(&kv, 3, &released).0, 0, "cached pages flushed");
    // What is evicted afterwards for new content still counts, one a page.
    run_prompt(&mut kv, 3, &released);
    kv.release(3, ReleaseReason::Finish).unwrap();
    let cached_pages = kv.accounting().cached_free_slots / u64::from(kv.block_size());
    let free_pages = kv.accounting().free_slots / u64::from(kv.block_size());
    let big = prompt(&mut rng, 4 * 8); // 24 pages over three tables
    let need = 24u64;
    start(&mut kv, 4, &big).unwrap();
    ok(&kv);
    let evicted = kv.prefix_stats().evictions;
    assert_eq!(
        evicted,
        need - free_pages.min(need),
        "{cached_pages} cached, {free_pages} free"
    );
    assert!(evicted > 0, "{cached_pages} cached, {free_pages} free");
}

/// Per page of `kv`'s pool, whether it is cached-free.
fn cached_set(kv: &HybridKv) -> BTreeSet<u32> {
    (0..kv.hybrid_layout().pages)
        .filter(|&p| kv.is_cached_free(p))
        .collect()
}

/// The policy's order weighs what it says: `lfu` fewest hits first, `priority` unshared before
/// shared and deepest first (ties by release, which only `lru` orders by alone).
fn assert_ordered(policy: EvictionPolicy, order: &[(u32, Evictable)], ctx: &str) {
    for w in order.windows(2) {
        let (a, b) = (w[0].1, w[1].1);
        match policy {
            EvictionPolicy::Lru => {}
            EvictionPolicy::Lfu => assert!(a.hits <= b.hits, "{ctx}: lfu order {order:?}"),
            EvictionPolicy::Priority => assert!(
                (a.shared, u32::MAX - a.depth) <= (b.shared, u32::MAX - b.depth),
                "{ctx}: priority order {order:?}"
            ),
        }
    }
}

/// What the prefix statistics must be, recounted from the operations themselves.
#[derive(Debug, Default, PartialEq, Eq)]
struct Recount {
    lookups: u64,
    lookup_tokens: u64,
    hit_tokens: u64,
    hit_blocks: u64,
    evictions: u64,
}

impl Recount {
    fn of(s: PrefixStats) -> Recount {
        Recount {
            lookups: s.lookups,
            lookup_tokens: s.lookup_tokens,
            hit_tokens: s.hit_tokens,
            hit_blocks: s.hit_blocks,
            evictions: s.evictions,
        }
    }
}

/// Cached-free pages in eviction order, with what the policy weighs.
type Order = Vec<(u32, Evictable)>;

/// One seeded string of operations over `m` under `policy`, prompts drawn from three shared
/// 30-token prefixes (long enough for a 28-token full + MLA hit): start, chunked fill, decode
/// with tokens, fork, release (finish or preempt), steps begun and retired, now and then a
/// flush. After every operation: the invariants; the cached-free pages that left the cache
/// other than by the operation's own hit are exactly the policy's next victims of the order
/// before it, and counted as evictions. Returns the hit tokens and the evictions seen.
fn run_string(m: &Mix, policy: EvictionPolicy, s: u64) -> (u64, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let prefixes: Vec<Vec<u32>> = (0..3).map(|_| prompt(&mut rng, 30)).collect();
    let mut kv = build(m).with_eviction(policy);
    let mut live: Vec<u64> = Vec::new();
    let mut steps = Vec::new();
    let mut next = 1u64;
    let mut want = Recount::default();
    for i in 0..200 {
        let ctx = format!("{} {} seed {s} op {i}", m.name, policy.name());
        let order_before = kv.eviction_order();
        // Blocks no table holds first, then the protected pages, each part in the policy's order.
        let (free_part, held_part): (Order, Order) = order_before
            .iter()
            .partition(|&&(p, _)| !kv.eviction_protected(p));
        assert!(
            order_before.len() == free_part.len() + held_part.len()
                && order_before[..free_part.len()] == free_part[..],
            "{ctx}: protected pages before free blocks' pages"
        );
        assert_ordered(policy, &free_part, &ctx);
        assert_ordered(policy, &held_part, &ctx);
        let cached_before = cached_set(&kv);
        let protected_before: BTreeSet<u32> = order_before
            .iter()
            .map(|&(p, _)| p)
            .filter(|&p| kv.eviction_protected(p))
            .collect();
        let block_before: std::collections::BTreeMap<u32, (u64, u64)> = order_before
            .iter()
            .filter_map(|&(p, _)| kv.eviction_block(p).map(|b| (p, b)))
            .collect();
        // The cached-free pages that left the cache since the snapshot, not by `hits`, are the
        // policy's next victims and count as evictions. Checked before a fill: a fill evicts
        // nothing, but a page evicted for a new prompt may be published and trimmed by it.
        let evicted_in_order = |kv: &HybridKv, hits: &BTreeSet<u32>, want: &mut Recount| {
            let gone: BTreeSet<u32> = cached_before
                .difference(&cached_set(kv))
                .copied()
                .filter(|p| !hits.contains(p))
                .collect();
            // A block's pages leave together: the pages of blocks no table holds (none before
            // the operation, none of a page it hit) go first, in the policy's order; the rest
            // only once those are gone.
            let hit_blocks: BTreeSet<(u64, u64)> =
                hits.iter().filter_map(|&p| kv.eviction_block(p)).collect();
            let (first, rest): (Vec<u32>, Vec<u32>) = order_before
                .iter()
                .map(|&(p, _)| p)
                .filter(|p| !hits.contains(p))
                .partition(|p| {
                    !protected_before.contains(p)
                        && block_before.get(p).is_none_or(|b| !hit_blocks.contains(b))
                });
            if gone.len() <= first.len() {
                let victims: BTreeSet<u32> = first.iter().copied().take(gone.len()).collect();
                assert_eq!(gone, victims, "{ctx}: evicted out of the policy's order");
            } else {
                let all: BTreeSet<u32> = first.iter().chain(&rest).copied().collect();
                assert!(
                    first.iter().all(|p| gone.contains(p)) && gone.is_subset(&all),
                    "{ctx}: a held block's page evicted before a free block's: gone {gone:?}, first {first:?}"
                );
            }
            want.evictions += gone.len() as u64;
            assert_eq!(Recount::of(kv.prefix_stats()), *want, "{ctx}: stats");
        };
        let mut accounted = false;
        let mut flushed = false;
        match rng.gen_range(0..11) {
            0 | 1 => {
                let mut p = prefixes[rng.gen_range(0..3)].clone();
                let extra = rng.gen_range(0..10);
                p.extend(prompt(&mut rng, extra));
                if let Ok(st) = start(&mut kv, next, &p) {
                    assert!(u64::from(st.cached_tokens) < p.len() as u64, "{ctx}");
                    want.lookups += 1;
                    want.lookup_tokens += p.len() as u64;
                    want.hit_tokens += u64::from(st.cached_tokens);
                    want.hit_blocks += st.hits.len() as u64;
                    let hits = st.hits.iter().map(|h| h.block).collect();
                    evicted_in_order(&kv, &hits, &mut want);
                    accounted = true;
                    let rest = p.len() as u32 - st.cached_tokens;
                    let chunk = rng.gen_range(1..=rest.max(1));
                    kv.fill(next, chunk.min(rest)).unwrap();
                    if rest > chunk {
                        kv.fill(next, rest - chunk).unwrap();
                    }
                    live.push(next);
                }
                next += 1;
            }
            2..=4 if !live.is_empty() => {
                let seq = live[rng.gen_range(0..live.len())];
                let _ = kv.append_token(seq, rng.gen_range(0..50_000));
            }
            5 if !live.is_empty() => {
                let seq = live[rng.gen_range(0..live.len())];
                if kv.fork(seq, next).is_ok() {
                    live.push(next);
                }
                next += 1;
            }
            6 | 7 if !live.is_empty() => {
                let seq = live.swap_remove(rng.gen_range(0..live.len()));
                let why = if rng.gen_bool(0.3) {
                    ReleaseReason::Preempt
                } else {
                    ReleaseReason::Finish
                };
                kv.release(seq, why).unwrap();
            }
            8 => steps.push(kv.begin_step()),
            9 if rng.gen_bool(0.1) => {
                kv.flush_prefix_cache();
                flushed = true;
            }
            _ if !steps.is_empty() => {
                let step = steps.remove(0);
                kv.retire_step(step);
            }
            _ => {}
        }
        if let Err(e) = kv.check_invariants() {
            panic!("{ctx}: {e}");
        }
        if flushed {
            // A flush empties the cache and evicts nothing (held pages are only unpublished).
            assert!(
                cached_set(&kv).is_empty(),
                "{ctx}: a flush left cached pages"
            );
        } else if !accounted {
            evicted_in_order(&kv, &BTreeSet::new(), &mut want);
        }
        assert_eq!(Recount::of(kv.prefix_stats()), want, "{ctx}: stats");
    }
    for seq in live {
        kv.release(seq, ReleaseReason::Finish).unwrap();
    }
    for step in steps {
        kv.retire_step(step);
    }
    if let Err(e) = kv.assert_quiescent() {
        panic!("{} {} seed {s}: {e}", m.name, policy.name());
    }
    let a = kv.accounting();
    assert_eq!(
        a.free_slots + a.cached_free_slots,
        a.total_slots,
        "{}",
        m.name
    );
    (want.hit_tokens, want.evictions)
}

/// Every policy over every mix keeps the invariants, evicts in its order and counts right.
#[test]
fn random_strings_with_shared_prompts_keep_the_invariants_under_every_policy() {
    let base = seed();
    for policy in EvictionPolicy::ALL {
        for (mi, m) in mixes().iter().enumerate() {
            let (mut hit_tokens, mut evictions) = (0u64, 0u64);
            for round in 0..20u64 {
                let s = base ^ (mi as u64) << 32 ^ round;
                let (h, e) = run_string(m, policy, s);
                hit_tokens += h;
                evictions += e;
            }
            // The strings exercise hits wherever the rule allows one, and evictions.
            assert_eq!(
                hit_tokens > 0,
                mi != RECURRENT,
                "{} {}: {hit_tokens} hit tokens",
                m.name,
                policy.name()
            );
            if mi != RECURRENT {
                assert!(evictions > 0, "{} {}: no eviction", m.name, policy.name());
            }
        }
    }
}
