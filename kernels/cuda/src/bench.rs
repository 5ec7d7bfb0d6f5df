//! The decode-attention benchmark behind `kvbench kernel-bench --backend cuda`: paged and
//! contiguous attention over the same device storage, launched alternately, with L2 kept cold by
//! rotating through copies of the storage that together exceed it several times, timed by CUDA
//! events per launch and by CUDA-graph replay (launch overhead removed), next to a read-bandwidth
//! ceiling measured in the same run by a plain streaming kernel.
//!
//! Bytes moved = batch × attended tokens × 2 (K and V) × kv_heads × head_dim × element size, as
//! on cpu; the attended tokens are the context, or with a sliding window (a sliding layer's
//! decode) the last `window` of it: the kernel reads nothing before the window.

use crate::device::{Addressing, DevLayer, Gpu, KvBuf, Rows, Workspace};
use crate::error::CudaError;
use crate::launch::{plan_partitions, AttnShape};
use crate::rng::Rng;
use crate::runtime::DevBuf;
use crate::KvDtype;
use cudarc::driver::sys;

#[derive(Debug, Clone)]
pub struct GpuBenchConfig {
    pub batches: Vec<usize>,
    pub contexts: Vec<usize>,
    pub block_sizes: Vec<usize>,
    pub shape: AttnShape,
    pub dtype: KvDtype,
    /// Timed launches per grid point and cache (event timing; the graph replays as many).
    pub reps: usize,
    /// Grid points whose K/V (one copy) exceed this are skipped.
    pub max_kv_bytes: u64,
    pub seed: u64,
    /// Sliding window in tokens (0: full attention): every row attends its last `window`
    /// positions, as a sliding layer of Gemma 3 or gpt-oss does.
    pub window: usize,
}

impl GpuBenchConfig {
    /// Tokens a row of `context` attends under the window.
    pub fn attended(&self, context: usize) -> usize {
        context - crate::launch::window_start(context, self.window)
    }
}

/// One measured grid point for one cache. The first eight columns are `kernel_bench.csv`'s
/// (the cpu backend's); the rest are cuda's own.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuBenchRow {
    pub cache: &'static str,
    pub batch: usize,
    pub context_tokens: usize,
    pub block_size: usize,
    /// CUDA-graph time per launch where capture worked, else the median event time.
    pub time_us: f64,
    pub gbytes_per_s: f64,
    pub ceiling_fraction: f64,
    pub time_events_us: f64,
    pub time_graph_us: Option<f64>,
    pub kv_bytes: u64,
    pub rotating_copies: usize,
    pub partitions: u32,
}

#[derive(Debug, Clone)]
pub struct GpuBenchResult {
    pub ceiling_gbytes_per_s: f64,
    pub ceiling_bytes: u64,
    pub rows: Vec<GpuBenchRow>,
}

fn elapsed_us(gpu: &Gpu, mut f: impl FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
    let a = gpu.new_event()?;
    let b = gpu.new_event()?;
    gpu.record(&a)?;
    f()?;
    gpu.record(&b)?;
    b.synchronize()?;
    Ok(a.elapsed_ms(&b)? as f64 * 1e3)
}

/// Streaming-read ceiling in GB/s over `bytes` (at least 8 × L2), best of 10.
pub fn read_ceiling(gpu: &Gpu, bytes: u64) -> Result<f64, CudaError> {
    let words = (bytes / 16 * 4) as usize;
    let mut buf = gpu.zeros::<u32>(words)?;
    gpu.fill_words(&mut buf, words, 0x1234_5678)?;
    let mut out = gpu.zeros::<u32>(gpu.info.sm_count * 8)?;
    gpu.read_ceiling(&buf, &mut out)?; // warm-up
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        best = best.min(elapsed_us(gpu, || gpu.read_ceiling(&buf, &mut out))?);
    }
    Ok((words * 4) as f64 / (best * 1e-6) / 1e9)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn run(gpu: &Gpu, cfg: &GpuBenchConfig) -> Result<GpuBenchResult, CudaError> {
    cfg.shape.check()?;
    let ceiling_bytes = (8 * gpu.info.l2_bytes as u64).max(1 << 30);
    let ceiling = read_ceiling(gpu, ceiling_bytes)?;
    let mut rows = Vec::new();
    let mut rng = Rng::new(cfg.seed);
    for &batch in &cfg.batches {
        for &context in &cfg.contexts {
            point(gpu, cfg, batch, context, ceiling, &mut rng, &mut rows)?;
        }
    }
    Ok(GpuBenchResult {
        ceiling_gbytes_per_s: ceiling,
        ceiling_bytes,
        rows,
    })
}

