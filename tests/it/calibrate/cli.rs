//! `kvbench calibrate` end to end on the cpu backend and the tiny model, and `--clock model`.
//!
//! The bound for `--check` (loose but meaningful — the uncalibrated cpu profile was 90× off on
//! TTFT and 5× on ITL): on `quick-basic`, calibrated on the same machine moments before,
//! throughput within ±50% and TTFT, ITL and E2E p50 within a factor of three (−67% .. +200%) in
//! both cache modes. That is a claim about this machine's step times, so it is asserted only with
//! `KVBENCH_TIMED_BOUNDS=1` (two attempts: load elsewhere can spoil one); otherwise the test
//! prints the errors it measured and a `SKIP:` line for the bound (counted by tests/check.sh).
//! Always checked: the fit writes a profile and its grid, a refit from the grid is the same
//! profile, `--check` writes both runs and its exit status agrees with its table, and every
//! error in `calibration.json` is recomputed from the two `summary.json` files beside it.
//!
//! On a loaded machine `calibrate` refuses a poor fit (R² below 0.95 or a constant on its bound)
//! and writes nothing; the check then runs with the committed cpu profile.
//!
//! The tests in this file take turns (one lock): the load test burns CPU on purpose.

use std::path::Path;
use std::sync::Mutex;

use crate::support;

static SERIAL: Mutex<()> = Mutex::new(());

fn kvbench(args: &[&str]) -> (i32, String) {
    support::kvbench(args)
}

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("json")
}

/// The summary figure behind a `calibration.json` key.
fn figure(run: &serde_json::Value, key: &str) -> f64 {
    let v = match key {
        "ttft_p50" => &run["ttft_ms"]["p50"],
        "ttft_p99" => &run["ttft_ms"]["p99"],
        "itl_p50" => &run["itl_ms"]["p50"],
        "itl_p99" => &run["itl_ms"]["p99"],
        "e2e_p50" => &run["e2e_ms"]["p50"],
        "throughput" => &run["throughput_tokens_per_s"],
        "goodput" => &run["goodput_requests_per_s"],
        _ => panic!("unknown key {key}"),
    };
    v.as_f64().expect(key)
}

/// The timed bound is a claim about this machine's step times, so it is asserted only when asked
/// for (`KVBENCH_TIMED_BOUNDS=1`, on a quiet machine); CI, on shared VMs whose load comes and goes,
/// checks everything else and prints the errors it measured with a `SKIP:` line for the bound.
fn timed_bounds() -> bool {
    std::env::var("KVBENCH_TIMED_BOUNDS").is_ok_and(|v| v == "1")
}

#[test]
fn calibrate_then_check_meets_the_ci_bound() {
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let attempts = if timed_bounds() { 2 } else { 1 };
    let mut misses = Vec::new();
    for attempt in 1..=attempts {
        let missed = calibrate_and_check();
        println!(
            "attempt {attempt}: {} figures outside the bound {missed:?}",
            missed.len()
        );
        if missed.is_empty() {
            return;
        }
        misses.push(missed);
    }
    if !timed_bounds() {
        println!(
            "SKIP: calibrate_then_check_meets_the_ci_bound: the accuracy bound is a timed claim, \
             asserted only with KVBENCH_TIMED_BOUNDS=1 on a quiet machine (files, refit and \
             recomputed errors were checked); outside it here: {misses:?}"
        );
        return;
    }
    // On a machine other work loads, calibrate says so and refuses the fit it cannot trust:
    // then there is no profile whose error this test could bound. That is a visible skip
    // (tests/check.sh counts it), never a pass; a refusal without a load warning fails.
    let loaded_refusals = misses
        .iter()
        .all(|m| m[0].contains("is refused") && m[0].contains("machine is loaded"));
    if loaded_refusals {
        println!(
            "SKIP: calibrate_then_check_meets_the_ci_bound: the machine is loaded and both fits \
             were refused (nothing written); the CI bound was not checked"
        );
        return;
    }
    panic!("outside the CI bound on both attempts: {misses:?}");
}

