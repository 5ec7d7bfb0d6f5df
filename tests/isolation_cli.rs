//! `kvbench isolation` end to end on `sim`: the three scopes are reported, global sharing leaks
//! more than tenant scope, and every AUC is recomputed here from `probes.csv`.

mod support;

use serde_json::Value;
use support::kvbench;

/// Pairwise AUC written out independently of the library's rank-based one.
fn pairwise_auc(hits: &[f64], misses: &[f64]) -> f64 {
    let mut score = 0.0;
    for h in hits {
        for m in misses {
            score += if m > h {
                1.0
            } else if m == h {
                0.5
            } else {
                0.0
            };
        }
    }
    score / (hits.len() * misses.len()) as f64
}

#[test]
fn global_leaks_tenant_does_not_and_aucs_recompute_from_probes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("iso");
    let (code, text) = kvbench(&[
        "isolation",
        "scenarios/chat-8b-h200.toml",
        "--backend",
        "sim",
        "--probes",
        "24",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("isolation.json")).unwrap())
            .unwrap();
    assert!(out.join("isolation.md").is_file());
    let scopes = json["scopes"].as_array().unwrap();
    let names: Vec<&str> = scopes
        .iter()
        .map(|s| s["scope"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["global", "tenant", "none"]);

    let csv = std::fs::read_to_string(out.join("probes.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("scope,request,hit,ttft_ms,cached_prompt_tokens")
    );
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let mut auc = std::collections::HashMap::new();
    for s in scopes {
        let name = s["scope"].as_str().unwrap();
        let of = |hit: &str| -> Vec<f64> {
            rows.iter()
                .filter(|r| r[0] == name && r[2] == hit)
                .map(|r| r[3].parse().unwrap())
                .collect()
        };
        let (hits, misses) = (of("1"), of("0"));
        assert_eq!(s["hit_probes"].as_u64().unwrap() as usize, hits.len());
        assert_eq!(s["miss_probes"].as_u64().unwrap() as usize, misses.len());
        assert_eq!(hits.len() + misses.len(), 24, "{name}");
        let written = s["auc"].as_f64().unwrap();
        let recomputed = pairwise_auc(&hits, &misses);
        assert!(
            (written - recomputed).abs() < 1e-9,
            "{name}: {written} vs {recomputed}"
        );
        let ci = s["auc_ci"].as_array().unwrap();
        let (lo, hi) = (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap());
        assert!(
            lo <= written && written <= hi,
            "{name}: {written} outside [{lo}, {hi}]"
        );
        auc.insert(name.to_string(), written);
    }
    assert!(auc["global"] > auc["tenant"], "{auc:?}");
    assert!(
        auc["global"] > 0.9,
        "global sharing at low load should leak: {auc:?}"
    );
    assert!((auc["tenant"] - 0.5).abs() < 0.2, "{auc:?}");
    // Under global scope the hit probes are the ones the cache served.
    assert!(rows
        .iter()
        .filter(|r| r[0] == "global" && r[2] == "1")
        .all(|r| r[4] != "0"));
    assert!(rows
        .iter()
        .filter(|r| r[0] == "tenant")
        .all(|r| r[4] == "0"));
}

#[test]
fn existing_output_and_bad_flags_exit_2_writing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("taken");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let (code, text) = kvbench(&[
        "isolation",
        "scenarios/chat-8b-h200.toml",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);

    let fresh = dir.path().join("fresh");
    let (code, text) = kvbench(&[
        "isolation",
        "scenarios/chat-8b-h200.toml",
        "--probes",
        "1",
        "--out",
        fresh.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--probes"), "{text}");
    assert!(!fresh.exists());
}
