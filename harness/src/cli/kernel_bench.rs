//! `kvbench kernel-bench`: decode attention, paged vs contiguous over the same bytes, next to a
//! streaming-read ceiling measured in the same run. Writes `kernel_bench.csv` under `--out`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use super::kernel_bench_grid::{csv_target, grid_axis};
use crate::backend::cpu::bench::{last_level_cache_bytes, run_grid, BenchConfig, BenchResult};
use crate::model::ModelShape;
use kvbench_kernels::AttnDims;

/// The backends with attention kernels in this build (the others exit 2, so they are not offered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KernelBackend {
    /// The cpu kernels (cuda runs only when named).
    Auto,
    Cpu,
    /// The CUDA kernels (needs a GPU; exits 2 naming what is missing otherwise).
    Cuda,
}

/// Bounds that keep every grid point's byte count (batch × context × row × 2 × element) far
/// inside u64, so the sizes below are refused rather than wrapped.
const MAX_BATCH: usize = 1 << 16;
const MAX_CONTEXT_TOKENS: usize = 1 << 24;
const MAX_BLOCK_SIZE: usize = 1 << 16;
const MAX_GIB: f64 = (1u64 << 20) as f64;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Compute backend.
    #[arg(long, value_enum, default_value = "auto")]
    backend: KernelBackend,
    /// Folder for kernel_bench.csv (created if missing).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A small grid that finishes in seconds.
    #[arg(long)]
    quick: bool,
    /// Model preset whose attention heads one layer uses.
    #[arg(long, default_value = "llama3-8b")]
    model: String,
    /// KV element type: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Batch sizes (comma-separated), overriding the grid.
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// Context lengths in tokens (comma-separated), overriding the grid.
    #[arg(long, value_delimiter = ',')]
    context: Vec<usize>,
    /// Block sizes (comma-separated, powers of two), overriding the grid.
    #[arg(long, value_delimiter = ',')]
    block_size: Vec<usize>,
    /// Skip grid points whose K/V exceed this many GiB.
    #[arg(long, default_value_t = 2.0)]
    max_gib: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl Args {
    fn cuda_args(&self) -> super::kernel_bench_cuda::CudaBenchArgs {
        super::kernel_bench_cuda::CudaBenchArgs {
            out: self.out.clone(),
            quick: self.quick,
            model: self.model.clone(),
            dtype: self.dtype.clone(),
            batch: self.batch.clone(),
            context: self.context.clone(),
            block_size: self.block_size.clone(),
            max_gib: self.max_gib,
            seed: self.seed,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    check_flags(&args)?;
    // Auto and cpu run the cpu kernels; cuda its own benchmark.
    if args.backend == KernelBackend::Cuda {
        return super::kernel_bench_cuda::run(&args.cuda_args());
    }
    let Some(shape) = ModelShape::preset(&args.model) else {
        bail!(
            "kernel-bench: --model {}: unknown preset (known: {})",
            args.model,
            ModelShape::PRESETS.join(", ")
        );
    };
    let bf16 = match args.dtype.as_str() {
        "f32" => false,
        "bf16" => true,
        d => bail!("kernel-bench: --dtype {d}: expected f32 or bf16"),
    };
    let llc = last_level_cache_bytes();
    let pick = |given: &[usize], quick: &[usize], full: &[usize]| {
        grid_axis(args.quick, given, quick, full)
    };
    let cfg = BenchConfig {
        batches: pick(&args.batch, &[1, 8], &[1, 8, 32]),
        contexts: pick(&args.context, &[512, 4096], &[1024, 4096, 16384]),
        block_sizes: pick(&args.block_size, &[16], &[8, 16, 32]),
        dims: AttnDims {
            q_heads: shape.q_heads as usize,
            kv_heads: shape.kv_heads as usize,
            head_dim: shape.head_dim as usize,
        },
        bf16,
        max_kv_bytes: (args.max_gib * (1u64 << 30) as f64) as u64,
        // Larger than the caches, so the ceiling is memory, not cache, bandwidth.
        ceiling_bytes: if args.quick {
            256 << 20
        } else {
            (2 * llc.unwrap_or(0)).max(1 << 30)
        },
        min_time_s: if args.quick { 0.1 } else { 0.6 },
        seed: args.seed,
    };
    // The output folder is made (or refused) before minutes of measurement, not after.
    let csv_path = csv_target(args.out.as_deref())?;
    let res = run_grid(&cfg).context("kernel-bench")?;
    print_table(&res, &cfg, llc);
    if let Some(path) = &csv_path {
        let mut w = csv::Writer::from_writer(Vec::new());
        for r in &res.rows {
            w.serialize(r)
                .map_err(|e| anyhow::anyhow!("kernel_bench.csv: {e}"))?;
        }
        let bytes = w
            .into_inner()
            .map_err(|e| anyhow::anyhow!("kernel_bench.csv: {e}"))?;
        let text = String::from_utf8(bytes).context("kernel_bench.csv")?;
        crate::results::staging::write_file_atomic(path, &text)?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuse flags the grid cannot honour, before any measurement.
fn check_flags(args: &Args) -> anyhow::Result<()> {
    let in_range = |flag: &str, xs: &[usize], max: usize| -> anyhow::Result<()> {
        match xs.iter().find(|&&x| x == 0 || x > max) {
            Some(x) => bail!("kernel-bench: --{flag} {x}: expected 1 to {max}"),
            None => Ok(()),
        }
    };
    in_range("batch", &args.batch, MAX_BATCH)?;
    in_range("context", &args.context, MAX_CONTEXT_TOKENS)?;
    in_range("block-size", &args.block_size, MAX_BLOCK_SIZE)?;
    if let Some(b) = args.block_size.iter().find(|b| !b.is_power_of_two()) {
        bail!("kernel-bench: --block-size {b}: not a power of two (1, 2, 4, ..., 16, 32, ...)");
    }
    if !(args.max_gib.is_finite() && args.max_gib > 0.0 && args.max_gib <= MAX_GIB) {
        bail!(
            "kernel-bench: --max-gib {}: expected a number of GiB above 0 and at most {MAX_GIB}",
            args.max_gib
        );
    }
    Ok(())
}

fn print_table(res: &BenchResult, cfg: &BenchConfig, llc: Option<u64>) {
    let d = cfg.dims;
    println!(
        "decode attention, one layer: {} q heads, {} kv heads, head dim {}, KV {}; threads {}",
        d.q_heads,
        d.kv_heads,
        d.head_dim,
        if cfg.bf16 { "bf16" } else { "f32" },
        rayon::current_num_threads()
    );
    println!(
        "streaming-read ceiling: {:.1} GB/s (sum over {} MiB); last-level cache {}",
        res.ceiling_gbytes_per_s,
        cfg.ceiling_bytes >> 20,
        llc.map_or("unknown".into(), |b| format!("{} MiB", b >> 20))
    );
    println!(
        "{:>5} {:>8} {:>5} {:>9} {:>11} {:>11} {:>11} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "batch",
        "context",
        "block",
        "KV MiB",
        "paged us",
        "placed us",
        "contig us",
        "paged/c",
        "placed/c",
        "GB/s",
        "ceil %",
        "> LLC"
    );
    // Rows come in threes per grid point: paged, paged with extents placement, contiguous.
    for (set, bytes) in res.rows.chunks(3).zip(res.kv_bytes.chunks(3)) {
        let [p, x, c] = set else { continue };
        println!(
            "{:>5} {:>8} {:>5} {:>9.1} {:>11.1} {:>11.1} {:>11.1} {:>8.3} {:>8.3} {:>8.1} {:>7.1}% {:>8}",
            p.batch,
            p.context_tokens,
            p.block_size,
            bytes[0] as f64 / (1u64 << 20) as f64,
            p.time_us,
            x.time_us,
            c.time_us,
            p.time_us / c.time_us,
            x.time_us / c.time_us,
            p.gbytes_per_s,
            p.ceiling_fraction * 100.0,
            if llc.is_some_and(|l| bytes[0] > l) {
                "yes"
            } else {
                "no"
            }
        );
    }
}
