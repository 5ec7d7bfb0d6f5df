//! (scenario, seed) → request list.
//!
//! Each aspect of a request draws from its own ChaCha20 stream of the same seed, so that changing
//! one knob (say, the cancellation share) leaves the arrivals and token ids of the others as they
//! were: two scenarios that differ in one setting differ in one thing.

use std::collections::BTreeMap;

use rand::Rng;
use rand_chacha::ChaCha20Rng;

use super::hash::workload_hash;
use super::sample::{DelaySampler, GapSampler, LengthSampler};
use super::seeded::{rng, MAX_TIME_MS};
use super::types::{CancelPoint, ClosedLoop, Request, Workload};
use super::WorkloadError;
use crate::scenario::{ArrivalSpec, CancelWhen, Scenario};

/// Most requests a duration-based workload may produce; beyond this a typo in a rate is likelier
/// than an intent. Load refuses the expected count past it; this bounds the draw itself.
pub const MAX_REQUESTS: usize = crate::scenario::ranges::MAX_REQUESTS as usize;

mod stream {
    pub const ARRIVALS: u64 = 0;
    pub const TENANTS: u64 = 1;
    pub const PREFIX_CHOICE: u64 = 2;
    pub const PROMPT_LENGTHS: u64 = 3;
    pub const PROMPT_TOKENS: u64 = 4;
    pub const OUTPUT_LENGTHS: u64 = 5;
    pub const SAMPLING: u64 = 6;
    pub const CANCELLATION: u64 = 7;
    /// Group g's prefix ids come from stream `PREFIX_IDS + g`.
    pub const PREFIX_IDS: u64 = 1 << 32;
}

/// The token ids of shared-prefix group `group`: a fixed function of (seed, group, length,
/// vocab), identical for every tenant; the cache's reuse scope decides who may share them.
pub fn prefix_tokens(seed: u64, group: u32, len: u32, vocab: u32) -> Vec<u32> {
    let mut r = rng(seed, stream::PREFIX_IDS + group as u64);
    (0..len).map(|_| r.gen_range(0..vocab)).collect()
}

/// Generates the request list. `seed` is usually `scenario.seed`; it is a parameter so sweeps
/// can vary it without editing the scenario.
pub fn generate(scenario: &Scenario, seed: u64) -> Result<Workload, WorkloadError> {
    generate_unplaced(scenario, seed).map_err(|e| place(scenario, e))
}

/// A problem with a key, placed in the scenario's file (`FILE:LINE:COL: KEY`) when it has one.
fn place(scenario: &Scenario, e: WorkloadError) -> WorkloadError {
    let (key, message) = match e {
        WorkloadError::Distribution { key, message } => (key, message),
        e @ WorkloadError::TooMany { .. } => ("traffic.duration_s".to_string(), e.to_string()),
        other => return other,
    };
    WorkloadError::Scenario(crate::scenario::ScenarioError::Invalid(vec![
        crate::scenario::locate_in_source(scenario.source.as_deref(), &key, message),
    ]))
}

