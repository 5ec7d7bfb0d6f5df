//! `kvbench isolation` with a host tier, end to end on `sim`: the prober's waited repeats find the
//! victim's prefix in the host tier, so global sharing shows three classes (device hit, host hit,
//! miss); every pair's AUC and interval recompute here from `probes.csv`, whose class column
//! itself recomputes from its hit-token columns; tenant scope gives the prober no hit at all, and
//! what it can claim by intent has an interval around 0.5, wholly below global's host-hit one.
//! On sim with a fixed seed the run is deterministic; the seed is printed.

use crate::support;

use std::path::Path;

use kvbench::isolation::auc;
use serde_json::Value;
use support::{kvbench, pairwise_auc};

const SEED: &str = "5";
const PROBES: usize = 96;

/// A device cache of 2,048 tokens (256 MiB of Llama-3-8B KV) under a 1 GiB host tier: the
/// shipped tiered scenario shrunk so a round's filler (1.5 × the device) is 12 requests.
fn run_tiered(out: &Path) -> Value {
    println!("probe seed {SEED}");
    let (code, text) = kvbench(&[
        "isolation",
        "scenarios/conversation-tiered-8b-h200.toml",
        "--backend",
        "sim",
        "--set",
        "memory.kv_budget=256 MiB",
        "--set",
        "cache.max_seq_len=1024",
        "--set",
        "cache.host_tier.capacity=1 GiB",
        "--prefix-tokens",
        "256",
        "--probes",
        &PROBES.to_string(),
        "--seed",
        SEED,
        "--noise-ms",
        "0,2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    serde_json::from_str(&std::fs::read_to_string(out.join("isolation.json")).unwrap()).unwrap()
}

fn rows(out: &Path) -> Vec<std::collections::BTreeMap<String, String>> {
    let csv = std::fs::read_to_string(out.join("probes.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(cells.len(), header.len(), "{l}");
            header
                .iter()
                .cloned()
                .zip(cells.into_iter().map(str::to_string))
                .collect()
        })
        .collect()
}

fn ci(v: &Value) -> (f64, f64) {
    let a = v["auc_ci"].as_array().unwrap();
    (a[0].as_f64().unwrap(), a[1].as_f64().unwrap())
}

/// Checks one pair against the probes' rows: counts, the AUC (this test's own pairwise count)
/// and the interval (the library's estimator, unit-tested against synthetic samples).
fn check_pair(pair: &Value, faster: &[f64], slower: &[f64], what: &str) {
    assert_eq!(
        pair["faster_probes"].as_u64().unwrap() as usize,
        faster.len(),
        "{what}"
    );
    assert_eq!(
        pair["slower_probes"].as_u64().unwrap() as usize,
        slower.len(),
        "{what}"
    );
    if faster.is_empty() || slower.is_empty() {
        assert!(pair["auc"].is_null() && pair["auc_ci"].is_null(), "{what}");
        return;
    }
    let written = pair["auc"].as_f64().unwrap();
    let recomputed = pairwise_auc(faster, slower);
    assert!(
        (written - recomputed).abs() < 1e-9,
        "{what}: {written} vs {recomputed}"
    );
    let est = auc::estimate(faster, slower, 0.95).unwrap();
    let (lo, hi) = ci(pair);
    assert!(
        (lo - est.ci.0).abs() < 1e-9 && (hi - est.ci.1).abs() < 1e-9,
        "{what}: [{lo}, {hi}] vs {:?}",
        est.ci
    );
}

#[test]
fn host_tier_makes_a_second_hit_class_and_every_pair_recomputes_from_the_probes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("iso");
    let json = run_tiered(&out);
    assert!(json["filler_tokens_per_round"].as_u64().unwrap() > 2048);
    let rows = rows(&out);
    let grid = json["grid"].as_array().unwrap();
    assert_eq!(grid.len(), 3 * 2);
    for cell in grid {
        let scope = cell["scope"].as_str().unwrap();
        let noise = cell["noise_ms"].as_f64().unwrap();
        let what = format!("{scope} noise {noise}");
        let mine: Vec<_> = rows
            .iter()
            .filter(|r| r["scope"] == scope && r["noise_ms"].parse::<f64>().unwrap() == noise)
            .collect();
        assert_eq!(mine.len(), PROBES, "{what}");
        // The class is the run's: read back from the hit-token columns by the stated rule.
        for r in &mine {
            let n = |k: &str| r[k].parse::<u32>().unwrap();
            let class = if n("hit_host_tokens") + n("hit_disk_tokens") > 0 {
                "host"
            } else if n("hit_device_tokens") > 0 {
                "device"
            } else {
                "miss"
            };
            assert_eq!(r["class"], class, "{what}: {r:?}");
        }
        let of = |class: &str, slot: Option<&str>| -> Vec<f64> {
            mine.iter()
                .filter(|r| r["class"] == class && slot.is_none_or(|s| r["slot"] == s))
                .map(|r| r["observed_ttft_ms"].parse().unwrap())
                .collect()
        };
        let meant = |intended: &str, slot: &str| -> Vec<f64> {
            mine.iter()
                .filter(|r| r["intended"] == intended && r["slot"] == slot)
                .map(|r| r["observed_ttft_ms"].parse().unwrap())
                .collect()
        };
        let c = &cell["classes"];
        for (class, key) in [
            ("device", "device_probes"),
            ("host", "host_probes"),
            ("miss", "miss_probes"),
        ] {
            assert_eq!(
                c[key].as_u64().unwrap() as usize,
                of(class, None).len(),
                "{what}"
            );
        }
        check_pair(
            &c["host_hit"],
            &of("host", None),
            &of("miss", Some("late")),
            &what,
        );
        check_pair(
            &c["device_hit"],
            &of("device", None),
            &of("miss", Some("early")),
            &what,
        );
        check_pair(
            &c["device_vs_host"],
            &of("device", None),
            &of("host", None),
            &what,
        );
        let by_intent = &c["by_intent"];
        check_pair(
            &by_intent["host_hit"],
            &meant("host", "late"),
            &meant("miss", "late"),
            &what,
        );
        check_pair(
            &by_intent["device_hit"],
            &meant("device", "early"),
            &meant("miss", "early"),
            &what,
        );
        // Where the intended-host probes landed, counted from the rows.
        let landed = &c["intended_host"];
        for class in ["device", "host", "miss"] {
            let n = mine
                .iter()
                .filter(|r| r["intended"] == "host" && r["class"] == class)
                .count();
            assert_eq!(landed[class].as_u64().unwrap() as usize, n, "{what}");
        }
        assert_eq!(landed["probes"].as_u64().unwrap() as usize, PROBES / 4);
    }

    let at = |scope: &str, noise: f64| -> &Value {
        grid.iter()
            .find(|c| c["scope"] == scope && c["noise_ms"].as_f64() == Some(noise))
            .unwrap()
    };
    for noise in [0.0, 2.0] {
        let global = &at("global", noise)["classes"];
        // All three classes, and the waited repeats found the host tier.
        for key in ["device_probes", "host_probes", "miss_probes"] {
            assert!(global[key].as_u64().unwrap() > 0, "global {key}: {global}");
        }
        assert!(global["intended_host"]["host"].as_u64().unwrap() > 0);
        // A host hit is still told from a miss under global sharing...
        let (g_lo, _) = ci(&global["host_hit"]);
        assert!(g_lo > 0.5, "global host hit vs miss: {global}");
        // ...and tenant scope gives the prober no hit of either kind: its late repeats read as
        // fresh prompts, with an interval around 0.5 wholly below global's.
        let tenant = &at("tenant", noise)["classes"];
        assert_eq!(tenant["host_probes"].as_u64(), Some(0), "{tenant}");
        assert_eq!(tenant["device_probes"].as_u64(), Some(0), "{tenant}");
        assert!(tenant["host_hit"]["auc"].is_null());
        assert_eq!(
            tenant["intended_host"]["miss"].as_u64().unwrap() as usize,
            PROBES / 4
        );
        let (t_lo, t_hi) = ci(&tenant["by_intent"]["host_hit"]);
        assert!(t_lo <= 0.5 && 0.5 <= t_hi, "tenant: [{t_lo}, {t_hi}]");
        // Without noise the engine's TTFTs are the prober's: the two intervals are disjoint.
        // (At 2 ms, about the host-hit/miss gap here, 12 probes a class leave them overlapping.)
        if noise == 0.0 {
            assert!(g_lo > t_hi, "global [{g_lo}, ..] vs tenant [.., {t_hi}]");
        }
    }
    let md = std::fs::read_to_string(out.join("isolation.md")).unwrap();
    assert!(md.contains("## Hit classes with the host tier"), "{md}");
    assert!(md.contains("| host hit vs miss |"), "{md}");
}

/// Without a host tier the report is as before (no classes, no filler), and asking for a filler
/// there is bad input: exit 2, nothing written.
#[test]
fn without_a_host_tier_no_classes_and_a_filler_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plain");
    let (code, text) = kvbench(&[
        "isolation",
        "scenarios/chat-8b-h200.toml",
        "--probes",
        "8",
        "--prefix-tokens",
        "64",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("isolation.json")).unwrap())
            .unwrap();
    assert!(json.get("filler_tokens_per_round").is_none());
    for cell in json["grid"].as_array().unwrap() {
        assert!(cell.get("classes").is_none(), "{cell}");
    }
    assert!(rows(&out).iter().all(|r| r["slot"] == "mid"));

    let refused = dir.path().join("refused");
    let (code, text) = kvbench(&[
        "isolation",
        "scenarios/chat-8b-h200.toml",
        "--filler-tokens",
        "1000",
        "--out",
        refused.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--filler-tokens"), "{text}");
    assert!(!refused.exists());
}
