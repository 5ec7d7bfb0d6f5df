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
//!
//! **What the gate refuses** (exit 2, never a pass): it compares only what both sides hold, from
//! one consistent source. [`Comparison::refusals`] lists, each as a sentence naming the folder,
//! file and entry: a figure (cache mode, metric) one side has and the other lacks; a figure that
//! is not a finite number where the other side has one (a sweep's `null` rate is not this: it
//! says no load passed); anything a folder holds twice; a headline that does not follow from its
//! own per-seed figures; a run whose own checks failed; two backends, or two device profiles for
//! one scenario (for runs against an endpoint, which have none: two served models); cells of one suite made by different kvbench revisions; different workloads or
//! definitions. The two sides' revisions differ by design: comparing builds is the gate's job.
//!
//! **No interval.** Two single runs (one seed, a point each) have no interval: the change is
//! stated, never called significant ([`Change::interval`]).

pub mod read;
pub mod strict_json;
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
    /// Whether the relative change has an interval of some width: two single runs have only
    /// their points, and a change between points is never called significant.
    pub interval: bool,
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
        return Some(crate::stats::signed_bracket_interval(&lows, &highs));
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
    let interval = rel_ci.is_some_and(|[lo, hi]| lo < hi);
    let significant = match rel_ci {
        Some([lo, hi]) => interval && (lo > 0.0 || hi < 0.0),
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
        interval,
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
    /// Figures only one side holds: `('A' or 'B', the metric)`.
    pub unmatched: Vec<(char, Metric)>,
    /// Why the gate cannot judge this comparison (module doc), each a sentence; empty when it can.
    pub refusals: Vec<String>,
}

fn mismatches(a: &Folder, b: &Folder) -> Vec<String> {
    let mut out = Vec::new();
    if a.backend != b.backend {
        out.push(format!(
            "{} ran on backend {}, {} on backend {}",
            a.path.display(),
            a.backend,
            b.path.display(),
            b.backend
        ));
    }
    let scenarios: std::collections::BTreeSet<&String> = a
        .metrics
        .iter()
        .chain(&b.metrics)
        .map(|m| &m.scenario)
        .collect();
    for s in scenarios {
        let models = (a.identity.models.get(s), b.identity.models.get(s));
        if models != (None, None) {
            // Endpoint runs: the served model is their identity (another backend is refused
            // above).
            if let (Some(x), Some(y)) = models {
                if x != y {
                    out.push(format!(
                        "{s}: {} measured model {x:?} at its endpoint, {} model {y:?}: runs of two models are not comparable",
                        a.path.display(),
                        b.path.display()
                    ));
                }
            }
            continue;
        }
        match (a.identity.devices.get(s), b.identity.devices.get(s)) {
            (Some(x), Some(y)) if x != y => out.push(format!(
                "{s}: {} priced with device profile {x}, {} with {y}",
                a.path.display(),
                b.path.display()
            )),
            (Some(_), Some(_)) => {}
            (None, None) => out.push(format!(
                "{s}: neither {} nor {} records its device profile (written by an older kvbench: run them again)",
                a.path.display(),
                b.path.display()
            )),
            (x, y) => {
                for (dir, missing) in [(&a.path, x.is_none()), (&b.path, y.is_none())] {
                    if missing {
                        out.push(format!(
                            "{s}: {} does not record its device profile (written by an older kvbench: run it again)",
                            dir.display()
                        ));
                    }
                }
            }
        }
    }
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

fn same(x: &Metric, y: &Metric) -> bool {
    x.scenario == y.scenario && x.cache == y.cache && x.name == y.name
}

/// Figures one side holds and the other does not, one sentence per (scenario, cache mode) when a
/// whole mode is missing, else per metric.
fn coverage(a: &Folder, b: &Folder, unmatched: &[(char, Metric)]) -> Vec<String> {
    let mut out = Vec::new();
    for (side, has, lacks) in [('A', a, b), ('B', b, a)] {
        let mut said = std::collections::BTreeSet::new();
        for (_, m) in unmatched.iter().filter(|(s, _)| *s == side) {
            let mode_missing = !lacks
                .metrics
                .iter()
                .any(|x| x.scenario == m.scenario && x.cache == m.cache);
            if mode_missing {
                if said.insert((m.scenario.clone(), m.cache.clone())) {
                    out.push(format!(
                        "{} {}: cache mode {} is in {} only, {} has none",
                        m.scenario,
                        m.cache,
                        m.cache,
                        has.path.display(),
                        lacks.path.display()
                    ));
                }
            } else {
                out.push(format!(
                    "{} {} {}: in {} only",
                    m.scenario,
                    m.cache,
                    m.name,
                    has.path.display()
                ));
            }
        }
    }
    out
}

/// A figure one side has and the other cannot state (runs and suites: `null`, NaN, not a
/// number; a sweep's `null` means no load passed and is a figure of its own).
fn non_finite(a: &Folder, b: &Folder, changes: &[Change]) -> Vec<String> {
    let mut out = Vec::new();
    for ch in changes {
        for (has, lacks, m_has, m_lacks) in [(a, b, &ch.a, &ch.b), (b, a, &ch.b, &ch.a)] {
            if lacks.kind == Kind::Sweep {
                continue;
            }
            if let (Some(x), None) = (m_has.value, m_lacks.value) {
                out.push(format!(
                    "{} {} {}: {} has no finite figure (null, NaN or missing) where {} has {x}",
                    ch.a.scenario,
                    ch.a.cache,
                    ch.a.name,
                    lacks.path.display(),
                    has.path.display()
                ));
            }
        }
    }
    out
}

pub fn compare(a_dir: &Path, b_dir: &Path) -> Result<Comparison, CompareError> {
    let (a, b) = (read(a_dir)?, read(b_dir)?);
    let mut changes = Vec::new();
    let mut unmatched = Vec::new();
    for ma in &a.metrics {
        match b.metrics.iter().find(|m| same(m, ma)) {
            Some(mb) => changes.push(change(ma, mb)),
            None => unmatched.push(('A', ma.clone())),
        }
    }
    for mb in &b.metrics {
        if !a.metrics.iter().any(|m| same(m, mb)) {
            unmatched.push(('B', mb.clone()));
        }
    }
    let mut refusals = mismatches(&a, &b);
    refusals.extend(a.problems.iter().cloned());
    refusals.extend(b.problems.iter().cloned());
    refusals.extend(coverage(&a, &b, &unmatched));
    refusals.extend(non_finite(&a, &b, &changes));
    Ok(Comparison {
        a,
        b,
        changes,
        unmatched,
        refusals,
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
