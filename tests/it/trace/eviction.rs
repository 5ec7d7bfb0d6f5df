//! Eviction bounds of a trace replay: `lru` against a linear-scan reference, the offline
//! optimum (`belady`) against an exhaustive search over eviction and bypass choices, the
//! optimum never below `lru` or `lfu`, every policy at most the infinite ceiling and equal to
//! it with room for every key; on request lists, the infinite replay of the access string
//! equals the ideal reuse; and `kvbench trace stats --capacity` on a hand-made trace.
//! Proptest prints a failing case's seed and stores it for replay.

use crate::support;

use std::collections::HashMap;
use std::path::Path;

use kvbench::workload::trace::evict::{hits, PolicyKind};
use kvbench::workload::trace::{access_string, eviction_bounds, ideal_prefix_reuse};
use kvbench::workload::{Head, Prompt, Recipe, Request};
use proptest::prelude::*;
use support::kvbench;

/// LRU by a Vec in recency order, scanned linearly.
fn lru_reference(keys: &[u32], capacity: usize) -> usize {
    let mut v: Vec<u32> = Vec::new();
    let mut n = 0;
    for &k in keys {
        if let Some(i) = v.iter().position(|&x| x == k) {
            v.remove(i);
            n += 1;
        } else if capacity == 0 {
            continue;
        } else if v.len() == capacity {
            v.remove(0);
        }
        v.push(k);
    }
    n
}

/// The most hits any choice of evictions (or keeping the missed block out) reaches: every
/// choice tried, memoised by (position, resident set as a bitmask of keys < 8).
fn optimum(keys: &[u32], capacity: usize) -> usize {
    fn go(
        keys: &[u32],
        pos: usize,
        set: u8,
        capacity: usize,
        memo: &mut HashMap<(usize, u8), usize>,
    ) -> usize {
        if pos == keys.len() {
            return 0;
        }
        if let Some(&v) = memo.get(&(pos, set)) {
            return v;
        }
        let bit = 1u8 << keys[pos];
        let best = if set & bit != 0 {
            1 + go(keys, pos + 1, set, capacity, memo)
        } else {
            // Keep it out, or insert it (evicting any one resident block when full).
            let mut best = go(keys, pos + 1, set, capacity, memo);
            if (set.count_ones() as usize) < capacity {
                best = best.max(go(keys, pos + 1, set | bit, capacity, memo));
            } else {
                for victim in 0..8 {
                    if set & (1 << victim) != 0 {
                        let s = (set & !(1 << victim)) | bit;
                        best = best.max(go(keys, pos + 1, s, capacity, memo));
                    }
                }
            }
            best
        };
        memo.insert((pos, set), best);
        best
    }
    go(keys, 0, 0, capacity, &mut HashMap::new())
}

