//! `kvbench trace stats`: what a trace holds, before any run.

use serde::Serialize;

use super::reuse::{ideal_prefix_reuse, IdealReuse};
use super::{replay, ParsedTrace, ReplayLimits};
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
}

/// `block_tokens`: the cache block size the ideal reuse is measured at; `vocab` and `seed` only
/// shape the token ids (equal content ids give equal ids whatever they are).
pub fn trace_stats(
    trace: &ParsedTrace,
    spec: &TraceSpec,
    max_seq_len: Option<u32>,
    block_tokens: u32,
) -> TraceStats {
    let mut times: Vec<u64> = trace.rows.iter().map(|r| r.time_ns).collect();
    times.sort_unstable();
    let span_ns = match (times.first(), times.last()) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    };
    let gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
    let (mean_rate_per_s, gap_cv) = if span_ns > 0 && !gaps.is_empty() {
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        (
            Some(gaps.len() as f64 / (span_ns as f64 / 1e9)),
            Some(var.sqrt() / mean),
        )
    } else {
        (None, None)
    };
    let prompts: Vec<u32> = trace.rows.iter().map(|r| r.prompt_tokens).collect();
    let outputs: Vec<u32> = trace.rows.iter().map(|r| r.output_tokens).collect();
    let over = max_seq_len.map(|m| {
        let n = trace
            .rows
            .iter()
            .filter(|r| r.prompt_tokens as u64 + r.output_tokens.max(1) as u64 > m as u64)
            .count();
        n as f64 / trace.rows.len().max(1) as f64
    });
    let ideal = trace.has_content_ids.then(|| {
        let limits = ReplayLimits {
            max_requests: None,
            duration_s: None,
        };
        let r = replay(trace, spec, &limits, 0, 1 << 20);
        ideal_prefix_reuse(
            &r.requests,
            block_tokens,
            max_seq_len.unwrap_or(u32::MAX),
            true,
        )
    });
    TraceStats {
        path: trace.path.display().to_string(),
        format: trace.format.name().into(),
        rows: trace.data_rows,
        skipped_bad_rows: trace.skipped_bad_rows,
        blake3: trace.blake3.clone(),
        span_s: span_ns as f64 / 1e9,
        mean_rate_per_s,
        gap_cv,
        prompt_tokens: Percentiles::of(&prompts),
        output_tokens: Percentiles::of(&outputs),
        max_seq_len,
        over_max_seq_len_share: over,
        ideal_prefix_reuse: ideal,
    }
}
