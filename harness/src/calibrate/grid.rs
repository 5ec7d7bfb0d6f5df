//! The calibration grid: which steps are measured, and the file that records their times.
//!
//! `grid.json` is the one format the fit reads (`kvbench calibrate --from-grid FILE`), whether a
//! `kvbench calibrate` run wrote it or a GPU session's script did:
//!
//! ```json
//! { "format": "kvbench-grid/1", "backend": "cuda", "device": "NVIDIA H200 (driver …)",
//!   "date": "2026-12-01T10:00:00Z", "model": { ModelShape }, "block_size": 16,
//!   "load_average": [0.1, 0.9],
//!   "points": [ { "kind": "decode", "cache": "paged",
//!                 "groups": [ { "count": 8, "context_tokens": 128, "new_tokens": 1 } ],
//!                 "copy_tokens": 0, "swap_out_tokens": 0, "swap_in_tokens": 0,
//!                 "samples_s": [0.00121, 0.00119, …] } ] }
//! ```
//!
//! A point is one step: `groups` of identical sequences (each reads `context_tokens` of K/V and
//! writes `new_tokens`), copies of `copy_tokens` tokens in all and swaps, on one cache mode.
//! `samples_s` are its repeated wall times, every one kept so the spread is on record; the fit
//! uses their median.

use serde::{Deserialize, Serialize};

use crate::backend::{SeqWork, SwapDirection, SwapOp};
use crate::model::ModelShape;
use kvbench_cache_api::{CacheMode, CopyOp};

pub const GRID_FORMAT: &str = "kvbench-grid/1";

/// Identical sequences within one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub count: u32,
    pub context_tokens: u32,
    pub new_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PointKind {
    Decode,
    Prefill,
    Mixed,
    Copy,
    Swap,
}

/// One measured step shape on one cache mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub kind: PointKind,
    pub cache: CacheMode,
    pub groups: Vec<Group>,
    #[serde(default)]
    pub copy_tokens: u32,
    #[serde(default)]
    pub swap_out_tokens: u32,
    #[serde(default)]
    pub swap_in_tokens: u32,
    /// Repeated wall times, seconds (empty until measured).
    #[serde(default)]
    pub samples_s: Vec<f64>,
}

/// A measured grid: everything the fit needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grid {
    pub format: String,
    pub backend: String,
    /// What ran the steps, as the machine names it (CPU model, GPU name).
    pub device: String,
    /// UTC, RFC 3339.
    pub date: String,
    pub model: ModelShape,
    pub block_size: u32,
    /// The machine's 1-minute load average before and after measuring, where known: a figure
    /// fitted on a busy machine says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_average: Option<[f64; 2]>,
    pub points: Vec<Point>,
}

impl Grid {
    /// Every sample that cannot be a step's wall time, as `points[I].samples_s[J]: message`: a
    /// time is finite and above zero. The fit takes each point's median as a measurement, so a
    /// negative or zero time (an edited file, a clock that stepped back) would pull the fitted
    /// constants silently, and a point whose median is not positive would drop out unremarked.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, p) in self.points.iter().enumerate() {
            for (j, &t) in p.samples_s.iter().enumerate() {
                if !(t.is_finite() && t > 0.0) {
                    out.push(format!(
                        "points[{i}].samples_s[{j}]: a step time must be finite and above 0 s, \
                         got {t}"
                    ));
                }
            }
        }
        out
    }
}

/// The 1-minute load average (Linux), if readable.
pub fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A sentence when the machine is busy: a 1-minute load average at or above half its cores
/// means other work competes for the CPU, step times spread and a fit suffers.
pub fn load_warning(load: f64, cores: usize) -> Option<String> {
    let cores = cores.max(1);
    (load >= 0.5 * cores as f64).then(|| {
        format!(
            "the machine is loaded (1-minute load average {load:.2} on {cores} cores): other \
             work competes for the CPU, so step times spread and the fit suffers; calibrate on \
             an idle machine"
        )
    })
}

impl Point {
    /// The step's sequences as the engine would plan them (ids from 0).
    pub fn seq_work(&self) -> Vec<SeqWork> {
        let mut out = Vec::new();
        for g in &self.groups {
            for _ in 0..g.count {
                out.push(SeqWork {
                    seq: out.len() as u64,
                    context_tokens: g.context_tokens,
                    new_tokens: g.new_tokens,
                    sample: true,
                });
            }
        }
        out
    }

    /// Copies as the cost model counts them (only their token total matters to it).
    pub fn copies(&self, block_size: u32) -> Vec<CopyOp> {
        let bs = block_size.max(1);
        let n = self.copy_tokens.div_ceil(bs);
        (0..n)
            .map(|i| CopyOp {
                src_slot: u64::from(i * bs),
                dst_slot: u64::from((n + i) * bs),
                len_tokens: bs.min(self.copy_tokens - i * bs),
            })
            .collect()
    }

    pub fn swaps(&self) -> Vec<SwapOp> {
        let mut out = Vec::new();
        if self.swap_out_tokens > 0 {
            out.push(SwapOp {
                seq: 0,
                direction: SwapDirection::Out,
                tokens: self.swap_out_tokens,
                bytes: None,
            });
        }
        if self.swap_in_tokens > 0 {
            out.push(SwapOp {
                seq: 0,
                direction: SwapDirection::In,
                tokens: self.swap_in_tokens,
                bytes: None,
            });
        }
        out
    }

    /// Median of the samples (the fit's target).
    pub fn median_s(&self) -> Option<f64> {
        quantile(&self.samples_s, 0.5)
    }