fn generate_unplaced(scenario: &Scenario, seed: u64) -> Result<Workload, WorkloadError> {
    scenario.validate().map_err(WorkloadError::Scenario)?;
    let t = &scenario.traffic;
    let shape = scenario
        .model_shape()
        .ok_or_else(|| WorkloadError::Distribution {
            key: "model".into(),
            message: "no model shape".into(),
        })?;
    let vocab = shape.vocab;
    if let ArrivalSpec::Trace(spec) = &t.arrival {
        return super::trace_workload(scenario, spec, seed, vocab);
    }
    let (Some(prompt_dist), Some(output_dist)) = (&t.prompt_tokens, &t.output_tokens) else {
        return Err(WorkloadError::Distribution {
            key: "traffic.prompt_tokens".into(),
            message: "required (only a trace gives its own lengths)".into(),
        });
    };
    let msl = scenario.cache.max_seq_len;

    let arrivals = arrival_times(scenario, seed)?;
    let n = arrivals.len();

    let prompt_len = LengthSampler::new(scenario, prompt_dist, "traffic.prompt_tokens")?;
    let output_len = LengthSampler::new(scenario, output_dist, "traffic.output_tokens")?;
    let cancel = match &t.cancellation {
        Some(c) => Some((
            c,
            c.delay
                .as_ref()
                .map(|d| DelaySampler::new(d, "traffic.cancellation.delay"))
                .transpose()?,
            c.after_tokens
                .as_ref()
                .map(|d| LengthSampler::new(scenario, d, "traffic.cancellation.after_tokens"))
                .transpose()?,
        )),
        None => None,
    };
    let tenants = Tenants::new(scenario);
    // Built on first use: ten million groups drawn by a hundred requests cost a hundred.
    let mut prefixes: BTreeMap<u32, Vec<u32>> = BTreeMap::new();

    let mut r_tenant = rng(seed, stream::TENANTS);
    let mut r_prefix = rng(seed, stream::PREFIX_CHOICE);
    let mut r_plen = rng(seed, stream::PROMPT_LENGTHS);
    let mut r_tok = rng(seed, stream::PROMPT_TOKENS);
    let mut r_olen = rng(seed, stream::OUTPUT_LENGTHS);
    let mut r_samp = rng(seed, stream::SAMPLING);
    let mut r_cancel = rng(seed, stream::CANCELLATION);

    let mut requests = Vec::with_capacity(n);
    for (i, arrival_ms) in arrivals.into_iter().enumerate() {
        let tenant = tenants.pick(r_tenant.gen());

        let group = match &t.shared_prefix {
            Some(sp) if r_prefix.gen::<f64>() < sp.share => Some(r_prefix.gen_range(0..sp.groups)),
            _ => None,
        };
        let mut prompt: Vec<u32> = match (group, &t.shared_prefix) {
            (Some(g), Some(sp)) => prefixes
                .entry(g)
                .or_insert_with(|| prefix_tokens(seed, g, sp.prefix_tokens, vocab))
                .clone(),
            _ => Vec::new(),
        };
        // Truncate to leave room for one output token: both cache modes must fit every request.
        let own = prompt_len
            .draw(&mut r_plen)
            .min((msl - 1).saturating_sub(prompt.len() as u32));
        prompt.extend((0..own).map(|_| r_tok.gen_range(0..vocab)));
        let room = msl - prompt.len() as u32;
        let output_tokens = output_len.draw(&mut r_olen).min(room).max(1);

        let samples = match &t.parallel_sampling {
            Some(ps) if r_samp.gen::<f64>() < ps.share => ps.n.max(1),
            _ => 1,
        };
        let cancel_point = match &cancel {
            Some((spec, delay, after)) if r_cancel.gen::<f64>() < spec.share => {
                let when = match spec.when {
                    CancelWhen::Mixed => match r_cancel.gen_range(0..3) {
                        0 => CancelWhen::Queued,
                        1 => CancelWhen::AfterDelay,
                        _ => CancelWhen::AfterTokens,
                    },
                    w => w,
                };
                let delay_ms = |r: &mut ChaCha20Rng| delay.as_ref().map_or(0.0, |d| d.draw(r));
                Some(match when {
                    CancelWhen::Queued => CancelPoint::Queued {
                        after_ms: delay_ms(&mut r_cancel),
                    },
                    CancelWhen::AfterDelay => CancelPoint::AfterDelay {
                        after_ms: delay_ms(&mut r_cancel),
                    },
                    _ => {
                        let k = after.as_ref().map_or(1, |a| a.draw(&mut r_cancel));
                        // A point at or past the end would never fire; keep it inside the output.
                        CancelPoint::AfterTokens {
                            tokens: k.min(output_tokens.saturating_sub(1)).max(1),
                        }
                    }
                })
            }
            _ => None,
        };
        requests.push(Request {
            id: i as u64,
            tenant,
            arrival_ms,
            prompt: prompt.into(),
            prefix_group: group,
            output_tokens,
            samples,
            cancel: cancel_point,
            session: None,
        });
    }

    if let Some(spec) = &t.sessions {
        requests = super::sessions::expand(scenario, spec, seed, vocab, requests)?;
    }
    let closed_loop = match t.arrival {
        ArrivalSpec::ClosedLoop { clients, think_ms } => Some(ClosedLoop { clients, think_ms }),
        _ => None,
    };
    let workload_hash = workload_hash(&requests, closed_loop.as_ref());
    Ok(Workload {
        requests,
        closed_loop,
        workload_hash,
        trace: None,
    })
}

/// Who sends a request: equal shares by a multiply (any tenant count costs nothing), stated
/// shares by their cumulative sums (as many as the file lists).
enum Tenants {
    Equal(u32),
    Shares(Vec<f64>),
}

impl Tenants {
    fn new(s: &Scenario) -> Tenants {
        let Some(t) = &s.traffic.tenants else {
            return Tenants::Equal(1);
        };
        let count = t.count.max(1);
        match &t.shares {
            Some(v) if v.len() == count as usize => {
                let mut acc = 0.0;
                let mut cdf: Vec<f64> = v
                    .iter()
                    .map(|s| {
                        acc += s;
                        acc
                    })
                    .collect();
                if let Some(last) = cdf.last_mut() {
                    *last = f64::INFINITY;
                }
                Tenants::Shares(cdf)
            }
            _ => Tenants::Equal(count),
        }
    }

    /// The tenant for a uniform draw `u` in [0, 1).
    fn pick(&self, u: f64) -> u32 {
        match self {
            Tenants::Equal(n) => ((u * *n as f64) as u32).min(n - 1),
            Tenants::Shares(cdf) => cdf.iter().position(|&c| u < c).unwrap_or(cdf.len() - 1) as u32,
        }
    }
}

/// Arrival times in ms, in order. Open loop starts at t = 0 and adds drawn gaps.
fn arrival_times(s: &Scenario, seed: u64) -> Result<Vec<f64>, WorkloadError> {
    let t = &s.traffic;
    let gaps = GapSampler::new(&t.arrival)?;
    let Some(gaps) = gaps else {
        let n = t.requests.unwrap_or(0) as usize;
        return Ok(vec![0.0; n]);
    };
    let mut r = rng(seed, stream::ARRIVALS);
    let cap = t.requests.map_or(MAX_REQUESTS, |n| n as usize);
    let end_ms = t.duration_s.map(|d| d * 1000.0);
    let mut out = Vec::new();
    let mut now = 0.0;
    while out.len() < cap {
        if end_ms.is_some_and(|e| now >= e) {
            break;
        }
        if now.is_nan() || now > MAX_TIME_MS {
            return Err(WorkloadError::Distribution {
                key: "traffic.arrival.rate_per_s".into(),
                message: format!(
                    "arrival {} at {now:e} ms is past the {MAX_TIME_MS:e} ms the virtual clock \
                     holds; raise the rate or lower the request count",
                    out.len()
                ),
            });
        }
        out.push(now);
        now += gaps.draw(&mut r);
    }
    if t.requests.is_none() && out.len() >= MAX_REQUESTS {
        return Err(WorkloadError::TooMany {
            limit: MAX_REQUESTS,
        });
    }
    Ok(out)
}
