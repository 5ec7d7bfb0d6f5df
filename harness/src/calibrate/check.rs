//! `calibrate --check`: one scenario on the measured backend and on `sim` with a profile, and the
//! signed relative error of each headline figure, per cache mode. The measured run is made twice,
//! identically: how far the two differ is the machine's own noise on that figure, reported beside
//! the error (an error inside the noise says nothing about the profile).

use kvbench_cache_api::CacheMode;

use crate::backend::sim::profile::DeviceProfile;
use crate::backend::{BackendKind, Clock};
use crate::experiment::{self, ExperimentError, RunOptions};
use crate::metrics::RunMetrics;
use crate::results::calibration::{Check, Figure, ModeCheck};
use crate::scenario::Scenario;

/// The figures compared, by their `calibration.json` key.
pub const FIGURES: [&str; 7] = [
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "e2e_p50",
    "throughput",
    "goodput",
];

/// The target each figure's relative error must meet, as a fraction (±), on the calibration's
/// own machine (docs/calibration.md): medians, throughput and goodput within 5%, p99s (where
/// one slow step weighs) within 10%.
pub const TARGETS: [(&str, f64); 7] = [
    ("ttft_p50", 0.05),
    ("ttft_p99", 0.10),
    ("itl_p50", 0.05),
    ("itl_p99", 0.10),
    ("e2e_p50", 0.05),
    ("throughput", 0.05),
    ("goodput", 0.05),
];

/// The unit of the figure called `key`.
pub fn unit(key: &str) -> &'static str {
    match key {
        "throughput" => "tok/s",
        "goodput" => "req/s",
        _ => "ms",
    }
}

/// The target of the figure called `key` (±, a fraction).
pub fn target(key: &str) -> Option<f64> {
    TARGETS.iter().find(|(k, _)| *k == key).map(|(_, t)| *t)
}

/// `pass` when `error` is within the figure's target; `miss` otherwise, or where no error
/// could be computed (a measured figure of 0 compares to nothing).
pub fn verdict(key: &str, error: Option<f64>) -> &'static str {
    match (error, target(key)) {
        (Some(e), Some(t)) if e.abs() <= t => "pass",
        _ => "miss",
    }
}

/// Every (cache mode, figure, error) that missed its target.
pub fn misses(c: &Check) -> Vec<String> {
    let mut out = Vec::new();
    for r in &c.runs {
        for key in FIGURES {
            let e = r.errors[key];
            if verdict(key, e) == "miss" {
                out.push(format!(
                    "{} {key}: {} against ±{:.0}%, the machine's noise on it {}",
                    r.cache.name(),
                    e.map_or("no error (measured 0)".into(), |e| format!(
                        "{:+.1}%",
                        100.0 * e
                    )),
                    100.0 * target(key).unwrap_or(0.0),
                    r.noise
                        .get(key)
                        .copied()
                        .flatten()
                        .map_or("unmeasured".to_string(), |n| format!("±{:.1}%", 100.0 * n))
                ));
            }
        }
    }
    out
}

/// The figure called `key` of a run (latencies in ms, throughput in tokens/s, goodput in
/// requests/s), as `summary.json` reports it.
pub fn figure(m: &RunMetrics, key: &str) -> Option<f64> {
    Some(match key {
        "ttft_p50" => m.ttft.p50,
        "ttft_p99" => m.ttft.p99,
        "itl_p50" => m.itl.p50,
        "itl_p99" => m.itl.p99,
        "e2e_p50" => m.e2e.p50,
        "throughput" => m.throughput_tokens_per_s,
        "goodput" => m.goodput_requests_per_s,
        _ => return None,
    })
}

/// (model − measured) / measured; `None` where the measured figure is 0.
pub fn rel_err(measured: f64, model: f64) -> Option<f64> {
    (measured != 0.0 && measured.is_finite() && model.is_finite())
        .then(|| (model - measured) / measured)
}

/// Runs `s` on `backend` (measured clock) and on `sim` with `profile`.
pub fn check(
    s: &Scenario,
    backend: BackendKind,
    profile: &DeviceProfile,
    seed: Option<u64>,
) -> Result<Check, ExperimentError> {
    let measured_opts = RunOptions {
        backend,
        seed,
        trace_tokens: true,
        invariant_check_every: 0,
        clock: Clock::Measured,
        ..RunOptions::default()
    };
    // The noise probe first: the same scenario, seed and backend, whose figures differ from the
    // kept run's only by the machine's timing.
    let probe = experiment::run_scenario(s, &measured_opts)?;
    let measured = experiment::run_scenario(s, &measured_opts)?;
    let model_opts = RunOptions {
        backend: BackendKind::Sim,
        profile: Some(profile.clone()),
        ..measured_opts
    };
    let model = experiment::run_scenario(s, &model_opts)?;
    let mut runs = Vec::new();
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        let (Some(a), Some(b)) = (measured.run(mode), model.run(mode)) else {
            continue;
        };
        let mut errors = std::collections::BTreeMap::new();
        let mut figures = std::collections::BTreeMap::new();
        let mut noise = std::collections::BTreeMap::new();
        for key in FIGURES {
            let again = probe
                .run(mode)
                .and_then(|p| figure(&p.metrics, key))
                .unwrap_or(0.0);
            let x = figure(&a.metrics, key).unwrap_or(0.0);
            noise.insert(key, rel_err(x, again).map(f64::abs));
            let (x, y) = (
                figure(&a.metrics, key).unwrap_or(0.0),
                figure(&b.metrics, key).unwrap_or(0.0),
            );
            errors.insert(key, rel_err(x, y));
            figures.insert(
                key,
                Figure {
                    measured: x,
                    model: y,
                },
            );
        }
        runs.push(ModeCheck {
            cache: mode,
            errors,
            noise,
            figures,
            measured_steps: a.end.steps as usize,
            model_steps: b.end.steps as usize,
        });
    }
    Ok(Check {
        profile: profile.name.clone(),
        measured,
        model,
        runs,
    })
}

/// The error table, one row per figure (with its unit and target), a column per cache mode:
/// measured, sim, error, the machine's noise on it and pass/miss.
pub fn table(c: &Check) -> String {
    let mut out = String::from("| figure | target | ");
    for r in &c.runs {
        out.push_str(&format!(
            "{} measured | {} sim | error | noise | verdict | ",
            r.cache.name(),
            r.cache.name()
        ));
    }
    out.push('\n');
    out.push_str(&"| --- ".repeat(2 + 5 * c.runs.len()));
    out.push_str("|\n");
    for key in FIGURES {
        let t = target(key).map_or("-".to_string(), |t| format!("±{:.0}%", 100.0 * t));
        out.push_str(&format!("| {key} ({}) | {t} | ", unit(key)));
        for r in &c.runs {
            let f = &r.figures[key];
            let e = r.errors[key].map_or("-".to_string(), |e| format!("{:+.1}%", 100.0 * e));
            let n = r
                .noise
                .get(key)
                .copied()
                .flatten()
                .map_or("-".to_string(), |n| format!("±{:.1}%", 100.0 * n));
            out.push_str(&format!(
                "{:.3} | {:.3} | {e} | {n} | {} | ",
                f.measured,
                f.model,
                verdict(key, r.errors[key])
            ));
        }
        out.push('\n');
    }
    out
}
