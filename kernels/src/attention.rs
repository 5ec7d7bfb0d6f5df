//! Attention over the KV cache: decode (one query token per sequence) and chunked prefill (a
//! span of query tokens, causal within the span) share one core.
//!
//! Each query token's context is cut into partitions of [`PARTITION_TOKENS`] logical positions
//! (vLLM v2 style). A task computes one partition for all heads of one query token, streaming
//! whole slot rows (every KV head of a token is adjacent in the NHD layout), so memory is read
//! sequentially and each K/V byte once per query token whatever the GQA ratio; partitions are
//! merged with log-sum-exp. Partition boundaries depend only on logical positions, never on the
//! batch or the thread count, so results are bit-identical however a step is composed, and a
//! paged and a contiguous caller (which differ only in how [`Run`]s were built) agree exactly.
//! [`attention_windowed`] is the same core for a sliding layer: partitions start at the window's
//! first position, then break at the same multiples of [`PARTITION_TOKENS`], so results still
//! depend only on logical positions.

mod core;
mod dots;
mod merge;
mod softmax;

use rayon::prelude::*;

use crate::addressing::{Run, TokenAddressing};
use crate::elem::KvElem;
use crate::error::{check_len, KernelError};
use crate::kv::LayerKv;

use self::core::{partial, PartArgs, PartTask, Scratch};
use self::merge::merge;

/// Logical positions per partition.
pub const PARTITION_TOKENS: usize = 256;

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
    attention_windowed(layer, num_slots, dims, spans, q, out, scale, None)
}

/// [`attention`] with a sliding window: with `Some(w)`, the query at position `p` attends to
/// positions `p + 1 - w ..= p` only (the last `w` tokens, itself included), as a sliding-window
/// layer does. Partitions start at the window's first position and then break at the same
/// multiples of [`PARTITION_TOKENS`] as without one, so results still depend only on logical
/// positions. `Some(0)` is refused (a window holds at least the token itself).
#[allow(clippy::too_many_arguments)]
pub fn attention_windowed<E: KvElem, A: TokenAddressing>(
    layer: &LayerKv<E>,
    num_slots: usize,
    dims: AttnDims,
    spans: &[QuerySpan<'_, A>],
    q: &[f32],
    out: &mut [f32],
    scale: f32,
    window: Option<usize>,
) -> Result<(), KernelError> {
    dims.validate()?;
    if window == Some(0) {
        return Err(KernelError::Config(
            "a sliding window holds at least one token".into(),
        ));
    }
    check_len("k cache", num_slots * dims.kv_row(), layer.k.len())?;
    check_len("v cache", num_slots * dims.kv_row(), layer.v.len())?;
    let total_q: usize = spans.iter().map(|s| s.q_len).sum();
    check_len("q", total_q * dims.q_row(), q.len())?;
    check_len("out", total_q * dims.q_row(), out.len())?;

    // Address translation, done once per span and checked before any read. `starts[i]` is the
    // logical position of `runs[i]`'s first token.
    let mut runs: Vec<Run> = Vec::new();
    let mut starts: Vec<usize> = Vec::new();
    let mut tasks: Vec<PartTask> = Vec::new();
    // Per query token: its first task and how many partitions it has.
    let mut token_parts: Vec<(usize, usize)> = Vec::with_capacity(total_q);
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
        let first_run = runs.len();
        // The first position any query of the span reads: with a window, the first query's
        // window start (a layout that released what lies before it is never asked for it).
        let from = window.map_or(0, |w| (s.context_len - s.q_len + 1).saturating_sub(w));
        let mut at = s
            .addr
            .runs_from(from, s.context_len, num_slots, &mut runs)?;
        if at > from {
            return Err(KernelError::Unmapped {
                pos: from,
                mapped_tokens: s.addr.mapped_tokens(),
            });
        }
        for r in &runs[first_run..] {
            starts.push(at);
            at += r.len;
        }
        let run_range = (first_run, runs.len());
        for i in 0..s.q_len {
            let ctx = s.context_len - s.q_len + i + 1;
            let tok = token_parts.len();
            let first_task = tasks.len();
            let mut p0 = window.map_or(0, |w| ctx.saturating_sub(w));
            while p0 < ctx {
                let p1 = ((p0 / PARTITION_TOKENS + 1) * PARTITION_TOKENS).min(ctx);
                tasks.push(PartTask {
                    tok,
                    runs: run_range,
                    p0,
                    p1,
                });
                p0 = p1;
            }
            token_parts.push((first_task, tasks.len() - first_task));
        }
    }

    let stride = dims.q_heads * (dims.head_dim + 2);
    let mut partials = vec![0f32; tasks.len() * stride];
    partials
        .par_chunks_mut(stride)
        .zip(tasks.par_iter())
        .for_each_init(Scratch::default, |scratch, (part_out, t)| {
            let q_row = &q[t.tok * dims.q_row()..(t.tok + 1) * dims.q_row()];
            let (r0, r1) = t.runs;
            let args = PartArgs {
                layer,
                runs: &runs[r0..r1],
                starts: &starts[r0..r1],
                t,
                dims,
                scale,
                q: q_row,
            };
            partial(&args, part_out, scratch);
        });
    out.par_chunks_mut(dims.q_row())
        .zip(token_parts.par_iter())
        .for_each(|(o, &(first, n))| {
            merge(&partials[first * stride..(first + n) * stride], dims, o)
        });
    Ok(())
}
