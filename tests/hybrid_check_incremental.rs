//! The hybrid manager's incremental invariant check finds what the full walk finds, at the same
//! check, and walks the whole pool only now and then.
//!
//! Seeded operation strings over the mixes (shared prompts, chunked fills, generated tokens,
//! forks, releases for finish and preemption, steps begun and retired, flushes), the check run
//! after every operation: the incremental check (`check_invariants`, what the engine calls at
//! `--check-every 1`) fails exactly when the full walk (`check_invariants_full`) fails. Clean,
//! both pass and the full walks are the first check and one every `FULL_EVERY`; with each
//! planted fault (`HybridFault`s and the trait's `Fault`s) armed, the fault fires and the
//! incremental check reports it at the first operation the full walk does.
//!
//! Prompts are random token ids from a seed printed by the test; `KVBENCH_SEED` replays one.

mod hybrid_kv_support;
mod support;

use hybrid_kv_support::{build, mixes, Mix};
use kvbench::cache::hybrid::{HybridFault, HybridKv};
use kvbench_cache_api::{
    Fault, KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest, StepId,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The incremental check's period of full walks (`check_incremental::FULL_EVERY`).
const FULL_EVERY: u64 = 64;
const OPS: usize = 400;

#[derive(Debug, Clone, Copy)]
enum Plant {
    None,
    Hybrid(HybridFault),
    Trait(Fault),
}

fn ids(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(0..50_000)).collect()
}

/// One seeded string on `m` with `plant` armed, both checks after every operation. Returns
/// (operations after which the full walk failed, incremental checks run).
fn run_string(m: &Mix, plant: Plant, s: u64) -> (u64, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let prefixes: Vec<Vec<u32>> = (0..3).map(|_| ids(&mut rng, 30)).collect();
    let scope = ScopeKey {
        model: "mix".into(),
        tokenizer: "tok".into(),
        reuse: ReuseScope::Global,
    };
    let mut kv: HybridKv = build(m);
    match plant {
        Plant::None => {}
        Plant::Hybrid(f) => kv.plant_fault(f),
        Plant::Trait(f) => kv.inject_fault(f),
    }
    // (seq, prompt tokens left to fill)
    let mut live: Vec<(u64, u32)> = Vec::new();
    let mut steps: Vec<StepId> = Vec::new();
    let mut next = 1u64;
    let (mut failed, mut checks) = (0u64, 0u64);
    for i in 0..OPS {
        match rng.gen_range(0..12) {
            0..=2 => {
                let mut p = prefixes[rng.gen_range(0..3)].clone();
                let extra = rng.gen_range(0..12);
                p.extend(ids(&mut rng, extra));
                let st = kv.start(&StartRequest {
                    seq: next,
                    tokens: &p,
                    scope: Some(&scope),
                    reserve_tokens: p.len() as u32,
                });
                if let Ok(st) = st {
                    live.push((next, p.len() as u32 - st.cached_tokens));
                }
                next += 1;
            }
            3 | 4 if !live.is_empty() => {
                let k = rng.gen_range(0..live.len());
                let (seq, left) = live[k];
                if left > 0 {
                    let n = rng.gen_range(1..=left);
                    if kv.fill(seq, n).is_ok() {
                        live[k].1 -= n;
                    }
                } else {
                    let _ = kv.append_token(seq, rng.gen_range(0..50_000));
                }
            }
            5 if !live.is_empty() => {
                let (seq, left) = live[rng.gen_range(0..live.len())];
                if left == 0 && kv.fork(seq, next).is_ok() {
                    live.push((next, 0));
                }
                next += 1;
            }
            6 if !live.is_empty() => {
                let (seq, _) = live.swap_remove(rng.gen_range(0..live.len()));
                let why = if rng.gen_bool(0.3) {
                    ReleaseReason::Preempt
                } else {
                    ReleaseReason::Finish
                };
                kv.release(seq, why).unwrap();
            }
            7 | 8 => steps.push(kv.begin_step()),
            9 if rng.gen_bool(0.05) => kv.flush_prefix_cache(),
            _ if !steps.is_empty() => {
                let step = steps.remove(0);
                kv.retire_step(step);
            }
            _ => {}
        }
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
    }
    if matches!(plant, Plant::None) {
        for (seq, _) in live {
            kv.release(seq, ReleaseReason::Finish).unwrap();
        }
        for step in steps {
            kv.retire_step(step);
        }
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
            let (failed, _) = run_string(m, Plant::None, s);
            assert_eq!(failed, 0, "{} seed {s}", m.name);
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
