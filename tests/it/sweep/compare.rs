//! `kvbench compare`'s figures recompute from the two folders' files: sweeps (the committed sim
//! baseline against a copy with the paged rates scaled down) and runs (two sim runs of
//! quick-basic with different step budgets).

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use statrs::distribution::{ContinuousCDF, StudentsT};
use support::kvbench;

const BASELINE: &str = "results/baseline/sim/chat-8b-h200";

fn compare(a: &Path, b: &Path, out: &Path) -> Vec<BTreeMap<String, String>> {
    let (code, text) = kvbench(&[
        "compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("| scenario | cache | metric |"), "{text}");
    let mut rdr = csv::Reader::from_path(out.join("compare.csv")).unwrap();
    let head = rdr.headers().unwrap().clone();
    rdr.records()
        .map(|r| {
            let r = r.unwrap();
            head.iter()
                .zip(r.iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn f(row: &BTreeMap<String, String>, k: &str) -> f64 {
    row[k]
        .parse()
        .unwrap_or_else(|_| panic!("{k}: {:?}", row[k]))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn read(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn sweep_comparison_recomputes_from_sweep_json() {
    let dir = tempfile::tempdir().unwrap();
    let a = read(&Path::new(BASELINE).join("sweep.json"));
    let mut b = a.clone();
    let paged = &mut b["runs"][0];
    assert_eq!(paged["cache"], "paged");
    let scale = |v: &mut Value| *v = Value::from(v.as_f64().unwrap() * 0.9);
    scale(&mut paged["rate_at_target_rps"]);
    for s in paged["per_seed"].as_array_mut().unwrap() {
        for x in s["rate_bracket_rps"].as_array_mut().unwrap() {
            scale(x);
        }
    }
    let bdir = dir.path().join("b");
    std::fs::create_dir(&bdir).unwrap();
    std::fs::write(bdir.join("sweep.json"), b.to_string()).unwrap();
    let rows = compare(Path::new(BASELINE), &bdir, &dir.path().join("cmp"));
    assert_eq!(rows.len(), 4, "{rows:?}");
    for row in &rows {
        let run = |j: &Value| {
            j["runs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["cache"].as_str() == Some(row["cache"].as_str()))
                .unwrap()
                .clone()
        };
        let (ra, rb) = (run(&a), run(&b));
        let metric = row["metric"].as_str();
        let (va, vb) = (ra[metric].as_f64().unwrap(), rb[metric].as_f64().unwrap());
        assert!(close(f(row, "a"), va) && close(f(row, "b"), vb), "{row:?}");
        assert!(close(f(row, "abs_change"), vb - va), "{row:?}");
        assert!(
            close(f(row, "rel_change_pct"), (vb / va - 1.0) * 100.0),
            "{row:?}"
        );
        // Paired over the seeds: per seed [lo_B/hi_A − 1, hi_B/lo_A − 1], then mean ∓ t·sd/√n.
        let key = if metric == "rate_at_target_rps" {
            "rate_bracket_rps"
        } else {
            "throughput_bracket_tokens_per_s"
        };
        let br = |r: &Value| -> Vec<(f64, f64)> {
            r["per_seed"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (s[key][0].as_f64().unwrap(), s[key][1].as_f64().unwrap()))
                .collect()
        };
        let (ba, bb) = (br(&ra), br(&rb));
        let lows: Vec<f64> = ba.iter().zip(&bb).map(|(a, b)| b.0 / a.1 - 1.0).collect();
        let highs: Vec<f64> = ba.iter().zip(&bb).map(|(a, b)| b.1 / a.0 - 1.0).collect();
        let n = lows.len() as f64;
        let t = StudentsT::new(0.0, 1.0, n - 1.0)
            .unwrap()
            .inverse_cdf(0.975);
        let mean_sd = |v: &[f64]| {
            let m = v.iter().sum::<f64>() / n;
            let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
            (m, sd)
        };
        let ((ml, sl), (mh, sh)) = (mean_sd(&lows), mean_sd(&highs));
        let (lo, hi) = (ml - t * sl / n.sqrt(), mh + t * sh / n.sqrt());
        assert!(
            close(f(row, "rel_change_ci_low_pct"), lo * 100.0),
            "{row:?} vs {lo}"
        );
        assert!(
            close(f(row, "rel_change_ci_high_pct"), hi * 100.0),
            "{row:?} vs {hi}"
        );
        assert_eq!(
            row["significant"] == "true",
            lo > 0.0 || hi < 0.0,
            "{row:?}"
        );
    }
    // The scaled paged rate is a significant 10% drop; the untouched contiguous one is not.
    let paged_rate = rows
        .iter()
        .find(|r| r["cache"] == "paged" && r["metric"] == "rate_at_target_rps")
        .unwrap();
    assert_eq!(paged_rate["direction"], "worse", "{paged_rate:?}");
    let cont_rate = rows
        .iter()
        .find(|r| r["cache"] == "contiguous" && r["metric"] == "rate_at_target_rps")
        .unwrap();
    assert_eq!(cont_rate["significant"], "false", "{cont_rate:?}");
}

#[test]
fn run_comparison_recomputes_from_summary_json() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (out, budget) in [(&a, "2048"), (&b, "64")] {
        let (code, text) = kvbench(&[
            "run",
            "scenarios/quick-basic.toml",
            "--backend",
            "sim",
            "--set",
            &format!("scheduler.max_tokens_per_step={budget}"),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{text}");
    }
    let rows = compare(&a, &b, &dir.path().join("cmp"));
    let (sa, sb) = (read(&a.join("summary.json")), read(&b.join("summary.json")));
    let fig = |s: &Value, cache: &str, keys: &[&str]| -> f64 {
        let run = s["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["cache"] == cache)
            .unwrap();
        keys.iter().fold(run, |v, k| &v[*k]).as_f64().unwrap()
    };
    let mut checked = 0;
    for row in &rows {
        let keys: &[&str] = match row["metric"].as_str() {
            "throughput_tokens_per_s" => &["throughput_tokens_per_s"],
            "ttft_p99_ms" => &["ttft_ms", "p99"],
            "itl_p99_ms" => &["itl_ms", "p99"],
            _ => continue,
        };
        let (va, vb) = (fig(&sa, &row["cache"], keys), fig(&sb, &row["cache"], keys));
        let rel = (vb / va - 1.0) * 100.0;
        assert!(close(f(row, "rel_change_pct"), rel), "{row:?}");
        // One run a side: the interval is the point.
        assert!(close(f(row, "rel_change_ci_low_pct"), rel), "{row:?}");
        assert!(close(f(row, "rel_change_ci_high_pct"), rel), "{row:?}");
        // Two single runs have no interval: a change is stated, never called significant.
        assert_eq!(row["significant"], "no interval", "{row:?}");
        checked += 1;
    }
    assert_eq!(checked, 6, "{rows:?}");
}

/// Two suites of two seeds each: per (scenario, cache) the mean over seeds, and — the seeds
/// being the same — the paired interval of the per-seed relative changes.
#[test]
fn suite_comparison_recomputes_from_suite_csv() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (out, budget) in [(&a, "2048"), (&b, "64")] {
        let (code, text) = kvbench(&[
            "suite",
            "scenarios/quick-basic.toml",
            "--backend",
            "sim",
            "--seeds",
            "2",
            "--set",
            &format!("scheduler.max_tokens_per_step={budget}"),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{text}");
    }
    let rows = compare(&a, &b, &dir.path().join("cmp"));
    let table = |dir: &Path| -> Vec<BTreeMap<String, String>> {
        let mut rdr = csv::Reader::from_path(dir.join("suite.csv")).unwrap();
        let head = rdr.headers().unwrap().clone();
        rdr.records()
            .map(|r| {
                let r = r.unwrap();
                head.iter()
                    .zip(r.iter())
                    .map(|(h, v)| (h.to_string(), v.to_string()))
                    .collect()
            })
            .collect()
    };
    let (ta, tb) = (table(&a), table(&b));
    let mut checked = 0;
    for row in rows
        .iter()
        .filter(|r| r["metric"] == "throughput_tokens_per_s")
    {
        let per_seed = |t: &[BTreeMap<String, String>]| -> Vec<(String, f64)> {
            t.iter()
                .filter(|r| row["cache"].starts_with(r["cache"].as_str()))
                .map(|r| (r["seed"].clone(), f(r, "throughput_tokens_per_s")))
                .collect()
        };
        let (pa, pb) = (per_seed(&ta), per_seed(&tb));
        assert_eq!(pa.len(), 2, "{row:?}");
        let mean = |v: &[(String, f64)]| v.iter().map(|x| x.1).sum::<f64>() / v.len() as f64;
        assert!(
            close(f(row, "a"), mean(&pa)) && close(f(row, "b"), mean(&pb)),
            "{row:?}"
        );
        let rel: Vec<f64> = pa.iter().zip(&pb).map(|(x, y)| y.1 / x.1 - 1.0).collect();
        let m = (rel[0] + rel[1]) / 2.0;
        let sd = ((rel[0] - m).powi(2) + (rel[1] - m).powi(2)).sqrt();
        let t = StudentsT::new(0.0, 1.0, 1.0).unwrap().inverse_cdf(0.975);
        let half = t * sd / 2f64.sqrt();
        assert!(
            close(f(row, "rel_change_ci_low_pct"), (m - half) * 100.0),
            "{row:?}"
        );
        assert!(
            close(f(row, "rel_change_ci_high_pct"), (m + half) * 100.0),
            "{row:?}"
        );
        checked += 1;
    }
    assert_eq!(checked, 2, "{rows:?}");
}
