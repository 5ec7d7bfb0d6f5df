//! The decode-attention microbenchmark behind `kvbench kernel-bench`: paged, paged with the
//! `extents` placement, and contiguous attention over the same K/V bytes, interleaved, next to a
//! streaming-read ceiling measured in the same process.
//!
//! All three read one shared storage: the contiguous layout gives sequence `i` slots
//! `i·context .. (i+1)·context`; the paged layout gives it a shuffled set of blocks of the same
//! slots (a pool aged by churn under the `lifo` free stack). The placed layout's tables come from
//! the paged manager's own `extents` free set: the sequences grow a block at a time in turn (as
//! decode steps do) in a pool a fifth of which other sequences hold at seeded random addresses
//! (the storage carries those extra slots; nobody reads them). Bytes moved = batch × context × 2
//! (K and V) × kv_heads × head_dim × element size.
//!
//! [`BenchConfig::run_blocks`] adds one more paged layout per run length L (`paged-runs-L`): each
//! sequence's blocks come in runs of L address-consecutive blocks, the runs shuffled over the
//! pool, so a sequence jumps far once every L blocks — the `extents` placement's 64-block extent
//! with the extent length as the only variable (no held blocks, no holes).

use std::time::Instant;

use crate::cache::{BlockAllocator, Placement};
use kvbench_baselines::attention::ContiguousRegion;
use kvbench_kernels::{
    attention, bf16, AttnDims, KernelError, KvElem, LayerKv, PagedTable, QuerySpan, TokenAddressing,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub batches: Vec<usize>,
    pub contexts: Vec<usize>,
    pub block_sizes: Vec<usize>,
    pub dims: AttnDims,
    pub bf16: bool,
    /// Grid points whose K/V would exceed this are skipped.
    pub max_kv_bytes: u64,
    /// Bytes summed by the streaming-read ceiling.
    pub ceiling_bytes: u64,
    /// Minimum measured time per repeat of a grid point (at least `MIN_REPS` calls of each
    /// layout). Each repeat keeps each layout's fastest call: on a shared machine it is the one
    /// least disturbed by other load, and the ceiling is measured the same way.
    pub min_time_s: f64,
    /// Measurements of each grid point. Each repeat times the layouts in turn, the order
    /// rotated by one from repeat to repeat (ABC, BCA, CAB, …), so a repeat's times are side by
    /// side and no layout always goes first; the ratios of one repeat are one paired sample.
    pub repeats: usize,
    pub seed: u64,
    /// Run lengths in blocks of the `paged-runs-L` layouts (empty: none).
    pub run_blocks: Vec<usize>,
}

const MIN_REPS: usize = 5;

/// One measured grid point for one cache.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    pub backend: String,
    pub cache: String,
    pub batch: usize,
    pub context_tokens: usize,
    pub block_size: usize,
    /// The fastest call over every repeat.
    pub time_us: f64,
    pub gbytes_per_s: f64,
    pub ceiling_fraction: f64,
    /// Each repeat's fastest call, in repeat order (the same repeats as the point's other rows).
    pub repeat_time_us: Vec<f64>,
}

#[derive(Debug, Clone)]
pub struct BenchResult {
    pub ceiling_gbytes_per_s: f64,
    pub rows: Vec<BenchRow>,
    pub kv_bytes: Vec<u64>,
}

/// The size of the last-level cache, from sysfs where present.
pub fn last_level_cache_bytes() -> Option<u64> {
    let mut best = None;
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let Ok(size) = std::fs::read_to_string(format!("{dir}/size")) else {
            continue;
        };
        let s = size.trim();
        let (num, mult) = match s.chars().last() {
            Some('K') => (&s[..s.len() - 1], 1024),
            Some('M') => (&s[..s.len() - 1], 1024 * 1024),
            _ => (s, 1),
        };
        if let Ok(n) = num.parse::<u64>() {
            best = best.max(Some(n * mult));
        }
    }
    best
}

#[inline(always)]
fn sum_chunk(c: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let it = c.chunks_exact(16);
    let rem: f32 = it.remainder().iter().sum();
    for x in it {
        for l in 0..16 {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + rem
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_chunk_avx2(c: &[f32]) -> f32 {
    sum_chunk(c)
}

fn sum_fast(c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked just above).
            return unsafe { sum_chunk_avx2(c) };
        }
    }
    sum_chunk(c)
}

