//! The hybrid manager's prefix cache through the engine's trait: a second sequence with the
//! same prompt hits exactly what `prefix_hit_tokens`' rule allows on full + sliding, full + MLA
//! and full + recurrent mixes (hit tokens computed by hand below), shares the pages, and the
//! invariants hold; generated blocks are hit by the next turn; another scope does not hit; the
//! lookups count what the summed manager counts; a block's key is hashed once however often its
//! sequence is probed; the planted `PublishEarly` (a block published before it is written) fires
//! and the invariants catch it. Eviction is `prefix_evict.rs`.
//!
//! Prompts are random token ids from a seed printed by each test; `KVBENCH_SEED` replays one.

use crate::support::hybrid_kv as hybrid_kv_support;
use crate::support::hybrid_prefix as cache_hybrid_prefix_support;

use cache_hybrid_prefix_support::{
    ok, probe_cached, prompt, run_prompt, scope, seed, start, MLA, RECURRENT, SLIDING,
};
use hybrid_kv_support::{build, full, mixes, shape, Mix};
use kvbench::cache::hybrid::{HybridFault, HybridLayout};
use kvbench_cache_api::{
    CacheMode, KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
    let mut summed = kvbench::cache::build(&kvbench::cache::CacheSpec::new(
        CacheMode::Paged,
        48 * 4,
        4,
        true,
    ));
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
