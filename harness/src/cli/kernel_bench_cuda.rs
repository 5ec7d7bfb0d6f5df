//! `kvbench kernel-bench --backend cuda`: the CUDA decode-attention benchmark
//! ([`kvbench_cuda::bench`]), paged and contiguous over the same device storage, next to a
//! streaming-read ceiling measured in the same run. Writes `kernel_bench.csv` with the cpu
//! backend's columns first, then cuda's own (dtype, event and graph times, copies, partitions).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use kvbench_cuda::bench::{self, GpuBenchConfig, GpuBenchResult};
use kvbench_cuda::device::Gpu;
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
}

pub fn run(args: &CudaBenchArgs) -> anyhow::Result<ExitCode> {
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
    let cfg = GpuBenchConfig {
        batches: pick(&args.batch, &[1, 64], &[1, 16, 64]),
        contexts: pick(&args.context, &[2048], &[512, 2048, 8192]),
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
    let gpu = Gpu::open().context("kernel-bench --backend cuda: no usable GPU")?;
    let res = bench::run(&gpu, &cfg).context("kernel-bench")?;
    print_table(&gpu, &cfg, &res);
    if let Some(path) = &csv_path {
        write_csv(path, &cfg, &res)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(gpu: &Gpu, cfg: &GpuBenchConfig, res: &GpuBenchResult) {
    let s = cfg.shape;
    println!(
        "decode attention on {} ({}), one layer: {} q heads, {} kv heads, head dim {}, KV {}",
        gpu.info.name,
        gpu.info.arch(),
        s.q_heads,
        s.kv_heads,
        s.head_dim,
        cfg.dtype.name()
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
    w.write_record([
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
    ])?;
    for r in &res.rows {
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
