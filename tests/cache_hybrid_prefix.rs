//! The hybrid manager's prefix cache through the engine's trait: a second sequence with the
//! same prompt hits exactly what `prefix_hit_tokens`' rule allows on full + sliding, full + MLA
//! and full + recurrent mixes (hit tokens computed by hand below), shares the pages, and the
//! invariants hold; a logical block is evicted whole (every table's page), deepest first, so the
//! head of an evicted prompt still hits; cached pages are evicted under pressure and never handed out
//! while a step in flight at their release runs.
//!
//! Seeded operation strings over every mix and every `cache.eviction` policy: the invariants
//! after every operation, each eviction takes the policy's next victims among the blocks no
//! table holds before any page of a held block (a block's pages leave together; each part of the
//! order weighs what the policy says), and the prefix statistics equal a recount from the operations; the
//! lookups count what the summed manager counts; a flush counts no eviction; a block's key is
//! hashed once however often its sequence is probed; the planted `PublishEarly` (a block
//! published before it is written) fires and the invariants catch it.
//!
//! Prompts are random token ids from a seed printed by each test; `KVBENCH_SEED` replays one.

mod hybrid_kv_support;
mod support;

use std::collections::BTreeSet;

use hybrid_kv_support::{build, full, mixes, shape, Mix};
use kvbench::cache::evict::Evictable;
use kvbench::cache::hybrid::{HybridFault, HybridKv, HybridLayout};
use kvbench::cache::EvictionPolicy;
use kvbench_cache_api::{
    AllocError, CacheMode, KvCacheManager, PrefixStats, ReleaseReason, ReuseScope, ScopeKey,
    StartRequest, Started,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SLIDING: usize = 0; // "2 sliding : 1 full": sliding tables 0 and 1, full table 2
const RECURRENT: usize = 1;
const MLA: usize = 2;

fn seed() -> u64 {
    let seed = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026);
    println!("seed {seed} (KVBENCH_SEED={seed} replays)");
    seed
}

fn prompt(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(0..50_000)).collect()
}

fn scope() -> ScopeKey {
    ScopeKey {
        model: "mix".into(),
        tokenizer: "tok".into(),
        reuse: ReuseScope::Global,
    }
}

fn start(kv: &mut HybridKv, seq: u64, tokens: &[u32]) -> Result<Started, AllocError> {
    let scope = scope();
    kv.start(&StartRequest {
        seq,
        tokens,
        scope: Some(&scope),
        reserve_tokens: tokens.len() as u32,
    })
}

fn probe_cached(kv: &HybridKv, seq: u64, tokens: &[u32]) -> (u32, bool) {
    let scope = scope();
    let p = kv.probe_start(&StartRequest {
        seq,
        tokens,
        scope: Some(&scope),
        reserve_tokens: tokens.len() as u32,
    });
    (p.cached_tokens, p.fits)
}

fn ok(kv: &HybridKv) {
    if let Err(e) = kv.check_invariants() {
        panic!("invariants: {e}");
    }
}

/// Start and fill `tokens` as `seq` in one chunk.
fn run_prompt(kv: &mut HybridKv, seq: u64, tokens: &[u32]) -> Started {
    let s = start(kv, seq, tokens).expect("start");
    kv.fill(seq, tokens.len() as u32 - s.cached_tokens)
        .expect("fill");
    ok(kv);
    s
}

/// (mix, prompt tokens, hit tokens, pages shared), by hand:
/// - 2 sliding (window 10) : 1 full, 4-token blocks everywhere: a 23-token prompt hits
///   ⌊22 / 4⌋ × 4 = 20; the full table shares blocks 0..5, each sliding table the blocks its
///   window at 20 reaches, ⌊(20 − 10) / 4⌋ = 2 ..5: 5 + 3 + 3 = 11 pages.
/// - full (4-token blocks) + MLA (7-token blocks): hits are multiples of 28; a 61-token prompt
///   hits ⌊60 / 28⌋ × 28 = 56: 14 full pages + 8 MLA pages = 22.
/// - full + recurrent: no hit (the state after the prefix is not kept).
const CASES: [(usize, usize, u32, usize); 3] = [
    (SLIDING, 23, 20, 11),
    (MLA, 61, 56, 22),
    (RECURRENT, 23, 0, 0),
];

