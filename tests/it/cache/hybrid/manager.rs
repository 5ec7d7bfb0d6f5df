//! The hybrid paged manager (`kvbench::cache::hybrid`): random operation strings (start, append
//! n, fork, release) over several layer-group mixes, checked after every operation against a
//! plain reference model of the logical blocks each sequence must hold in each table, with the
//! manager's invariants, and quiescence at the end; a planted bug the same checks catch; a fork's
//! copy-on-write and a sliding window's release by hand. Layouts, fits and the prefix hit rule
//! are `layout.rs`.
//!
//! `PROPTEST_CASES` raises the proptest case count; `KVBENCH_SEED` replays one seeded run and
//! `KVBENCH_HYBRID_SEEDS` widens the seeded sweep.

use crate::support;
use crate::support::cache_hybrid as cache_hybrid_support;

use cache_hybrid_support::model::{op, random_ops, run_ops, Op};
use cache_hybrid_support::{build, mixes};
use kvbench::cache::hybrid::{HybridError, HybridFault};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn hybrid_matches_the_model(mix in 0..4usize, ops in prop::collection::vec(op(), 1..120)) {
        if let Err(e) = run_ops(&mixes()[mix], &ops, None, true) {
            prop_assert!(false, "{e}");
        }
    }
}

fn seeds() -> Vec<u64> {
    support::seeds("KVBENCH_HYBRID_SEEDS", 32, 0)
}

#[test]
fn seeded_operation_strings_match_the_model() {
    let seeds = seeds();
    eprintln!("seeds {seeds:?} (replay one: KVBENCH_SEED=N)");
    for seed in seeds {
        for mix in mixes() {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let ops = random_ops(&mut rng, 300);
            if let Err(e) = run_ops(&mix, &ops, None, true) {
                panic!("seed {seed} (replay: KVBENCH_SEED={seed}): {e}");
            }
        }
    }
}

#[test]
fn keeping_out_of_window_blocks_is_caught() {
    let gemma_like = &mixes()[0];
    let (mut by_model, mut by_invariants, mut runs) = (0, 0, 0);
    for seed in 0..16u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ops = random_ops(&mut rng, 300);
        assert_eq!(
            run_ops(gemma_like, &ops, None, true),
            Ok(()),
            "seed {seed}: the unplanted manager must pass"
        );
        runs += 1;
        let fault = Some(HybridFault::KeepOutOfWindow);
        if let Err(e) = run_ops(gemma_like, &ops, fault, false) {
            assert!(e.contains("holds blocks"), "seed {seed}: {e}");
            by_model += 1;
        }
        if let Err(e) = run_ops(gemma_like, &ops, fault, true) {
            assert!(
                e.contains("holds blocks") || e.contains("should hold"),
                "seed {seed}: {e}"
            );
            by_invariants += 1;
        }
    }
    // Every string grows some sequence past its 10-token window.
    assert_eq!((by_model, by_invariants), (runs, runs));

    // And the smallest case by hand: 14 tokens, window 10, blocks of 4: block 0 (tokens 0–3)
    // is wholly before the window (tokens 4–13).
    let ops = [Op::Start, Op::Append { pick: 0, n: 14 }];
    assert_eq!(run_ops(gemma_like, &ops, None, true), Ok(()));
    let err = run_ops(gemma_like, &ops, Some(HybridFault::KeepOutOfWindow), true).unwrap_err();
    assert!(
        err.contains("holds blocks [0, 1, 2, 3], model [1, 2, 3]"),
        "{err}"
    );
}

#[test]
fn a_fork_shares_pages_and_copies_a_partial_last_block_on_write() {
    let mix = &mixes()[0]; // 6 tables of 1 layer, blocks of 4 tokens
    let mut cache = build(mix);
    cache.start(1).unwrap();
    cache.append(1, 6).unwrap(); // 2 blocks a table, the second half full
    assert_eq!(cache.used_pages(), 12);
    cache.fork(1, 2).unwrap();
    assert_eq!(cache.used_pages(), 12, "a fork takes no page");
    let shared = cache.table(1, 5).unwrap().pages.clone();
    assert!(shared.iter().all(|&p| cache.page_refs(p) == Some(2)));
    cache.append(2, 1).unwrap();
    let copies = cache.take_copies();
    assert_eq!(
        copies.len(),
        6,
        "one copy of the partial last block a table"
    );
    assert!(copies.iter().all(|c| c.src != c.dst));
    assert_eq!(cache.used_pages(), 18);
    assert_eq!(
        cache.page_refs(shared[0]),
        Some(2),
        "full blocks stay shared"
    );
    assert_eq!(
        cache.page_refs(shared[1]),
        Some(1),
        "the parent keeps its partial block"
    );
    cache.append(1, 1).unwrap();
    assert!(
        cache.take_copies().is_empty(),
        "no longer shared: written in place"
    );
    assert!(cache.check_invariants().is_empty());
    cache.release(1).unwrap();
    cache.release(2).unwrap();
    assert!(cache.check_quiescent().is_empty());
    assert_eq!(cache.start(3), Ok(()));
    assert_eq!(cache.start(3), Err(HybridError::DuplicateSeq(3)));
    assert_eq!(cache.append(9, 1), Err(HybridError::UnknownSeq(9)));
    let before = cache.free_pages();
    assert!(matches!(
        cache.append(3, 10_000),
        Err(HybridError::OutOfPages { .. })
    ));
    assert_eq!(
        cache.free_pages(),
        before,
        "a refused append changes nothing"
    );
}

#[test]
fn a_sliding_table_releases_blocks_as_the_window_moves() {
    let mix = &mixes()[0]; // window 10, blocks of 4; table 0 is sliding, table 5 full
    let mut cache = build(mix);
    cache.start(7).unwrap();
    let mut held = Vec::new();
    for tokens in 1..=40u64 {
        cache.append(7, 1).unwrap();
        let t = cache.table(7, 0).unwrap();
        held.push((t.first_block, t.end_block()));
        assert_eq!(cache.table(7, 5).unwrap().first_block, 0);
        assert_eq!(cache.table(7, 5).unwrap().end_block(), tokens.div_ceil(4));
    }
    // At 12 tokens the window is tokens 2..12: block 0 (tokens 0..4) still holds token 2–3.
    assert_eq!(held[11], (0, 3));
    // At 14 tokens the window is 4..14: block 0 is gone.
    assert_eq!(held[13], (1, 4));
    // At 40 tokens: window 30..40, blocks 7 (28..32), 8, 9.
    assert_eq!(held[39], (7, 10));
    // One unshared sequence: 3 sliding blocks × 5 tables + 10 full blocks.
    assert_eq!(cache.used_pages(), 25);
}
