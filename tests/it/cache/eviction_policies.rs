//! The paged prefix cache's eviction policies (`cache.eviction`): each policy, driven through
//! its trait as a cache over random access strings, against an independent linear-scan model;
//! `lru` and `lfu` against the trace replays of `workload::trace::evict`; the offline optimum
//! (`belady` there, and an exhaustive search on small strings) never below any policy; the
//! policies wired into the paged manager (hits and depths reach them); and a run's achieved
//! prefix hit share, recomputed from its `requests.csv`, at most the offline optimum at the
//! pool's capacity, itself at most the infinite-cache ceiling. Proptest prints a failing case's
//! seed and stores it for replay.

use crate::support;

use std::collections::HashMap;
use std::path::Path;

use kvbench::cache::evict::{Evictable, EvictionPolicy, Evictor};
use kvbench::cache::fuzz::{self, FuzzConfig};
use kvbench::cache::{CacheMode, PagedCache, PagedConfig, Placement};
use kvbench::workload::trace::evict::{hits, PolicyKind};
use kvbench_cache_api::{KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest};
use proptest::prelude::*;
use support::{kvbench, run_sim};

/// What a cache of `capacity` slots under `policy` does with `keys`: a resident key is a hit
/// (it leaves the evictable set while in use and comes back with one more hit); a miss takes a
/// free slot or the policy's victim. A key's depth in its prefix chain is `key % 4`. Returns the
/// hits and the keys evicted, in order.
fn drive(policy: EvictionPolicy, keys: &[u32], capacity: u32) -> (usize, Vec<u32>) {
    let mut e = policy.build(capacity);
    let mut slot_of: HashMap<u32, u32> = HashMap::new();
    let mut key_of: Vec<Option<(u32, u32)>> = vec![None; capacity as usize]; // (key, hits)
    let (mut n, mut evicted) = (0, Vec::new());
    for &k in keys {
        if capacity == 0 {
            continue;
        }
        let slot = match slot_of.get(&k) {
            Some(&s) => {
                e.remove(s);
                n += 1;
                if let Some((_, h)) = key_of[s as usize].as_mut() {
                    *h += 1;
                }
                s
            }
            None => {
                let s = if slot_of.len() < capacity as usize {
                    slot_of.len() as u32
                } else {
                    let v = e.pop_victim().expect("a full cache has a victim");
                    let (old, _) = key_of[v as usize].expect("the victim holds a key");
                    slot_of.remove(&old);
                    evicted.push(old);
                    v
                };
                slot_of.insert(k, s);
                key_of[s as usize] = Some((k, 0));
                s
            }
        };
        let (_, h) = key_of[slot as usize].expect("resident");
        e.insert(
            slot,
            Evictable {
                depth: k % 4,
                hits: h,
                shared: h > 0,
            },
        );
    }
    (n, evicted)
}

/// The same cache by a list of `(key, hits, last access)` scanned for each policy's victim:
/// written from the policies' definitions, sharing no code with them.
fn model(policy: EvictionPolicy, keys: &[u32], capacity: usize) -> (usize, Vec<u32>) {
    let mut v: Vec<(u32, u32, usize)> = Vec::new();
    let (mut n, mut evicted) = (0, Vec::new());
    for (t, &k) in keys.iter().enumerate() {
        if capacity == 0 {
            continue;
        }
        if let Some(e) = v.iter_mut().find(|e| e.0 == k) {
            e.1 += 1;
            e.2 = t;
            n += 1;
            continue;
        }
        if v.len() == capacity {
            let i = (0..v.len())
                .min_by_key(|&i| {
                    let (key, h, last) = v[i];
                    match policy {
                        EvictionPolicy::Lru => (0, 0, last),
                        EvictionPolicy::Lfu => (h, 0, last),
                        // Unshared first, then deepest, then least recent.
                        EvictionPolicy::Priority => (u32::from(h > 0), 3 - key % 4, last),
                    }
                })
                .expect("full");
            evicted.push(v.remove(i).0);
        }
        v.push((k, 0, t));
    }
    (n, evicted)
}

