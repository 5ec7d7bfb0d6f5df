//! The paged manager's incremental invariant check finds what the full walk finds, at the same
//! check, and walks the whole pool only now and then.
//!
//! Seeded operation strings (shared prompts, chunked fills, generated tokens, forks, releases
//! for finish and preemption, steps begun and retired, flushes) on small pools that fill up and
//! evict, under both placements and every eviction policy, the check run after every operation:
//! the incremental check (`check_invariants`, what the engine calls at `--check-every 1`) fails
//! exactly when the full walk (`check_invariants_full`) fails. Clean, both pass and the full
//! walks are the first check and one every 64 (on these small pools); with each planted fault armed, the
//! fault fires and the incremental check reports it at the first operation the full walk does.
//!
//! Prompts are random token ids from a seed printed by the test; `KVBENCH_SEED` replays one.

mod support;

use kvbench::cache::{EvictionPolicy, PagedCache, PagedConfig, Placement, PlantedBug};
use kvbench_cache_api::{
    Fault, KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest, StepId,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The incremental check's period of full walks: `max(64, blocks / 8)` checks
/// (`check_incremental::walk_period`), 64 on these 40-block pools.
const FULL_EVERY: u64 = 64;
const OPS: usize = 500;

#[derive(Debug, Clone, Copy)]
enum Plant {
    None,
    Trait(Fault),
    Bug(PlantedBug),
}

fn ids(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(0..50_000)).collect()
}

fn cache(placement: Placement, eviction: EvictionPolicy) -> PagedCache {
    PagedCache::with_eviction(
        PagedConfig {
            total_blocks: 40,
            block_size: 4,
            prefix_cache: true,
            placement,
        },
        eviction,
    )
}

/// One seeded string with `plant` armed, both checks after every operation. Returns (operations
/// after which the full walk failed, checks run, the cache).
fn run_string(
    placement: Placement,
    eviction: EvictionPolicy,
    plant: Plant,
    s: u64,
) -> (u64, u64, PagedCache) {
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let prefixes: Vec<Vec<u32>> = (0..3).map(|_| ids(&mut rng, 10)).collect();
    let scopes: Vec<ScopeKey> = (0..2)
        .map(|t| ScopeKey {
            model: "m".into(),
            tokenizer: "t".into(),
            reuse: ReuseScope::Tenant(t),
        })
        .collect();
    let mut c = cache(placement, eviction);
    match plant {
        Plant::None => {}
        Plant::Trait(f) => c.inject_fault(f),
        Plant::Bug(b) => c.plant_bug(b),
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
                let extra = rng.gen_range(0..10);
                p.extend(ids(&mut rng, extra));
                let started = c.start(&StartRequest {
                    seq: next,
                    tokens: &p,
                    scope: Some(&scopes[rng.gen_range(0..2)]),
                    reserve_tokens: p.len() as u32,
                });
                if let Ok(st) = started {
                    live.push((next, p.len() as u32 - st.cached_tokens));
                }
                next += 1;
            }
            3 | 4 if !live.is_empty() => {
                let k = rng.gen_range(0..live.len());
                let (seq, left) = live[k];
                if left > 0 {
                    let n = rng.gen_range(1..=left);
                    if c.fill(seq, n).is_ok() {
                        live[k].1 -= n;
                    }
                } else {
                    let _ = c.append_token(seq, rng.gen_range(0..50_000));
                }
            }
            5 if !live.is_empty() => {
                let (seq, left) = live[rng.gen_range(0..live.len())];
                if left == 0 && c.fork(seq, next).is_ok() {
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
                c.release(seq, why).unwrap();
            }
            7 | 8 => steps.push(c.begin_step()),
            9 if rng.gen_bool(0.05) => c.flush_prefix_cache(),
            _ if !steps.is_empty() => {
                let step = steps.remove(0);
                c.retire_step(step);
            }
            _ => {}
        }
        let full = c.check_invariants_full();
        let incremental = c.check_invariants();
        checks += 1;
        assert_eq!(
            incremental.is_err(),
            full.is_err(),
            "{placement:?} {eviction:?} {plant:?} seed {s} op {i}: incremental {incremental:?}, \
             full walk {full:?}"
        );
        failed += u64::from(full.is_err());
    }
    if matches!(plant, Plant::None) {
        for (seq, _) in live {
            c.release(seq, ReleaseReason::Finish).unwrap();
        }
        for step in steps {
            c.retire_step(step);
        }
        c.assert_quiescent().unwrap();
    }
    (failed, checks, c)
}

fn configs() -> Vec<(Placement, EvictionPolicy)> {
    [Placement::Lifo, Placement::Extents]
        .into_iter()
        .flat_map(|p| EvictionPolicy::ALL.into_iter().map(move |e| (p, e)))
        .collect()
}

#[test]
fn clean_strings_pass_both_checks_and_walk_the_pool_only_every_so_often() {
    let base = support::seed_or(0x5eed_2027);
    println!("seed {base}");
    for (ci, (placement, eviction)) in configs().into_iter().enumerate() {
        for round in 0..4u64 {
            let s = base ^ (ci as u64) << 32 ^ round;
            let (failed, checks, c) = run_string(placement, eviction, Plant::None, s);
            assert_eq!(failed, 0, "{placement:?} {eviction:?} seed {s}");
            // The first check and every FULL_EVERY-th walk the pool; the rest only what changed.
            assert_eq!(
                c.invariant_full_walks(),
                1 + checks / FULL_EVERY,
                "{placement:?} {eviction:?} seed {s}: full walks"
            );
        }
    }
}

/// Every planted fault fires on some string and the incremental check catches it where the full
/// walk does (the assertion inside `run_string`, at every operation).
#[test]
fn every_planted_fault_is_caught_at_the_same_operation_as_the_full_walk() {
    let base = support::seed_or(0x5eed_2027);
    println!("seed {base}");
    let mut plants: Vec<Plant> = Fault::ALL.into_iter().map(Plant::Trait).collect();
    plants.push(Plant::Bug(PlantedBug::CrossScopeHit));
    for plant in plants {
        let (mut caught, mut fired) = (0u64, 0u64);
        for (ci, (placement, eviction)) in configs().into_iter().enumerate() {
            for round in 0..3u64 {
                let s = base ^ (ci as u64) << 32 ^ round;
                let (failed, _, c) = run_string(placement, eviction, plant, s);
                caught += failed;
                fired += c.fault_fired();
            }
        }
        // A cross-scope hit is a wrong answer, not a broken structure: the checks stay clean
        // (the shadow and the oracle catch it); the faults of the trait break the structure.
        if let Plant::Trait(f) = plant {
            assert!(fired > 0, "{f:?} never fired");
            assert!(caught > 0, "{f:?}: fired but never caught");
        }
    }
}