#[allow(clippy::too_many_arguments)]
fn point(
    gpu: &Gpu,
    cfg: &GpuBenchConfig,
    batch: usize,
    context: usize,
    ceiling: f64,
    rng: &mut Rng,
    rows_out: &mut Vec<GpuBenchRow>,
) -> Result<(), CudaError> {
    let shape = cfg.shape;
    let elem = cfg.dtype.bytes();
    let stored_bytes = (batch * context * 2 * shape.kv_row() * elem) as u64;
    if stored_bytes > cfg.max_kv_bytes || batch == 0 || context == 0 {
        return Ok(());
    }
    let kv_bytes = (batch * cfg.attended(context) * 2 * shape.kv_row() * elem) as u64;
    let unit = cfg.block_sizes.iter().fold(1usize, |l, &b| l.max(b));
    let per_seq = context.div_ceil(unit) * unit;
    let num_slots = batch * per_seq;
    // Copies so that what one round of launches touches is >= 4 x L2.
    let copies =
        ((4 * gpu.info.l2_bytes as u64).div_ceil(stored_bytes.max(1)) as usize).clamp(1, 64);
    let value_word = match cfg.dtype {
        KvDtype::F32 => 0x3c00_0000, // 2^-7
        KvDtype::Bf16 => 0x3c00_3c00,
    };
    let mut layers: Vec<DevLayer> = Vec::with_capacity(copies);
    for _ in 0..copies {
        let mut l = gpu.new_layer(cfg.dtype, num_slots, shape)?;
        let words = num_slots * shape.kv_row() * elem / 4;
        for b in [&mut l.k, &mut l.v] {
            match b {
                KvBuf::F32(s) => gpu.fill_words(s, words, value_word)?,
                KvBuf::Bf16(s) => gpu.fill_words(s, words, value_word)?,
            }
        }
        layers.push(l);
    }
    let q: Vec<f32> = (0..batch * shape.q_row()).map(|_| rng.unit()).collect();
    let q = gpu.upload(&q)?;
    let mut out = gpu.zeros::<f32>(batch * shape.q_row())?;
    let row_seq = gpu.upload(&(0..batch as i32).collect::<Vec<_>>())?;
    let row_len = gpu.upload(&vec![context as i32; batch])?;
    let rows = Rows {
        row_seq: &row_seq,
        row_len: &row_len,
        rows: batch,
        max_len: context,
        window: cfg.window,
    };
    let bases = gpu.upload(&(0..batch).map(|i| (i * per_seq) as i64).collect::<Vec<_>>())?;
    let parts = plan_partitions(batch, shape.kv_heads, context, gpu.info.sm_count);
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let mut ws = Workspace::default();
    for &bs in &cfg.block_sizes {
        let nb = per_seq / bs;
        let mut perm: Vec<i32> = (0..(num_slots / bs) as i32).collect();
        rng.shuffle(&mut perm);
        let tables = gpu.upload(&perm)?; // sequence i owns perm[i*nb .. (i+1)*nb]
        let paged = Addressing::Paged {
            block_tables: &tables,
            max_blocks: nb,
            block_size: bs,
        };
        let contig = Addressing::Contiguous { seq_base: &bases };
        let addrs = [("paged", &paged), ("contiguous", &contig)];
        let mut launch = |which: usize, copy: usize, out: &mut DevBuf<f32>| {
            gpu.attention(
                &layers[copy],
                addrs[which].1,
                &rows,
                &q,
                out,
                parts,
                &mut ws,
                scale,
            )
        };
        for w in 0..2 {
            launch(w, 0, &mut out)?; // warm-up: module load, workspace growth
        }
        let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for rep in 0..cfg.reps.max(3) {
            for (w, t) in times.iter_mut().enumerate() {
                t.push(elapsed_us(gpu, || launch(w, rep % copies, &mut out))?);
            }
        }
        let mut graph_us: [Option<f64>; 2] = [None, None];
        for (w, g) in graph_us.iter_mut().enumerate() {
            *g = graph_time(gpu, copies, cfg.reps.max(3), |c| launch(w, c, &mut out)).ok();
        }
        for w in 0..2 {
            let ev = median(&mut times[w]);
            let t = graph_us[w].unwrap_or(ev);
            let gbs = kv_bytes as f64 / (t * 1e-6) / 1e9;
            rows_out.push(GpuBenchRow {
                cache: addrs[w].0,
                batch,
                context_tokens: context,
                block_size: bs,
                time_us: t,
                gbytes_per_s: gbs,
                ceiling_fraction: gbs / ceiling,
                time_events_us: ev,
                time_graph_us: graph_us[w],
                kv_bytes,
                rotating_copies: copies,
                partitions: parts.parts,
            });
        }
    }
    Ok(())
}

