//! The partition kernel: one partition of one query token's context, every query head.

use crate::addressing::Run;
use crate::attention::AttnDims;
use crate::elem::KvElem;
use crate::kv::LayerKv;

/// Logical positions `p0..p1` of query token `tok`'s context, read through `runs`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PartTask {
    pub tok: usize,
    pub runs: (usize, usize),
    pub p0: usize,
    pub p1: usize,
}

/// The code paths `partial` chooses from, slowest first.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum CodePath {
    Portable,
    Avx2,
    Fma,
}

/// The fastest path `partial` may take: the CPU's best, unless `KVBENCH_KERNEL_PATH` (`portable`
/// or `avx2`) caps it, so the slower paths are tested on machines that would never take them
/// (`tests/check.sh` reruns the kernel tests under each cap). Read once.
#[cfg(target_arch = "x86_64")]
fn code_path_ceiling() -> CodePath {
    static CEILING: std::sync::OnceLock<CodePath> = std::sync::OnceLock::new();
    *CEILING.get_or_init(|| match std::env::var("KVBENCH_KERNEL_PATH").as_deref() {
        Ok("portable") => CodePath::Portable,
        Ok("avx2") => CodePath::Avx2,
        _ => CodePath::Fma,
    })
}

/// What one partition task reads: the layer's K/V, the address runs covering the partition (with
/// each run's first logical position), the task, the shape, the softmax scale and the query row.
pub(super) struct PartArgs<'a, E: KvElem> {
    pub layer: &'a LayerKv<E>,
    pub runs: &'a [Run],
    pub starts: &'a [usize],
    pub t: &'a PartTask,
    pub dims: AttnDims,
    pub scale: f32,
    pub q: &'a [f32],
}

/// Computes one partition for every query head; `out` holds, per head, `[max, sum, acc…]`
/// with `acc = Σ exp(s − max) · v` (unnormalised).
pub(super) fn partial<E: KvElem>(a: &PartArgs<'_, E>, out: &mut [f32], scratch: &mut Scratch) {
    #[cfg(target_arch = "x86_64")]
    {
        let ceiling = code_path_ceiling();
        if ceiling >= CodePath::Fma
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            unsafe { partial_fma(a, out, scratch) };
            return;
        }
        if ceiling >= CodePath::Avx2 && std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { partial_avx2(a, out, scratch) };
            return;
        }
    }
    partial_core::<E, false>(a, out, scratch)
}

/// The same code compiled for AVX2 with fused multiply-add: the default x86-64 target has only
/// SSE2, and decode attention is memory-bound only if the arithmetic keeps up. FMA halves the
/// arithmetic instructions: on the 2-core Xeon it took an L3-resident 64 MiB step from 3.65 to
/// 3.24 ms and a 1 GiB one from 69 to 66 ms. (AVX-512 gave nothing more beyond the caches.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn partial_fma<E: KvElem>(a: &PartArgs<'_, E>, out: &mut [f32], scratch: &mut Scratch) {
    partial_core::<E, true>(a, out, scratch)
}

/// AVX2 without FMA (rounding each product, as the portable path does).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn partial_avx2<E: KvElem>(a: &PartArgs<'_, E>, out: &mut [f32], scratch: &mut Scratch) {
    partial_core::<E, false>(a, out, scratch)
}

const LANES: usize = 16;

/// `acc + a·b`, fused where `F` (only in code compiled with the FMA feature: elsewhere
/// `mul_add` is a slow library call).
#[inline(always)]
fn madd<const F: bool>(acc: f32, a: f32, b: f32) -> f32 {
    if F {
        a.mul_add(b, acc)
    } else {
        acc + a * b
    }
}