fn distinct(keys: &[u32]) -> usize {
    let mut v = keys.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn belady_is_the_exhaustive_optimum_on_small_strings(
        keys in prop::collection::vec(0u32..4, 0..=10),
        capacity in 1usize..=3,
    ) {
        prop_assert_eq!(hits(PolicyKind::Belady, &keys, capacity), optimum(&keys, capacity));
    }

    #[test]
    fn policies_against_references_and_bounds(
        keys in prop::collection::vec(0u32..12, 0..200),
        capacity in 0usize..14,
    ) {
        let lru = hits(PolicyKind::Lru, &keys, capacity);
        let lfu = hits(PolicyKind::Lfu, &keys, capacity);
        let belady = hits(PolicyKind::Belady, &keys, capacity);
        let ceiling = keys.len() - distinct(&keys);
        prop_assert_eq!(lru, lru_reference(&keys, capacity));
        prop_assert_eq!(hits(PolicyKind::Infinite, &keys, capacity), ceiling);
        prop_assert!(belady >= lru, "belady {} < lru {}", belady, lru);
        prop_assert!(belady >= lfu, "belady {} < lfu {}", belady, lfu);
        for h in [lru, lfu, belady] {
            prop_assert!(h <= ceiling);
        }
        if capacity >= distinct(&keys) {
            prop_assert_eq!((lru, lfu, belady), (ceiling, ceiling, ceiling));
        }
    }

    /// Request lists of Mooncake rows sharing hash ids: the access string's infinite replay is
    /// the ideal reuse, and at each capacity belady's leading-run hits are at least lru's and
    /// lfu's and at most the ceiling.
    #[test]
    fn request_lists_replay_to_the_ideal_reuse(
        rows in prop::collection::vec(
            (prop::collection::vec(0u64..5, 1..6), 1u32..64, 0u32..2),
            1..30,
        ),
        block in prop::sample::select(vec![8u32, 16, 24, 32]),
    ) {
        let requests: Vec<Request> = rows
            .iter()
            .enumerate()
            .map(|(i, (ids, short_by, tenant))| {
                let len = (ids.len() as u32 * 16).saturating_sub(*short_by % 16).max(1);
                mooncake(i as u64, *tenant, len, ids)
            })
            .collect();
        let ideal = ideal_prefix_reuse(&requests, block, 4096, true);
        let s = access_string(&requests, block, 4096, true);
        let caps: Vec<u64> = (0..=s.distinct_blocks as u64 + 1).collect();
        for b in eviction_bounds(&s, &caps) {
            prop_assert_eq!(b.ceiling.hit_tokens, ideal.hit_tokens);
            prop_assert_eq!(b.lookup_tokens, ideal.lookup_tokens);
            let by = |k: PolicyKind| b.policies.iter().find(|h| h.policy == k).unwrap().hit_tokens;
            let (lru, lfu, belady) = (by(PolicyKind::Lru), by(PolicyKind::Lfu), by(PolicyKind::Belady));
            prop_assert!(belady >= lru && belady >= lfu, "cap {}: {} {} {}", b.capacity_blocks, lru, lfu, belady);
            prop_assert!(belady <= ideal.hit_tokens);
            if b.capacity_blocks >= s.distinct_blocks as u64 {
                prop_assert_eq!((lru, lfu, belady), (ideal.hit_tokens, ideal.hit_tokens, ideal.hit_tokens));
            }
        }
    }
}

