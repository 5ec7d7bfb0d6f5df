//! The sim shadow payload verifies grouped layouts: random runs of starts, chunked prefills,
//! decodes, forks and cancellations, two steps in flight as the engine keeps them, driven
//! through the sim backend against the grouped managers over full + sliding, full + recurrent
//! and full + MLA layouts. Clean runs report no violation and a non-zero count of checked
//! grouped reads; each planted fault (a skipped copy-on-write, pages reused before the fence, a
//! wrong block table, a sliding table released one block too early) is caught by the shadow
//! itself.
//!
//! Seeded: each run prints its seed; `KVBENCH_SEED` replays one, `KVBENCH_SHADOW_GROUPED_SEEDS`
//! widens the sweep.

use crate::support;
use crate::support::shadow_grouped as shadow_grouped_support;

use kvbench::shadow::ShadowReport;
use kvbench_cache_api::{CacheMode, Fault, KvCacheManager};

use shadow_grouped_support::driver::{Driver, Tally};
use shadow_grouped_support::early_release::EarlyRelease;
use shadow_grouped_support::{layout, manager, mixes, Which, MANAGERS, STEPS};

fn seeds() -> Vec<u64> {
    support::seeds("KVBENCH_SHADOW_GROUPED_SEEDS", 3, 1)
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn clean_grouped_runs_report_no_violation_and_check_every_table() {
    for mix in mixes() {
        for which in MANAGERS {
            for seed in seeds() {
                let name = format!("{} / {which:?} / seed {seed}", mix.shape.name);
                println!("{name} (replay: KVBENCH_SEED={seed})");
                let mut d = Driver::new(manager(which, &mix), seed, 7);
                let r = d.run(STEPS);
                let t = &d.tally;
                println!(
                    "  checked {} of {} grouped reads, wrote {}; {t:?}",
                    r.checked_slots, r.read_slots, r.written_slots
                );
                assert_eq!(r.violations, 0, "{name}: {:?} {t:?}", r.messages);
                assert!(t.invariant_errors.is_empty(), "{name}: {t:?}");
                assert!(
                    t.starts > 5 && t.finished > 3 && t.cancels > 3,
                    "{name}: the run exercised too little: {t:?}"
                );
                assert!(t.forks > 0, "{name}: no fork: {t:?}");
                assert!(
                    t.swaps > 0 || which == Which::Contiguous,
                    "{name}: no swap: {t:?}"
                );
                assert!(
                    r.checked_slots > 0 && r.read_slots >= r.checked_slots,
                    "{name}: {r:?}"
                );
                assert!(r.written_slots > 0, "{name}: {r:?}");
                assert!(r.allocated_bytes > 0, "{name}: {r:?}");
                d.cache.assert_quiescent().expect("quiescent");
            }
        }
    }
}

/// A run of `cache` (its fault armed): the shadow's report, how often the fault fired, and what
/// the run did.
fn faulty(cache: Box<dyn KvCacheManager>, seed: u64) -> (ShadowReport, u64, Tally) {
    let mut d = Driver::new(cache, seed, 5);
    let r = d.run(STEPS);
    let fired = d.cache.fault_fired();
    println!(
        "  fired {fired}, {} violations, first: {:?}; {:?}",
        r.violations,
        r.messages.first(),
        d.tally
    );
    (r, fired, d.tally)
}

#[test]
fn pages_reused_before_the_fence_are_caught_by_the_shadow() {
    for mix in mixes() {
        for which in MANAGERS {
            for seed in seeds() {
                let name = format!("{} / {which:?} / seed {seed}", mix.shape.name);
                println!("{name} (replay: KVBENCH_SEED={seed})");
                let mut cache = manager(which, &mix);
                cache.inject_fault(Fault::EarlyReuse);
                let (r, fired, t) = faulty(cache, seed);
                assert!(fired > 0, "{name}: the fault never fired: {t:?}");
                assert!(
                    r.violations > 0,
                    "{name}: early reuse not caught: {r:?} {t:?}"
                );
                assert!(
                    r.messages.iter().any(|m| m.contains("read position")),
                    "{name}: {:?}",
                    r.messages
                );
            }
        }
    }
}

#[test]
fn a_wrong_block_table_is_caught_by_the_shadow() {
    for mix in mixes() {
        for which in MANAGERS {
            for seed in seeds() {
                let name = format!("{} / {which:?} / seed {seed}", mix.shape.name);
                println!("{name} (replay: KVBENCH_SEED={seed})");
                let mut cache = manager(which, &mix);
                cache.inject_fault(Fault::BadBlockTable);
                let (r, fired, t) = faulty(cache, seed);
                assert!(fired > 0, "{name}: the fault never fired: {t:?}");
                assert!(
                    r.violations > 0,
                    "{name}: bad table not caught: {r:?} {t:?}"
                );
            }
        }
    }
}

#[test]
fn a_sliding_table_released_one_block_too_early_is_caught_by_the_shadow() {
    let mix = mixes().remove(0);
    for which in MANAGERS {
        for seed in seeds() {
            let name = format!("{} / {which:?} / seed {seed}", mix.shape.name);
            println!("{name} (replay: KVBENCH_SEED={seed})");
            let pool = layout(&mix).grouped_pool();
            let cache = Box::new(EarlyRelease::new(manager(which, &mix), &pool));
            let (r, fired, t) = faulty(cache, seed);
            assert!(fired > 0, "{name}: no table was cut: {t:?}");
            assert!(r.violations > 0, "{name}: {r:?} {t:?}");
            assert!(
                r.messages
                    .iter()
                    .any(|m| m.contains("of table 0, which the table no longer holds")),
                "{name}: {:?}",
                r.messages
            );
        }
    }
}

#[test]
fn a_write_into_a_shared_page_without_its_copy_is_caught_by_the_shadow() {
    // Only the hybrid manager shares pages (a fork's partial last page); the baseline copies.
    for mix in mixes() {
        for seed in seeds() {
            let name = format!("{} / Hybrid / seed {seed}", mix.shape.name);
            println!("{name} (replay: KVBENCH_SEED={seed})");
            let mut cache = manager(Which::Hybrid, &mix);
            cache.inject_fault(Fault::SkipCow);
            let (r, fired, t) = faulty(cache, seed);
            assert!(t.forks > 0, "{name}: no fork, nothing shared: {t:?}");
            assert!(
                r.violations > 0,
                "{name}: skipped copy not caught: {r:?} {t:?}"
            );
            // Each skipped copy is a write into a page the other stream reads, seen by the
            // writer's look at the page's readers: most are reported as they happen, not
            // found later by chance (a build that stored decodes blind caught 1 in 50).
            assert!(
                r.violations * 2 >= fired,
                "{name}: {} violations for {fired} skipped copies: {:?}",
                r.violations,
                r.messages.first()
            );
            assert!(
                r.messages.iter().any(|m| m.contains("read position")),
                "{name}: {:?}",
                r.messages
            );
        }
    }
}

/// The grouped shadow's shortcuts — the fused decode, a fresh stream's first step in one pass, a
/// decode's blind store where its record alone holds the page — are the general path made
/// cheaper: a run reports exactly what the same run reports without them (every violation, in
/// order, and every count), clean or with any planted fault.
#[test]
fn the_shortcuts_report_what_the_general_path_reports() {
    let faults = [
        None,
        Some(Fault::EarlyReuse),
        Some(Fault::BadBlockTable),
        Some(Fault::SkipCow),
    ];
    let mut compared_violations = 0;
    for mix in mixes() {
        for which in MANAGERS {
            for fault in faults {
                for early_release in [false, true] {
                    for seed in seeds() {
                        let name = format!(
                            "{} / {which:?} / {fault:?} / early release {early_release} / seed \
                             {seed}",
                            mix.shape.name
                        );
                        println!("{name} (replay: KVBENCH_SEED={seed})");
                        let run = |shortcuts: bool| {
                            let mut cache = manager(which, &mix);
                            if let Some(f) = fault {
                                cache.inject_fault(f);
                            }
                            if early_release {
                                let pool = layout(&mix).grouped_pool();
                                cache = Box::new(EarlyRelease::new(cache, &pool));
                            }
                            let mut d = Driver::new(cache, seed, 5);
                            d.be.set_shadow_shortcuts(shortcuts);
                            let r = d.run(STEPS);
                            (r, format!("{:?}", d.tally))
                        };
                        let (fast, fast_tally) = run(true);
                        let (general, general_tally) = run(false);
                        assert_eq!(fast_tally, general_tally, "{name}: the runs differ");
                        assert!(general.read_slots > 0, "{name}: nothing read: {general:?}");
                        assert_eq!(fast, general, "{name}");
                        compared_violations += general.violations;
                    }
                }
            }
        }
    }
    assert!(compared_violations > 0, "no planted fault was seen");
}

// ---------------------------------------------------------------------------------------------
// Through the engine

/// `quick-basic` on `sim` with a tiny grouped model and the grouped managers.
fn engine_run(preset: &str, fault: Option<Fault>) -> kvbench::experiment::Experiment {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-basic.toml");
    let sets: Vec<String> = [
        format!("model.preset={preset}"),
        "cache.manager=hybrid".into(),
        "scheduler.prefix_cache=false".into(),
        "memory.kv_budget=1MiB".into(),
    ]
    .into();
    let s = kvbench::scenario::load(&path, &sets).expect("scenario loads");
    let opts = kvbench::experiment::RunOptions {
        fault,
        shadow: true,
        invariant_check_every: 0,
        trace_tokens: false,
        ..Default::default()
    };
    kvbench::experiment::run_scenario(&s, &opts).expect("run")
}

fn engine_shadow(exp: &kvbench::experiment::Experiment, mode: CacheMode) -> ShadowReport {
    exp.run(mode)
        .and_then(|r| r.shadow.clone())
        .expect("sim carries the shadow")
}

#[test]
fn engine_runs_of_grouped_models_are_shadowed_clean_in_both_modes() {
    for preset in ["tiny-sliding", "tiny-hybrid", "tiny-mla"] {
        let exp = engine_run(preset, None);
        for mode in [CacheMode::Paged, CacheMode::Contiguous] {
            let r = engine_shadow(&exp, mode);
            println!(
                "{preset} {mode:?}: checked {} of {} grouped reads",
                r.checked_slots, r.read_slots
            );
            assert_eq!(r.violations, 0, "{preset} {mode:?}: {:?}", r.messages);
            // A stream's own writes are not re-read (the reverse index keeps them valid), so
            // `checked_slots` counts only what entered a context unwritten: it may be 0 here.
            assert!(
                r.read_slots > 0 && r.written_slots > 0 && r.read_slots >= r.checked_slots,
                "{preset} {mode:?}: {r:?}"
            );
        }
    }
}

#[test]
fn a_wrong_block_table_in_an_engine_run_is_caught_by_the_shadow() {
    // `--check-every 0`: the manager's own checks run only at the end; the shadow sees it first.
    for preset in ["tiny-sliding", "tiny-mla"] {
        let exp = engine_run(preset, Some(Fault::BadBlockTable));
        let paged = exp.run(CacheMode::Paged).expect("paged run");
        assert!(paged.fault_fired > 0, "{preset}: never fired");
        let r = engine_shadow(&exp, CacheMode::Paged);
        assert!(r.violations > 0, "{preset}: not caught: {r:?}");
    }
}
