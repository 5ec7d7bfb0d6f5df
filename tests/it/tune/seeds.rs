//! `kvbench tune --seeds N` end to end on `sim`: every configuration carries its per-seed
//! brackets, its rate and interval are the sweep's over them (recomputed here with
//! `bracket_interval`), pruned configurations lie wholly below the best's interval, the known
//! optimum is still found, and `tune.md`/`report.html` show the per-seed figures.

use crate::support;

use std::path::Path;

use kvbench::stats::bracket_interval;
use kvbench::tune::write::{markdown, TuneJson};
use support::kvbench;
use support::tune_small::TUNE_SMALL;

fn read_json(out: &Path) -> TuneJson {
    serde_json::from_str(&std::fs::read_to_string(out.join("tune.json")).unwrap()).unwrap()
}

#[test]
fn three_seeds_give_each_configuration_the_sweeps_interval_over_them() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("small.toml");
    std::fs::write(&scenario, TUNE_SMALL).unwrap();
    let space = dir.path().join("space.toml");
    std::fs::write(&space, "scheduler.max_seqs_per_step = [1, 4, 8]\n").unwrap();
    let out = dir.path().join("out");
    let (code, text) = kvbench(&[
        "tune",
        scenario.to_str().unwrap(),
        "--space",
        space.to_str().unwrap(),
        "--seeds",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let j = read_json(&out);
    assert_eq!(j.seeds, vec![3, 4, 5], "from the scenario's seed upwards");
    let mut pruned = 0;
    for m in &j.modes {
        let best = &j.configurations[m.best.expect("a best")];
        assert_eq!(
            best.values["scheduler.max_seqs_per_step"], "8",
            "{}",
            m.cache
        );
        assert_eq!(m.rate_at_target_rps_ci, best.rate_at_target_rps_ci);
        for c in j.configurations.iter().filter(|c| c.cache == m.cache) {
            let seeds: Vec<u64> = c.per_seed.iter().map(|s| s.seed).collect();
            assert_eq!(seeds, j.seeds, "{}: {}", m.cache, c.set);
            match c.verdict.name() {
                "refused" | "unfinished" => {}
                "pruned" => {
                    pruned += 1;
                    assert_eq!(c.rate_at_target_rps, None);
                    for s in &c.per_seed {
                        assert_eq!(s.rate_at_target_rps, None, "pruned: no seed passed");
                        let f = s
                            .lowest_failing_rps
                            .expect("failed at the centre's lower end");
                        assert!(
                            f <= best.rate_at_target_rps_ci[0],
                            "{}: pruned {} failed at {f}, inside the best's interval {:?}",
                            m.cache,
                            c.set,
                            best.rate_at_target_rps_ci
                        );
                    }
                }
                _ => {
                    let a: Vec<f64> = c
                        .per_seed
                        .iter()
                        .map(|s| s.rate_at_target_rps.expect("every seed passed"))
                        .collect();
                    let b: Vec<f64> = c
                        .per_seed
                        .iter()
                        .zip(&a)
                        .map(|(s, &a)| s.lowest_failing_rps.unwrap_or(a).max(a))
                        .collect();
                    // JSON's number text round-trips to within an ulp or two.
                    let want = bracket_interval(&a, &b);
                    for (got, want) in c.rate_at_target_rps_ci.iter().zip(want) {
                        assert!(
                            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                            "{}: {:?} vs {want}",
                            c.set,
                            c.rate_at_target_rps_ci
                        );
                    }
                    let mean = a.iter().sum::<f64>() / a.len() as f64;
                    let rate = c.rate_at_target_rps.unwrap();
                    assert!((rate - mean).abs() <= 1e-9 * mean, "{rate} vs {mean}");
                }
            }
        }
        // Every indistinguishable configuration's interval overlaps the best's; every one below
        // lies wholly below the top's lower end.
        let top = j
            .configurations
            .iter()
            .filter(|c| c.cache == m.cache && c.rate_at_target_rps.is_some())
            .map(|c| c.rate_at_target_rps_ci[0])
            .fold(0.0, f64::max);
        for c in j.configurations.iter().filter(|c| c.cache == m.cache) {
            if c.verdict.name() == "below" {
                assert!(c.rate_at_target_rps_ci[1] <= top, "{}", c.set);
            }
            if c.verdict.name() == "indistinguishable" {
                assert!(c.rate_at_target_rps_ci[1] > top, "{}", c.set);
            }
        }
    }
    assert!(
        pruned > 0,
        "1 sequence a step is pruned below the scenario's 2"
    );
    let md = std::fs::read_to_string(out.join("tune.md")).unwrap();
    assert_eq!(md, markdown(&j));
    assert!(md.contains("seeds 3, 4, 5"), "{md}");
    assert!(
        md.contains("Per seed (passing–failing, req/s): 3: "),
        "{md}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert_eq!(html, kvbench::tune::html::report(&j).unwrap());
    assert!(html.contains("per seed: passing–failing (req/s)"));
}

#[test]
fn zero_seeds_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("small.toml");
    std::fs::write(&scenario, TUNE_SMALL).unwrap();
    let out = dir.path().join("out");
    let (code, text) = kvbench(&[
        "tune",
        scenario.to_str().unwrap(),
        "--seeds",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--seeds"), "{text}");
    assert!(!out.exists(), "nothing written");
}