#[inline(always)]
fn dot<E: KvElem, const F: bool>(q: &[f32], k: &[E]) -> f32 {
    let mut acc = [0f32; LANES];
    let qc = q.chunks_exact(LANES);
    let kc = k.chunks_exact(LANES);
    let (qr, kr) = (qc.remainder(), kc.remainder());
    for (qa, ka) in qc.zip(kc) {
        for l in 0..LANES {
            acc[l] = madd::<F>(acc[l], qa[l], ka[l].to_f32());
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

/// The slot of each logical position `p0..p1`, in order. Plain loops over this list (no
/// closures) keep the hot loops inside the feature-compiled function: a closure would be
/// compiled without its features.
#[inline(always)]
fn slot_list(runs: &[Run], starts: &[usize], p0: usize, p1: usize, out: &mut Vec<usize>) {
    out.clear();
    let mut r = starts.partition_point(|&s| s <= p0) - 1;
    let mut pos = p0;
    while pos < p1 {
        let run = runs[r];
        let off = pos - starts[r];
        let n = (run.len - off).min(p1 - pos);
        out.extend(run.first_slot + off..run.first_slot + off + n);
        pos += n;
        r += 1;
    }
}

/// Rows ahead whose first bytes are prefetched, so each row's first lines are in flight (and
/// the hardware streamer started on its page) well before the row is read. Measured on a 1 GiB
/// f32 working set (2 cores), both passes walking [`ROW_BLOCK`] rows at once: 1 KiB of a 4 KiB
/// row beat 512 or 768 B by 4-8%, and 1.5 KiB, 2 KiB or whole rows were slower (the fill
/// buffers saturate); 4, 12 or 16 rows ahead were no better. Extra prefetches or demand touches
/// of a block's first rows a block or more ahead gained nothing: what paging still costs is not
/// the block boundary as such (blocks shuffled only within 2 MiB windows cost 0-2%) but jumps
/// far across the cache (16 MiB windows 5%, the whole 1 GiB 7% at block 16).
const PREFETCH_ROWS: usize = 8;
const PREFETCH_BYTES: usize = 1024;
/// Rows up to this size are prefetched whole: a 2 KiB bf16 row (Llama-3-8B shape) took a 512 MiB
/// step from ~52 to ~45 ms that way, where a 4 KiB f32 row prefers its first 1 KiB.
const WHOLE_ROW_BYTES: usize = 2048;

#[inline(always)]
fn prefetch_row<E>(buf: &[E], first: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let row_bytes = len * std::mem::size_of::<E>();
        let bytes = if row_bytes <= WHOLE_ROW_BYTES {
            row_bytes
        } else {
            PREFETCH_BYTES
        };
        let base = buf[first..first + len].as_ptr() as *const i8;
        let mut off = 0;
        while off < bytes {
            // SAFETY: `base + off` lies inside `buf[first..first + len]` (bounds-checked slice
            // above); a prefetch never faults and changes no program state.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(off)) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (buf, first, len);
}

/// Prefetches rows `blk + PREFETCH_ROWS ..` for a block of `tn` rows starting at `blk`.
#[inline(always)]
fn prefetch_ahead<E>(buf: &[E], slots: &[usize], row: usize, blk: usize, tn: usize) {
    for d in 0..tn {
        if let Some(&s) = slots.get(blk + d + PREFETCH_ROWS) {
            prefetch_row(buf, s * row, row);
        }
    }
}

/// Per-thread buffers reused across tasks.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    scores: Vec<f32>,
    slots: Vec<usize>,
}

/// Rows per block in both passes: each head's slice of [`ROW_BLOCK`] rows is visited before the
/// next head's, so [`ROW_BLOCK`] pages are read at once (more requests in flight than one row
/// after another) and the rows stay in L1 while every head sweeps them. In pass 1 this took a
/// 1 GiB step from 77 to 69 ms (with 1 KiB prefetches); 4 or 16 rows were no better.
const ROW_BLOCK: usize = 8;

#[inline(always)]
fn partial_core<E: KvElem, const F: bool>(
    a: &PartArgs<'_, E>,
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let PartArgs {
        layer,
        runs,
        starts,
        t,
        dims,
        scale,
        q,
    } = *a;
    let (hd, g, kvh, qh) = (dims.head_dim, dims.group(), dims.kv_heads, dims.q_heads);
    let n = t.p1 - t.p0;
    let row = dims.kv_row();
    let Scratch { scores, slots } = scratch;
    scores.clear();
    scores.resize(qh * n, 0.0);
    slot_list(runs, starts, t.p0, t.p1, slots);

    // Pass 1: scores[head][i] = q_head · k_(p0+i) × scale, a block of rows at a time.
    let mut blk = 0;
    while blk < n {
        let tn = ROW_BLOCK.min(n - blk);
        prefetch_ahead(&layer.k, slots, row, blk, tn);
        #[cfg(target_arch = "x86_64")]
        if F && g.is_multiple_of(4) && hd.is_multiple_of(8) && super::dots::simd_storage::<E>() {
            let k = &layer.k;
            for h in 0..kvh {
                for i in (blk..blk + tn).step_by(2) {
                    let b0 = slots[i] * row + h * hd;
                    // An odd last row is paired with itself; its duplicate is dropped.
                    let i1 = (i + 1).min(blk + tn - 1);
                    let b1 = slots[i1] * row + h * hd;
                    for j0 in (h * g..(h + 1) * g).step_by(4) {
                        // SAFETY: F is true only in code compiled for (and run on) AVX2+FMA.
                        let d = unsafe {
                            super::dots::dots_4x2(
                                &q[j0 * hd..(j0 + 4) * hd],
                                hd,
                                &k[b0..b0 + hd],
                                &k[b1..b1 + hd],
                            )
                        };
                        for a in 0..4 {
                            scores[(j0 + a) * n + i] = d[2 * a] * scale;
                            scores[(j0 + a) * n + i1] = d[2 * a + 1] * scale;
                        }
                    }
                }
            }
            blk += tn;
            continue;
        }
        for h in 0..kvh {
            for i in blk..blk + tn {
                let b = slots[i] * row + h * hd;
                let kh = &layer.k[b..b + hd];
                for j in h * g..(h + 1) * g {
                    scores[j * n + i] = dot::<E, F>(&q[j * hd..(j + 1) * hd], kh) * scale;
                }
            }
        }
        blk += tn;
    }
    for &slot in slots.iter().take(PREFETCH_ROWS) {
        prefetch_row(&layer.v, slot * row, row);
    }

    // Per head: max, exponentials, their sum.
    let stride = hd + 2;
    for j in 0..qh {
        let s = &mut scores[j * n..(j + 1) * n];
        let (max, sum) = exp_minus_max::<F>(s);
        let o = &mut out[j * stride..(j + 1) * stride];
        o[0] = max;
        o[1] = sum;
        o[2..].fill(0.0);
    }

    // Pass 2: acc[head] += exp(s) · v, a block of rows at a time. Within a block each
    // 16-lane slice of a head's accumulator stays in registers across the block's tokens, so
    // the accumulator is loaded and stored once per block instead of once per token. Per
    // element the additions still run token by token in logical order.
    let mut blk = 0;
    while blk < n {
        let tn = ROW_BLOCK.min(n - blk);
        prefetch_ahead(&layer.v, slots, row, blk, tn);
        for h in 0..kvh {
            let mut bases = [0usize; ROW_BLOCK];
            for (t, b) in bases.iter_mut().take(tn).enumerate() {
                *b = slots[blk + t] * row + h * hd;
            }
            let bases = &bases[..tn];
            #[cfg(target_arch = "x86_64")]
            if F && g.is_multiple_of(2) && hd.is_multiple_of(32) && super::dots::simd_storage::<E>()
            {
                let v = &layer.v;
                for j in (h * g..(h + 1) * g).step_by(2) {
                    let p = |j: usize| &scores[j * n + blk..j * n + blk + tn];
                    // SAFETY: F is true only in code compiled for (and run on) AVX2+FMA.
                    unsafe {
                        super::dots::accumulate_2x32(
                            out,
                            j * stride + 2,
                            (j + 1) * stride + 2,
                            p(j),
                            p(j + 1),
                            v,
                            bases,
                            hd,
                        )
                    };
                }
                continue;
            }
            for j in h * g..(h + 1) * g {
                let o = &mut out[j * stride + 2..(j + 1) * stride];
                let p = &scores[j * n + blk..j * n + blk + tn];
                let mut c = 0;
                while c + WIDE_LANES <= hd {
                    accumulate::<E, WIDE_LANES, F>(o, p, &layer.v, bases, c);
                    c += WIDE_LANES;
                }
                while c + ACC_LANES <= hd {
                    accumulate::<E, ACC_LANES, F>(o, p, &layer.v, bases, c);
                    c += ACC_LANES;
                }
                for (&pt, &b) in p.iter().zip(bases) {
                    axpy(&mut o[c..], pt, &layer.v[b + c..b + hd]);
                }
            }
        }
        blk += tn;
    }
}

#[inline(always)]
fn exp_minus_max<const F: bool>(s: &mut [f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if F {
        // SAFETY: F is true only in code compiled for (and run on) AVX2+FMA.
        return unsafe { super::softmax::exp_minus_max(s) };
    }
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = 0f32;
    for x in s.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    (max, sum)
}

/// Accumulator slices kept in registers: eight AVX2 vectors where the head is wide enough
/// (the per-token index arithmetic is then amortised over 64 lanes), else two.
const WIDE_LANES: usize = 64;
const ACC_LANES: usize = 16;

/// `o[c..c+L] += Σ_t p[t] · v[bases[t] + c ..][..L]`, tokens in order, the slice in registers.
#[inline(always)]
fn accumulate<E: KvElem, const L: usize, const F: bool>(
    o: &mut [f32],
    p: &[f32],
    v: &[E],
    bases: &[usize],
    c: usize,
) {
    let mut acc = [0f32; L];
    acc.copy_from_slice(&o[c..c + L]);
    for (&pt, &b) in p.iter().zip(bases) {
        let vs = &v[b + c..b + c + L];
        for l in 0..L {
            acc[l] = madd::<F>(acc[l], pt, vs[l].to_f32());
        }
    }
    o[c..c + L].copy_from_slice(&acc);
}
