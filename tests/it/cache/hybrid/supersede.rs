//! A block a sequence computed although another table still cached its key (a hit that a
//! sliding window cut short) supersedes the cached copy, so every table's page of the block is
//! one logical block again — held, and so protected, while its sequence runs.
//!
//! On the "2 sliding : 1 full" mix (48 pages, 3 tables of 4-token blocks, window 10): sequence 1
//! writes a 24-token prompt, its sliding pages of blocks 0 and 1 fall behind the window and a
//! start evicts them, while its full table still holds the blocks. Sequence 3 starts with the same
//! first 8 tokens: no hit (its window needs the evicted pages), so it computes blocks 0 and 1 in
//! every table. Once its own sliding pages of them fall behind its window they must wait as
//! protected pages (its full table holds the block), not lead the eviction order in a block of
//! their own while the old full pages linger — which let the pages of a shared prompt that later
//! hits need go first, and cut the hybrid manager's hit rate under load.
//!
//! Prompts are random token ids from a seed printed by the test; `KVBENCH_SEED` replays one.

use crate::support::hybrid_kv as hybrid_kv_support;
use crate::support::hybrid_prefix as cache_hybrid_prefix_support;

use cache_hybrid_prefix_support::{ok, probe_cached, prompt, seed, start, SLIDING};
use hybrid_kv_support::{build, mixes};
use kvbench::cache::hybrid::EvictProtected;
use kvbench_cache_api::{KvCacheManager, ReleaseReason};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

#[test]
fn a_recomputed_block_joins_its_own_tables_and_stays_protected_while_held() {
    let s = seed();
    println!("seed {s}");
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let mut kv = build(&mixes()[SLIDING]).with_evict_protected(EvictProtected::Always);
    let p = prompt(&mut rng, 24);
    start(&mut kv, 1, &p).expect("start");
    for _ in 0..6 {
        kv.fill(1, 4).expect("fill");
        ok(&kv);
    }
    assert_eq!(
        kv.protected_pages(),
        4,
        "blocks 0 and 1 of both sliding tables"
    );
    // A 33-page start evicts the four protected pages, then lets go of its own.
    let other = prompt(&mut rng, 44);
    start(&mut kv, 2, &other).expect("start evicting protected pages");
    assert_eq!(kv.prefix_stats().evictions, 4);
    kv.release(2, ReleaseReason::Finish).expect("release");
    ok(&kv);

    let mut q = p[..8].to_vec();
    q.extend(prompt(&mut rng, 16));
    assert_eq!(
        probe_cached(&kv, 3, &q).0,
        0,
        "the window of every hit reaches the evicted sliding pages"
    );
    start(&mut kv, 3, &q).expect("start");
    for _ in 0..6 {
        kv.fill(3, 4).expect("fill");
        ok(&kv);
    }
    let cached: Vec<u32> = kv.eviction_order().into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        cached.len(),
        4,
        "sequence 3's sliding pages of blocks 0 and 1, behind its window: {cached:?}"
    );
    for page in &cached {
        assert!(
            kv.eviction_protected(*page),
            "page {page} of sequence 3's block {:?} is cached-free while sequence 3 holds the \
             block in its full table: it must wait as protected",
            kv.eviction_block(*page)
        );
        assert_eq!(kv.eviction_block(*page).map(|b| b.0), Some(3));
    }
    if let Err(e) = kv.check_invariants_full() {
        panic!("invariants: {e}");
    }
    // The superseded full pages are sequence 1's alone now: its release frees them, and a
    // later prompt with the same head hits sequence 3's copy in every table.
    kv.release(1, ReleaseReason::Finish).expect("release");
    kv.release(3, ReleaseReason::Finish).expect("release");
    ok(&kv);
    let mut r = p[..8].to_vec();
    r.extend(prompt(&mut rng, 4));
    assert_eq!(
        probe_cached(&kv, 4, &r).0,
        8,
        "blocks 0 and 1 of every table"
    );
}