#[test]
fn a_second_sequence_hits_what_the_rule_allows_and_shares_the_pages() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    for (mix, len, h, shared) in CASES {
        for first_released in [false, true] {
            let m = &mixes()[mix];
            let mut kv = build(m);
            let p = prompt(&mut rng, len);
            let first = run_prompt(&mut kv, 1, &p);
            assert_eq!(first.cached_tokens, 0, "{}: nothing cached yet", m.name);
            if first_released {
                kv.release(1, ReleaseReason::Finish).unwrap();
                ok(&kv);
            }
            assert_eq!(probe_cached(&kv, 2, &p).0, h, "{} probe", m.name);
            let s = start(&mut kv, 2, &p).unwrap();
            ok(&kv);
            assert_eq!(s.cached_tokens, h, "{}: hit tokens", m.name);
            assert_eq!(s.hits.len(), shared, "{}: pages shared", m.name);
            let refs = if first_released { 1 } else { 2 };
            for hit in &s.hits {
                assert_eq!(kv.cache().page_refs(hit.block), Some(refs), "{}", m.name);
                assert_eq!(hit.publisher, 1);
            }
            let stats = kv.prefix_stats();
            assert_eq!(stats.hit_tokens, u64::from(h), "{}", m.name);
            assert_eq!(stats.hit_blocks, shared as u64, "{}", m.name);
            assert_eq!(stats.lookups, 2, "{}", m.name);
            kv.fill(2, len as u32 - h).unwrap();
            ok(&kv);
            // The second holds the same tokens as the first, from the hit on its own pages.
            assert_eq!(kv.seq_tokens(2), Some(len as u32));
            kv.release(2, ReleaseReason::Finish).unwrap();
            if !first_released {
                kv.release(1, ReleaseReason::Finish).unwrap();
            }
            ok(&kv);
            kv.assert_quiescent().unwrap();
            let a = kv.accounting();
            if mix == RECURRENT {
                assert_eq!(
                    a.cached_free_slots, 0,
                    "a recurrent model publishes nothing"
                );
            } else {
                assert!(
                    a.cached_free_slots > 0,
                    "{}: released pages stay cached",
                    m.name
                );
            }
            kv.flush_prefix_cache();
            ok(&kv);
            let a = kv.accounting();
            assert_eq!(a.cached_free_slots, 0);
            assert_eq!(a.free_slots, a.total_slots, "{}", m.name);
        }
    }
}

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

#[test]
fn generated_blocks_are_published_for_the_next_turn() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = &mixes()[SLIDING];
    let mut kv = build(m);
    let p = prompt(&mut rng, 9);
    run_prompt(&mut kv, 1, &p);
    let mut turn = p.clone();
    for _ in 0..11 {
        let t = rng.gen_range(0..50_000);
        kv.append_token(1, t).unwrap();
        turn.push(t);
        ok(&kv);
    }
    kv.release(1, ReleaseReason::Finish).unwrap();
    turn.extend(prompt(&mut rng, 5));
    // 20 tokens written: the next turn (25 tokens) hits 20 (⌊24 / 4⌋ × 4 = 24 needs block 5,
    // never written).
    let s = start(&mut kv, 2, &turn).unwrap();
    assert_eq!(s.cached_tokens, 20);
    ok(&kv);
}

#[test]
fn another_scope_does_not_hit() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = &mixes()[SLIDING];
    let mut kv = build(m);
    let p = prompt(&mut rng, 23);
    run_prompt(&mut kv, 1, &p);
    let other = ScopeKey {
        reuse: ReuseScope::Tenant(7),
        ..scope()
    };
    let s = kv
        .start(&StartRequest {
            seq: 2,
            tokens: &p,
            scope: Some(&other),
            reserve_tokens: 23,
        })
        .unwrap();
    assert_eq!(s.cached_tokens, 0);
    ok(&kv);
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

