//! Model-based tests of both cache managers: random operation sequences checked against a
//! reference model after every operation (`kvbench::cache::fuzz`), and proof that each planted
//! bug is caught by those same checks.
//!
//! `PROPTEST_CASES` raises the proptest case count; `KVBENCH_SEED` replays one seeded run and
//! `KVBENCH_FUZZ_SEEDS` widens the seeded sweep.

use crate::support;

use kvbench::cache::fuzz::{self, FuzzConfig, FuzzFailure, Op};
use kvbench::cache::PlantedBug;
use kvbench_cache_api::{CacheMode, Fault};
use proptest::prelude::*;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3u8, 0..24u8, 0..9u8, 0..5u8)
            .prop_map(|(family, shared_len, tail_len, scope)| Op::Start { family, shared_len, tail_len, scope }),
        3 => (any::<u8>(), 1..12u8).prop_map(|(pick, n)| Op::Fill { pick, n }),
        4 => (any::<u8>(), any::<u16>()).prop_map(|(pick, token)| Op::Append { pick, token }),
        1 => any::<u8>().prop_map(|pick| Op::Fork { pick }),
        2 => (any::<u8>(), 0..3u8).prop_map(|(pick, why)| Op::Release { pick, why }),
        2 => Just(Op::BeginStep),
        2 => any::<u8>().prop_map(|pick| Op::RetireStep { pick }),
        1 => Just(Op::Flush),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        // Integration tests have no lib.rs to anchor a regressions file; the failing ops print.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn paged_matches_the_model(ops in prop::collection::vec(op(), 1..150)) {
        if let Err(f) = fuzz::run_ops(FuzzConfig::small(CacheMode::Paged), &ops) {
            prop_assert!(false, "{f}");
        }
    }

    #[test]
    fn paged_block_size_one_matches_the_model(ops in prop::collection::vec(op(), 1..100)) {
        let cfg = FuzzConfig { block_size: 1, total_slots: 24, ..FuzzConfig::small(CacheMode::Paged) };
        if let Err(f) = fuzz::run_ops(cfg, &ops) {
            prop_assert!(false, "{f}");
        }
    }

    #[test]
    fn paged_extents_placement_matches_the_model(ops in prop::collection::vec(op(), 1..150)) {
        if let Err(f) = fuzz::run_ops(FuzzConfig::extents(), &ops) {
            prop_assert!(false, "{f}");
        }
    }

    #[test]
    fn contiguous_matches_the_model(ops in prop::collection::vec(op(), 1..150)) {
        if let Err(f) = fuzz::run_ops(FuzzConfig::small(CacheMode::Contiguous), &ops) {
            prop_assert!(false, "{f}");
        }
    }

    #[test]
    fn byte_decoding_never_breaks_the_managers(data in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Err(f) = fuzz::run_bytes(&data) {
            prop_assert!(false, "{f}");
        }
    }
}

fn seeds() -> Vec<u64> {
    support::seeds("KVBENCH_FUZZ_SEEDS", 40, 0)
}

#[test]
fn seeded_runs_pass_and_exercise_everything() {
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let mut totals = fuzz::FuzzSummary::default();
        for seed in seeds() {
            eprintln!("mode {mode:?} seed {seed} (replay: KVBENCH_SEED={seed})");
            let s = fuzz::run_seed_with(seed, 400, FuzzConfig::small(mode))
                .unwrap_or_else(|f| panic!("{f}"));
            totals.add(&s);
        }
        if seeds().len() > 1 {
            // The runs must reach the interesting states, or passing says little.
            assert!(
                totals.starts > 100 && totals.failed_allocations > 0 && totals.fenced_releases > 0,
                "{totals:?}"
            );
            assert!(totals.copies > 0, "{totals:?}");
            if mode == CacheMode::Paged {
                assert!(
                    totals.prefix_hit_blocks > 0 && totals.evictions > 0,
                    "{totals:?}"
                );
            }
        }
    }
}

#[test]
fn same_seed_same_run() {
    assert_eq!(fuzz::random_ops(7, 50), fuzz::random_ops(7, 50));
    let cfg = FuzzConfig::small(CacheMode::Paged);
    assert_eq!(
        fuzz::run_seed_with(7, 300, cfg).ok(),
        fuzz::run_seed_with(7, 300, cfg).ok()
    );
    let both = fuzz::run_seed(7, 300).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(
        both.ops, 900,
        "run_seed drives both modes, the paged one under both placements"
    );
}

/// The first seeded run that a planted bug makes fail, with its message.
fn first_catch(cfg: FuzzConfig, model_only: bool) -> Option<FuzzFailure> {
    (0..200u64).find_map(|seed| {
        let ops = fuzz::random_ops(seed, 400);
        let run = if model_only {
            fuzz::run_ops_model_only(cfg, &ops)
        } else {
            fuzz::run_ops(cfg, &ops)
        };
        run.err().map(|mut f| {
            f.seed = Some(seed);
            f
        })
    })
}

/// Both the manager's self-checks and, separately, the reference model alone must catch the bug.
fn assert_caught(cfg: FuzzConfig, by_checks: &[&str], by_model: &[&str]) {
    for (model_only, expect_any) in [(false, by_checks), (true, by_model)] {
        let f = first_catch(cfg, model_only).unwrap_or_else(|| {
            panic!("{cfg:?} model_only={model_only}: no seed caught the planted bug")
        });
        eprintln!("{cfg:?} model_only={model_only} caught:\n{f}");
        assert!(
            expect_any.iter().any(|e| f.message.contains(e)),
            "{cfg:?} model_only={model_only} was caught for an unexpected reason: {}",
            f.message
        );
    }
}

#[test]
fn a_correct_manager_passes_the_model_only_runs_too() {
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        assert!(first_catch(FuzzConfig::small(mode), true).is_none());
    }
}

#[test]
fn planted_skip_cow_is_caught() {
    let cfg = FuzzConfig {
        fault: Some(Fault::SkipCow),
        ..FuzzConfig::small(CacheMode::Paged)
    };
    assert_caught(cfg, &["without copy-on-write"], &["reads ", "live slots"]);
}

#[test]
fn planted_early_reuse_is_caught() {
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let cfg = FuzzConfig {
            fault: Some(Fault::EarlyReuse),
            ..FuzzConfig::small(mode)
        };
        assert_caught(cfg, &["fence"], &["before its fence", "reads"]);
    }
}

#[test]
fn planted_leak_is_caught() {
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let cfg = FuzzConfig {
            fault: Some(Fault::Leak),
            ..FuzzConfig::small(mode)
        };
        assert_caught(
            cfg,
            &["ref count", "belong to nothing"],
            &["live slots", "free"],
        );
    }
}

#[test]
fn planted_bad_block_table_is_caught() {
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let cfg = FuzzConfig {
            fault: Some(Fault::BadBlockTable),
            ..FuzzConfig::small(mode)
        };
        assert_caught(
            cfg,
            &["layout"],
            &["reads", "holds", "unmapped", "before its fence"],
        );
    }
}

#[test]
fn planted_cross_scope_hit_is_caught() {
    let cfg = FuzzConfig {
        bug: Some(PlantedBug::CrossScopeHit),
        ..FuzzConfig::small(CacheMode::Paged)
    };
    assert_caught(cfg, &["scope"], &["scope"]);
}
