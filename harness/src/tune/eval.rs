//! The evaluator that measures: a configuration is the scenario file loaded again with its
//! `--set` overrides, probed and searched by the sweep's own functions (`sweep::search`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use kvbench_cache_api::CacheMode;

use super::search::{Bracket, Evaluator, Searched};
use super::space::{Config, Space};
use crate::experiment::RunOptions;
use crate::scenario::{ArrivalSpec, Scenario};
use crate::sweep::search::{self as sweep_search, SearchConfig};
use crate::sweep::verdict::Verdict;
use crate::sweep::{self, load, By, SweepError};

pub struct SweepEvaluator<'a> {
    pub path: PathBuf,
    /// The command line's own `--set` overrides, applied before a configuration's.
    pub base_overrides: Vec<String>,
    pub space: &'a Space,
    pub search: SearchConfig,
    pub opts: RunOptions,
    pub base_load: f64,
    scenarios: Mutex<BTreeMap<Config, Result<Scenario, String>>>,
    failures: Mutex<Vec<String>>,
}

impl<'a> SweepEvaluator<'a> {
    pub fn new(
        path: PathBuf,
        base_overrides: Vec<String>,
        space: &'a Space,
        search: SearchConfig,
        opts: RunOptions,
        base: &Scenario,
    ) -> Result<SweepEvaluator<'a>, SweepError> {
        sweep::check(base, By::Rate, search.max_extend)?;
        let base_load = load::base_load(base, By::Rate)?;
        Ok(SweepEvaluator {
            path,
            base_overrides,
            space,
            search,
            opts,
            base_load,
            scenarios: Mutex::new(BTreeMap::new()),
            failures: Mutex::new(Vec::new()),
        })
    }

    /// The run checks that failed in any probe (invariants, reclamation, shadow payload).
    pub fn check_failures(&self) -> Vec<String> {
        self.failures.lock().map(|f| f.clone()).unwrap_or_default()
    }

    /// The scenario with `c` applied, or why it is refused.
    fn scenario(&self, c: &Config) -> Result<Scenario, String> {
        if let Some(s) = self.scenarios.lock().ok().and_then(|m| m.get(c).cloned()) {
            return s;
        }
        let mut overrides = self.base_overrides.clone();
        overrides.extend(self.space.overrides(c));
        let s = crate::scenario::load(&self.path, &overrides)
            .map_err(|e| e.to_string())
            .and_then(|s| {
                sweep::check(&s, By::Rate, self.search.max_extend).map_err(|e| e.to_string())?;
                Ok(s)
            });
        if let Ok(mut m) = self.scenarios.lock() {
            m.insert(c.clone(), s.clone());
        }
        s
    }

    /// The run options with the workload seed of one of the search's seeds (as `sweep` sets it).
    fn seeded(&self, seed: u64) -> RunOptions {
        RunOptions {
            seed: Some(seed),
            ..self.opts.clone()
        }
    }

    fn note(&self, c: &Config, mode: CacheMode, probes: &[sweep::probe::Probe]) {
        let set = self.space.set_line(c);
        let mut failed = Vec::new();
        for p in probes {
            for f in &p.check_failures {
                failed.push(format!("{} [{set}] load {}: {f}", mode.name(), p.load));
            }
        }
        if !failed.is_empty() {
            if let Ok(mut all) = self.failures.lock() {
                all.extend(failed);
            }
        }
    }
}

impl Evaluator for SweepEvaluator<'_> {
    type Error = SweepError;

    fn refusal(&self, c: &Config) -> Option<String> {
        self.scenario(c).err()
    }

    fn base_load(&self) -> f64 {
        self.base_load
    }

    fn probe(&self, c: &Config, mode: CacheMode, load: f64, seed: u64) -> Result<bool, SweepError> {
        let s = self.scenario(c).map_err(SweepError::Input)?;
        let p = sweep_search::resolved(&s, &self.search, load, mode, &self.seeded(seed))?;
        self.note(c, mode, std::slice::from_ref(&p));
        Ok(p.verdict == Verdict::Pass)
    }

    fn search(
        &self,
        c: &Config,
        mode: CacheMode,
        start: f64,
        seed: u64,
    ) -> Result<Searched, SweepError> {
        let s = self.scenario(c).map_err(SweepError::Input)?;
        // The sweep searches from a scenario's own load: give it `start`. A trace's load is a
        // multiplier of its recorded rate, so the rebased search's loads are relative to `start`.
        let rebased = load::at_load(&s, By::Rate, start, 1)?;
        let scale = match s.traffic.arrival {
            ArrivalSpec::Trace(_) => start,
            _ => 1.0,
        };
        let r = sweep_search::search(&rebased, &self.search, mode, &self.seeded(seed))?;
        self.note(c, mode, &r.probes);
        Ok(Searched {
            bracket: Bracket {
                pass: r.pass_probe().map(|p| p.load * scale),
                fail: r.fail_probe().map(|p| p.load * scale),
            },
            probes: u32::try_from(r.probes.len()).unwrap_or(u32::MAX),
            capped: r.capped,
        })
    }
}