/// One seeded string of operations over `m` under `policy`, prompts drawn from three shared
/// 30-token prefixes (long enough for a 28-token full + MLA hit): start, chunked fill, decode
/// with tokens, fork, release (finish or preempt), steps begun and retired, now and then a
/// flush. After every operation: the invariants; the cached-free pages that left the cache
/// other than by the operation's own hit are exactly the policy's next victims of the order
/// before it, and counted as evictions. Returns the hit tokens and the evictions seen.
/// Cached-free pages in eviction order, with what the policy weighs.
type Order = Vec<(u32, Evictable)>;

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

/// A one-table model (two full layers, 4-token blocks, 48 pages), where a hybrid page is a
/// summed block: the same operations on both managers.
fn full_only() -> Mix {
    Mix {
        name: "full only",
        shape: shape(vec![full(2)]),
        block_size: 4,
        pages: 48,
    }
}

/// `lookups` is the summed manager's: one a started sequence with a reuse scope, whatever its
/// length (a one-token prompt looks up and cannot hit), none without a scope (a swap-in); the
/// tokens looked up and hit agree too.
#[test]
fn lookups_count_what_the_summed_manager_counts() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = full_only();
    let mut hybrid = build(&m);
    let layout: &HybridLayout = hybrid.hybrid_layout();
    assert_eq!(layout.tables.len(), 1, "one table");
    let mut summed = kvbench::cache::build(CacheMode::Paged, 48 * 4, 4, true);
    let p = prompt(&mut rng, 30);
    let scope = scope();
    let cases: [(u64, Vec<u32>, bool); 5] = [
        (1, p.clone(), true),
        (2, p.clone(), true),
        (3, p[..1].to_vec(), true),
        (4, p.clone(), false),
        (5, p[..9].to_vec(), true),
    ];
    let kvs: [&mut dyn KvCacheManager; 2] = [&mut hybrid, summed.as_mut()];
    let mut stats = Vec::new();
    for kv in kvs {
        for (seq, tokens, scoped) in &cases {
            let st = kv
                .start(&StartRequest {
                    seq: *seq,
                    tokens,
                    scope: scoped.then_some(&scope),
                    reserve_tokens: tokens.len() as u32,
                })
                .unwrap();
            kv.fill(*seq, tokens.len() as u32 - st.cached_tokens)
                .unwrap();
        }
        for (seq, _, _) in &cases {
            kv.release(*seq, ReleaseReason::Finish).unwrap();
        }
        kv.check_invariants().unwrap();
        stats.push(kv.prefix_stats());
    }
    assert_eq!(stats[0].lookups, 4, "{:?}", stats[0]);
    assert_eq!(stats[0].lookup_tokens, 30 + 30 + 1 + 9);
    assert_eq!(stats[0].hit_tokens, 28 + 8);
    assert_eq!(stats[0], stats[1], "hybrid, then summed");
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

