//! `kvbench kernel-bench --backend cuda`: the CUDA decode-attention benchmark
//! ([`kvbench_cuda::bench`]), paged and contiguous over the same device storage, next to a
//! streaming-read ceiling measured in the same run. Writes `kernel_bench.csv` with the cpu
//! backend's columns first, then cuda's own (dtype, event and graph times, copies, partitions,
//! phase, K/V bytes read and ideal, the sliding window). With `--window N` every row attends
//! its last N positions, as a sliding layer does; the byte figures are then the window's. On the emulated device (`--backend cuda-emu`) nothing is
//! timed: the emulator counts the K/V bytes each kernel reads, for decode and for prefill, and
//! the file's timing fields are empty.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use kvbench_cuda::bench::{self, ByteRow, GpuBenchConfig, GpuBenchResult};
use kvbench_cuda::device::Gpu;
use kvbench_cuda::emu::EmuConfig;
use kvbench_cuda::launch::AttnShape;
use kvbench_cuda::KvDtype;

use super::kernel_bench_grid::{csv_target, grid_axis};
use crate::model::ModelShape;

/// The flags of `kernel-bench` that the cuda branch reads.
#[derive(Debug, Clone)]
pub struct CudaBenchArgs {
    pub out: Option<PathBuf>,
    pub quick: bool,
    pub model: String,
    pub dtype: String,
    pub batch: Vec<usize>,
    pub context: Vec<usize>,
    pub block_size: Vec<usize>,
    pub max_gib: f64,
    pub seed: u64,
    /// Sliding window in tokens (0: full attention).
    pub window: usize,
}