fn mooncake(id: u64, tenant: u32, len: u32, ids: &[u64]) -> Request {
    Request {
        id,
        tenant,
        arrival_ms: id as f64,
        prompt: Prompt::Recipe(Recipe {
            seed: 3,
            key: id,
            len_tokens: len,
            vocab: 50_000,
            head: Head::HashIds {
                block_tokens: 16,
                ids: ids.to_vec().into_boxed_slice(),
            },
        }),
        prefix_group: None,
        output_tokens: 1,
        samples: 1,
        cancel: None,
        session: None,
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write fixture");
    p.display().to_string()
}

#[test]
fn trace_stats_reports_the_bounds_of_a_hand_made_trace() {
    // 16 tokens per hash id and per block; each row reads these blocks (at most this many hit):
    //   r0 [1,2,3] 48 tokens: b1 b2 b3 (2)     r1 [1,2,4,5] 64: b1 b2 b4 b5 (3)
    //   r2 [1,2,3] 33: b1 b2 (2)               r3 [1,2] 32: b1 b2 (1)
    //   r4 [9,1,2] 40: c9 c91 (2)
    // Infinite: r1 2, r2 2, r3 1 = 5 blocks, 80 tokens of 217.
    // Capacity 2. lru: b3 evicts b1, r1's b1 misses and pushes the rest out; r2 reloads b1 b2
    // and r3 hits b1: 16. lfu: every count is 1 when it evicts, so the same: 16. belady keeps
    // b1 b2 and everything else out: 80, the ceiling.
    // Capacity 1. lru 0 (no key repeats at once); belady keeps b1: r1, r2, r3 one each, 48.
    let tmp = tempfile::tempdir().unwrap();
    let f = support::hand_mooncake_trace(tmp.path());
    let base = [
        "trace",
        "stats",
        f.as_str(),
        "--hash-block-tokens",
        "16",
        "--block-size",
        "16",
        "--capacity",
        "1,2",
        "--capacity",
        "7",
    ];
    let mut args = base.to_vec();
    args.push("--json");
    let (code, out) = kvbench(&args);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ev = v["eviction"].as_array().expect("eviction bounds");
    let expect: [(u64, [(&str, u64); 3]); 3] = [
        (1, [("lru", 0), ("lfu", 0), ("belady", 48)]),
        (2, [("lru", 16), ("lfu", 16), ("belady", 80)]),
        (7, [("lru", 80), ("lfu", 80), ("belady", 80)]),
    ];
    assert_eq!(ev.len(), expect.len(), "{v}");
    for (b, (cap, policies)) in ev.iter().zip(expect) {
        assert_eq!(b["capacity_blocks"].as_u64(), Some(cap), "{b}");
        assert_eq!(b["distinct_blocks"].as_u64(), Some(7), "{b}");
        assert_eq!(b["ceiling"]["hit_tokens"].as_u64(), Some(80), "{b}");
        assert_eq!(b["ceiling"]["policy"].as_str(), Some("infinite"), "{b}");
        assert_eq!(b["lookup_tokens"].as_u64(), Some(217), "{b}");
        for (p, (name, tokens)) in b["policies"].as_array().unwrap().iter().zip(policies) {
            assert_eq!(p["policy"].as_str(), Some(name), "{b}");
            assert_eq!(
                p["hit_tokens"].as_u64(),
                Some(tokens),
                "cap {cap} {name}: {b}"
            );
        }
    }
    // The text form says the same.
    let (code, text) = kvbench(&base);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("capacity 2 blocks (32 tokens; 7 distinct blocks read)"),
        "{text}"
    );
    assert!(
        text.contains("belady     36.87% of prompt tokens (80 tokens)"),
        "{text}"
    );
    // Without content ids there are no bounds to report.
    let g = write(
        tmp.path(),
        "g.csv",
        "arrival_ms,prompt_tokens,output_tokens\n0,100,10\n",
    );
    let (code, text) = kvbench(&["trace", "stats", &g, "--capacity", "4"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("eviction bounds  - (the trace has no content ids)"),
        "{text}"
    );
}

#[test]
fn a_capacity_size_is_read_as_whole_blocks_at_the_bytes_per_token_given() {
    use kvbench::workload::trace::capacity_blocks;
    // 16-token blocks at 16 B a token: 256 B a block; 1000 B hold 3 whole blocks.
    assert_eq!(capacity_blocks("1000 B", 16, Some(16)), Ok(3));
    assert_eq!(capacity_blocks("1 KiB", 16, Some(16)), Ok(4));
    assert_eq!(capacity_blocks("1_000", 16, None), Ok(1000));
    for bad in ["1 KiB", "ten", "-3 GiB", ""] {
        assert!(capacity_blocks(bad, 16, None).is_err(), "{bad}");
    }
    let e = capacity_blocks("1 GiB", 16, Some(u64::MAX)).unwrap_err();
    assert!(e.contains("overflow"), "{e}");
    let tmp = tempfile::tempdir().unwrap();
    let f = write(
        tmp.path(),
        "t.jsonl",
        "{\"timestamp\": 0, \"input_length\": 48, \"output_length\": 4, \"hash_ids\": [1, 2, 3]}\n\
         {\"timestamp\": 1, \"input_length\": 48, \"output_length\": 4, \"hash_ids\": [1, 2, 3]}\n",
    );
    let args = |cap: &'static str, extra: &[&'static str]| {
        let mut a = vec!["trace", "stats", &f, "--hash-block-tokens", "16", "--json"];
        a.extend(["--capacity", cap]);
        a.extend_from_slice(extra);
        kvbench(&a)
    };
    let (code, out) = args("512 B", &["--kv-bytes-per-token", "16"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["eviction"][0]["capacity_blocks"].as_u64(), Some(2), "{v}");
    let (code, out) = args("512 B", &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--kv-bytes-per-token"), "{out}");
}
