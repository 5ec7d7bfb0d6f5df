//! `kvbench compare` and `kvbench gate`: two results folders (runs, suites or sweeps), each
//! metric's absolute and relative change with a 95% interval, and whether it is significant.
//!
//! **Interval of a change.** Each side states, per seed it ran, a bracket for each metric: a
//! sweep's per-seed `[highest passing, lowest failing]` (rate, throughput), a run's or suite's
//! per-seed value (a bracket of width zero). When both sides ran the same seeds — which the gate
//! requires, since it insists on the same workloads — the comparison is *paired*: per seed the
//! relative change lies in `[lo_B / hi_A − 1, hi_B / lo_A − 1]`, and the interval over seeds is
//! `[mean(low ends) − t·sd/√n, mean(high ends) + t·sd/√n]` (95%, Student t; with one seed, the
//! bracket itself). Otherwise it is interval arithmetic on each side's own 95% interval
//! (`[lo_B / hi_A − 1, hi_B / lo_A − 1]`), which covers the true ratio with at least 95%
//! probability and errs towards "not significant". A change is *significant* when its interval
//! excludes zero. A single run on a deterministic backend has a point for an interval: any change
//! is then a real change of that seed's figure.
//!
//! **The gate** (criterion's rule): a gated metric *regressed* when its relative change's
//! interval lies wholly beyond the threshold in the worse direction — for a higher-is-better
//! figure, its upper end is below −threshold; for a lower-is-better one, its lower end is above
//! +threshold. Gated: throughput and rate at target per cache mode (sweeps); throughput and the
//! p99 TTFT and inter-token gap at the scenario's fixed rate (runs, suites). Two folders that ran
//! different workloads (workload hash per scenario and seed) or different scenario definitions
//! (a sweep's definition hash, axis and SLO) are not comparable.

pub mod read;
pub mod write;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use read::{read, Folder, Kind};

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Format { path: PathBuf, message: String },
    /// The two sides are not the same experiment.
    #[error("not comparable: {0}")]
    Mismatch(String),
}

impl CompareError {
    fn io(path: &Path, source: std::io::Error) -> CompareError {
        CompareError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
}

/// One figure of one side, with its own 95% interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub scenario: String,
    pub cache: String,
    pub name: String,
    pub better: Better,
    pub gated: bool,
    /// `None`: the side has no figure (a sweep where nothing passed).
    pub value: Option<f64>,
    pub lo: f64,
    pub hi: f64,
    /// Samples behind it (seeds).
    pub n: usize,
    /// Seed → this seed's bracket `[low, high]` (a value twice for a run or suite row).
    pub per_seed: BTreeMap<u64, [f64; 2]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Better,
    Worse,
    Unchanged,
}

/// One metric on both sides.
#[derive(Debug, Clone)]
pub struct Change {
    pub a: Metric,
    pub b: Metric,
    pub abs: Option<f64>,
    /// Relative change `B / A − 1` and its interval.
    pub rel: Option<f64>,
    pub rel_ci: Option<[f64; 2]>,
    pub significant: bool,
    pub direction: Direction,
}

/// The relative change's 95% interval (module doc): paired over seeds when both sides have the
/// same seeds, else interval arithmetic; `None` when A's figures touch zero.
pub fn rel_interval(a: &Metric, b: &Metric) -> Option<[f64; 2]> {
    let ratio = |a: [f64; 2], b: [f64; 2]| -> Option<[f64; 2]> {
        (a[0] > 0.0 && a[1] > 0.0 && b[0].is_finite() && b[1].is_finite())
            .then(|| [b[0] / a[1] - 1.0, b[1] / a[0] - 1.0])
    };
    let paired = !a.per_seed.is_empty() && a.per_seed.keys().eq(b.per_seed.keys());
    if paired {
        let per: Option<Vec<[f64; 2]>> = a
            .per_seed
            .iter()
            .map(|(seed, x)| ratio(*x, b.per_seed[seed]))
            .collect();
        let per = per?;
        let lows: Vec<f64> = per.iter().map(|r| r[0]).collect();
        let highs: Vec<f64> = per.iter().map(|r| r[1]).collect();
        return Some(crate::sweep::aggregate::signed_bracket_interval(
            &lows, &highs,
        ));
    }
    ratio([a.lo, a.hi], [b.lo, b.hi])
}