pub fn run(args: &CudaBenchArgs, emulated: bool) -> anyhow::Result<ExitCode> {
    let Some(m) = ModelShape::preset(&args.model) else {
        bail!(
            "kernel-bench: --model {}: unknown preset (known: {})",
            args.model,
            ModelShape::PRESETS.join(", ")
        );
    };
    let Some(dtype) = KvDtype::parse(&args.dtype) else {
        bail!("kernel-bench: --dtype {}: expected f32 or bf16", args.dtype);
    };
    let pick = |given: &[usize], quick: &[usize], full: &[usize]| {
        grid_axis(args.quick, given, quick, full)
    };
    // The emulator runs every CUDA thread on the host: its grid is small.
    let (batches, contexts): (&[usize], &[usize]) = if emulated {
        (&[1, 4], &[128, 512])
    } else {
        (&[1, 16, 64], &[512, 2048, 8192])
    };
    let cfg = GpuBenchConfig {
        batches: pick(&args.batch, &batches[..2], batches),
        contexts: pick(&args.context, &contexts[..1], contexts),
        block_sizes: pick(&args.block_size, &[16], &[8, 16, 32]),
        shape: AttnShape {
            q_heads: m.q_heads as usize,
            kv_heads: m.kv_heads_per_device() as usize,
            head_dim: m.head_dim as usize,
        },
        dtype,
        reps: if args.quick { 10 } else { 30 },
        max_kv_bytes: (args.max_gib * (1u64 << 30) as f64) as u64,
        seed: args.seed,
        window: args.window,
    };
    if cfg.batches.contains(&0) || cfg.contexts.contains(&0) {
        bail!("kernel-bench: batch and context must be positive");
    }
    for &b in &cfg.block_sizes {
        kvbench_cuda::launch::log2_block_size(b).context("kernel-bench --block-size")?;
    }
    cfg.shape.check().context("kernel-bench --model")?;
    // The output folder is made (or refused) before any measurement, as on cpu.
    let csv_path = csv_target(args.out.as_deref())?;
    if emulated {
        let gpu = Gpu::emulated_open(EmuConfig::new(args.seed))
            .context("kernel-bench --backend cuda-emu: the emulated device")?;
        let rows = bench::count_bytes(&gpu, &cfg).context("kernel-bench")?;
        print_bytes(&cfg, &rows);
        if let Some(path) = &csv_path {
            write_bytes_csv(path, &cfg, &rows)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let gpu = Gpu::open().context("kernel-bench --backend cuda: no usable GPU")?;
    let res = bench::run(&gpu, &cfg).context("kernel-bench")?;
    print_table(&gpu, &cfg, &res);
    if let Some(path) = &csv_path {
        write_csv(path, &cfg, &res)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn window_note(cfg: &GpuBenchConfig) -> String {
    match cfg.window {
        0 => String::new(),
        w => format!(", sliding window {w} tokens"),
    }
}

fn print_table(gpu: &Gpu, cfg: &GpuBenchConfig, res: &GpuBenchResult) {
    let s = cfg.shape;
    println!(
        "decode attention on {} ({}), one layer: {} q heads, {} kv heads, head dim {}, KV {}{}",
        gpu.info.name,
        gpu.info.arch(),
        s.q_heads,
        s.kv_heads,
        s.head_dim,
        cfg.dtype.name(),
        window_note(cfg)
    );
    println!(
        "read-bandwidth ceiling: {:.0} GB/s (streaming {} MiB); L2 {} MiB",
        res.ceiling_gbytes_per_s,
        res.ceiling_bytes >> 20,
        gpu.info.l2_bytes >> 20
    );
    println!(
        "{:>5} {:>8} {:>5} {:>9} {:>10} {:>10} {:>8} {:>8} {:>7} {:>6}",
        "batch",
        "context",
        "block",
        "KV MiB",
        "paged us",
        "contig us",
        "paged/c",
        "GB/s",
        "ceil %",
        "parts"
    );
    for pair in res.rows.chunks(2) {
        let [p, c] = pair else { continue };
        println!(
            "{:>5} {:>8} {:>5} {:>9.1} {:>10.2} {:>10.2} {:>8.3} {:>8.0} {:>6.1}% {:>6}",
            p.batch,
            p.context_tokens,
            p.block_size,
            p.kv_bytes as f64 / (1u64 << 20) as f64,
            p.time_us,
            c.time_us,
            p.time_us / c.time_us,
            p.gbytes_per_s,
            p.ceiling_fraction * 100.0,
            p.partitions
        );
    }
}

fn write_csv(
    path: &std::path::Path,
    cfg: &GpuBenchConfig,
    res: &GpuBenchResult,
) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(CSV_HEADER)?;
    for r in &res.rows {
        write_gpu_row(&mut w, cfg, res, r)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| anyhow::anyhow!("kernel_bench.csv: {e}"))?;
    let text = String::from_utf8(bytes).context("kernel_bench.csv")?;
    crate::results::staging::write_file_atomic(path, &text)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// `kernel_bench.csv`'s columns on cuda and cuda-emu: the cpu file's eight, then cuda's own
/// (`window_tokens`: the sliding window, 0 for full attention).
const CSV_HEADER: [&str; 19] = [
    "backend",
    "cache",
    "batch",
    "context_tokens",
    "block_size",
    "time_us",
    "gbytes_per_s",
    "ceiling_fraction",
    "dtype",
    "time_events_us",
    "time_graph_us",
    "kv_bytes",
    "rotating_copies",
    "partitions",
    "ceiling_gbytes_per_s",
    "phase",
    "kv_bytes_read",
    "kv_bytes_ideal",
    "window_tokens",
];

fn write_gpu_row(
    w: &mut csv::Writer<Vec<u8>>,
    cfg: &GpuBenchConfig,
    res: &GpuBenchResult,
    r: &bench::GpuBenchRow,
) -> anyhow::Result<()> {
    w.write_record([
        "cuda".to_string(),
        r.cache.to_string(),
        r.batch.to_string(),
        r.context_tokens.to_string(),
        r.block_size.to_string(),
        format!("{:.3}", r.time_us),
        format!("{:.2}", r.gbytes_per_s),
        format!("{:.4}", r.ceiling_fraction),
        cfg.dtype.name().to_string(),
        format!("{:.3}", r.time_events_us),
        r.time_graph_us.map_or(String::new(), |t| format!("{t:.3}")),
        r.kv_bytes.to_string(),
        r.rotating_copies.to_string(),
        r.partitions.to_string(),
        format!("{:.2}", res.ceiling_gbytes_per_s),
        // A GPU has no byte counter: the count comes from the emulator.
        "decode".to_string(),
        String::new(),
        r.kv_bytes.to_string(),
        cfg.window.to_string(),
    ])?;
    Ok(())
}

fn print_bytes(cfg: &GpuBenchConfig, rows: &[ByteRow]) {
    let s = cfg.shape;
    println!(
        "K/V bytes read by the attention kernels on the emulated device (counted per load), one \
         layer: {} q heads, {} kv heads, head dim {}, KV {}{}",
        s.q_heads,
        s.kv_heads,
        s.head_dim,
        cfg.dtype.name(),
        window_note(cfg)
    );
    println!(
        "{:>10} {:>7} {:>5} {:>8} {:>5} {:>5} {:>5} {:>13} {:>13} {:>7} {:>9}",
        "cache",
        "phase",
        "batch",
        "context",
        "block",
        "tile",
        "parts",
        "read bytes",
        "ideal bytes",
        "read/id",
        "per-row/id"
    );
    for r in rows {
        println!(
            "{:>10} {:>7} {:>5} {:>8} {:>5} {:>5} {:>5} {:>13} {:>13} {:>7.3} {:>9.2}",
            r.cache,
            r.phase,
            r.batch,
            r.context_tokens,
            r.block_size,
            r.tile_rows,
            r.partitions,
            r.kv_bytes_read,
            r.kv_bytes_ideal,
            r.ratio(),
            r.kv_bytes_per_row as f64 / r.kv_bytes_ideal.max(1) as f64
        );
    }
}

/// The same columns as the GPU's file; the timing fields are empty (nothing is timed).
fn write_bytes_csv(
    path: &std::path::Path,
    cfg: &GpuBenchConfig,
    rows: &[ByteRow],
) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(CSV_HEADER)?;
    for r in rows {
        w.write_record([
            "cuda-emu".to_string(),
            r.cache.to_string(),
            r.batch.to_string(),
            r.context_tokens.to_string(),
            r.block_size.to_string(),
            String::new(),
            String::new(),
            String::new(),
            cfg.dtype.name().to_string(),
            String::new(),
            String::new(),
            r.kv_bytes.to_string(),
            "1".to_string(),
            r.partitions.to_string(),
            String::new(),
            r.phase.to_string(),
            r.kv_bytes_read.to_string(),
            r.kv_bytes_ideal.to_string(),
            cfg.window.to_string(),
        ])?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| anyhow::anyhow!("kernel_bench.csv: {e}"))?;
    let text = String::from_utf8(bytes).context("kernel_bench.csv")?;
    crate::results::staging::write_file_atomic(path, &text)?;
    println!("wrote {}", path.display());
    Ok(())
}
