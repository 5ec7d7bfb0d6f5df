//! The calibration fit and the profile validation, without measuring anything.
//!
//! - The fit recovers known constants from step times the cost model itself generates, with
//!   seeded multiplicative noise (`KVBENCH_SEED` replays a seed; it is printed).
//! - A fitted profile's text loads back as the same profile.
//! - A profile with a constant missing, out of range or unknown is refused with FILE:LINE:COL:
//!   KEY, for a file given by path and for one beside a scenario.

use std::path::Path;

use kvbench::backend::sim::cost::CostModel;
use kvbench::backend::sim::profile::{Combine, DeviceProfile};
use kvbench::calibrate::fit::{self, Origin, PARAMS};
use kvbench::calibrate::grid::{default_points, Grid, GridLimits, GRID_FORMAT};
use kvbench::calibrate::write::profile_toml;
use kvbench::model::ModelShape;
use kvbench_cache_api::CacheMode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn seed() -> u64 {
    let s = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00ca_11b8);
    println!("seed {s} (replay with KVBENCH_SEED={s})");
    s
}

fn truth() -> DeviceProfile {
    let mut p = DeviceProfile::load("cpu", None).expect("cpu profile");
    p.name = "truth".into();
    p.combine = Combine::Sum;
    p.step_overhead_s = 50e-6;
    p.seq_overhead_s = 20e-6;
    p.weight_bytes_per_s = Some(10e9);
    p.hbm_effective_bytes_per_s = 20e9;
    p.paged_attention_efficiency = 0.8;
    p.peak_flops_per_s = 50e9;
    p.attention_flops_per_s = Some(10e9);
    p.copy_bytes_per_s = Some(20e9);
    p.host_link_bytes_per_s = 10e9;
    p
}

/// The default grid for `quick-mixed`'s limits, timed by `profile`'s own cost model with
/// multiplicative Gaussian noise of relative size `noise`.
fn synthetic_grid(profile: &DeviceProfile, noise: f64, seed: u64) -> Grid {
    synthetic_grid_of(ModelShape::tiny(), profile, noise, seed)
}

