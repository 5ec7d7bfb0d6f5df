//! What a generated workload looks like, for `kvbench scenario show` and for reports.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::types::{CancelPoint, Workload};

/// Nearest-rank percentiles of a list of token counts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Percentiles {
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
    pub mean: f64,
}

impl Percentiles {
    pub fn of(values: &[u32]) -> Percentiles {
        if values.is_empty() {
            return Percentiles::default();
        }
        let mut v = values.to_vec();
        v.sort_unstable();
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Percentiles {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: v[v.len() - 1],
            mean: v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub requests: usize,
    /// Sequences to decode: Σ samples.
    pub continuations: u64,
    pub prompt_tokens: Percentiles,
    pub output_tokens: Percentiles,
    /// Arrival of the last request, ms (0 for burst and closed loop).
    pub span_ms: f64,
    /// Requests per second over the arrival span; `None` when everything arrives at once.
    pub offered_rate_per_s: Option<f64>,
    /// Coefficient of variation of gaps between arrivals (1 for Poisson, > 1 burstier).
    pub gap_cv: Option<f64>,
    pub cancel_queued: usize,
    pub cancel_after_delay: usize,
    pub cancel_after_tokens: usize,
    /// Distinct shared-prefix groups used.
    pub prefix_groups: usize,
    pub shared_prefix_requests: usize,
    /// Share of all prompt tokens that sit in shared prefixes.
    pub shared_prompt_token_share: f64,
    /// Requests with more than one continuation (they fork after prefill).
    pub forked_requests: usize,
    /// Requests per tenant, by tenant id.
    pub per_tenant: BTreeMap<u32, usize>,
    pub closed_loop_clients: Option<u32>,
    pub workload_hash: String,
}

impl Summary {
    /// `prefix_tokens` is the shared-prefix length (0 when the scenario has none).
    pub fn of(w: &Workload, prefix_tokens: u32) -> Summary {
        let r = &w.requests;
        let prompts: Vec<u32> = r.iter().map(|q| q.prompt.len_tokens()).collect();
        let outputs: Vec<u32> = r.iter().map(|q| q.output_tokens).collect();
        let gaps: Vec<f64> = r
            .windows(2)
            .map(|p| p[1].arrival_ms - p[0].arrival_ms)
            .collect();
        let span_ms =
            r.last().map_or(0.0, |q| q.arrival_ms) - r.first().map_or(0.0, |q| q.arrival_ms);
        let (offered_rate_per_s, gap_cv) = if span_ms > 0.0 && !gaps.is_empty() {
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            (
                Some(gaps.len() as f64 * 1000.0 / span_ms),
                Some(var.sqrt() / mean),
            )
        } else {
            (None, None)
        };
        let count = |f: fn(&CancelPoint) -> bool| {
            r.iter()
                .filter(|q| q.cancel.as_ref().is_some_and(f))
                .count()
        };
        let groups: std::collections::BTreeSet<u32> =
            r.iter().filter_map(|q| q.prefix_group).collect();
        let shared_requests = r.iter().filter(|q| q.prefix_group.is_some()).count();
        let total_prompt: u64 = prompts.iter().map(|&p| p as u64).sum();
        let shared_tokens: u64 = r
            .iter()
            .filter(|q| q.prefix_group.is_some())
            .map(|q| (prefix_tokens as u64).min(q.prompt.len_tokens() as u64))
            .sum();
        let mut per_tenant = BTreeMap::new();
        for q in r {
            *per_tenant.entry(q.tenant).or_insert(0) += 1;
        }
        Summary {
            requests: r.len(),
            continuations: r.iter().map(|q| q.samples as u64).sum(),
            prompt_tokens: Percentiles::of(&prompts),
            output_tokens: Percentiles::of(&outputs),
            span_ms,
            offered_rate_per_s,
            gap_cv,
            cancel_queued: count(|c| matches!(c, CancelPoint::Queued { .. })),
            cancel_after_delay: count(|c| matches!(c, CancelPoint::AfterDelay { .. })),
            cancel_after_tokens: count(|c| matches!(c, CancelPoint::AfterTokens { .. })),
            prefix_groups: groups.len(),
            shared_prefix_requests: shared_requests,
            shared_prompt_token_share: if total_prompt == 0 {
                0.0
            } else {
                shared_tokens as f64 / total_prompt as f64
            },
            forked_requests: r.iter().filter(|q| q.samples > 1).count(),
            per_tenant,
            closed_loop_clients: w.closed_loop.map(|c| c.clients),
            workload_hash: w.workload_hash.clone(),
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = |x: &Percentiles| {
            format!(
                "p50 {} / p90 {} / p99 {} / max {} (mean {:.1})",
                x.p50, x.p90, x.p99, x.max, x.mean
            )
        };
        writeln!(
            f,
            "requests          {} ({} continuations)",
            self.requests, self.continuations
        )?;
        writeln!(f, "prompt tokens     {}", p(&self.prompt_tokens))?;
        writeln!(f, "output tokens     {}", p(&self.output_tokens))?;
        match (
            self.closed_loop_clients,
            self.offered_rate_per_s,
            self.gap_cv,
        ) {
            (Some(c), _, _) => writeln!(f, "arrivals          closed loop, {c} clients")?,
            (None, Some(rate), Some(cv)) => writeln!(
                f,
                "arrivals          {rate:.3} req/s offered over {:.1} s, gap CV {cv:.3}",
                self.span_ms / 1000.0
            )?,
            _ => writeln!(f, "arrivals          all at t = 0")?,
        }
        writeln!(
            f,
            "cancellations     {} (queued {}, after delay {}, after tokens {})",
            self.cancel_queued + self.cancel_after_delay + self.cancel_after_tokens,
            self.cancel_queued,
            self.cancel_after_delay,
            self.cancel_after_tokens
        )?;
        writeln!(
            f,
            "shared prefixes   {} groups used by {} requests; {:.1}% of prompt tokens are shared",
            self.prefix_groups,
            self.shared_prefix_requests,
            self.shared_prompt_token_share * 100.0
        )?;
        writeln!(
            f,
            "forks             {} requests sample more than one continuation",
            self.forked_requests
        )?;
        let tenants: Vec<String> = self
            .per_tenant
            .iter()
            .map(|(t, n)| format!("{t}: {n}"))
            .collect();
        writeln!(f, "tenants           {}", tenants.join(", "))?;
        write!(f, "workload hash     {}", self.workload_hash)
    }
}
