//! One probe: one cache mode at one load on one seed, measured over its window and judged.

use kvbench_cache_api::CacheMode;
use serde::Serialize;

use super::load::{self, By};
use super::verdict::{self, AttainmentCheck, P99Check, Verdict};
use super::window;
use super::SweepError;
use crate::experiment::{self, RunOptions};
use crate::metrics::hist::LatencyHist;
use crate::metrics::{self, Dist};
use crate::scenario::Scenario;
use crate::workload;

/// The measured outcome of one probe.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// The load on the swept axis: requests per second (a trace's rate multiplier) or clients.
    pub load: f64,
    pub seed: u64,
    /// Requests issued (the scenario's, times the extension factor).
    pub requests: u64,
    /// 1, then 2, 4, … when the probe was rerun longer to resolve its verdict.
    pub request_factor: u32,
    pub workload_hash: String,
    pub window_s: f64,
    pub offered_rps: f64,
    pub achieved_rps: f64,
    pub throughput_tokens_per_s: f64,
    /// TTFT samples in the window.
    pub samples: u64,
    pub ttft: Option<P99Check>,
    pub itl: Option<P99Check>,
    pub attainment: AttainmentCheck,
    pub ttft_ms: Dist,
    pub itl_ms: Dist,
    pub verdict: Verdict,
    pub oversaturated: bool,
    /// Checks the run itself failed (invariants, reclamation): a sweep with any exits 1.
    pub check_failures: Vec<String>,
    #[serde(skip)]
    pub ttft_hist: LatencyHist,
    #[serde(skip)]
    pub itl_hist: LatencyHist,
}

impl Probe {
    /// The probe's rate on the rate axis of the result: the offered load when sweeping the rate,
    /// the achieved rate when sweeping clients.
    pub fn rate_rps(&self, by: By) -> f64 {
        match by {
            By::Rate => self.load,
            By::Concurrency => self.achieved_rps,
        }
    }
}

/// Run `mode` of `base` at `load` (× `request_factor` requests) on `opts.seed`.
pub fn run(
    base: &Scenario,
    by: By,
    load: f64,
    request_factor: u32,
    mode: CacheMode,
    opts: &RunOptions,
) -> Result<Probe, SweepError> {
    let s = load::at_load(base, by, load, request_factor)?;
    let setup = experiment::setup(&s, opts).map_err(SweepError::experiment)?;
    let work = workload::generate(&s, setup.seed)
        .map_err(|e| SweepError::experiment(experiment::ExperimentError::Workload(e)))?;
    let (run, _) =
        experiment::run_mode(&s, &setup, &work, opts, mode).map_err(SweepError::experiment)?;
    // The probe trims its record to the measurement window: the collect path (probes are
    // bounded runs).
    let Some(record) = run.record else {
        return Err(SweepError::Input(
            "internal: a probe's run kept no record".into(),
        ));
    };
    let mut check_failures = Vec::new();
    if let Some(v) = &record.end.violation {
        check_failures.push(format!("invariant violation: {v}"));
    }
    if !record.end.reclamation.ok {
        check_failures.push(format!(
            "reclamation failed: {}",
            record.end.reclamation.detail
        ));
    }
    if let Some(sh) = run.shadow.as_ref().filter(|sh| sh.violations > 0) {
        check_failures.push(format!(
            "shadow payload: {} bad reads; first: {}",
            sh.violations,
            sh.messages.first().map_or("", String::as_str)
        ));
    }
    let win = window::window(&record);
    let (rates, over, window_s) = match &win {
        Some(w) => (
            window::rates(&record, w),
            window::oversaturated(&record, w),
            w.span_s(),
        ),
        None => (
            window::Rates {
                offered_rps: 0.0,
                achieved_rps: 0.0,
                throughput_tokens_per_s: 0.0,
            },
            false,
            0.0,
        ),
    };
    let trimmed = match &win {
        Some(w) => window::trimmed(record, w),
        None => {
            let mut r = record;
            r.streams.clear();
            r
        }
    };
    let m = metrics::compute(&trimmed, &s.slo);
    let ttft = s
        .slo
        .ttft_p99_ms
        .map(|t| verdict::check_p99(&m.ttft_hist, t));
    let itl = s.slo.itl_p99_ms.map(|t| verdict::check_p99(&m.itl_hist, t));
    let attainment = verdict::check_attainment(m.good_requests, m.counts.total, s.slo.attainment);
    let v = match Verdict::all(
        ttft.iter()
            .chain(itl.iter())
            .map(|c| c.verdict)
            .chain([attainment.verdict]),
    ) {
        // A growing backlog would break the SLO given time: no pass until a longer run settles it.
        Verdict::Pass if over => Verdict::Unresolved,
        v => v,
    };
    Ok(Probe {
        load,
        seed: setup.seed,
        requests: work.requests.len() as u64,
        request_factor,
        workload_hash: work.workload_hash,
        window_s,
        offered_rps: rates.offered_rps,
        achieved_rps: rates.achieved_rps,
        throughput_tokens_per_s: rates.throughput_tokens_per_s,
        samples: m.counts.total,
        ttft,
        itl,
        attainment,
        ttft_ms: m.ttft_hist.dist(),
        itl_ms: m.itl_hist.dist(),
        verdict: v,
        oversaturated: over,
        check_failures,
        ttft_hist: m.ttft_hist,
        itl_hist: m.itl_hist,
    })
}