/// [`synthetic_grid`] for `model`.
fn synthetic_grid_of(model: ModelShape, profile: &DeviceProfile, noise: f64, seed: u64) -> Grid {
    let limits = GridLimits {
        max_seq_len: 256,
        max_tokens_per_step: 512,
        max_seqs_per_step: 32,
        block_size: 16,
    };
    let cost = CostModel::new(&model, profile, None);
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut points = default_points(&limits);
    for p in &mut points {
        let t = cost
            .step(
                &p.seq_work(),
                &p.copies(16),
                &p.swaps(),
                p.cache == CacheMode::Paged,
            )
            .total_s;
        for _ in 0..7 {
            // Box–Muller: one standard normal from two uniforms.
            let (u1, u2): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            p.samples_s.push(t * (1.0 + noise * z));
        }
    }
    Grid {
        format: GRID_FORMAT.into(),
        backend: "synthetic".into(),
        device: "the cost model itself".into(),
        date: "2026-12-01T00:00:00Z".into(),
        model,
        block_size: 16,
        load_average: None,
        points,
    }
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

/// Every constant the fit solves for came back within `tol` of the one the times were made with.
fn assert_recovers(fitted: &DeviceProfile, truth: &DeviceProfile, tol: f64) {
    for key in PARAMS {
        let (got, want) = (fitted.value(key), truth.value(key));
        let (got, want) = (got.expect(key), want.expect(key));
        assert!(rel(got, want) < tol, "{key}: fitted {got:e}, true {want:e}");
    }
}

/// The profile `fit` writes for `grid` parses back as the fitted profile; returns its text.
fn loads_back(f: &fit::Fit, grid: &Grid, device: &str) -> (String, DeviceProfile) {
    let text = profile_toml(f, grid, device);
    let back = DeviceProfile::parse(&text, Some(Path::new("fitted.toml"))).expect("loads");
    assert_eq!(back, f.profile);
    (text, back)
}

#[test]
fn the_fit_recovers_the_constants_that_generated_the_times() {
    let seed = seed();
    let t = truth();
    let base = DeviceProfile::load("cpu", None).expect("cpu");
    // Without noise: exact recovery of every constant.
    let f = fit::fit(&synthetic_grid(&t, 0.0, seed), &base, "fitted").expect("fit");
    assert_recovers(&f.profile, &t, 1e-6);
    assert!(f.r2 > 0.999_999, "{}", f.r2);
    assert!(f.origins.iter().all(|o| *o == Origin::Fitted));
    // With 1% noise per sample: the constants that carry most of the time come back within a
    // few percent, and the model predicts every point within 5%.
    let f = fit::fit(&synthetic_grid(&t, 0.01, seed), &base, "fitted").expect("fit");
    for (key, tol) in [
        ("step_overhead_s", 0.25),
        ("seq_overhead_s", 0.10),
        ("weight_bytes_per_s", 0.05),
        ("peak_flops_per_s", 0.05),
        ("attention_flops_per_s", 0.10),
        ("copy_bytes_per_s", 0.10),
        ("host_link_bytes_per_s", 0.10),
    ] {
        let (got, want) = (f.profile.value(key), t.value(key));
        let (got, want) = (got.expect(key), want.expect(key));
        assert!(
            rel(got, want) < tol,
            "{key}: fitted {got:e}, true {want:e} (seed {seed})"
        );
    }
    assert!(
        f.max_abs_rel_err < 0.05,
        "max error {} (seed {seed})",
        f.max_abs_rel_err
    );
}

#[test]
fn a_fitted_profile_loads_back_as_itself() {
    let seed = seed();
    let base = DeviceProfile::load("cpu", None).expect("cpu");
    let grid = synthetic_grid(&truth(), 0.02, seed);
    let f = fit::fit(&grid, &base, "cpu").expect("fit");
    let (text, _) = loads_back(&f, &grid, "cpu");
    // Every constant names its source.
    for key in PARAMS {
        let at = text.find(&format!("\n{key} = ")).expect(key);
        let comment = text[..at].lines().last().unwrap_or_default();
        assert!(
            comment.starts_with("# Fitted on the cost model itself"),
            "{key}: {comment}"
        );
        assert!(comment.contains("points, R²"), "{comment}");
    }
}

#[test]
fn a_grid_without_copies_or_swaps_keeps_those_constants_from_the_base() {
    let base = DeviceProfile::load("h200", None).expect("h200");
    let mut grid = synthetic_grid(&truth(), 0.0, 1);
    grid.points
        .retain(|p| p.copy_tokens == 0 && p.swap_in_tokens == 0 && p.swap_out_tokens == 0);
    let f = fit::fit(&grid, &base, "h200").expect("fit");
    let i = |k: &str| PARAMS.iter().position(|p| *p == k).unwrap_or(0);
    assert_eq!(f.origins[i("copy_bytes_per_s")], Origin::Kept);
    assert_eq!(f.origins[i("host_link_bytes_per_s")], Origin::Kept);
    assert_eq!(f.profile.host_link_bytes_per_s, base.host_link_bytes_per_s);
    assert!(rel(f.profile.peak_flops_per_s, 50e9) < 1e-6);
}

/// The attention rate's half-saturation length is searched beside the linear fit: a grid timed
/// with a curve gives the curve back, with every linear constant, and the written profile says
/// it was fitted.
#[test]
fn the_fit_recovers_the_attention_half_saturation_length() {
    let seed = seed();
    let mut t = truth();
    t.attention_half_tokens = Some(64.0);
    let base = DeviceProfile::load("cpu", None).expect("cpu");
    let grid = synthetic_grid(&t, 0.0, seed);
    let f = fit::fit(&grid, &base, "fitted").expect("fit");
    assert_eq!(f.half_tokens_origin, Origin::Fitted);
    let half = f.profile.attention_half_tokens.expect("fitted");
    assert!(rel(half, 64.0) < 1e-3, "attention_half_tokens {half}");
    assert_recovers(&f.profile, &t, 1e-3);
    assert!(f.max_abs_rel_err < 1e-4, "{}", f.max_abs_rel_err);
    let (text, _) = loads_back(&f, &grid, "cpu");
    let at = text.find("\nattention_half_tokens = ").expect("written");
    let comment = text[..at].lines().last().unwrap_or_default();
    assert!(comment.starts_with("# Fitted on"), "{comment}");
    // Without a curve in the times, one rate at every length (0) is the fit.
    let f = fit::fit(&synthetic_grid(&truth(), 0.0, seed), &base, "flat").expect("fit");
    assert_eq!(f.profile.attention_half_tokens, Some(0.0));
}

/// A grid measured at tp = 2: each point's all-reduces are priced at the base profile's link
/// and taken off before the fit, so the one device's constants come back exactly; the fitted
/// profile keeps the link, and predicts the whole measured times.
#[test]
fn a_tp_2_grid_is_fitted_with_its_all_reduces_separated_by_the_link() {
    let seed = seed();
    let mut t = truth();
    t.nvlink_bytes_per_s = Some(5e9);
    t.nvlink_latency_s = Some(20e-6);
    let mut model = ModelShape::tiny();
    model.tp = 2;
    let grid = synthetic_grid_of(model.clone(), &t, 0.0, seed);
    // The all-reduces are a real share of these steps, so ignoring them would not fit.
    let cost = CostModel::new(&model, &t, None);
    let p = &grid.points[0];
    let c = cost.step(&p.seq_work(), &[], &[], p.cache == CacheMode::Paged);
    assert!(c.all_reduce_s > 0.1 * c.total_s, "{c:?}");
    let mut base = DeviceProfile::load("cpu", None).expect("cpu");
    base.nvlink_bytes_per_s = t.nvlink_bytes_per_s;
    base.nvlink_latency_s = t.nvlink_latency_s;
    let f = fit::fit(&grid, &base, "fitted").expect("fit");
    assert_recovers(&f.profile, &t, 1e-6);
    assert!(f.max_abs_rel_err < 1e-6, "{}", f.max_abs_rel_err);
    let (_, back) = loads_back(&f, &grid, "cpu");
    assert_eq!(back.nvlink_bytes_per_s, Some(5e9));
    // A base profile without a device link cannot separate them: refused, naming the key.
    let cpu = DeviceProfile::load("cpu", None).expect("cpu");
    let err = fit::fit(&grid, &cpu, "fitted")
        .expect_err("no link")
        .to_string();
    assert!(
        err.contains("model.tp") && err.contains("nvlink_bytes_per_s"),
        "{err}"
    );
    // A point measured faster than its all-reduces alone is refused, naming it.
    let mut fast = grid.clone();
    fast.points[3].samples_s = vec![1e-9];
    let err = fit::fit(&fast, &base, "fitted")
        .expect_err("too fast")
        .to_string();
    assert!(err.contains("points.3"), "{err}");
}

const CPU: &str = include_str!("../../../scenarios/devices/cpu.toml");

fn refused(text: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).expect("write");
    let err = DeviceProfile::load_file(&path)
        .expect_err("must be refused")
        .to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    err.replace(&path.display().to_string(), "bad.toml")
}