/// The most hits any sequence of evictions and bypasses reaches (every choice tried), for
/// strings of keys below 6.
fn exhaustive_optimum(keys: &[u32], capacity: usize) -> usize {
    fn go(keys: &[u32], set: u8, capacity: usize, memo: &mut HashMap<(usize, u8), usize>) -> usize {
        let Some((&k, rest)) = keys.split_first() else {
            return 0;
        };
        if let Some(&v) = memo.get(&(keys.len(), set)) {
            return v;
        }
        let bit = 1u8 << k;
        let best = if set & bit != 0 {
            1 + go(rest, set, capacity, memo)
        } else {
            let mut options = vec![set];
            if (set.count_ones() as usize) < capacity {
                options.push(set | bit);
            } else {
                options.extend(
                    (0..6)
                        .filter(|v| set & (1 << v) != 0)
                        .map(|v| (set & !(1 << v)) | bit),
                );
            }
            options
                .into_iter()
                .map(|s| go(rest, s, capacity, memo))
                .max()
                .unwrap_or(0)
        };
        memo.insert((keys.len(), set), best);
        best
    }
    go(keys, 0, capacity, &mut HashMap::new())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_matches_its_linear_scan_model(
        keys in prop::collection::vec(0u32..12, 0..160),
        capacity in 0u32..10,
    ) {
        for policy in EvictionPolicy::ALL {
            prop_assert_eq!(
                drive(policy, &keys, capacity),
                model(policy, &keys, capacity as usize),
                "{}", policy.name()
            );
        }
    }

    #[test]
    fn lru_and_lfu_are_the_trace_replays_and_the_optimum_bounds_every_policy(
        keys in prop::collection::vec(0u32..16, 0..200),
        capacity in 0u32..14,
    ) {
        let cap = capacity as usize;
        let (lru, _) = drive(EvictionPolicy::Lru, &keys, capacity);
        let (lfu, _) = drive(EvictionPolicy::Lfu, &keys, capacity);
        let (priority, _) = drive(EvictionPolicy::Priority, &keys, capacity);
        prop_assert_eq!(lru, hits(PolicyKind::Lru, &keys, cap));
        prop_assert_eq!(lfu, hits(PolicyKind::Lfu, &keys, cap));
        let optimum = hits(PolicyKind::Belady, &keys, cap);
        let ceiling = hits(PolicyKind::Infinite, &keys, cap);
        for (name, h) in [("lru", lru), ("lfu", lfu), ("priority", priority)] {
            prop_assert!(h <= optimum, "{} {} > optimum {}", name, h, optimum);
        }
        prop_assert!(optimum <= ceiling);
    }

    #[test]
    fn on_small_strings_the_optimum_is_the_exhaustive_one_and_no_policy_beats_it(
        keys in prop::collection::vec(0u32..6, 0..=11),
        capacity in 1u32..=3,
    ) {
        let best = exhaustive_optimum(&keys, capacity as usize);
        prop_assert_eq!(hits(PolicyKind::Belady, &keys, capacity as usize), best);
        for policy in EvictionPolicy::ALL {
            let (h, _) = drive(policy, &keys, capacity);
            prop_assert!(h <= best, "{} {} > {}", policy.name(), h, best);
        }
    }
}

const BS: u32 = 4;

fn paged(policy: EvictionPolicy) -> PagedCache {
    PagedCache::with_eviction(
        PagedConfig {
            total_blocks: 16,
            block_size: BS,
            prefix_cache: true,
            placement: Placement::Lifo,
        },
        policy,
    )
}

