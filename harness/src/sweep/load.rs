//! A scenario at a given load: the open-loop arrival rate (`--by rate`) or the number of
//! closed-loop clients (`--by concurrency`), with the arrival shape kept, and optionally more
//! requests (a probe that could not be resolved runs longer).
//!
//! Scaling a rate keeps the shape: the workload draws each gap from its own ChaCha20 stream as a
//! scaled unit draw, so a Poisson or gamma process at twice the rate is the same process with
//! every gap halved, and every request keeps its lengths (those come from other streams). A trace
//! keeps its own pattern and is time-scaled: load `x` is `x` times the trace's recorded rate
//! (`time_scale` divided by `x`).

use serde::Serialize;

use super::SweepError;
use crate::scenario::{ArrivalSpec, Scenario};

/// What a sweep scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The open-loop arrival rate (requests per second; a trace's rate multiplier).
    Rate,
    /// The number of closed-loop clients.
    Concurrency,
}

impl By {
    pub fn name(self) -> &'static str {
        match self {
            By::Rate => "rate",
            By::Concurrency => "concurrency",
        }
    }
}

/// The scenario's own load on the swept axis: where the search starts. Refuses arrival kinds the
/// axis cannot scale, naming the key.
pub fn base_load(s: &Scenario, by: By) -> Result<f64, SweepError> {
    let key = "traffic.arrival.kind";
    match (&s.traffic.arrival, by) {
        (ArrivalSpec::Poisson { rate_per_s }, By::Rate)
        | (ArrivalSpec::Gamma { rate_per_s, .. }, By::Rate)
        | (ArrivalSpec::Constant { rate_per_s }, By::Rate) => Ok(*rate_per_s),
        (ArrivalSpec::Trace { .. }, By::Rate) => Ok(1.0),
        (ArrivalSpec::ClosedLoop { clients, .. }, By::Concurrency) => Ok(f64::from(*clients)),
        (ArrivalSpec::ClosedLoop { .. }, By::Rate) => Err(SweepError::input(
            s,
            key,
            "closed-loop arrivals have no rate to scale; use --by concurrency",
        )),
        (ArrivalSpec::Burst, _) => Err(SweepError::input(
            s,
            key,
            "burst arrivals have no rate or clients to scale",
        )),
        (_, By::Concurrency) => Err(SweepError::input(
            s,
            key,
            "--by concurrency needs closed_loop arrivals; use --by rate for open-loop traffic",
        )),
    }
}

/// `base` at `load` on the `by` axis, with `request_factor` times its requests (or duration).
pub fn at_load(
    base: &Scenario,
    by: By,
    load: f64,
    request_factor: u32,
) -> Result<Scenario, SweepError> {
    let mut s = base.clone();
    match (&mut s.traffic.arrival, by) {
        (ArrivalSpec::Poisson { rate_per_s }, By::Rate)
        | (ArrivalSpec::Gamma { rate_per_s, .. }, By::Rate)
        | (ArrivalSpec::Constant { rate_per_s }, By::Rate) => *rate_per_s = load,
        (ArrivalSpec::Trace(tr), By::Rate) => tr.time_scale /= load,
        (ArrivalSpec::ClosedLoop { clients, .. }, By::Concurrency) => {
            *clients = load.round().clamp(1.0, f64::from(u32::MAX)) as u32;
        }
        _ => {
            base_load(base, by)?;
        }
    }
    if request_factor > 1 {
        if let Some(n) = s.traffic.requests {
            s.traffic.requests = Some(n.checked_mul(request_factor).ok_or_else(|| {
                SweepError::input(
                    base,
                    "traffic.requests",
                    "too many requests to extend a probe",
                )
            })?);
        }
        if let Some(d) = s.traffic.duration_s {
            s.traffic.duration_s = Some(d * f64::from(request_factor));
        }
    }
    Ok(s)
}
