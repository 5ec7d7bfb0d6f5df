//! What one experiment produced — both cache modes' runs, their metrics and the cross-mode
//! checks — as the writers of this module read it. Running one is `crate::experiment`'s job.

use kvbench_cache_api::{CacheMode, Fault};

use super::sink::ModeFiles;
use crate::engine::{RunEnd, RunRecord};
use crate::metrics::timeline::Resolution;
use crate::metrics::RunMetrics;
use crate::scenario::Scenario;
use crate::shadow::ShadowReport;
use crate::workload::Workload;

pub struct ModeRun {
    /// The run's scalar outcome (both paths).
    pub end: RunEnd,
    /// Every stream, event and step: kept on the collect path only (`experiment::run_scenario`); `None`
    /// on the streaming path (`experiment::run_scenario_streaming`).
    pub record: Option<RunRecord>,
    pub metrics: RunMetrics,
    /// Times the planted fault took effect in this run (0 without one; the contiguous run never
    /// has one armed).
    pub fault_fired: u64,
    /// The shadow payload's findings, on `sim` unless it was switched off.
    pub shadow: Option<ShadowReport>,
    /// Wall seconds the backend spent in steps, where it measures them (under `--clock model`
    /// the clock did not advance by these).
    pub measured_step_s: Option<f64>,
    /// How the mode's rows come out in `memory.csv` and `trace.perfetto.json`.
    pub files: ModeFiles,
}

pub struct Experiment {
    pub scenario: Scenario,
    pub backend: &'static str,
    pub seed: u64,
    pub workload: Workload,
    pub kv_bytes_per_token: u64,
    pub kv_budget_bytes: u64,
    /// The managers both modes ran (`cache.manager` resolved).
    pub cache_manager: crate::scenario::CacheManager,
    /// Bytes one accounting slot stands for (each run's record carries it too).
    pub slot_bytes: u64,
    pub fault: Option<Fault>,
    /// Whether `sim` carried the shadow payload (false with `--no-shadow`; always false on other
    /// backends).
    pub shadow: bool,
    /// Paged first, then contiguous.
    pub runs: Vec<ModeRun>,
    /// On compute backends: the first stream whose greedy tokens differ between the modes.
    pub token_mismatch: Option<String>,
    /// The resolution the data files are written at.
    pub memory_resolution: Resolution,
    /// The request list's prefix-hit ceiling and offline optimum at the paged pool's capacity,
    /// or why the list cannot give them.
    pub prefix_bounds: Result<crate::metrics::prefix_bounds::PrefixBounds, String>,
    /// A hybrid run's request list's infinite-cache ceiling (the one bound that holds for it),
    /// where the list gives one; `None` on the summed managers, whose `prefix_bounds` has it.
    pub prefix_ceiling: Option<crate::metrics::prefix_bounds::PrefixCeiling>,
    /// What a served run (`kvbench serve`) adds; `None` for a batch run.
    pub served: Option<Served>,
}

/// A served run: one cache mode behind an HTTP server, its requests as clients sent them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Served {
    /// The address it listened on.
    pub address: String,
    /// Requests the engine took in.
    pub requests: u64,
    /// Requests answered with an error before reaching the engine (bad body, queue full,
    /// draining).
    pub refused: u64,
    /// Requests cancelled because their client went away or fell behind its stream.
    pub client_cancels: u64,
    /// How it stopped: `drained` (every request finished) or `cancelled` (some were cut).
    pub shutdown: &'static str,
}

impl Experiment {
    /// The managers, where the summary and the report name them: wherever they could have
    /// differed — a hybrid run, or a model whose layers keep tokens differently — and nowhere
    /// else, so the files of a model whose layers all keep every token read as they always did.
    pub fn recorded_manager(&self) -> Option<crate::scenario::CacheManager> {
        let differs = self
            .scenario
            .model_shape()
            .is_some_and(|m| crate::scenario::layers_keep_tokens_differently(&m));
        (differs || self.cache_manager == crate::scenario::CacheManager::Hybrid)
            .then_some(self.cache_manager)
    }

    /// Every check the run makes: invariants, reclamation, numerics, paged-vs-contiguous tokens.
    /// Empty when all passed.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.runs {
            let mode = r.end.mode.name();
            if let Some(v) = &r.end.violation {
                out.push(format!("{mode}: invariant violation: {v}"));
            }
            if !r.end.reclamation.ok {
                out.push(format!(
                    "{mode}: reclamation failed: {}",
                    r.end.reclamation.detail
                ));
            }
            if let Some(sh) = &r.shadow {
                if sh.violations > 0 {
                    out.push(format!(
                        "{mode}: shadow payload: {} bad reads; first: {}",
                        sh.violations,
                        sh.messages.first().map_or("", String::as_str)
                    ));
                }
            }
            if let Some(n) = r.end.numerics {
                if !n.ok {
                    out.push(format!(
                        "{mode}: numerics: max relative error {:.3e} > tolerance {:.1e}",
                        n.max_rel_err, n.tolerance
                    ));
                }
            }
        }
        if let Some(m) = &self.token_mismatch {
            out.push(format!("paged vs contiguous tokens differ: {m}"));
        }
        if let Some(f) = self.fault {
            if self.fault_fired() == 0 {
                out.push(format!(
                    "{} never fired: {}, so the run proves nothing",
                    f.name(),
                    f.precondition()
                ));
            }
        }
        out
    }

    /// Times the planted fault took effect, over both runs.
    pub fn fault_fired(&self) -> u64 {
        self.runs.iter().map(|r| r.fault_fired).sum()
    }

    pub fn run(&self, mode: CacheMode) -> Option<&ModeRun> {
        self.runs.iter().find(|r| r.end.mode == mode)
    }
}
