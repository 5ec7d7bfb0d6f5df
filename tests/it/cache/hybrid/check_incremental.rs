//! The hybrid manager's incremental invariant check finds what the full walk finds, at the same
//! check, and walks the whole pool only now and then.
//!
//! Seeded operation strings over the mixes (shared prompts, chunked fills, generated tokens,
//! forks, releases for finish and preemption, steps begun and retired, flushes), the check run
//! after every operation: the incremental check (`check_invariants`, what the engine calls at
//! `--check-every 1`) fails exactly when the full walk (`check_invariants_full`) fails. Clean
//! (starts allowed to evict protected blocks' pages or not, `cache.evict_protected`), both pass
//! and the full walks are the first check and one every `FULL_EVERY`; with each
//! planted fault (`HybridFault`s and the trait's `Fault`s) armed, the fault fires and the
//! incremental check reports it at the first operation the full walk does.
//!
//! Prompts are random token ids from a seed printed by the test; `KVBENCH_SEED` replays one.

use crate::support;
use crate::support::check_strings;
use crate::support::hybrid_kv as hybrid_kv_support;

use hybrid_kv_support::{build, mixes, Mix};
use kvbench::cache::hybrid::{EvictProtected, HybridFault, HybridKv};
use kvbench_cache_api::{Fault, KvCacheManager, ReuseScope, ScopeKey};

/// The incremental check's period of full walks: `max(64, pages / 8)` checks
/// (`cache::touched::walk_period`), 64 on these pools of at most 56 pages.
const FULL_EVERY: u64 = 64;
const OPS: usize = 400;

#[derive(Debug, Clone, Copy)]
enum Plant {
    None,
    Hybrid(HybridFault),
    Trait(Fault),
}

/// One seeded string on `m` with `plant` armed, both checks after every operation. Returns
/// (operations after which the full walk failed, incremental checks run).
fn run_string(m: &Mix, plant: Plant, s: u64) -> (u64, u64) {
    run_string_evicting(m, plant, s, EvictProtected::Always)
}

/// [`run_string`] with starts allowed to evict protected blocks' pages or not.
fn run_string_evicting(m: &Mix, plant: Plant, s: u64, evict: EvictProtected) -> (u64, u64) {
    let scopes = [ScopeKey {
        model: "mix".into(),
        tokenizer: "tok".into(),
        reuse: ReuseScope::Global,
    }];
    let prompts = check_strings::Prompts {
        prefix_tokens: 30,
        extra_tokens: 12,
        scopes: &scopes,
    };
    let mut kv: HybridKv = build(m).with_evict_protected(evict);
    match plant {
        Plant::None => {}
        Plant::Hybrid(f) => kv.plant_fault(f),
        Plant::Trait(f) => kv.inject_fault(f),
    }
    let (mut failed, mut checks) = (0u64, 0u64);
    let clean = matches!(plant, Plant::None);
    check_strings::run(&mut kv, &prompts, s, OPS, clean, |kv, i| {
        let full = kv.check_invariants_full();
        let incremental = kv.check_invariants();
        checks += 1;
        assert_eq!(
            incremental.is_err(),
            full.is_err(),
            "{} {plant:?} seed {s} op {i}: incremental {incremental:?}, full walk {full:?}",
            m.name
        );
        failed += u64::from(full.is_err());
    });
    if clean {
        kv.assert_quiescent().unwrap();
        // The first check and every FULL_EVERY-th walk the pool; the rest only what changed.
        assert_eq!(
            kv.invariant_full_walks(),
            1 + checks / FULL_EVERY,
            "{} seed {s}: full walks",
            m.name
        );
    }
    (failed, checks)
}

#[test]
fn clean_strings_pass_both_checks_and_walk_the_pool_only_every_so_often() {
    let base = support::seed_or(0x5eed_2026);
    for (mi, m) in mixes().iter().enumerate() {
        for round in 0..6u64 {
            let s = base ^ (mi as u64) << 32 ^ round;
            for evict in [EvictProtected::Always, EvictProtected::ToGrow] {
                let (failed, _) = run_string_evicting(m, Plant::None, s, evict);
                assert_eq!(failed, 0, "{} {evict:?} seed {s}", m.name);
            }
        }
    }
}

/// Every planted fault fires on some string and the incremental check catches it where the full
/// walk does (the assertion inside `run_string`, at every operation).
#[test]
fn every_planted_fault_is_caught_at_the_same_operation_as_the_full_walk() {
    let base = support::seed_or(0x5eed_2026);
    let mut plants = vec![
        Plant::Hybrid(HybridFault::KeepOutOfWindow),
        Plant::Hybrid(HybridFault::PublishEarly),
    ];
    plants.extend(Fault::ALL.into_iter().map(Plant::Trait));
    for plant in plants {
        let mut caught = 0u64;
        for (mi, m) in mixes().iter().enumerate() {
            for round in 0..6u64 {
                let s = base ^ (mi as u64) << 32 ^ round;
                caught += run_string(m, plant, s).0;
            }
        }
        assert!(caught > 0, "{plant:?}: never fired nor caught");
    }
}
