//! The search for the highest load at which the SLO holds, for one cache mode on one seed.
//!
//! From the scenario's own load: double while probes pass (or halve while they do not), then
//! bisect between the highest passing and the lowest non-passing load until they are within
//! `precision` of each other (relative). A probe whose verdict is unresolved is rerun with twice
//! the requests, up to `max_extend` times the scenario's; one still unresolved then is reported
//! as such and bounds the search from above like a failure, so the rate at target is always a
//! load that was shown to pass.

use kvbench_cache_api::CacheMode;

use super::load::{self, By};
use super::probe::{self, Probe};
use super::verdict::Verdict;
use super::SweepError;
use crate::experiment::RunOptions;
use crate::scenario::Scenario;

/// How far the doubling (or halving) phase may go from the scenario's load: 2^16 either way.
pub const MAX_DOUBLINGS: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchConfig {
    pub by: By,
    /// Relative width at which bisection stops (0.02 = 2%).
    pub precision: f64,
    /// Largest request factor an unresolved probe is rerun with (1 = never rerun).
    pub max_extend: u32,
}

/// Every probe of one search, in the order run, and where the search ended.
#[derive(Debug, Clone)]
pub struct SeedSearch {
    pub mode: CacheMode,
    pub seed: u64,
    /// The host-tier capacity this paged search ran at, as the scenario writes it, when the
    /// scenario lists several (each its own search); `None` otherwise.
    pub host_tier: Option<String>,
    pub probes: Vec<Probe>,
    /// Index of the highest passing probe.
    pub pass: Option<usize>,
    /// Index of the lowest non-passing probe above it.
    pub fail: Option<usize>,
    /// The doubling phase hit its limit without a failure (the rate at target is a lower bound).
    pub capped: bool,
}

impl SeedSearch {
    pub fn pass_probe(&self) -> Option<&Probe> {
        self.pass.map(|i| &self.probes[i])
    }
    pub fn fail_probe(&self) -> Option<&Probe> {
        self.fail.map(|i| &self.probes[i])
    }
}

/// Run a probe, rerunning it longer while unresolved (up to the stated cap).
pub fn resolved(
    base: &Scenario,
    cfg: &SearchConfig,
    load: f64,
    mode: CacheMode,
    opts: &RunOptions,
) -> Result<Probe, SweepError> {
    let mut factor = 1u32;
    loop {
        let p = probe::run(base, cfg.by, load, factor, mode, opts)?;
        match factor.checked_mul(2) {
            Some(next) if p.verdict == Verdict::Unresolved && next <= cfg.max_extend => {
                factor = next
            }
            _ => return Ok(p),
        }
    }
}

fn snap(by: By, load: f64) -> f64 {
    match by {
        By::Rate => load,
        By::Concurrency => load.floor().max(1.0),
    }
}

/// Search `mode` of `base` on seed `opts.seed`.
pub fn search(
    base: &Scenario,
    cfg: &SearchConfig,
    mode: CacheMode,
    opts: &RunOptions,
) -> Result<SeedSearch, SweepError> {
    let l0 = snap(cfg.by, load::base_load(base, cfg.by)?);
    let span = f64::from(1u32 << MAX_DOUBLINGS);
    let mut probes: Vec<Probe> = Vec::new();
    let run = |load: f64, probes: &mut Vec<Probe>| -> Result<(usize, bool), SweepError> {
        let p = resolved(base, cfg, load, mode, opts)?;
        let ok = p.verdict == Verdict::Pass;
        probes.push(p);
        Ok((probes.len() - 1, ok))
    };
    let (mut pass, mut fail, mut capped) = (None, None, false);
    let (i0, ok0) = run(l0, &mut probes)?;
    if ok0 {
        pass = Some(i0);
        let mut lo = l0;
        loop {
            let next = snap(cfg.by, lo * 2.0);
            if next > l0 * span {
                capped = true;
                break;
            }
            let (i, ok) = run(next, &mut probes)?;
            if ok {
                (pass, lo) = (Some(i), next);
            } else {
                fail = Some(i);
                break;
            }
        }
    } else {
        fail = Some(i0);
        let mut hi = l0;
        loop {
            let next = snap(cfg.by, hi / 2.0);
            if next < l0 / span || next >= hi {
                break;
            }
            let (i, ok) = run(next, &mut probes)?;
            if ok {
                pass = Some(i);
                break;
            }
            (fail, hi) = (Some(i), next);
        }
    }
    while let (Some(p), Some(f)) = (pass, fail) {
        let (lo, hi) = (probes[p].load, probes[f].load);
        if (hi - lo) <= cfg.precision * lo {
            break;
        }
        let mid = snap(cfg.by, (lo + hi) / 2.0);
        if mid <= lo || mid >= hi {
            break;
        }
        let (i, ok) = run(mid, &mut probes)?;
        if ok {
            pass = Some(i);
        } else {
            fail = Some(i);
        }
    }
    Ok(SeedSearch {
        mode,
        seed: opts.seed.unwrap_or(base.seed),
        host_tier: None,
        probes,
        pass,
        fail,
        capped,
    })
}
