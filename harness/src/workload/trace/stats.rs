//! `kvbench trace stats`: what a trace holds, before any run, folded over its rows as they
//! stream: exact length percentiles from a count per distinct length, gap statistics in one
//! pass (a second pass collects the times only when the file is not in time order), and for
//! traces with content ids the ideal reuse over the replay's prompt recipes.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::bounds::{access_string, eviction_bounds, EvictionBounds};
use super::hash_block::HashBlock;
use super::reuse::{ideal_prefix_reuse, IdealReuse};
use super::{read_rows, replay, ReplayLimits, TraceError};
use crate::scenario::TraceSpec;
use crate::workload::Percentiles;

#[derive(Debug, Clone, Serialize)]
pub struct TraceStats {
    pub path: String,
    pub format: String,
    /// Data rows (header excluded), and of them the malformed ones skipped.
    pub rows: u64,
    pub skipped_bad_rows: u64,
    pub blake3: String,
    /// From the first row's time to the last's, seconds.
    pub span_s: f64,
    /// Rows per second over the span (None when all rows share one time).
    pub mean_rate_per_s: Option<f64>,
    /// Coefficient of variation of the gaps between consecutive rows (1 for Poisson).
    pub gap_cv: Option<f64>,
    pub prompt_tokens: Percentiles,
    pub output_tokens: Percentiles,
    pub max_seq_len: Option<u32>,
    /// Share of rows whose prompt + output exceeds `max_seq_len`.
    pub over_max_seq_len_share: Option<f64>,
    /// For traces with content ids: the infinite-cache prefix reuse at `block_tokens`.
    pub ideal_prefix_reuse: Option<IdealReuse>,
    /// Mooncake: tokens per hash id (stated or inferred), the range the rows allow, and the
    /// coverage: ids × block against the input tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash_block: Option<HashBlock>,
    /// For traces with content ids: `lru`, `lfu` and the offline optimum at each capacity asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub eviction: Vec<EvictionBounds>,
}

/// Gaps between consecutive times, folded in time order (Welford's mean and variance).
#[derive(Default)]
struct Gaps {
    first: Option<u64>,
    last: u64,
    n: u64,
    mean: f64,
    m2: f64,
}

impl Gaps {
    /// `false` once a time is earlier than the one before (the fold needs time order).
    fn push(&mut self, t: u64) -> bool {
        let Some(_) = self.first else {
            self.first = Some(t);
            self.last = t;
            return true;
        };
        if t < self.last {
            return false;
        }
        let g = (t - self.last) as f64;
        self.last = t;
        self.n += 1;
        let d = g - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (g - self.mean);
        true
    }

    fn span_ns(&self) -> u64 {
        self.first.map_or(0, |f| self.last - f)
    }
}

/// Exact percentiles of lengths from their counts (memory: distinct lengths, not rows).
fn percentiles(counts: &BTreeMap<u32, u64>) -> Percentiles {
    let n: u64 = counts.values().sum();
    if n == 0 {
        return Percentiles::default();
    }
    // The same rank rule as `Percentiles::of`: the ceil(q n)-th smallest value, 1-based.
    let rank = |q: f64| {
        let k = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (&v, &c) in counts {
            seen += c;
            if seen >= k {
                return v;
            }
        }
        0
    };
    let sum: u128 = counts.iter().map(|(&v, &c)| v as u128 * c as u128).sum();
    Percentiles {
        p50: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        max: counts.keys().next_back().copied().unwrap_or(0),
        mean: sum as f64 / n as f64,
    }
}

/// `block_tokens`: the cache block size the ideal reuse is measured at. The replay behind the
/// ideal reuse uses seed 0 and a 2^20 vocabulary: equal content ids give equal ids whatever
/// they are.
pub fn trace_stats(
    path: &Path,
    spec: &TraceSpec,
    max_seq_len: Option<u32>,
    block_tokens: u32,
) -> Result<TraceStats, TraceError> {
    trace_stats_with(path, spec, max_seq_len, block_tokens, &[])
}