/// Streaming-read ceiling in GB/s: a plain parallel sum over `bytes` of f32, best of 5 passes.
/// The buffer comes from the same allocator as the KV cache ([`kv_buffer`], advised for
/// transparent huge pages), so the ceiling reads the same kind of memory as the kernel: on the
/// 2-core Xeon VM a plain `vec!` (4 KiB pages) summed at 23.6 GB/s and huge pages at 34 GB/s,
/// which had flattered every ceiling fraction by ~45%.
///
/// [`kv_buffer`]: kvbench_kernels::kv::kv_buffer
pub fn streaming_ceiling(bytes: u64) -> f64 {
    let n = (bytes / 4) as usize;
    let mut buf = kvbench_kernels::kv::kv_buffer(n, 0f32);
    buf.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(i, c)| c.fill(1.0 + (i % 7) as f32));
    let mut best = f64::INFINITY;
    let mut sink = 0f32;
    for _ in 0..6 {
        let t = Instant::now();
        sink += buf.par_chunks(1 << 16).map(sum_fast).sum::<f32>();
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    bytes as f64 / best / 1e9
}

type Call<'a> = &'a mut dyn FnMut() -> Result<(), KernelError>;

/// Per call, the fastest time of each of `repeats` repeats. A repeat calls each of `calls` in
/// turn — A, B, C, A, B, C… in repeat 0, B, C, A… in repeat 1, C, A, B… in repeat 2 — for at
/// least `MIN_REPS` rounds and `min_time_s` in all, so the calls of one repeat see the same drift
/// and the same interference from other load, and no call always runs first.
fn time_repeats(
    min_time_s: f64,
    repeats: usize,
    calls: &mut [Call<'_>],
) -> Result<Vec<Vec<f64>>, KernelError> {
    for c in calls.iter_mut() {
        c()?; // warm-up: page faults, thread pool
    }
    let n = calls.len();
    let mut times = vec![Vec::with_capacity(repeats); n];
    for r in 0..repeats {
        let mut best = vec![f64::INFINITY; n];
        let mut reps = 0;
        let start = Instant::now();
        while reps < MIN_REPS || start.elapsed().as_secs_f64() < min_time_s {
            for k in 0..n {
                let i = (r + k) % n;
                let t = Instant::now();
                calls[i]()?;
                best[i] = best[i].min(t.elapsed().as_secs_f64());
            }
            reps += 1;
        }
        for (t, b) in times.iter_mut().zip(best) {
            t.push(b);
        }
    }
    Ok(times)
}

/// Share of the placed pool that other sequences hold: one block in five.
const HELD_PER_FREE: usize = 4;

/// The block tables `extents` placement gives `batch` sequences of `nb` blocks each, grown a
/// block at a time in turn, in a pool of `batch·nb + held` blocks whose `held` blocks other
/// sequences hold (chosen by `rng`). Concatenated, `nb` per sequence.
fn placed_tables(
    batch: usize,
    nb: usize,
    held: usize,
    bs: usize,
    rng: &mut ChaCha8Rng,
) -> Vec<u32> {
    let total = batch * nb + held;
    let mut pool = BlockAllocator::with_placement(total as u32, bs as u32, Placement::Extents);
    let mut all: Vec<u32> = (0..total).filter_map(|_| pool.allocate()).collect();
    all.shuffle(rng);
    for &b in &all[held..] {
        pool.free(b);
    }
    let mut last = vec![None; batch];
    let mut tables = vec![Vec::with_capacity(nb); batch];
    for _ in 0..nb {
        for (t, l) in tables.iter_mut().zip(&mut last) {
            // The pool holds exactly the blocks the tables need.
            let b = pool.allocate_after(*l).unwrap_or(0);
            t.push(b);
            *l = Some(b);
        }
    }
    tables.concat()
}

/// Tables whose sequences hold runs of `run_len` address-consecutive blocks (the last run of
/// the pool may be shorter), the runs shuffled over a pool of `pool` blocks by `rng`.
/// Concatenated, `nb` per sequence; needs `batch·nb ≤ pool`.
fn runs_tables(
    pool: usize,
    batch: usize,
    nb: usize,
    run_len: usize,
    rng: &mut ChaCha8Rng,
) -> Vec<u32> {
    let run_len = run_len.max(1);
    let mut runs: Vec<usize> = (0..pool.div_ceil(run_len)).collect();
    runs.shuffle(rng);
    runs.iter()
        .flat_map(|&r| r * run_len..((r + 1) * run_len).min(pool))
        .take(batch * nb)
        .map(|b| b as u32)
        .collect()
}

/// The most a grid may be estimated to take before it is refused: an hour of measurement.
pub const MAX_ESTIMATED_S: f64 = 3600.0;

/// K/V bytes of one grid point in element size `elem` (0 where it overflows: skipped).
fn point_bytes(cfg: &BenchConfig, batch: usize, context: usize, elem: usize) -> u64 {
    batch
        .checked_mul(context)
        .and_then(|x| x.checked_mul(cfg.dims.kv_row()))
        .and_then(|x| x.checked_mul(2 * elem))
        .map_or(u64::MAX, |b| b as u64)
}

/// The grid points that run (their K/V within `max_kv_bytes`).
fn points(cfg: &BenchConfig) -> Vec<(usize, usize)> {
    let elem = if cfg.bf16 { 2 } else { 4 };
    let mut out = Vec::new();
    for &batch in &cfg.batches {
        for &context in &cfg.contexts {
            let bytes = point_bytes(cfg, batch, context, elem);
            if bytes <= cfg.max_kv_bytes && batch > 0 && context > 0 {
                out.push((batch, context));
            }
        }
    }
    out
}

/// A lower bound on the grid's measuring time, in seconds: each repeat of each (point, block
/// size) runs for at least `min_time_s`.
pub fn min_seconds(cfg: &BenchConfig) -> f64 {
    points(cfg).len() as f64
        * cfg.block_sizes.len() as f64
        * cfg.repeats.max(1) as f64
        * cfg.min_time_s
}

/// Runs the grid: refused before any measurement when its time is estimated past
/// [`MAX_ESTIMATED_S`] (naming `--repeats` and the figure); the estimate and each grid point are
/// printed on stderr as it goes.
pub fn run_grid(cfg: &BenchConfig) -> Result<BenchResult, KernelError> {
    cfg.dims.validate()?;
    let estimate_s = min_seconds(cfg);
    let points = points(cfg);
    if estimate_s > MAX_ESTIMATED_S {
        return Err(KernelError::Config(format!(
            "--repeats {}: {} grid points × {} block sizes × {} repeats × {} s a repeat is at \
             least {:.0} s of measurement, above the {:.0} s bound; lower --repeats or the grid",
            cfg.repeats,
            points.len(),
            cfg.block_sizes.len(),
            cfg.repeats.max(1),
            cfg.min_time_s,
            estimate_s,
            MAX_ESTIMATED_S
        )));
    }
    eprintln!(
        "kernel-bench: {} grid points, at least {estimate_s:.0} s of measurement",
        points.len()
    );
    // The ceiling is measured before and after the grid and the better kept, so a burst of
    // other load during one measurement cannot inflate every fraction.
    let ceiling = streaming_ceiling(cfg.ceiling_bytes);
    let mut result = BenchResult {
        ceiling_gbytes_per_s: ceiling,
        rows: Vec::new(),
        kv_bytes: Vec::new(),
    };
    for (i, &(batch, context)) in points.iter().enumerate() {
        eprintln!(
            "kernel-bench: [{}/{}] batch {batch} context {context}",
            i + 1,
            points.len()
        );
        if cfg.bf16 {
            grid_point::<bf16>(cfg, batch, context, &mut result)?;
        } else {
            grid_point::<f32>(cfg, batch, context, &mut result)?;
        }
    }
    result.ceiling_gbytes_per_s = ceiling.max(streaming_ceiling(cfg.ceiling_bytes));
    for r in &mut result.rows {
        r.ceiling_fraction = r.gbytes_per_s / result.ceiling_gbytes_per_s;
    }
    Ok(result)
}

fn grid_point<E: KvElem>(
    cfg: &BenchConfig,
    batch: usize,
    context: usize,
    res: &mut BenchResult,
) -> Result<(), KernelError> {
    let dims = cfg.dims;
    let row = dims.kv_row();
    let bytes = (batch * context * row * 2 * std::mem::size_of::<E>()) as u64;
    if bytes > cfg.max_kv_bytes || batch == 0 || context == 0 {
        return Ok(());
    }
    // Every block size must tile a sequence's region exactly: round up to their lcm.
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let unit = cfg
        .block_sizes
        .iter()
        .fold(1, |l, &b| l / gcd(l, b.max(1)) * b.max(1));
    let per_seq = context.div_ceil(unit) * unit;
    let num_slots = batch * per_seq;
    // The placed pool's extra blocks, held by other sequences.
    let held_slots = (num_slots / HELD_PER_FREE).div_ceil(unit) * unit;
    let storage_slots = num_slots + held_slots;
    // The storage is allocated whole: refused where this process cannot get it, not aborted.
    let storage_bytes = (storage_slots as u64)
        .saturating_mul(row as u64)
        .saturating_mul(2 * std::mem::size_of::<E>() as u64);
    if let Some((available, source)) = crate::scenario::host_available_bytes() {
        if storage_bytes > available {
            return Err(KernelError::Config(format!(
                "--max-gib {:.3}: batch {batch} context {context} needs {} of host memory for \
                 its K/V, and {} is available ({source}); lower --max-gib or the grid",
                cfg.max_kv_bytes as f64 / (1u64 << 30) as f64,
                crate::units::format_bytes(storage_bytes),
                crate::units::format_bytes(available)
            )));
        }
    }
    let mut layer = LayerKv {
        k: kvbench_kernels::kv::kv_buffer(storage_slots * row, E::default()),
        v: kvbench_kernels::kv::kv_buffer(storage_slots * row, E::default()),
    };
    layer.k.par_chunks_mut(row).enumerate().for_each(|(s, r)| {
        r.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = E::from_f32(((s * 31 + i * 7) % 97) as f32 / 97.0 - 0.5))
    });
    layer.v.par_chunks_mut(row).enumerate().for_each(|(s, r)| {
        r.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = E::from_f32(((s * 17 + i * 13) % 89) as f32 / 89.0 - 0.5))
    });
    let q: Vec<f32> = (0..batch * dims.q_row())
        .map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5)
        .collect();
    // The two layouts place different values at a given logical position (one storage, two
    // address maps), so outputs differ; their equality on equal data is tested elsewhere
    // (tests/it/kernels/attention.rs).
    let (mut out_p, mut out_x, mut out_c) = (
        vec![0f32; q.len()],
        vec![0f32; q.len()],
        vec![0f32; q.len()],
    );
    let scale = 1.0 / (dims.head_dim as f32).sqrt();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ (batch as u64) << 32 ^ context as u64);
    let regions: Vec<ContiguousRegion> = (0..batch)
        .map(|i| ContiguousRegion {
            base_slot: i * per_seq,
            capacity_tokens: per_seq,
        })
        .collect();
    for &bs in &cfg.block_sizes {
        let mut perm: Vec<u32> = (0..(num_slots / bs) as u32).collect();
        perm.shuffle(&mut rng);
        let nb = per_seq / bs;
        let tables: Vec<PagedTable<'_>> = (0..batch)
            .map(|i| PagedTable {
                block_size: bs,
                blocks: &perm[i * nb..(i + 1) * nb],
            })
            .collect();
        // Its own stream, so the shuffled tables are the ones earlier versions measured.
        let mut held_rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0xE87E_4750 ^ (bs as u64) << 48);
        let placed = placed_tables(batch, nb, held_slots / bs, bs, &mut held_rng);
        let placed_tables: Vec<PagedTable<'_>> = placed
            .chunks(nb)
            .map(|blocks| PagedTable {
                block_size: bs,
                blocks,
            })
            .collect();
        // Their own stream per run length, so adding one leaves the others' tables alone.
        let runs: Vec<Vec<u32>> = cfg
            .run_blocks
            .iter()
            .map(|&l| {
                let mut r = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5275_6E73 ^ (l as u64) << 40);
                runs_tables(num_slots / bs, batch, nb, l, &mut r)
            })
            .collect();
        let runs_tables: Vec<Vec<PagedTable<'_>>> = runs
            .iter()
            .map(|t| {
                t.chunks(nb)
                    .map(|blocks| PagedTable {
                        block_size: bs,
                        blocks,
                    })
                    .collect()
            })
            .collect();
        let mut names: Vec<String> = ["paged", "paged-extents", "contiguous"]
            .map(String::from)
            .to_vec();
        names.extend(cfg.run_blocks.iter().map(|l| format!("paged-runs-{l}")));
        let s = storage_slots;
        let mut out_r = vec![vec![0f32; q.len()]; runs_tables.len()];
        let mut calls: Vec<Box<dyn FnMut() -> Result<(), KernelError> + '_>> = vec![
            Box::new(|| run(&layer, s, dims, &tables, context, &q, &mut out_p, scale)),
            Box::new(|| {
                run(
                    &layer,
                    s,
                    dims,
                    &placed_tables,
                    context,
                    &q,
                    &mut out_x,
                    scale,
                )
            }),
            Box::new(|| run(&layer, s, dims, &regions, context, &q, &mut out_c, scale)),
        ];
        for (t, out) in runs_tables.iter().zip(&mut out_r) {
            let (layer, q) = (&layer, &q);
            calls.push(Box::new(move || {
                run(layer, s, dims, t, context, q, out, scale)
            }));
        }
        let mut refs: Vec<Call<'_>> = calls.iter_mut().map(|c| &mut **c as Call<'_>).collect();
        let times = time_repeats(cfg.min_time_s, cfg.repeats.max(1), &mut refs)?;
        drop(refs);
        drop(calls);
        for (cache, reps) in names.iter().zip(times) {
            let t = reps.iter().copied().fold(f64::INFINITY, f64::min);
            let gbs = bytes as f64 / t / 1e9;
            res.rows.push(BenchRow {
                backend: "cpu".into(),
                cache: cache.clone(),
                batch,
                context_tokens: context,
                block_size: bs,
                time_us: t * 1e6,
                gbytes_per_s: gbs,
                ceiling_fraction: gbs / res.ceiling_gbytes_per_s,
                repeat_time_us: reps.iter().map(|t| t * 1e6).collect(),
            });
            res.kv_bytes.push(bytes);
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run<E: KvElem, A: TokenAddressing>(
    layer: &LayerKv<E>,
    num_slots: usize,
    dims: AttnDims,
    addrs: &[A],
    context: usize,
    q: &[f32],
    out: &mut [f32],
    scale: f32,
) -> Result<(), KernelError> {
    let spans: Vec<QuerySpan<'_, A>> = addrs
        .iter()
        .map(|a| QuerySpan {
            addr: a,
            context_len: context,
            q_len: 1,
        })
        .collect();
    attention(layer, num_slots, dims, &spans, q, out, scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sequence's blocks are distinct pool blocks, in runs of the run length that ascend
    /// by one and start on a multiple of it; a run length of the whole pool is one address order.
    #[test]
    fn runs_tables_hold_runs_of_consecutive_blocks() {
        let seed = std::env::var("KVBENCH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(18_07);
        println!("seed {seed} (KVBENCH_SEED replays)");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for (pool, batch, nb, run_len) in [(100, 3, 30, 8), (64, 4, 16, 64), (50, 5, 10, 1)] {
            let t = runs_tables(pool, batch, nb, run_len, &mut rng);
            assert_eq!(t.len(), batch * nb);
            let mut seen = vec![false; pool];
            for &b in &t {
                assert!(
                    (b as usize) < pool && !seen[b as usize],
                    "block {b} twice or outside"
                );
                seen[b as usize] = true;
            }
            let mut jumps = 0;
            for w in t.windows(2) {
                let (a, b) = (w[0] as usize, w[1] as usize);
                if b % run_len == 0 || a + 1 != b {
                    // A new run starts at its own multiple of the run length.
                    assert_eq!(b % run_len, 0, "{t:?}");
                    jumps += 1;
                }
            }
            // Ceil of blocks per run, less the first: at least this many runs were started.
            assert!(jumps + 1 >= (batch * nb).div_ceil(run_len), "{t:?}");
            if run_len >= pool {
                assert!(t.windows(2).all(|w| w[0] + 1 == w[1]), "{t:?}");
            }
        }
    }
}
