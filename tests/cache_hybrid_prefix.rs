//! The hybrid manager's prefix cache through the engine's trait: a second sequence with the
//! same prompt hits exactly what `prefix_hit_tokens`' rule allows on full + sliding, full + MLA
//! and full + recurrent mixes (hit tokens computed by hand below), shares the pages, and the
//! invariants hold; a sliding table whose window pages were evicted leaves no hit while the full
//! table's pages are still cached; cached pages are evicted under pressure and never handed out
//! while a step in flight at their release runs.
//!
//! Prompts are random token ids from a seed printed by each test; `KVBENCH_SEED` replays one.

mod hybrid_kv_support;
mod support;

use hybrid_kv_support::{build, mixes};
use kvbench::cache::hybrid::HybridKv;
use kvbench_cache_api::{
    AllocError, KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest, Started,
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
fn a_sliding_window_evicted_leaves_no_hit_while_the_full_table_is_cached() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = &mixes()[SLIDING];
    let mut kv = build(m);
    let p = prompt(&mut rng, 24); // 6 full blocks a table, every one published
                                  // Chunks of 4: each sliding table lets go of the blocks behind its window as it goes, so
                                  // they are released (cached-free) first; the release then frees the sliding tables' pages
                                  // before the full table's (layout order), so the sliding pages are the oldest.
    start(&mut kv, 1, &p).unwrap();
    for n in [4; 6] {
        kv.fill(1, n).unwrap();
        ok(&kv);
    }
    kv.release(1, ReleaseReason::Finish).unwrap();
    ok(&kv);
    // 6 blocks × 3 tables cached; 48 − 18 = 30 free. Taking 30 + 12 pages evicts exactly the
    // 12 sliding pages (two tables × 6 blocks).
    let other = prompt(&mut rng, 14 * 4);
    start(&mut kv, 3, &other).unwrap();
    ok(&kv);
    assert_eq!(kv.prefix_stats().evictions, 12);
    let a = kv.accounting();
    assert_eq!(
        a.cached_free_slots,
        6 * u64::from(kv.block_size()),
        "the full table's 6 pages"
    );
    assert_eq!(probe_cached(&kv, 2, &p).0, 0);
    let s = start(&mut kv, 2, &p);
    // 18 fresh pages needed, only the 6 cached ones left: refused, nothing changed.
    assert!(matches!(s, Err(AllocError::NoSpace { .. })), "{s:?}");
    ok(&kv);
    kv.release(3, ReleaseReason::Finish).unwrap();
    let s = start(&mut kv, 2, &p).unwrap();
    assert_eq!(s.cached_tokens, 0, "no window at any hit is cached");
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

/// Seeded operation strings over every mix, prompts drawn from three shared 30-token prefixes
/// (long enough for a 28-token full + MLA hit): start,
/// chunked fill, decode with tokens, fork, release, steps begun and retired; the invariants
/// (cached set included) after every operation, every page back (free or cached) at the end.
#[test]
fn random_strings_with_shared_prompts_keep_the_invariants() {
    let base = seed();
    for (mi, m) in mixes().iter().enumerate() {
        let mut hit_tokens = 0u64;
        for round in 0..20u64 {
            let s = base ^ (mi as u64) << 32 ^ round;
            let mut rng = ChaCha8Rng::seed_from_u64(s);
            let prefixes: Vec<Vec<u32>> = (0..3).map(|_| prompt(&mut rng, 30)).collect();
            let mut kv = build(m);
            let mut live: Vec<u64> = Vec::new();
            let mut steps = Vec::new();
            let mut next = 1u64;
            for i in 0..200 {
                let ctx = format!("{} seed {s} op {i}", m.name);
                match rng.gen_range(0..10) {
                    0 | 1 => {
                        let mut p = prefixes[rng.gen_range(0..3)].clone();
                        let extra = rng.gen_range(0..10);
                        p.extend(prompt(&mut rng, extra));
                        if let Ok(st) = start(&mut kv, next, &p) {
                            assert!(u64::from(st.cached_tokens) < p.len() as u64, "{ctx}");
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
                        kv.release(seq, ReleaseReason::Finish).unwrap();
                    }
                    8 => steps.push(kv.begin_step()),
                    _ if !steps.is_empty() => {
                        let step = steps.remove(0);
                        kv.retire_step(step);
                    }
                    _ => {}
                }
                if let Err(e) = kv.check_invariants() {
                    panic!("{ctx}: {e}");
                }
            }
            for seq in live {
                kv.release(seq, ReleaseReason::Finish).unwrap();
            }
            for step in steps {
                kv.retire_step(step);
            }
            if let Err(e) = kv.assert_quiescent() {
                panic!("{} seed {s}: {e}", m.name);
            }
            let a = kv.accounting();
            assert_eq!(
                a.free_slots + a.cached_free_slots,
                a.total_slots,
                "{}",
                m.name
            );
            hit_tokens += kv.prefix_stats().hit_tokens;
        }
        // The strings exercise hits wherever the rule allows one.
        assert_eq!(
            hit_tokens > 0,
            mi != RECURRENT,
            "{}: {hit_tokens} hit tokens",
            m.name
        );
    }
}