/// Per-launch time of a CUDA graph holding one launch per rotating copy, replayed `reps` times.
fn graph_time(
    gpu: &Gpu,
    copies: usize,
    reps: usize,
    mut launch: impl FnMut(usize) -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let per_graph = copies.max(4);
    let rt = gpu
        .real()
        .ok_or_else(|| CudaError::Shape("CUDA graphs need a GPU".into()))?;
    rt.stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(CudaError::driver("cuStreamBeginCapture"))?;
    let mut captured = Ok(());
    for i in 0..per_graph {
        captured = captured.and_then(|()| launch(i % copies));
    }
    let graph = rt
        .stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(CudaError::driver("cuStreamEndCapture"))?;
    captured?;
    let graph = graph.ok_or_else(|| CudaError::Shape("empty graph".into()))?;
    graph.launch().map_err(CudaError::driver("cuGraphLaunch"))?; // upload + warm
    let total = elapsed_us(gpu, || {
        for _ in 0..reps {
            graph.launch().map_err(CudaError::driver("cuGraphLaunch"))?;
        }
        Ok(())
    })?;
    Ok(total / (reps * per_graph) as f64)
}

/// One point of the K/V traffic count (`kernel-bench --backend cuda-emu`): the bytes the
/// attention kernels read from the cache, counted by the emulator, beside the least a kernel of
/// this design must read. Hardware-independent: the count is a property of the kernel's code.
#[derive(Debug, Clone, PartialEq)]
pub struct ByteRow {
    pub cache: &'static str,
    /// `decode` (one query row per sequence) or `prefill` (a whole prompt per sequence).
    pub phase: &'static str,
    pub batch: usize,
    pub context_tokens: usize,
    pub block_size: usize,
    /// The K/V bytes the decode rows attend (batch × attended tokens × 2 × kv row × element
    /// size; the attended tokens are the context, or its last `window` with a window).
    pub kv_bytes: u64,
    pub kv_bytes_read: u64,
    /// Decode: `kv_bytes`, each byte once. Prefill: the tiling bound, each query tile reading
    /// the causal prefix of its last row once (⌈N / tile rows⌉ passes over growing prefixes),
    /// from its first row's window start with a window.
    pub kv_bytes_ideal: u64,
    /// One block per query row instead of per tile: what the tiling saves.
    pub kv_bytes_per_row: u64,
    pub partitions: u32,
    pub tile_rows: usize,
}

impl ByteRow {
    pub fn ratio(&self) -> f64 {
        self.kv_bytes_read as f64 / self.kv_bytes_ideal.max(1) as f64
    }
}