fn change(a: &Metric, b: &Metric) -> Change {
    let (abs, rel, rel_ci) = match (a.value, b.value) {
        (Some(x), Some(y)) => (
            Some(y - x),
            (x != 0.0).then(|| y / x - 1.0),
            rel_interval(a, b),
        ),
        _ => (None, None, None),
    };
    let significant = match rel_ci {
        Some([lo, hi]) => lo > 0.0 || hi < 0.0,
        // A figure that exists on one side only.
        None => a.value.is_some() != b.value.is_some(),
    };
    let up = match (a.value, b.value) {
        (Some(x), Some(y)) => y > x,
        (None, Some(_)) => true,
        _ => false,
    };
    let direction = if !significant {
        Direction::Unchanged
    } else if up == (a.better == Better::Higher) {
        Direction::Better
    } else {
        Direction::Worse
    };
    Change {
        a: a.clone(),
        b: b.clone(),
        abs,
        rel,
        rel_ci,
        significant,
        direction,
    }
}

/// The two folders and every metric both have, in A's order.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub a: Folder,
    pub b: Folder,
    pub changes: Vec<Change>,
    /// Why the two are not the same experiment (empty when they are).
    pub mismatches: Vec<String>,
}

fn mismatches(a: &Folder, b: &Folder) -> Vec<String> {
    let mut out = Vec::new();
    if a.kind != b.kind {
        out.push(format!(
            "{} is a {}, {} is a {}",
            a.path.display(),
            a.kind.name(),
            b.path.display(),
            b.kind.name()
        ));
    }
    let (wa, wb) = (&a.identity.workloads, &b.identity.workloads);
    for (key, h) in wa {
        match wb.get(key) {
            Some(g) if g != h => out.push(format!(
                "{} seed {}: workload hash {} vs {}",
                key.0,
                key.1,
                short(h),
                short(g)
            )),
            None => out.push(format!("{} seed {}: only in the baseline", key.0, key.1)),
            _ => {}
        }
    }
    for key in wb.keys().filter(|k| !wa.contains_key(*k)) {
        out.push(format!(
            "{} seed {}: only in the current side",
            key.0, key.1
        ));
    }
    for (map_a, map_b, what) in [
        (
            &a.identity.definitions,
            &b.identity.definitions,
            "scenario definition",
        ),
        (&a.identity.axis, &b.identity.axis, "sweep axis and SLO"),
    ] {
        for (s, d) in map_a {
            if map_b.get(s).is_some_and(|e| e != d) {
                out.push(format!("{s}: {what} differs"));
            }
        }
    }
    out
}

fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

pub fn compare(a_dir: &Path, b_dir: &Path) -> Result<Comparison, CompareError> {
    let (a, b) = (read(a_dir)?, read(b_dir)?);
    let mut changes = Vec::new();
    for ma in &a.metrics {
        if let Some(mb) = b
            .metrics
            .iter()
            .find(|m| m.scenario == ma.scenario && m.cache == ma.cache && m.name == ma.name)
        {
            changes.push(change(ma, mb));
        }
    }
    let mismatches = mismatches(&a, &b);
    Ok(Comparison {
        a,
        b,
        changes,
        mismatches,
    })
}

/// The gate's judgment of one gated metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateVerdict {
    Ok,
    Regressed,
}

/// Criterion's rule at `max_regression` (a fraction; module doc).
pub fn gate_verdict(c: &Change, max_regression: f64) -> GateVerdict {
    let regressed = match (c.a.value, c.b.value, c.rel_ci) {
        // The current side no longer meets the target at any load the baseline did.
        (Some(_), None, _) => true,
        (_, _, Some([lo, hi])) => match c.a.better {
            Better::Higher => hi < -max_regression,
            Better::Lower => lo > max_regression,
        },
        _ => false,
    };
    if regressed {
        GateVerdict::Regressed
    } else {
        GateVerdict::Ok
    }
}