fn line_of(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| l.starts_with(&format!("{key} =")))
        .map_or(0, |i| i + 1)
}

#[test]
fn a_missing_constant_is_refused_naming_it() {
    for key in ["peak_flops_per_s", "step_overhead_s", "memory_bytes"] {
        let text: String = CPU
            .lines()
            .filter(|l| !l.starts_with(&format!("{key} =")))
            .map(|l| format!("{l}\n"))
            .collect();
        let err = refused(&text);
        // The full key, not prefixed by the key the error's span starts at.
        assert!(
            err.contains(&format!("bad.toml:1:1: {key}: missing field")),
            "{err}"
        );
    }
}

#[test]
fn out_of_range_constants_are_refused_at_their_line() {
    for (key, value) in [
        ("hbm_effective_bytes_per_s", "1e-300"),
        ("peak_flops_per_s", "1e-300"),
        ("paged_attention_efficiency", "1e-300"),
        ("step_overhead_s", "20.0"),
        ("step_overhead_s", "-1e-6"),
        ("seq_overhead_s", "nan"),
        ("memory_bytes", "0"),
        ("attention_half_tokens", "-1.0"),
        ("attention_half_tokens", "1e8"),
        ("attention_half_tokens", "nan"),
    ] {
        let line = line_of(CPU, key);
        let text = if line == 0 {
            format!("{CPU}\n{key} = {value}\n")
        } else {
            CPU.lines()
                .map(|l| {
                    if l.starts_with(&format!("{key} =")) {
                        format!("{key} = {value}\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect()
        };
        let line = line_of(&text, key);
        let err = refused(&text);
        assert!(
            err.contains(&format!("bad.toml:{line}:1: {key}: must be between")),
            "{key} = {value}: {err}"
        );
    }
}

#[test]
fn unknown_keys_and_wrong_types_are_refused_at_their_line() {
    let text = format!("{CPU}\nhbm_bandwith = 5e9\n");
    let err = refused(&text);
    let line = line_of(&text, "hbm_bandwith");
    assert!(
        err.contains(&format!("bad.toml:{line}:1: hbm_bandwith: unknown field")),
        "{err}"
    );
    let text = CPU.replace("peak_flops_per_s = ", "peak_flops_per_s = \"fast\" # ");
    let err = refused(&text);
    let line = line_of(&text, "peak_flops_per_s");
    assert!(
        err.contains(&format!("bad.toml:{line}:")) && err.contains("peak_flops_per_s"),
        "{err}"
    );
}

#[test]
fn a_bad_profile_beside_a_scenario_fails_the_run_with_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("devices")).expect("mkdir");
    let text = CPU
        .lines()
        .map(|l| {
            if l.starts_with("step_overhead_s =") {
                "step_overhead_s = 20.0\n".to_string()
            } else {
                format!("{l}\n")
            }
        })
        .collect::<String>();
    std::fs::write(dir.path().join("devices/cpu.toml"), &text).expect("write");
    let scenario = dir.path().join("s.toml");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-basic.toml"),
        &scenario,
    )
    .expect("copy");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["run", "--backend", "sim", "--out"])
        .arg(dir.path().join("out"))
        .arg(&scenario)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let line = line_of(&text, "step_overhead_s");
    assert!(
        stderr.contains(&format!(
            "cpu.toml:{line}:1: step_overhead_s: must be between"
        )),
        "{stderr}"
    );
    assert!(!dir.path().join("out").exists());
}