/// Counts the K/V bytes of decode and prefill attention at every grid point, paged and
/// contiguous, on the emulated device (whose counter [`crate::emu::kernels::take_kv_read_bytes`]
/// is process-wide: nothing else may launch kernels meanwhile). Decode splits rows into
/// partitions by [`plan_partitions`] (FlashDecoding), prefill by the model's fixed 512 tokens.
pub fn count_bytes(gpu: &Gpu, cfg: &GpuBenchConfig) -> Result<Vec<ByteRow>, CudaError> {
    use crate::device::{tile_rows, Tiles};
    use crate::launch::{fixed_partitions, ATTN_MAX_PART_TOKENS};
    use crate::model::batch::tiles;
    cfg.shape.check()?;
    let shape = cfg.shape;
    let elem = cfg.dtype.bytes();
    let row_bytes = (2 * shape.kv_row() * elem) as u64;
    let tq = tile_rows(shape.group());
    let mut rng = Rng::new(cfg.seed);
    let mut out = Vec::new();
    for &batch in &cfg.batches {
        for &context in &cfg.contexts {
            let stored_bytes = batch as u64 * context as u64 * row_bytes;
            if stored_bytes > cfg.max_kv_bytes || batch == 0 || context == 0 {
                continue;
            }
            let kv_bytes = batch as u64 * cfg.attended(context) as u64 * row_bytes;
            let lo = |len: i32| crate::launch::window_start(len as usize, cfg.window) as u64;
            let unit = cfg.block_sizes.iter().fold(1usize, |l, &b| l.max(b));
            let per_seq = context.div_ceil(unit) * unit;
            let num_slots = batch * per_seq;
            let mut layer = gpu.new_layer(cfg.dtype, num_slots, shape)?;
            let words = num_slots * shape.kv_row() * elem / 4;
            for b in [&mut layer.k, &mut layer.v] {
                match b {
                    KvBuf::F32(s) => gpu.fill_words(s, words, 0x3c00_0000)?,
                    KvBuf::Bf16(s) => gpu.fill_words(s, words, 0x3c00_3c00)?,
                }
            }
            let bases =
                gpu.upload(&(0..batch).map(|i| (i * per_seq) as i64).collect::<Vec<_>>())?;
            // Decode: one row per sequence at the full context.
            let dec_seq: Vec<i32> = (0..batch as i32).collect();
            let dec_len = vec![context as i32; batch];
            // Prefill: every position of every sequence, in query tiles.
            let pre_seq: Vec<i32> = (0..batch as i32)
                .flat_map(|s| std::iter::repeat_n(s, context))
                .collect();
            let pre_len: Vec<i32> = (0..batch).flat_map(|_| 1..=context as i32).collect();
            let pre_tiles = tiles(&pre_seq, &pre_len, tq);
            let ideal_prefill: u64 = pre_tiles
                .windows(2)
                .map(|w| {
                    let (first, last) = (pre_len[w[0] as usize], pre_len[w[1] as usize - 1]);
                    (last as u64 - lo(first)) * row_bytes
                })
                .sum();
            let per_row_prefill: u64 = pre_len
                .iter()
                .map(|&l| (l as u64 - lo(l)) * row_bytes)
                .sum();
            let scale = 1.0 / (shape.head_dim as f32).sqrt();
            let mut ws = Workspace::default();
            for &bs in &cfg.block_sizes {
                let nb = per_seq / bs;
                let mut perm: Vec<i32> = (0..(num_slots / bs) as i32).collect();
                rng.shuffle(&mut perm);
                let tables = gpu.upload(&perm)?;
                let paged = Addressing::Paged {
                    block_tables: &tables,
                    max_blocks: nb,
                    block_size: bs,
                };
                let contig = Addressing::Contiguous { seq_base: &bases };
                for (cache, addr) in [("paged", &paged), ("contiguous", &contig)] {
                    for phase in ["decode", "prefill"] {
                        let (seq, len) = match phase {
                            "decode" => (&dec_seq, &dec_len),
                            _ => (&pre_seq, &pre_len),
                        };
                        let n = seq.len();
                        let row_seq = gpu.upload(seq)?;
                        let row_len = gpu.upload(len)?;
                        let tile_buf = gpu.upload(&pre_tiles)?;
                        let q: Vec<f32> = (0..n * shape.q_row()).map(|_| rng.unit()).collect();
                        let q = gpu.upload(&q)?;
                        let mut o = gpu.zeros::<f32>(n * shape.q_row())?;
                        let rows = Rows {
                            row_seq: &row_seq,
                            row_len: &row_len,
                            rows: n,
                            max_len: context,
                            window: cfg.window,
                        };
                        let t = Tiles {
                            row0: &tile_buf,
                            count: pre_tiles.len() - 1,
                        };
                        let (parts, tiling) = match phase {
                            "decode" => (
                                plan_partitions(batch, shape.kv_heads, context, gpu.info.sm_count),
                                None,
                            ),
                            _ => (fixed_partitions(context, ATTN_MAX_PART_TOKENS), Some(&t)),
                        };
                        gpu.sync()?;
                        crate::emu::kernels::take_kv_read_bytes();
                        gpu.attention_tiled(
                            &layer, addr, &rows, tiling, &q, &mut o, parts, &mut ws, scale,
                        )?;
                        gpu.sync()?;
                        let read = crate::emu::kernels::take_kv_read_bytes();
                        let (ideal, per_row) = match phase {
                            "decode" => (kv_bytes, kv_bytes),
                            _ => (ideal_prefill, per_row_prefill),
                        };
                        out.push(ByteRow {
                            cache,
                            phase,
                            batch,
                            context_tokens: context,
                            block_size: bs,
                            kv_bytes,
                            kv_bytes_read: read,
                            kv_bytes_ideal: ideal,
                            kv_bytes_per_row: per_row,
                            partitions: parts.parts,
                            tile_rows: if phase == "decode" { 1 } else { tq },
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}