/// A block's key is hashed once: probing a waiting sequence again and again, starting it,
/// publishing its blocks and decoding compute each block's key of each table once, and a
/// preempted sequence probed again with its generated tokens computes none.
#[test]
fn each_block_key_is_hashed_once_however_often_its_sequence_is_probed() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = &mixes()[SLIDING]; // three tables of 4-token blocks
    let mut kv = build(m);
    let p = prompt(&mut rng, 23);
    assert_eq!(kv.prefix_keys_hashed(), 0);
    probe_cached(&kv, 1, &p);
    // Nothing cached: the full table's first block misses, the sliding tables look no further.
    assert_eq!(kv.prefix_keys_hashed(), 1);
    for _ in 0..50 {
        probe_cached(&kv, 1, &p);
    }
    assert_eq!(kv.prefix_keys_hashed(), 1, "probing again hashes nothing");
    run_prompt(&mut kv, 1, &p);
    // 23 tokens: 5 full blocks in each of 3 tables, the first key reused from the probe.
    assert_eq!(kv.prefix_keys_hashed(), 15);
    let mut turn = p.clone();
    for _ in 0..9 {
        let t = rng.gen_range(0..50_000);
        kv.append_token(1, t).unwrap();
        turn.push(t);
    }
    ok(&kv);
    assert_eq!(
        kv.prefix_keys_hashed(),
        3 * (32 / 4),
        "one key a block a table"
    );
    kv.release(1, ReleaseReason::Preempt).unwrap();
    for _ in 0..50 {
        assert_eq!(probe_cached(&kv, 1, &turn).0, 28);
    }
    assert_eq!(
        kv.prefix_keys_hashed(),
        24,
        "the preempted sequence kept its keys"
    );
    // Another sequence with the same prompt: its keys once, however often it is probed.
    probe_cached(&kv, 2, &p);
    let once = kv.prefix_keys_hashed();
    assert!(once > 24);
    for _ in 0..50 {
        assert_eq!(probe_cached(&kv, 2, &p).0, 20);
    }
    assert_eq!(kv.prefix_keys_hashed(), once);
    let s = start(&mut kv, 2, &p).unwrap();
    assert_eq!(s.cached_tokens, 20);
    assert_eq!(
        kv.prefix_keys_hashed(),
        once,
        "the start reuses the probe's keys"
    );
    ok(&kv);
}

/// The planted `PublishEarly` publishes a prompt's mapped blocks when its first chunk is
/// written: a second prompt would share positions nobody wrote (a 20-token hit after a 4-token
/// chunk, where the correct manager gives 4), and the invariants name the page. Over seeded
/// chunked prompts on every mix that publishes, it fires and is caught; the recurrent mix
/// publishes nothing, so it cannot fire.
#[test]
fn a_block_published_before_it_is_written_is_caught() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let p = prompt(&mut rng, 23);
    for planted in [false, true] {
        let mut kv = build(&mixes()[SLIDING]);
        if planted {
            kv.plant_fault(HybridFault::PublishEarly);
        }
        start(&mut kv, 1, &p).unwrap();
        kv.fill(1, 4).unwrap();
        let hit = probe_cached(&kv, 2, &p).0;
        if planted {
            assert_eq!(hit, 20, "the unwritten blocks are offered");
            assert!(kv.published_early() > 0);
            let e = kv.check_invariants().unwrap_err();
            assert!(e.contains("published page"), "{e}");
        } else {
            assert_eq!(hit, 4);
            ok(&kv);
        }
    }
    let base = seed();
    for (mi, m) in mixes().iter().enumerate() {
        let s = base ^ (mi as u64) << 32;
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        let shared = prompt(&mut rng, 30);
        let mut kv = build(m);
        kv.plant_fault(HybridFault::PublishEarly);
        let mut caught = None;
        for seq in 1..=6u64 {
            let mut p = shared.clone();
            let extra = rng.gen_range(0..10);
            p.extend(prompt(&mut rng, extra));
            let Ok(st) = start(&mut kv, seq, &p) else {
                break;
            };
            let mut rest = p.len() as u32 - st.cached_tokens;
            while rest > 0 && caught.is_none() {
                let chunk = rng.gen_range(1..=rest);
                kv.fill(seq, chunk).unwrap();
                rest -= chunk;
                caught = kv.check_invariants().err();
            }
            if caught.is_some() {
                break;
            }
        }
        if mi == RECURRENT {
            assert_eq!(kv.published_early(), 0, "{} seed {s}", m.name);
            assert!(caught.is_none(), "{} seed {s}: {caught:?}", m.name);
        } else {
            let e = caught.unwrap_or_else(|| panic!("{} seed {s}: not caught", m.name));
            assert!(kv.published_early() > 0, "{} seed {s}", m.name);
            assert!(e.contains("published page"), "{} seed {s}: {e}", m.name);
        }
    }
}