/// The calibration figures of docs/calibration.md: every error in the committed `calibration.json` files
/// recomputes from the two runs' `summary.json` beside it.
#[test]
fn committed_calibration_errors_recompute_from_their_summaries() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/calibration");
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).expect("read")).expect("json")
    };
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).expect("results/calibration") {
        let dir = entry.expect("entry").path();
        let cal = read(&dir.join("calibration.json"));
        let (m, s) = (
            read(&dir.join("measured/summary.json")),
            read(&dir.join("sim/summary.json")),
        );
        for (i, run) in cal["runs"].as_array().expect("runs").iter().enumerate() {
            for (key, path) in [
                ("ttft_p50", ["ttft_ms", "p50"]),
                ("ttft_p99", ["ttft_ms", "p99"]),
                ("itl_p50", ["itl_ms", "p50"]),
                ("itl_p99", ["itl_ms", "p99"]),
                ("e2e_p50", ["e2e_ms", "p50"]),
            ] {
                let x = m["runs"][i][path[0]][path[1]].as_f64().expect(key);
                let y = s["runs"][i][path[0]][path[1]].as_f64().expect(key);
                let e = run["errors"][key].as_f64().expect(key);
                assert!((e - (y - x) / x).abs() < 1e-12, "{}: {key}", dir.display());
                checked += 1;
            }
            for (key, field) in [
                ("throughput", "throughput_tokens_per_s"),
                ("goodput", "goodput_requests_per_s"),
            ] {
                let x = m["runs"][i][field].as_f64().expect(key);
                let y = s["runs"][i][field].as_f64().expect(key);
                let e = run["errors"][key].as_f64().expect(key);
                assert!((e - (y - x) / x).abs() < 1e-12, "{}: {key}", dir.display());
                checked += 1;
            }
        }
    }
    assert!(checked >= 28, "{checked}");
}