/// Prompt A served twice (its two full blocks hit once), C three times (three blocks, two hits
/// each), B once: what each policy is told (hits, depth, shared) shows in its order, and a
/// fresh block is taken from the head of that order.
#[test]
fn the_paged_manager_tells_each_policy_hits_and_depths() {
    let scope = ScopeKey {
        model: "m".into(),
        tokenizer: "t".into(),
        reuse: ReuseScope::Tenant(1),
    };
    let a: Vec<u32> = (100..109).collect(); // 2 full blocks + 1
    let c: Vec<u32> = (200..213).collect(); // 3 full blocks + 1
    let b: Vec<u32> = (300..309).collect();
    for policy in EvictionPolicy::ALL {
        let mut m = paged(policy);
        assert_eq!(m.eviction(), policy);
        let mut seq = 0;
        let mut tables: HashMap<&str, Vec<u32>> = HashMap::new();
        for (name, prompt, times) in [("a", &a, 2), ("c", &c, 3), ("b", &b, 1)] {
            for _ in 0..times {
                seq += 1;
                let started = m
                    .start(&StartRequest {
                        seq,
                        tokens: prompt,
                        scope: Some(&scope),
                        reserve_tokens: prompt.len() as u32,
                    })
                    .expect("start");
                tables.insert(name, m.block_table(seq).expect("table").to_vec());
                m.fill(seq, prompt.len() as u32 - started.cached_tokens)
                    .expect("fill");
                m.release(seq, ReleaseReason::Finish).expect("release");
                m.check_invariants().expect("invariants");
            }
        }
        let (ta, tc, tb) = (&tables["a"], &tables["c"], &tables["b"]);
        let want = match policy {
            // Released tail first; last released last.
            EvictionPolicy::Lru => vec![ta[1], ta[0], tc[2], tc[1], tc[0], tb[1], tb[0]],
            // Never hit, then one hit, then two.
            EvictionPolicy::Lfu => vec![tb[1], tb[0], ta[1], ta[0], tc[2], tc[1], tc[0]],
            // Unshared first; then deepest first, older first at one depth.
            EvictionPolicy::Priority => vec![tb[1], tb[0], tc[2], ta[1], tc[1], ta[0], tc[0]],
        };
        assert_eq!(m.eviction_order(), want, "{}", policy.name());
        // 16 blocks, 7 cached, 9 free: a 10-block prompt takes the free ones and one victim.
        let d: Vec<u32> = (400..440).collect();
        m.start(&StartRequest {
            seq: 99,
            tokens: &d,
            scope: Some(&scope),
            reserve_tokens: d.len() as u32,
        })
        .expect("start");
        m.check_invariants().expect("invariants");
        assert!(m.block_table(99).expect("table").contains(&want[0]));
        assert!(!m.is_published(want[0]), "{}", policy.name());
        assert!(
            want[1..].iter().all(|&b| m.is_published(b)),
            "{}",
            policy.name()
        );
        assert_eq!(m.prefix_stats().evictions, 1);
    }
}

/// Per paged run: `cached_prompt_tokens` of the rows without a parent in `requests.csv`.
fn request_hit_tokens(dir: &Path) -> u64 {
    let text = std::fs::read_to_string(dir.join("requests.csv")).expect("requests.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (cache, parent, cached) = (col("cache"), col("parent_id"), col("cached_prompt_tokens"));
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[cache] == "paged" && f[parent].is_empty())
        .map(|f| f[cached].parse::<u64>().expect("a count"))
        .sum()
}

