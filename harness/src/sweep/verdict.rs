//! One probe's verdict against the scenario's `[slo]`, statistically resolved.
//!
//! - **p99 targets** (`ttft_p99_ms`, `itl_p99_ms`): the 95% distribution-free interval of the p99
//!   (binomial order statistics over the window's samples). *Pass* when its upper end is within
//!   the target **and** the sample meets MLPerf's early-stopping floor for a p99 claim at 99%
//!   confidence given the samples over the target; *fail* when its lower end is beyond the
//!   target; otherwise *unresolved*.
//! - **attainment** (share of the window's requests that completed and met every per-request
//!   target): the 95% Wilson interval. *Pass* when its lower end reaches `slo.attainment`, *fail*
//!   when its upper end is below it.
//!
//! A probe passes when every stated criterion passes and fails when any fails.

use serde::Serialize;

use crate::metrics::hist::LatencyHist;
use crate::stats;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    Unresolved,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Unresolved => "unresolved",
        }
    }

    /// Every criterion passes → pass; any fails → fail; else unresolved.
    pub fn all(vs: impl IntoIterator<Item = Verdict>) -> Verdict {
        let mut out = Verdict::Pass;
        for v in vs {
            match v {
                Verdict::Fail => return Verdict::Fail,
                Verdict::Unresolved => out = Verdict::Unresolved,
                Verdict::Pass => {}
            }
        }
        out
    }
}

/// A p99 with its interval and verdict against a target.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct P99Check {
    pub p99_ms: f64,
    /// `[low, high]`; `null` on a side the sample is too small to bound.
    pub ci_ms: [Option<f64>; 2],
    pub target_ms: f64,
    pub samples: u64,
    pub over_target: u64,
    /// Fewest samples MLPerf's early stopping asks for with `over_target` violations.
    pub floor: u64,
    pub verdict: Verdict,
}

pub fn check_p99(h: &LatencyHist, target_ms: f64) -> P99Check {
    let n = h.count();
    let ms = |ns: u64| ns as f64 / 1e6;
    let r = stats::quantile_rank_interval(n, stats::P99, stats::CONFIDENCE);
    let lo = r.lo_rank.map(|k| ms(h.value_at_rank_ns(k)));
    let hi = r.hi_rank.map(|k| ms(h.value_at_rank_ns(k)));
    let target_ns = (target_ms * 1e6).floor().clamp(0.0, u64::MAX as f64) as u64;
    let over = h.count_above_ns(target_ns);
    let floor = stats::p99_claim_floor(over);
    let verdict = match (lo, hi) {
        (Some(lo), _) if lo > target_ms => Verdict::Fail,
        (_, Some(hi)) if hi <= target_ms && n >= floor => Verdict::Pass,
        _ => Verdict::Unresolved,
    };
    P99Check {
        p99_ms: if n > 0 {
            ms(h.quantile_ns(stats::P99))
        } else {
            0.0
        },
        ci_ms: [lo, hi],
        target_ms,
        samples: n,
        over_target: over,
        floor,
        verdict,
    }
}

/// SLO attainment with its Wilson interval and verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AttainmentCheck {
    pub attainment: f64,
    pub ci: [f64; 2],
    pub target: f64,
    pub good: u64,
    pub total: u64,
    pub verdict: Verdict,
}

pub fn check_attainment(good: u64, total: u64, target: f64) -> AttainmentCheck {
    let (lo, hi) = stats::wilson_interval(good, total, stats::CONFIDENCE);
    let verdict = if total > 0 && lo >= target {
        Verdict::Pass
    } else if total > 0 && hi < target {
        Verdict::Fail
    } else {
        Verdict::Unresolved
    };
    AttainmentCheck {
        attainment: if total > 0 {
            good as f64 / total as f64
        } else {
            0.0
        },
        ci: [lo, hi],
        target,
        good,
        total,
        verdict,
    }
}
