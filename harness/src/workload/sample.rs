//! Samplers built once from a scenario's distributions, then drawn from with a seeded RNG.

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, Exp, Gamma, LogNormal, Normal, Zipf};

use super::WorkloadError;
use crate::scenario::{self, ArrivalSpec, DelayDist, LengthDist, Scenario};

/// A length distribution with its clamps resolved: every draw lands in `lo..=hi`.
#[derive(Debug, Clone)]
pub struct LengthSampler {
    kind: LengthKind,
    lo: u32,
    hi: u32,
}

#[derive(Debug, Clone)]
enum LengthKind {
    Fixed(u32),
    Uniform(u32, u32),
    Normal(Normal<f64>),
    LogNormal(LogNormal<f64>),
    Zipf(Zipf<f64>, f64),
    Empirical(Vec<u32>),
}

fn dist_error(key: &str, e: impl std::fmt::Display) -> WorkloadError {
    WorkloadError::Distribution {
        key: key.to_string(),
        message: e.to_string(),
    }
}

impl LengthSampler {
    pub fn new(s: &Scenario, d: &LengthDist, key: &str) -> Result<LengthSampler, WorkloadError> {
        let range = scenario::length_range(s, d, key, s.cache.max_seq_len).map_err(|p| {
            WorkloadError::Distribution {
                key: p.key,
                message: p.message,
            }
        })?;
        let kind = match d {
            LengthDist::Fixed { value } => LengthKind::Fixed(*value),
            LengthDist::Uniform { min, max } => LengthKind::Uniform(*min, *max),
            LengthDist::Normal { mean, std, .. } => {
                LengthKind::Normal(Normal::new(*mean, *std).map_err(|e| dist_error(key, e))?)
            }
            LengthDist::Lognormal { median, sigma, .. } => LengthKind::LogNormal(
                LogNormal::new(median.ln(), *sigma).map_err(|e| dist_error(key, e))?,
            ),
            LengthDist::Zipf {
                n, s: exp, scale, ..
            } => LengthKind::Zipf(Zipf::new(*n, *exp).map_err(|e| dist_error(key, e))?, *scale),
            LengthDist::Empirical { csv, column, .. } => {
                let path = s.resolve_path(csv);
                let values = scenario::read_lengths(&path, column)
                    .map_err(|m| dist_error(&format!("{key}.csv"), m))?;
                LengthKind::Empirical(values)
            }
        };
        Ok(LengthSampler {
            kind,
            lo: range.lo,
            hi: range.hi,
        })
    }

    pub fn draw(&self, rng: &mut ChaCha20Rng) -> u32 {
        let raw: f64 = match &self.kind {
            LengthKind::Fixed(v) => *v as f64,
            LengthKind::Uniform(a, b) => rng.gen_range(*a..=*b) as f64,
            LengthKind::Normal(d) => d.sample(rng).round(),
            LengthKind::LogNormal(d) => d.sample(rng).round(),
            LengthKind::Zipf(d, scale) => (d.sample(rng) * scale).round(),
            LengthKind::Empirical(v) => v[rng.gen_range(0..v.len())] as f64,
        };
        clamp_round(raw, self.lo, self.hi)
    }

    pub fn range(&self) -> (u32, u32) {
        (self.lo, self.hi)
    }
}

fn clamp_round(x: f64, lo: u32, hi: u32) -> u32 {
    if x.is_nan() {
        return lo;
    }
    x.clamp(lo as f64, hi as f64) as u32
}

/// Delays in milliseconds.
#[derive(Debug, Clone)]
pub enum DelaySampler {
    Fixed(f64),
    Uniform(f64, f64),
    Exponential(Exp<f64>),
}

impl DelaySampler {
    pub fn new(d: &DelayDist, key: &str) -> Result<DelaySampler, WorkloadError> {
        Ok(match d {
            DelayDist::Fixed { ms } => DelaySampler::Fixed(*ms),
            DelayDist::Uniform { min_ms, max_ms } => DelaySampler::Uniform(*min_ms, *max_ms),
            DelayDist::Exponential { mean_ms } => {
                DelaySampler::Exponential(Exp::new(1.0 / mean_ms).map_err(|e| dist_error(key, e))?)
            }
        })
    }

    /// A delay in `[0, MAX_TIME_MS]`: an exponential's rare far tail saturates there rather than
    /// overflowing the clock it is added to.
    pub fn draw(&self, rng: &mut ChaCha20Rng) -> f64 {
        let ms = match self {
            DelaySampler::Fixed(ms) => *ms,
            DelaySampler::Uniform(a, b) if a < b => rng.gen_range(*a..*b),
            DelaySampler::Uniform(a, _) => *a,
            DelaySampler::Exponential(d) => d.sample(rng),
        };
        if ms.is_nan() {
            0.0
        } else {
            ms.clamp(0.0, super::seeded::MAX_TIME_MS)
        }
    }
}

/// Gaps between open-loop arrivals, in milliseconds.
#[derive(Debug, Clone)]
pub enum GapSampler {
    Exponential(Exp<f64>),
    Gamma(Gamma<f64>),
    Constant(f64),
}

impl GapSampler {
    /// `None` for arrivals that are not an open-loop process (burst, closed loop, trace).
    pub fn new(a: &ArrivalSpec) -> Result<Option<GapSampler>, WorkloadError> {
        let key = "traffic.arrival";
        Ok(match a {
            ArrivalSpec::Poisson { rate_per_s } => Some(GapSampler::Exponential(
                Exp::new(rate_per_s / 1000.0).map_err(|e| dist_error(key, e))?,
            )),
            ArrivalSpec::Gamma { rate_per_s, shape } => {
                // Mean gap 1000/rate ms; the shape sets the burstiness (CV = 1/sqrt(shape)).
                let scale = 1000.0 / rate_per_s / shape;
                Some(GapSampler::Gamma(
                    Gamma::new(*shape, scale).map_err(|e| dist_error(key, e))?,
                ))
            }
            ArrivalSpec::Constant { rate_per_s } => Some(GapSampler::Constant(1000.0 / rate_per_s)),
            _ => None,
        })
    }

    pub fn draw(&self, rng: &mut ChaCha20Rng) -> f64 {
        match self {
            GapSampler::Exponential(d) => d.sample(rng),
            GapSampler::Gamma(d) => d.sample(rng),
            GapSampler::Constant(g) => *g,
        }
    }
}