/// A synthetic shared-prefix scenario (forks, cancellations, two tenants, a tight budget), a
/// Mooncake replay with content ids in a small budget, and shared system prompts in a budget
/// that holds a fraction of them, under every policy: the
/// achieved share recomputed from `requests.csv` is what summary.json says, and achieved ≤
/// optimum ≤ ceiling.
#[test]
fn achieved_prefix_hits_are_bounded_by_the_optimum_and_the_ceiling() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // (scenario, overrides, whether capacity binds: the optimum below the ceiling)
    let cases: [(&str, &[&str], bool); 3] = [
        ("scenarios/quick-mixed.toml", &[], false),
        (
            "scenarios/trace-mooncake.toml",
            &["--set", "memory.kv_budget=\"600 MiB\""],
            false,
        ),
        (
            "scenarios/shared-prompts-8b-h200.toml",
            &[
                "--set",
                "memory.kv_budget=\"1 GiB\"",
                "--set",
                "traffic.requests=300",
                "--set",
                "traffic.arrival.rate_per_s=4",
            ],
            true,
        ),
    ];
    for (scenario, extra, binds) in cases {
        for policy in EvictionPolicy::ALL {
            let out = tmp.path().join(format!(
                "{}-{}",
                Path::new(scenario).file_stem().unwrap().to_string_lossy(),
                policy.name()
            ));
            let set = format!("cache.eviction={}", policy.name());
            let mut args = vec!["--no-shadow", "--set", &set];
            args.extend_from_slice(extra);
            run_sim(scenario, &out, &args);
            let summary: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(out.join("summary.json")).expect("summary"),
            )
            .expect("json");
            let paged = &summary["runs"][0]["prefix_cache"];
            assert_eq!(summary["runs"][0]["cache"], "paged");
            assert_eq!(paged["eviction"], policy.name(), "{scenario}");
            let b = &paged["bounds"];
            let lookup = b["lookup_tokens"].as_u64().expect("lookup tokens");
            let (optimum, ceiling) = (
                b["optimum_hit_tokens"].as_u64().expect("optimum"),
                b["ceiling_hit_tokens"].as_u64().expect("ceiling"),
            );
            let achieved = request_hit_tokens(&out);
            assert_eq!(paged["request_hit_tokens"].as_u64(), Some(achieved));
            let rate = paged["achieved_hit_rate"].as_f64().expect("rate");
            assert!((rate - achieved as f64 / lookup as f64).abs() < 1e-12);
            println!(
                "{scenario} {}: achieved {achieved} <= optimum {optimum} <= ceiling {ceiling} \
                 of {lookup} tokens at {} blocks",
                policy.name(),
                b["capacity_blocks"]
            );
            assert!(ceiling > 0, "{scenario}: no reuse to bound");
            assert!(achieved <= optimum, "{scenario} {}", policy.name());
            assert!(optimum <= ceiling, "{scenario}");
            assert_eq!(optimum < ceiling, binds, "{scenario}: does capacity bind?");
            // Contiguous has no prefix cache: no policy, no bounds.
            assert!(summary["runs"][1]["prefix_cache"].get("eviction").is_none());
        }
    }
}

/// A multi-turn conversation's later turns are built during the run: the summary says so
/// instead of giving bounds.
#[test]
fn sessions_say_why_there_are_no_bounds() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("conv");
    run_sim("scenarios/conversation-quick.toml", &out, &["--no-shadow"]);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary"))
            .expect("json");
    let paged = &summary["runs"][0]["prefix_cache"];
    assert!(paged.get("bounds").is_none());
    let why = paged["bounds_unavailable"].as_str().expect("a reason");
    assert!(why.contains("multi-turn"), "{why}");
}

/// The cache fuzzer's reference model (payload per slot, fences, copy-on-write) under every
/// policy, both placements: which block is evicted changes, correctness must not.
#[test]
fn the_fuzz_model_holds_under_every_policy() {
    let seeds: u64 = std::env::var("KVBENCH_FUZZ_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let first: u64 = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    println!(
        "seeds {first}..{} (KVBENCH_SEED, KVBENCH_FUZZ_SEEDS)",
        first + seeds
    );
    for eviction in EvictionPolicy::ALL {
        for base in [FuzzConfig::small(CacheMode::Paged), FuzzConfig::extents()] {
            let cfg = FuzzConfig { eviction, ..base };
            let mut evictions = 0;
            for seed in first..first + seeds {
                let s = fuzz::run_seed_with(seed, 400, cfg)
                    .unwrap_or_else(|f| panic!("{} {:?}: {f}", eviction.name(), base.placement));
                evictions += s.evictions;
            }
            assert!(evictions > 0, "{}: nothing was evicted", eviction.name());
        }
    }
}

/// A bad policy name is refused at its key, in a file (FILE:LINE:COL) and on the command line,
/// with exit 2 and nothing written.
#[test]
fn an_unknown_policy_is_refused_at_its_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string("scenarios/quick-basic.toml").expect("scenario");
    let bad = text.replacen("[cache]\n", "[cache]\neviction = \"mru\"\n", 1);
    assert_ne!(bad, text, "quick-basic has a [cache] table");
    let said = support::run_refused(tmp.path(), "bad.toml", &bad, "eviction");
    assert!(said.contains("cache.eviction"), "{said}");
    let out = tmp.path().join("out");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--set",
        "cache.eviction=fifo",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("cache.eviction") && text.contains("fifo"),
        "{text}"
    );
    assert!(!out.exists());
}
