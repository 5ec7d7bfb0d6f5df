//! `kvbench sweep` end to end on `sim`: refusals (exit 2), monotone verdicts, unresolved probes.

mod support;

use serde_json::Value;
use support::kvbench;

fn sweep(dir: &std::path::Path, extra: &[&str]) -> (i32, String, Option<Value>) {
    let out = dir.to_str().unwrap();
    let mut args = vec![
        "sweep",
        "scenarios/chat-8b-h200.toml",
        "--backend",
        "sim",
        "--out",
        out,
        "--force",
    ];
    args.extend_from_slice(extra);
    let (code, text) = kvbench(&args);
    let json = std::fs::read_to_string(dir.join("sweep.json"))
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    (code, text, json)
}

#[test]
fn empty_slo_is_refused_naming_slo() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("noslo.toml");
    let text = std::fs::read_to_string("scenarios/chat-8b-h200.toml").unwrap();
    let cut = text.find("[slo]").unwrap();
    std::fs::write(&p, &text[..cut]).unwrap();
    let out = dir.path().join("out");
    let (code, text) = kvbench(&[
        "sweep",
        p.to_str().unwrap(),
        "--backend",
        "sim",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("slo: a sweep needs a latency target"),
        "{text}"
    );
    assert!(text.contains("noslo.toml:"), "names the file: {text}");
    assert!(!out.exists(), "no half-written results");
}

#[test]
fn concurrency_axis_needs_closed_loop_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text, json) = sweep(dir.path(), &["--by", "concurrency"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("traffic.arrival.kind"), "{text}");
    assert!(json.is_none());
}

fn probes(j: &Value) -> Vec<(String, u64, f64, String)> {
    j["runs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["probes"].as_array().unwrap().iter())
        .map(|p| {
            (
                p["cache"].as_str().unwrap().to_string(),
                p["seed"].as_u64().unwrap(),
                p["load"].as_f64().unwrap(),
                p["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// chat on sim is monotone in the rate (more load never lowers latency): no probe may pass at a
/// load above one that did not pass, for either cache mode, and the rate at target is the
/// highest passing load, bracketed by its interval.
#[test]
fn verdicts_are_monotone_and_the_rate_at_target_passed() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text, json) = sweep(
        dir.path(),
        &["--set", "traffic.requests=700", "--precision", "5"],
    );
    assert_eq!(code, 0, "{text}");
    let j = json.unwrap();
    let ps = probes(&j);
    for cache in ["paged", "contiguous"] {
        let mine: Vec<_> = ps.iter().filter(|p| p.0 == cache).collect();
        assert!(mine.len() >= 3, "{cache}: {mine:?}");
        let max_pass = mine
            .iter()
            .filter(|p| p.3 == "pass")
            .map(|p| p.2)
            .fold(f64::NAN, f64::max);
        let min_nonpass = mine
            .iter()
            .filter(|p| p.3 != "pass")
            .map(|p| p.2)
            .fold(f64::NAN, f64::min);
        assert!(max_pass < min_nonpass, "{cache}: not monotone: {mine:?}");
        let run = j["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["cache"] == cache)
            .unwrap();
        assert_eq!(run["rate_at_target_rps"].as_f64(), Some(max_pass));
        let ci = run["rate_at_target_rps_ci"].as_array().unwrap();
        assert_eq!(ci[0].as_f64(), Some(max_pass));
        assert_eq!(ci[1].as_f64(), Some(min_nonpass));
        assert!((min_nonpass - max_pass) <= 0.05 * max_pass + 1e-9);
    }
    // The paged cache sustains more than the contiguous baseline at the same SLO.
    let ratio = j["ratio_paged_over_contiguous"].as_f64().unwrap();
    assert!(ratio > 1.2, "{ratio}");
    let md = std::fs::read_to_string(dir.path().join("sweep.md")).unwrap();
    assert!(md.contains("| paged |") && md.contains("## Probes"), "{md}");
}

/// 100 requests leave 80 in the window: too few to bound a p99 from above, and no rerun is
/// allowed, so every probe that is not clearly failing is reported unresolved and nothing is
/// claimed at any load.
#[test]
fn an_unresolved_probe_is_reported_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text, json) = sweep(
        dir.path(),
        &["--set", "traffic.requests=100", "--max-extend", "1"],
    );
    assert_eq!(code, 0, "{text}");
    let j = json.unwrap();
    let ps = probes(&j);
    assert!(ps.iter().any(|p| p.3 == "unresolved"), "{ps:?}");
    assert!(ps.iter().all(|p| p.3 != "pass"), "{ps:?}");
    for r in j["runs"].as_array().unwrap() {
        assert!(r["rate_at_target_rps"].is_null(), "{r}");
    }
    let md = std::fs::read_to_string(dir.path().join("sweep.md")).unwrap();
    assert!(md.contains("| unresolved"), "{md}");
}
