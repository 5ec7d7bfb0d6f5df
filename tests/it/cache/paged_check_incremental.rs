//! The paged manager's incremental invariant check finds what the full walk finds, at the same
//! check, and walks the whole pool only now and then.
//!
//! Seeded operation strings (shared prompts, chunked fills, generated tokens, forks, releases
//! for finish and preemption, steps begun and retired, flushes) on small pools that fill up and
//! evict, under both placements and every eviction policy and over host and disk tiers, the
//! check run after every operation:
//! the incremental check (`check_invariants`, what the engine calls at `--check-every 1`) fails
//! exactly when the full walk (`check_invariants_full`) fails. Clean, both pass and the full
//! walks are the first check and one every 64 (on these small pools); with each planted fault armed, the
//! fault fires and the incremental check reports it at the first operation the full walk does.
//!
//! Prompts are random token ids from a seed printed by the test; `KVBENCH_SEED` replays one.

use crate::support;
use crate::support::check_strings;

use kvbench::cache::{EvictionPolicy, PagedCache, PagedConfig, Placement, PlantedBug, TierConfig};
use kvbench_cache_api::{Fault, KvCacheManager, OffloadMode, ReuseScope, ScopeKey};

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

/// Lower tiers under the device pool: none, a host tier, or host and disk.
#[derive(Debug, Clone, Copy)]
enum Tiers {
    None,
    Host,
    HostDisk,
}

fn cache(placement: Placement, eviction: EvictionPolicy, tiers: Tiers) -> PagedCache {
    let (host_blocks, disk_blocks) = match tiers {
        Tiers::None => (0, 0),
        Tiers::Host => (12, 0),
        Tiers::HostDisk => (6, 12),
    };
    PagedCache::with_tiers(
        PagedConfig {
            total_blocks: 40,
            block_size: 4,
            prefix_cache: true,
            placement,
        },
        eviction,
        TierConfig {
            host_blocks,
            disk_blocks,
            offload: OffloadMode::OnEvict,
            ..TierConfig::default()
        },
    )
}

/// One seeded string with `plant` armed, both checks after every operation. Returns (operations
/// after which the full walk failed, checks run, the cache).
fn run_string(
    (placement, eviction, tiers): Config,
    plant: Plant,
    s: u64,
) -> (u64, u64, PagedCache) {
    let scopes: Vec<ScopeKey> = (0..2)
        .map(|t| ScopeKey {
            model: "m".into(),
            tokenizer: "t".into(),
            reuse: ReuseScope::Tenant(t),
        })
        .collect();
    let prompts = check_strings::Prompts {
        prefix_tokens: 10,
        extra_tokens: 10,
        scopes: &scopes,
    };
    let mut c = cache(placement, eviction, tiers);
    match plant {
        Plant::None => {}
        Plant::Trait(f) => c.inject_fault(f),
        Plant::Bug(b) => c.plant_bug(b),
    }
    let (mut failed, mut checks) = (0u64, 0u64);
    let clean = matches!(plant, Plant::None);
    let mut ops = Vec::new();
    check_strings::run(&mut c, &prompts, s, OPS, clean, |c, i| {
        // The engine takes the tier transfers a step's calls decided as it plans the step.
        c.drain_tier_ops(&mut ops);
        ops.clear();
        let full = c.check_invariants_full();
        let incremental = c.check_invariants();
        checks += 1;
        assert_eq!(
            incremental.is_err(),
            full.is_err(),
            "{placement:?} {eviction:?} {tiers:?} {plant:?} seed {s} op {i}: incremental \
             {incremental:?}, full walk {full:?}"
        );
        failed += u64::from(full.is_err());
    });
    if clean {
        c.assert_quiescent().unwrap();
    }
    (failed, checks, c)
}

type Config = (Placement, EvictionPolicy, Tiers);

/// Both placements under every eviction policy, and the lower tiers under the default pair.
fn configs() -> Vec<Config> {
    let mut all: Vec<Config> = [Placement::Lifo, Placement::Extents]
        .into_iter()
        .flat_map(|p| {
            EvictionPolicy::ALL
                .into_iter()
                .map(move |e| (p, e, Tiers::None))
        })
        .collect();
    for tiers in [Tiers::Host, Tiers::HostDisk] {
        all.push((Placement::Lifo, EvictionPolicy::Lru, tiers));
    }
    all
}

#[test]
fn clean_strings_pass_both_checks_and_walk_the_pool_only_every_so_often() {
    let base = support::seed_or(0x5eed_2027);
    println!("seed {base}");
    for (ci, config) in configs().into_iter().enumerate() {
        for round in 0..4u64 {
            let s = base ^ (ci as u64) << 32 ^ round;
            let (failed, checks, c) = run_string(config, Plant::None, s);
            assert_eq!(failed, 0, "{config:?} seed {s}");
            // The first check and every FULL_EVERY-th walk the pool; the rest only what changed.
            assert_eq!(
                c.invariant_full_walks(),
                1 + checks / FULL_EVERY,
                "{config:?} seed {s}: full walks"
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
        for (ci, config) in configs().into_iter().enumerate() {
            for round in 0..3u64 {
                let s = base ^ (ci as u64) << 32 ^ round;
                let (failed, _, c) = run_string(config, plant, s);
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
