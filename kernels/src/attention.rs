//! Attention over the KV cache: decode (one query token per sequence) and chunked prefill (a
//! span of query tokens, causal within the span) share one core.
//!
//! Work is split into tasks of (query token, KV head): a task reads each K and V row of its KV
//! head once and serves all `q_heads / kv_heads` query heads of that group, so GQA does not
//! multiply memory traffic. The core is two-pass (scores, softmax, then V), streaming the
//! sequence's [`Run`]s; a paged and a contiguous caller differ only in how runs were built.

use rayon::prelude::*;

use crate::addressing::{Run, TokenAddressing};
use crate::elem::KvElem;
use crate::error::{check_len, KernelError};
use crate::kv::LayerKv;

/// Head layout of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttnDims {
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.kv_heads == 0 || self.head_dim == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(KernelError::Config(format!(
                "q_heads {} must be a positive multiple of kv_heads {} (head_dim {})",
                self.q_heads, self.kv_heads, self.head_dim
            )));
        }
        Ok(())
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    pub fn q_row(&self) -> usize {
        self.q_heads * self.head_dim
    }

    pub fn kv_row(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// The query tokens of one sequence in this call: the last `q_len` of its `context_len` tokens,
/// whose K/V are already written. Query `i` attends to positions `0 ..= context_len - q_len + i`.
#[derive(Debug, Clone, Copy)]
pub struct QuerySpan<'a, A> {
    pub addr: &'a A,
    pub context_len: usize,
    pub q_len: usize,
}

/// Attention for a batch of spans. `q` and `out` are `[Σ q_len, q_heads, head_dim]` in span
/// order; every element of `out` is written. `scale` is usually `1/sqrt(head_dim)`.
pub fn attention<E: KvElem, A: TokenAddressing>(
    layer: &LayerKv<E>,
    num_slots: usize,
    dims: AttnDims,
    spans: &[QuerySpan<'_, A>],
    q: &[f32],
    out: &mut [f32],
    scale: f32,
) -> Result<(), KernelError> {
    dims.validate()?;
    check_len("k cache", num_slots * dims.kv_row(), layer.k.len())?;
    check_len("v cache", num_slots * dims.kv_row(), layer.v.len())?;
    let total_q: usize = spans.iter().map(|s| s.q_len).sum();
    check_len("q", total_q * dims.q_row(), q.len())?;
    check_len("out", total_q * dims.q_row(), out.len())?;

    // Address translation, done once per span and checked before any read.
    let mut runs: Vec<Run> = Vec::new();
    let mut span_runs: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    // Per query token: (index into span_runs, attended context length).
    let mut token_ctx: Vec<(usize, usize)> = Vec::with_capacity(total_q);
    for s in spans {
        if s.q_len == 0 {
            continue;
        }
        if s.q_len > s.context_len {
            return Err(KernelError::Shape {
                what: "q_len <= context_len",
                expected: s.context_len,
                got: s.q_len,
            });
        }
        let start = runs.len();
        s.addr.runs(s.context_len, num_slots, &mut runs)?;
        span_runs.push((start, runs.len()));
        let first_ctx = s.context_len - s.q_len + 1;
        token_ctx.extend((0..s.q_len).map(|i| (span_runs.len() - 1, first_ctx + i)));
    }

    let g = dims.group();
    let hd = dims.head_dim;
    let task = TaskShape {
        row_stride: dims.kv_row(),
        head_dim: hd,
        group: g,
        scale,
    };
    out.par_chunks_mut(g * hd)
        .enumerate()
        .for_each_init(Vec::new, |scores, (c, out_group)| {
            let tok = c / dims.kv_heads;
            let head = c % dims.kv_heads;
            let (sr, ctx) = token_ctx[tok];
            let (r0, r1) = span_runs[sr];
            let q_group = &q[(tok * dims.q_heads + head * g) * hd..][..g * hd];
            attend(
                layer,
                &runs[r0..r1],
                ctx,
                head,
                task,
                q_group,
                out_group,
                scores,
            );
        });
    Ok(())
}

#[derive(Debug, Clone, Copy)]
struct TaskShape {
    row_stride: usize,
    head_dim: usize,
    group: usize,
    scale: f32,
}

/// Runtime dispatch to an AVX2 build of the same code: the default x86-64 target has only SSE2,
/// and a decode step is memory-bound only if the arithmetic keeps up.
#[allow(clippy::too_many_arguments)]
fn attend<E: KvElem>(
    layer: &LayerKv<E>,
    runs: &[Run],
    ctx: usize,
    head: usize,
    t: TaskShape,
    q: &[f32],
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { attend_avx2(layer, runs, ctx, head, t, q, out, scores) };
            return;
        }
    }
    attend_core(layer, runs, ctx, head, t, q, out, scores)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx2<E: KvElem>(
    layer: &LayerKv<E>,
    runs: &[Run],
    ctx: usize,
    head: usize,
    t: TaskShape,
    q: &[f32],
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    attend_core(layer, runs, ctx, head, t, q, out, scores)
}

const LANES: usize = 8;

#[inline(always)]
fn dot<E: KvElem>(q: &[f32], k: &[E]) -> f32 {
    let mut acc = [0f32; LANES];
    let qc = q.chunks_exact(LANES);
    let kc = k.chunks_exact(LANES);
    let (qr, kr) = (qc.remainder(), kc.remainder());
    for (qa, ka) in qc.zip(kc) {
        for l in 0..LANES {
            acc[l] += qa[l] * ka[l].to_f32();
        }
    }
    let mut tail = 0f32;
    for (a, b) in qr.iter().zip(kr) {
        tail += a * b.to_f32();
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn axpy<E: KvElem>(out: &mut [f32], p: f32, v: &[E]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o += p * x.to_f32();
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_core<E: KvElem>(
    layer: &LayerKv<E>,
    runs: &[Run],
    ctx: usize,
    head: usize,
    t: TaskShape,
    q: &[f32],
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let (hd, g) = (t.head_dim, t.group);
    scores.clear();
    scores.resize(g * ctx, 0.0);
    let head_off = head * hd;

    // Pass 1: scores[j][pos] = q_j · k_pos × scale.
    let mut pos = 0;
    for run in runs {
        if pos >= ctx {
            break;
        }
        let n = run.len.min(ctx - pos);
        for i in 0..n {
            let base = (run.first_slot + i) * t.row_stride + head_off;
            let krow = &layer.k[base..base + hd];
            for j in 0..g {
                scores[j * ctx + pos + i] = dot(&q[j * hd..(j + 1) * hd], krow) * t.scale;
            }
        }
        pos += n;
    }

    // Softmax per query head.
    for j in 0..g {
        let s = &mut scores[j * ctx..(j + 1) * ctx];
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f32;
        for x in s.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in s.iter_mut() {
            *x *= inv;
        }
    }

    // Pass 2: out_j = Σ_pos p[j][pos] · v_pos.
    out.fill(0.0);
    let mut pos = 0;
    for run in runs {
        if pos >= ctx {
            break;
        }
        let n = run.len.min(ctx - pos);
        for i in 0..n {
            let base = (run.first_slot + i) * t.row_stride + head_off;
            let vrow = &layer.v[base..base + hd];
            for j in 0..g {
                axpy(
                    &mut out[j * hd..(j + 1) * hd],
                    scores[j * ctx + pos + i],
                    vrow,
                );
            }
        }
        pos += n;
    }
}