/// One calibrate + check; the figures outside the bound (the file checks always hold). A fit
/// the machine's noise spoiled is refused and writes nothing; the check then runs with the
/// committed cpu profile, so its files are still checked.
fn calibrate_and_check() -> Vec<String> {
    let mut missed = Vec::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let fitted = dir.path().join("cpu.toml");
    let (code, text) = kvbench(&[
        "calibrate",
        "scenarios/quick-basic.toml",
        "--repeats",
        "5",
        "--out",
        fitted.to_str().expect("utf-8"),
    ]);
    let profile = if code == 2 && text.contains("is refused") {
        assert!(!fitted.exists(), "a refused fit writes nothing");
        missed.push(format!("fit refused: {text}"));
        Path::new("scenarios/devices/cpu.toml").to_path_buf()
    } else {
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("R²"), "{text}");
        assert!(dir.path().join("cpu.grid.json").is_file());
        // A refit from the grid file gives the same profile.
        let refit = dir.path().join("refit.toml");
        let (code, text) = kvbench(&[
            "calibrate",
            "--from-grid",
            dir.path().join("cpu.grid.json").to_str().expect("utf-8"),
            "--out",
            refit.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, 0, "{text}");
        assert_eq!(
            std::fs::read_to_string(&fitted).expect("profile"),
            std::fs::read_to_string(&refit).expect("refit")
        );
        fitted
    };
    let p = profile.to_str().expect("utf-8");

    let out = dir.path().join("check");
    let (code, text) = kvbench(&[
        "calibrate",
        "--check",
        "scenarios/quick-basic.toml",
        "--profile",
        p,
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    // Exit 1 when a figure misses its stated target (the files are written either way); the
    // CI bound below is looser than the targets, for a shared VM.
    assert!(code == 0 || code == 1, "{text}");
    assert_eq!(code == 1, text.contains("missed their target"), "{text}");
    assert!(text.contains("| ttft_p50 (ms) | ±5% |"), "{text}");
    assert!(text.contains("| error | noise | verdict |"), "{text}");
    assert!(
        text.contains("| pass |") || text.contains("| miss |"),
        "{text}"
    );
    println!("{text}");
    let cal = json(&out.join("calibration.json"));
    let measured = json(&out.join("measured/summary.json"));
    let sim = json(&out.join("sim/summary.json"));
    assert_eq!(measured["backend"], "cpu");
    assert_eq!(sim["backend"], "sim");
    let runs = cal["runs"].as_array().expect("runs[]");
    assert_eq!(runs.len(), 2);
    for (i, run) in runs.iter().enumerate() {
        let cache = run["cache"].as_str().expect("cache");
        assert_eq!(measured["runs"][i]["cache"], cache);
        assert_eq!(sim["runs"][i]["cache"], cache);
        for key in [
            "ttft_p50",
            "ttft_p99",
            "itl_p50",
            "itl_p99",
            "e2e_p50",
            "throughput",
            "goodput",
        ] {
            let err = run["errors"][key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key}"));
            let (x, y) = (
                figure(&measured["runs"][i], key),
                figure(&sim["runs"][i], key),
            );
            let want = (y - x) / x;
            assert!(
                (err - want).abs() <= 1e-9 * want.abs().max(1.0),
                "{cache} {key}: {err} vs {want}"
            );
        }
        // The machine's noise beside each error: two identical measured runs' difference.
        for key in ["ttft_p50", "itl_p50", "throughput"] {
            let n = run["noise"][key]
                .as_f64()
                .unwrap_or_else(|| panic!("{cache} noise {key}: {run}"));
            assert!(n.is_finite() && n >= 0.0, "{cache} noise {key}: {n}");
        }
        let e = |k: &str| run["errors"][k].as_f64().unwrap_or(f64::NAN);
        if e("throughput").abs() > 0.5 {
            missed.push(format!("{cache} throughput {:+.3}", e("throughput")));
        }
        for key in ["ttft_p50", "itl_p50", "e2e_p50"] {
            if !(-2.0 / 3.0..=2.0).contains(&e(key)) {
                missed.push(format!("{cache} {key} {:+.3}", e(key)));
            }
        }
    }
    missed
}

#[test]
fn a_bad_profile_for_check_exits_2_naming_file_line_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.toml");
    let text = include_str!("../../../scenarios/devices/cpu.toml");
    let line = text
        .lines()
        .position(|l| l.starts_with("peak_flops_per_s ="))
        .expect("key")
        + 1;
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("peak_flops_per_s =") {
                "peak_flops_per_s = 1e-300\n".to_string()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&bad, text).expect("write");
    let out = dir.path().join("out");
    let (code, text) = kvbench(&[
        "calibrate",
        "--check",
        "scenarios/quick-basic.toml",
        "--profile",
        bad.to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(&format!(
            "{}:{line}:1: peak_flops_per_s: must be between",
            bad.display()
        )),
        "{text}"
    );
    assert!(!out.exists());
}

/// A grid's step times are wall times: a negative or zero one (an edited file, a clock that
/// stepped back) is refused before the fit, naming the file and the sample, and nothing is
/// written; the same grid with the sample restored fits.
#[test]
fn a_grid_with_a_step_time_that_is_not_positive_is_refused_naming_the_sample() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/devices/cpu.grid.json"),
    )
    .expect("grid");
    let grid: serde_json::Value = serde_json::from_str(&shipped).expect("json");
    for (label, sample, shown) in [
        ("negative", "-0.001", "-0.001"),
        ("zero", "0.0", "0"),
        ("huge", "1e999", ""),
    ] {
        let mut g = grid.clone();
        g["points"][2]["samples_s"][1] = serde_json::json!(0.125);
        // Written by hand: JSON numbers as the file would carry them (1e999 is not finite).
        let text = serde_json::to_string_pretty(&g)
            .expect("render")
            .replacen("0.125", sample, 1);
        let path = dir.path().join(format!("{label}.grid.json"));
        std::fs::write(&path, text).expect("write");
        let out = dir.path().join(format!("{label}.toml"));
        let (code, text) = kvbench(&[
            "calibrate",
            "--from-grid",
            path.to_str().expect("utf-8"),
            "--out",
            out.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, 2, "{label}: {text}");
        let named = match label {
            "huge" => format!("{}: not a grid file", path.display()),
            _ => format!(
                "{}: points[2].samples_s[1]: a step time must be finite and above 0 s, got {shown}",
                path.display(),
            ),
        };
        assert!(text.contains(&named), "{label}: {text}");
        assert!(!out.exists(), "{label}: a refused grid writes nothing");
    }
    let path = dir.path().join("shipped.grid.json");
    std::fs::write(&path, &shipped).expect("write");
    let out = dir.path().join("shipped.toml");
    let (code, text) = kvbench(&[
        "calibrate",
        "--from-grid",
        path.to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(out.is_file());
}

/// Burns one core per thread until `stop` is set.
fn burn(stop: &std::sync::atomic::AtomicBool) {
    let mut x = 1u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for _ in 0..100_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
    }
}

#[test]
fn clock_model_schedules_identically_under_load_and_as_sim_does() {
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |name: &str, extra: &[&str]| -> String {
        let out = dir.path().join(name);
        let mut args = vec![
            "run",
            "scenarios/quick-mixed.toml",
            "--set",
            "traffic.requests=40",
            "--check-every",
            "0",
            "--out",
            out.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        let (code, text) = kvbench(&args);
        assert_eq!(code, 0, "{text}");
        std::fs::read_to_string(out.join("requests.csv")).expect("requests.csv")
    };
    let model = ["--backend", "cpu", "--clock", "model"];
    let quiet = run("quiet", &model);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let loaded = std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| burn(&stop));
        }
        let r = run("loaded", &model);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    });
    assert!(quiet == loaded, "requests.csv differs under load");
    // The modelled clock is the cpu profile's cost model: the schedule is sim's, step for step.
    let sim = run("sim", &["--backend", "sim"]);
    assert!(
        quiet == sim,
        "cpu --clock model and sim schedule differently"
    );
    // The math was still real and checked, and the measured time is kept.
    let summary = json(&dir.path().join("quiet/summary.json"));
    assert_eq!(summary["checks"]["ok"], true);
    for r in summary["runs"].as_array().expect("runs") {
        assert!(
            r["numerics"]["checked_steps"].as_u64().unwrap_or(0) > 0,
            "{r}"
        );
        assert!(r["measured_step_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }
}