    /// Relative spread: (p90 − p10) / median.
    pub fn spread(&self) -> Option<f64> {
        let m = self.median_s()?;
        let lo = quantile(&self.samples_s, 0.1)?;
        let hi = quantile(&self.samples_s, 0.9)?;
        (m > 0.0).then(|| (hi - lo) / m)
    }

    /// Slots the point's sequences need, for sizing the cache it is measured on.
    pub fn slots(&self, block_size: u32) -> u64 {
        let bs = u64::from(block_size.max(1));
        let seqs: u64 = self
            .groups
            .iter()
            .map(|g| {
                let tokens = u64::from(g.context_tokens) + u64::from(g.new_tokens);
                u64::from(g.count) * tokens.div_ceil(bs) * bs
            })
            .sum();
        let copies = 2 * u64::from(self.copy_tokens).div_ceil(bs) * bs;
        let swap = u64::from(self.swap_out_tokens.max(self.swap_in_tokens)).div_ceil(bs) * bs;
        seqs + copies + swap + bs
    }
}

/// Linear-interpolated quantile of unsorted values (`None` when empty or not finite).
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// The limits a scenario puts on one step, which bound the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridLimits {
    pub max_seq_len: u32,
    pub max_tokens_per_step: u32,
    pub max_seqs_per_step: u32,
    pub block_size: u32,
}

/// The default grid, sized by the scenario's limits: decode batches × contexts, prefill chunks
/// (fresh and after a context), mixed steps, copies and swaps, each on both cache modes. About
/// 60 points; on the tiny model it measures in seconds.
pub fn default_points(l: &GridLimits) -> Vec<Point> {
    let max_ctx = l.max_seq_len.saturating_sub(1).max(1);
    let max_batch = l.max_seqs_per_step.max(1);
    let max_chunk = l.max_tokens_per_step.max(1);
    let mut batches: Vec<u32> = [1, 4, 16, 32].iter().map(|&b| b.min(max_batch)).collect();
    batches.dedup();
    let mut contexts: Vec<u32> = [16, 64, 128, 240]
        .iter()
        .map(|&c| (c * max_ctx / 256).max(1))
        .collect();
    contexts.dedup();
    let mut chunks: Vec<u32> = [16, 64, 128, 256, 512]
        .iter()
        .map(|&c| c.min(max_chunk).min(max_ctx))
        .collect();
    chunks.dedup();
    let bs = l.block_size.max(1);
    let mut shapes: Vec<(PointKind, Vec<Group>, u32, u32, u32)> = Vec::new();
    let g = |count, context_tokens, new_tokens| Group {
        count,
        context_tokens,
        new_tokens,
    };
    for &b in &batches {
        for &c in &contexts {
            shapes.push((PointKind::Decode, vec![g(b, c, 1)], 0, 0, 0));
        }
    }
    for &n in &chunks {
        shapes.push((PointKind::Prefill, vec![g(1, 0, n)], 0, 0, 0));
    }
    let later = (max_ctx / 2).min(max_ctx.saturating_sub(chunks[0])).max(1);
    shapes.push((PointKind::Prefill, vec![g(1, later, chunks[0])], 0, 0, 0));
    if chunks.len() > 2 {
        shapes.push((PointKind::Prefill, vec![g(4, 0, chunks[1])], 0, 0, 0));
    }
    let mixed_chunk = chunks[chunks.len() / 2];
    for &b in &batches[1..] {
        let c = contexts[contexts.len() / 2];
        let decodes = b.min(max_batch.saturating_sub(1)).max(1);
        shapes.push((
            PointKind::Mixed,
            vec![g(decodes, c, 1), g(1, 0, mixed_chunk)],
            0,
            0,
            0,
        ));
    }
    for copy in [bs, 8 * bs, 32 * bs, max_ctx] {
        shapes.push((PointKind::Copy, Vec::new(), copy, 0, 0));
    }
    for tokens in [contexts[0], *contexts.last().unwrap_or(&1)] {
        shapes.push((PointKind::Swap, Vec::new(), 0, tokens, 0));
        shapes.push((PointKind::Swap, Vec::new(), 0, 0, tokens));
    }
    let mut out = Vec::new();
    for cache in [CacheMode::Paged, CacheMode::Contiguous] {
        for (kind, groups, copy_tokens, swap_out_tokens, swap_in_tokens) in &shapes {
            out.push(Point {
                kind: *kind,
                cache,
                groups: groups.clone(),
                copy_tokens: *copy_tokens,
                swap_out_tokens: *swap_out_tokens,
                swap_in_tokens: *swap_in_tokens,
                samples_s: Vec::new(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), Some(2.0));
        assert_eq!(quantile(&[1.0, 2.0], 0.5), Some(1.5));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[f64::NAN], 0.5), None);
    }

    #[test]
    fn the_default_grid_stays_inside_the_scenario_limits() {
        let l = GridLimits {
            max_seq_len: 256,
            max_tokens_per_step: 512,
            max_seqs_per_step: 32,
            block_size: 16,
        };
        let pts = default_points(&l);
        assert!(pts.len() > 40, "{}", pts.len());
        for p in &pts {
            let seqs: u32 = p.groups.iter().map(|g| g.count).sum();
            let tokens: u32 = p.groups.iter().map(|g| g.count * g.new_tokens).sum();
            assert!(seqs <= 32 && tokens <= 512, "{p:?}");
            for g in &p.groups {
                assert!(g.context_tokens + g.new_tokens <= 256, "{p:?}");
            }
            let copied: u32 = p.copies(16).iter().map(|c| c.len_tokens).sum();
            assert_eq!(copied, p.copy_tokens);
        }
    }
}