/// [`trace_stats`] with the eviction bounds at each of `capacities_blocks` (none: not computed).
pub fn trace_stats_with(
    path: &Path,
    spec: &TraceSpec,
    max_seq_len: Option<u32>,
    block_tokens: u32,
    capacities_blocks: &[u64],
) -> Result<TraceStats, TraceError> {
    let mut gaps = Gaps::default();
    let mut in_order = true;
    let (mut prompts, mut outputs) = (BTreeMap::new(), BTreeMap::new());
    let (mut rows, mut over) = (0u64, 0u64);
    let read = read_rows(path, spec.format, spec.skip_bad_rows, |_, _, r| {
        in_order = in_order && gaps.push(r.time_ns);
        *prompts.entry(r.prompt_tokens).or_insert(0u64) += 1;
        *outputs.entry(r.output_tokens).or_insert(0u64) += 1;
        rows += 1;
        if max_seq_len
            .is_some_and(|m| r.prompt_tokens as u64 + r.output_tokens.max(1) as u64 > m as u64)
        {
            over += 1;
        }
    })?;
    if !in_order {
        let mut times = Vec::with_capacity(rows as usize);
        read_rows(path, read.format, spec.skip_bad_rows, |_, _, r| {
            times.push(r.time_ns)
        })?;
        times.sort_unstable();
        gaps = Gaps::default();
        for t in times {
            gaps.push(t);
        }
    }
    let span_ns = gaps.span_ns();
    let (mean_rate_per_s, gap_cv) = if span_ns > 0 && gaps.n > 0 {
        let var = gaps.m2 / gaps.n as f64;
        (
            Some(gaps.n as f64 / (span_ns as f64 / 1e9)),
            Some(var.max(0.0).sqrt() / gaps.mean),
        )
    } else {
        (None, None)
    };
    let mut eviction = Vec::new();
    let mut hash_block = None;
    let ideal = if read.has_content_ids {
        let limits = ReplayLimits {
            max_requests: None,
            duration_s: None,
        };
        let r = replay(path, spec, &limits, 0, 1 << 20)?;
        hash_block = r.hash_block.clone();
        let max = max_seq_len.unwrap_or(u32::MAX);
        if !capacities_blocks.is_empty() {
            let s = access_string(&r.requests, block_tokens, max, true);
            eviction = eviction_bounds(&s, capacities_blocks);
        }
        Some(ideal_prefix_reuse(&r.requests, block_tokens, max, true))
    } else {
        None
    };
    Ok(TraceStats {
        path: read.path.display().to_string(),
        format: read.format.name().into(),
        rows: read.data_rows,
        skipped_bad_rows: read.skipped_bad_rows,
        blake3: read.blake3.clone(),
        span_s: span_ns as f64 / 1e9,
        mean_rate_per_s,
        gap_cv,
        prompt_tokens: percentiles(&prompts),
        output_tokens: percentiles(&outputs),
        max_seq_len,
        over_max_seq_len_share: max_seq_len.map(|_| over as f64 / rows.max(1) as f64),
        ideal_prefix_reuse: ideal,
        hash_block,
        eviction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_percentiles_equal_sorted_ones() {
        let v: Vec<u32> = (0..1000u32).map(|i| (i * 7919) % 613).collect();
        let mut counts = BTreeMap::new();
        for &x in &v {
            *counts.entry(x).or_insert(0u64) += 1;
        }
        assert_eq!(percentiles(&counts), Percentiles::of(&v));
        assert_eq!(percentiles(&BTreeMap::new()), Percentiles::default());
    }

    #[test]
    fn gaps_fold_like_the_two_pass_formula() {
        let t: Vec<u64> = vec![0, 5, 7, 20, 21, 50];
        let mut g = Gaps::default();
        assert!(t.iter().all(|&x| g.push(x)));
        let d: Vec<f64> = t.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
        let mean = d.iter().sum::<f64>() / d.len() as f64;
        let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / d.len() as f64;
        assert!((g.mean - mean).abs() < 1e-12);
        assert!((g.m2 / g.n as f64 - var).abs() < 1e-9);
        assert_eq!(g.span_ns(), 50);
        assert!(!g.push(3), "out of order is reported");
    }
}