#[test]
fn a_fit_on_its_bounds_or_below_the_r2_floor_is_refused_and_writes_nothing() {
    let seed = seed();
    let base = DeviceProfile::load("cpu", None).expect("cpu");
    // The true fit is accepted.
    let true_grid = synthetic_grid(&truth(), 0.0, seed);
    let good = fit::fit(&true_grid, &base, "fitted").expect("fit");
    assert_eq!(good.refusal(), None);
    // Swaps that cost nothing measurable: the host link's rate sits on its range's bound.
    let mut t = truth();
    t.host_link_bytes_per_s = 1e30;
    let free_swaps = synthetic_grid(&t, 0.0, seed);
    let f = fit::fit(&free_swaps, &base, "fitted").expect("fit");
    let why = f.refusal().expect("refused");
    assert!(why.contains("host_link_bytes_per_s"), "{why}");
    // Times the model cannot explain (each point timed as another one): R² below the floor.
    let mut g = true_grid;
    let times: Vec<Vec<f64>> = g.points.iter().map(|p| p.samples_s.clone()).collect();
    for (p, t) in g.points.iter_mut().zip(times.into_iter().rev()) {
        p.samples_s = t;
    }
    let f = fit::fit(&g, &base, "fitted").expect("fit");
    println!("R² {} with the times reversed", f.r2);
    assert!(f.r2 < fit::R2_FLOOR, "{}", f.r2);
    assert!(f.refusal().expect("refused").contains("R²"));

    // Through the binary: exit non-zero, no profile written.
    let dir = tempfile::tempdir().expect("tempdir");
    let grid = dir.path().join("g.grid.json");
    std::fs::write(&grid, serde_json::to_string(&free_swaps).expect("json")).expect("write grid");
    let out = dir.path().join("p.toml");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["calibrate", "--from-grid"])
        .arg(&grid)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains("host_link_bytes_per_s") && text.contains("nothing written"));
    assert!(!out.exists());
}

#[test]
fn a_fit_whose_residuals_exceed_the_machines_noise_is_refused() {
    let seed = seed();
    let base = DeviceProfile::load("cpu", None).expect("cpu");
    // 2% noise per probe, seven probes a point: the model that made the times misses each
    // point's median by far less than the probes scatter.
    let clean = synthetic_grid(&truth(), 0.02, seed);
    let f = fit::fit(&clean, &base, "fitted").expect("fit");
    let (noise, ratio) = (
        f.noise_rel.expect("noise"),
        f.error_over_noise.expect("ratio"),
    );
    println!(
        "seed {seed}: noise {noise:.4}, error / noise {ratio:.3}, R² {}",
        f.r2
    );
    assert!((0.01..0.04).contains(&noise), "{noise}");
    assert!(ratio < 1.0, "{ratio}");
    assert_eq!(f.refusal(), None);
    // Every other point 15% slower than the model says, a cost it has no term for: the
    // residuals stand out of the noise though R² stays high.
    let mut g = clean.clone();
    for p in g.points.iter_mut().step_by(2) {
        for t in &mut p.samples_s {
            *t *= 1.15;
        }
    }
    let f = fit::fit(&g, &base, "fitted").expect("fit");
    println!(
        "perturbed: error / noise {:?}, R² {}",
        f.error_over_noise, f.r2
    );
    let why = f.refusal().expect("refused");
    assert!(why.contains("exceed the machine's own noise"), "{why}");
    assert!(f.error_over_noise.expect("ratio") > 1.0);
}

#[test]
fn a_loaded_machine_is_named() {
    use kvbench::calibrate::grid::load_warning;
    assert_eq!(load_warning(0.3, 2), None);
    let w = load_warning(16.5, 2).expect("a warning");
    assert!(w.contains("16.50 on 2 cores"), "{w}");
}
