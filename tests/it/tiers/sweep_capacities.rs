//! `kvbench sweep` over a scenario listing several host-tier capacities searches the paged cache
//! once per capacity: `sweep.json`'s `capacities[]` holds one paged run per capacity, each the
//! same search a sweep of that capacity alone runs and each recomputable from its own probes;
//! the contiguous baseline (no tier) is searched once; and a one-element list writes the same
//! bytes as the plain capacity.

use crate::support;

use std::path::Path;

use serde_json::Value;
use support::kvbench;

const SCENARIO: &str = "scenarios/quick-tiered.toml";
const CAPS: [&str; 2] = ["256 KiB", "1 MiB"];

/// A short sweep of quick-tiered on `sim` at `capacity` (a TOML value: a string or a list).
fn sweep(out: &Path, capacity: &str) -> (Value, String) {
    let cap = format!("cache.host_tier.capacity={capacity}");
    let args = [
        "sweep",
        SCENARIO,
        "--backend",
        "sim",
        "--seeds",
        "1",
        "--max-extend",
        "1",
        "--precision",
        "20",
        "--set",
        "traffic.requests=600",
        "--set",
        &cap,
        "--out",
        out.to_str().expect("utf-8 path"),
    ];
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{text}");
    let read =
        |f: &str| std::fs::read_to_string(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    (
        serde_json::from_str(&read("sweep.json")).expect("sweep.json"),
        read("sweep.md"),
    )
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The highest passing load and the lowest non-passing one above it (itself when none), from a
/// one-seed run's probes alone.
fn bracket(run: &Value) -> [f64; 2] {
    let probes = run["probes"].as_array().expect("probes");
    let a = probes
        .iter()
        .filter(|p| p["verdict"] == "pass")
        .map(|p| f(&p["load"]))
        .fold(f64::NAN, f64::max);
    assert!(a.is_finite(), "no passing probe: {run}");
    let b = probes
        .iter()
        .filter(|p| p["verdict"] != "pass")
        .map(|p| f(&p["load"]))
        .filter(|&l| l > a)
        .fold(f64::INFINITY, f64::min);
    [a, if b.is_finite() { b } else { a }]
}

#[test]
fn each_listed_capacity_is_its_own_paged_search() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let list = format!("[\"{}\", \"{}\"]", CAPS[0], CAPS[1]);
    let (j, md) = sweep(&tmp.path().join("list"), &list);

    // runs keeps its two entries: paged at the first capacity, contiguous without a tier.
    let runs = j["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{j}");
    assert_eq!(runs[0]["cache"], "paged");
    assert_eq!(runs[0]["host_tier"], CAPS[0]);
    assert_eq!(runs[1]["cache"], "contiguous");
    assert!(runs[1].get("host_tier").is_none(), "contiguous has no tier");
    let contiguous_rate = f(&runs[1]["rate_at_target_rps"]);

    let caps = j["capacities"].as_array().expect("capacities[]");
    assert_eq!(caps.len(), CAPS.len(), "{j}");
    let bytes = [256u64 << 10, 1 << 20];
    for ((c, cap), b) in caps.iter().zip(CAPS).zip(bytes) {
        assert_eq!(c["host_tier"], cap);
        assert_eq!(c["host_tier_bytes"].as_u64(), Some(b));
        let paged = &c["paged"];
        assert_eq!(paged["cache"], "paged");
        assert_eq!(paged["host_tier"], cap);
        let probes = paged["probes"].as_array().expect("probes");
        assert!(!probes.is_empty());
        assert!(
            probes.iter().all(|p| p["host_tier"] == cap),
            "every probe of {cap} says so: {paged}"
        );
        // Recomputed from the run's own probes (one seed: the bracket is the interval).
        let [a, hi] = bracket(paged);
        assert_eq!(f(&paged["rate_at_target_rps"]), a, "{cap}");
        assert_eq!(
            [
                f(&paged["rate_at_target_rps_ci"][0]),
                f(&paged["rate_at_target_rps_ci"][1])
            ],
            [a, hi],
            "{cap}"
        );
        let ratio = f(&c["ratio_paged_over_contiguous"]);
        assert!(
            (ratio - a / contiguous_rate).abs() < 1e-12,
            "{cap}: ratio {ratio} vs {a} / {contiguous_rate}"
        );
        // The table row of this capacity in sweep.md shows its rate at target.
        let row = format!("| {cap} | {a:.3} | [{a:.3}, {hi:.3}] |");
        assert!(md.contains(&row), "no row {row:?} in\n{md}");
    }
    // The first capacity's run is runs' paged entry.
    assert_eq!(caps[0]["paged"], runs[0]);
    assert_eq!(
        j["ratio_paged_over_contiguous"],
        caps[0]["ratio_paged_over_contiguous"]
    );
    assert_eq!(
        md.matches("has no host tier").count(),
        1,
        "the contiguous note once:\n{md}"
    );

    let html = std::fs::read_to_string(tmp.path().join("list").join("report.html")).expect("html");
    assert!(html.contains("Rate at target by host-tier capacity"));
    for cap in CAPS {
        assert!(html.contains(&format!("<td>{cap}</td>")), "{cap} row");
    }

    // Each capacity's run is the search a sweep of that capacity alone runs.
    let (alone, _) = sweep(&tmp.path().join("alone"), &format!("\"{}\"", CAPS[1]));
    assert!(
        alone.get("capacities").is_none(),
        "one capacity adds nothing"
    );
    let key = |r: &Value| -> Vec<(String, String, String)> {
        r["probes"]
            .as_array()
            .expect("probes")
            .iter()
            .map(|p| {
                (
                    p["load"].to_string(),
                    p["verdict"].to_string(),
                    p["ttft_p99_ms"].to_string(),
                )
            })
            .collect()
    };
    assert_eq!(key(&caps[1]["paged"]), key(&alone["runs"][0]));
    assert_eq!(
        caps[1]["paged"]["rate_at_target_rps"],
        alone["runs"][0]["rate_at_target_rps"]
    );
    // The capacities differ in what they measure (the larger tier keeps more heads), so a
    // search that ignored the capacity would not pass the line above for both.
    assert_ne!(key(&caps[0]["paged"]), key(&caps[1]["paged"]));
    assert_eq!(
        alone["runs"][1], runs[1],
        "contiguous does not depend on it"
    );
}

#[test]
fn a_one_element_list_writes_what_the_plain_capacity_writes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_, md_one) = sweep(&tmp.path().join("one"), "[\"1 MiB\"]");
    let (_, md_plain) = sweep(&tmp.path().join("plain"), "\"1 MiB\"");
    let bytes = |d: &str| std::fs::read(tmp.path().join(d).join("sweep.json")).expect("read");
    assert_eq!(bytes("one"), bytes("plain"));
    assert_eq!(md_one, md_plain);
    assert!(!md_plain.contains("host tier"), "{md_plain}");
}
