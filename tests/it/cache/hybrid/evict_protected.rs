//! `cache.evict_protected`: whether a start may evict the cached pages of a *protected* block —
//! one a running sequence still holds in another table (a prompt's sliding pages released behind
//! the window while its full table holds the block).
//!
//! On the "2 sliding : 1 full" mix (48 pages, 3 tables of 4-token blocks, window 10): a prompt
//! of 24 tokens filled in chunks of 4 leaves 4 protected pages cached (blocks 0 and 1 of the two
//! sliding tables) and 30 free. A start that needs 33 pages fits under `always` (it evicts
//! protected pages) and is refused under `to_grow`, its probe saying so first and nothing
//! changed; under `to_grow` a running sequence's growth still evicts them. The invariants —
//! the protected-page counter recomputed from the blocks among them — hold after every step.
//!
//! Prompts are random token ids from a seed printed by the test; `KVBENCH_SEED` replays one.

use crate::support;
use crate::support::hybrid_kv as hybrid_kv_support;
use crate::support::hybrid_prefix as cache_hybrid_prefix_support;

use cache_hybrid_prefix_support::{probe_cached, prompt, seed, start, SLIDING};
use hybrid_kv_support::{build, mixes};
use kvbench::cache::hybrid::{EvictProtected, HybridKv};
use kvbench_cache_api::{AllocError, KvCacheManager};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn ok(kv: &HybridKv) {
    if let Err(e) = kv.check_invariants_full() {
        panic!("invariants: {e}");
    }
    if let Err(e) = kv.check_invariants() {
        panic!("invariants (incremental): {e}");
    }
}

/// A manager of `evict` with sequence 1 holding a 24-token prompt, written in chunks of 4: 18
/// pages mapped, 4 of them (the sliding tables' blocks 0 and 1) released behind the window,
/// cached and protected.
fn with_protected_pages(evict: EvictProtected, rng: &mut ChaCha8Rng) -> HybridKv {
    let mut kv = build(&mixes()[SLIDING]).with_evict_protected(evict);
    let p = prompt(rng, 24);
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
    assert_eq!(kv.accounting().free_slots, 30 * u64::from(kv.block_size()));
    kv
}

#[test]
fn a_start_evicts_protected_pages_only_when_allowed() {
    let s = seed();
    println!("seed {s}");
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let other = prompt(&mut rng, 44); // 11 blocks in each of 3 tables: 33 pages
    for evict in [EvictProtected::Always, EvictProtected::ToGrow] {
        let mut kv = with_protected_pages(evict, &mut ChaCha8Rng::seed_from_u64(s ^ 1));
        let (_, fits) = probe_cached(&kv, 2, &other);
        let started = start(&mut kv, 2, &other);
        ok(&kv);
        match evict {
            EvictProtected::Always => {
                assert!(fits, "30 free + 4 protected pages hold 33");
                started.expect("the start evicts protected pages");
                // Two sliding pages a block: both blocks, four pages, to find the last three.
                assert_eq!(kv.prefix_stats().evictions, 4);
                assert_eq!(kv.protected_pages(), 0);
            }
            EvictProtected::ToGrow => {
                assert!(
                    !fits,
                    "30 free pages do not hold 33, and protected ones do not count"
                );
                assert!(
                    matches!(started, Err(AllocError::NoSpace { .. })),
                    "{started:?}"
                );
                assert_eq!(kv.prefix_stats().evictions, 0, "nothing changed");
                assert_eq!(kv.protected_pages(), 4);
                assert_eq!(kv.accounting().free_slots, 30 * u64::from(kv.block_size()));
            }
        }
    }
}

#[test]
fn a_running_sequence_grows_into_protected_pages_when_starts_may_not() {
    let s = seed();
    println!("seed {s}");
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let mut kv = with_protected_pages(EvictProtected::ToGrow, &mut rng);
    // Every free page taken by a start (10 blocks × 3 tables), none evicted.
    let other = prompt(&mut rng, 40);
    start(&mut kv, 3, &other).expect("30 free pages hold 30");
    ok(&kv);
    assert_eq!(kv.accounting().free_slots, 0);
    assert_eq!(kv.prefix_stats().evictions, 0);
    // Sequence 1's 25th token opens block 6 in each table: three pages, from protected blocks.
    kv.append_token(1, 7)
        .expect("growth may evict protected pages");
    ok(&kv);
    assert_eq!(kv.prefix_stats().evictions, 4, "two blocks of two pages");
    // A start of a block now waits: one page free (of the four evicted), none unprotected.
    let one = prompt(&mut rng, 4);
    assert!(!probe_cached(&kv, 4, &one).1);
    assert!(matches!(
        start(&mut kv, 4, &one),
        Err(AllocError::NoSpace { .. })
    ));
    ok(&kv);
}

/// `to_grow` on a run of the summed managers is refused before any work, naming the key's file
/// and line; so is a value that is neither `always` nor `to_grow`.
#[test]
fn evict_protected_off_the_hybrid_manager_or_misspelt_is_refused_naming_the_key() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text =
        std::fs::read_to_string(root.join("scenarios/gpt-oss-120b-h200.toml")).expect("scenario");
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(tmp.path().join("devices")).expect("devices");
    std::fs::copy(
        root.join("scenarios/devices/h200.toml"),
        tmp.path().join("devices/h200.toml"),
    )
    .expect("device profile");
    let cases: [(&str, &[&str]); 2] = [
        (
            "manager = \"summed\"\nevict_protected = \"to_grow\"\n",
            &["cache.evict_protected", "summed"],
        ),
        (
            "evict_protected = \"sometimes\"\n",
            &["evict_protected", "always", "to_grow"],
        ),
    ];
    for (i, (lines, words)) in cases.iter().enumerate() {
        let scenario = text.replace("[cache]\n", &format!("[cache]\n{lines}"));
        let said = support::run_refused(
            tmp.path(),
            &format!("case{i}.toml"),
            &scenario,
            "evict_protected",
        );
        for w in *words {
            assert!(said.contains(w), "case {i}: no {w:?} in {said}");
        }
    }
}

/// A hybrid run with `to_grow` completes with its invariants checked at every step, reclaims
/// everything, and says the setting in `summary.json` (absent at the default).
#[test]
fn a_hybrid_run_keeping_protected_blocks_from_starts_says_so_in_its_summary() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (i, value) in ["always", "to_grow"].into_iter().enumerate() {
        let out = tmp.path().join(format!("out{i}"));
        let (code, said) = support::kvbench(&[
            "run",
            "scenarios/gpt-oss-120b-h200.toml",
            "--backend",
            "sim",
            "--set",
            "traffic.requests=24",
            "--set",
            "scheduler.prefix_cache=true",
            "--set",
            &format!("cache.evict_protected={value}"),
            "--out",
            out.to_str().expect("utf-8 path"),
        ]);
        assert_eq!(code, 0, "{value}: {said}");
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("summary.json")).expect("summary"),
        )
        .expect("json");
        let paged = &summary["runs"][0];
        assert_eq!(paged["cache"], "paged");
        assert_eq!(paged["invariants"]["ok"], true, "{value}");
        assert_eq!(paged["reclamation"]["ok"], true, "{value}");
        let said_in_summary = &paged["prefix_cache"]["evict_protected"];
        match value {
            "always" => assert!(said_in_summary.is_null(), "{said_in_summary}"),
            _ => assert_eq!(said_in_summary, value),
        }
    }
}
