//! `kvbench kernel-bench`: decode attention, paged vs contiguous over the same bytes, next to a
//! streaming-read ceiling measured in the same run. Writes `kernel_bench.csv` under `--out`.
//! With `--repeats N` each grid point is measured N times side by side and each layout's ratio
//! to contiguous is reported as the median of the N paired ratios with a distribution-free
//! interval (`kernel_bench_ratio.rs`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use super::kernel_bench_grid::{csv_target, grid_axis};
use super::kernel_bench_ratio::{median_interval, paired_ratios, CONFIDENCE};
use crate::backend::cpu::bench::{
    last_level_cache_bytes, run_grid, BenchConfig, BenchResult, BenchRow,
};
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
    /// The CUDA kernels on the emulated device: K/V bytes read per kernel, decode and
    /// prefill, beside the least each must read (counts, not timings).
    CudaEmu,
}

/// Bounds that keep every grid point's byte count (batch × context × row × 2 × element) far
/// inside u64, so the sizes below are refused rather than wrapped.
const MAX_BATCH: usize = 1 << 16;
const MAX_CONTEXT_TOKENS: usize = 1 << 24;
const MAX_BLOCK_SIZE: usize = 1 << 16;
const MAX_GIB: f64 = (1u64 << 20) as f64;
/// More repeats than anyone waits for: a typo, refused.
const MAX_REPEATS: usize = 10_000;
/// Longer runs than any pool here holds blocks: a typo, refused.
const MAX_RUN_BLOCKS: usize = 1 << 20;

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
    /// Measurements of each grid point (cpu), the three layouts side by side in each, their
    /// order rotated; ratios are reported as the median over repeats with a 95% interval
    /// (reached from 6 repeats on).
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Extent-length sweep (cpu): one more paged layout per run length in blocks
    /// (comma-separated), `paged-runs-L`, whose sequences hold runs of L address-consecutive
    /// blocks with the runs shuffled over the pool.
    #[arg(long, value_delimiter = ',')]
    run_blocks: Vec<usize>,
    /// Sliding window in tokens (cuda, cuda-emu): every decode row attends its last N
    /// positions only, as a sliding layer does (0: full attention).
    #[arg(long, default_value_t = 0)]
    window: usize,
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
            window: self.window,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    check_flags(&args)?;
    // Auto and cpu run the cpu kernels; cuda its own benchmark.
    if matches!(args.backend, KernelBackend::Cuda | KernelBackend::CudaEmu) {
        if args.repeats != 1 {
            bail!("kernel-bench: --repeats is for the cpu kernels; the cuda benchmark times its own rounds");
        }
        if !args.run_blocks.is_empty() {
            bail!("kernel-bench: --run-blocks is for the cpu kernels");
        }
        if args.window > MAX_CONTEXT_TOKENS {
            bail!(
                "kernel-bench: --window {}: at most {MAX_CONTEXT_TOKENS} tokens",
                args.window
            );
        }
        return super::kernel_bench_cuda::run(
            &args.cuda_args(),
            args.backend == KernelBackend::CudaEmu,
        );
    }
    if args.window != 0 {
        bail!("kernel-bench: --window is for the cuda kernels (--backend cuda or cuda-emu)");
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
        repeats: args.repeats,
        seed: args.seed,
        run_blocks: args.run_blocks.clone(),
    };
    // The output folder is made (or refused) before minutes of measurement, not after.
    let csv_path = csv_target(args.out.as_deref())?;
    let load_before = load_average();
    let res = run_grid(&cfg).context("kernel-bench")?;
    let rows = csv_rows(&res.rows)?;
    print_table(&res, &rows, &cfg, llc, [load_before, load_average()]);
    if let Some(path) = &csv_path {
        let mut w = csv::Writer::from_writer(Vec::new());
        for r in &rows {
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

/// One line of `kernel_bench.csv`: the first eight columns are the file's original contract;
/// the rest were added after them.
#[derive(Debug, Clone, serde::Serialize)]
struct CsvRow<'a> {
    backend: &'a str,
    cache: &'a str,
    batch: usize,
    context_tokens: usize,
    block_size: usize,
    time_us: f64,
    gbytes_per_s: f64,
    ceiling_fraction: f64,
    repeats: usize,
    /// The median over repeats of each repeat's fastest call.
    time_us_median: f64,
    /// This cache's time over contiguous's in the same repeat: median over the repeats, and the
    /// distribution-free interval for it (1 for contiguous itself).
    ratio_median: f64,
    ratio_low: f64,
    ratio_high: f64,
    ratio_confidence: f64,
}

/// Whether two rows are of the same grid point.
fn same_point(a: &BenchRow, b: &BenchRow) -> bool {
    (a.batch, a.context_tokens, a.block_size) == (b.batch, b.context_tokens, b.block_size)
}

/// The CSV's rows, each with its ratio to the contiguous row of its grid point. A grid point's
/// rows are consecutive: paged, paged with extents placement, contiguous, then any
/// `paged-runs-L`.
fn csv_rows(rows: &[BenchRow]) -> anyhow::Result<Vec<CsvRow<'_>>> {
    let mut out = Vec::with_capacity(rows.len());
    for set in rows.chunk_by(same_point) {
        let Some(contiguous) = set.iter().find(|r| r.cache == "contiguous") else {
            bail!("kernel-bench: a grid point without its contiguous row");
        };
        for r in set {
            let ratio = paired_ratios(&r.repeat_time_us, &contiguous.repeat_time_us)
                .as_deref()
                .and_then(median_interval);
            let Some(ratio) = ratio else {
                bail!(
                    "kernel-bench: batch {} context {} block {} {}: a time that is not a \
                     positive number",
                    r.batch,
                    r.context_tokens,
                    r.block_size,
                    r.cache
                );
            };
            let time = median_interval(&r.repeat_time_us).map_or(r.time_us, |m| m.median);
            out.push(CsvRow {
                backend: &r.backend,
                cache: &r.cache,
                batch: r.batch,
                context_tokens: r.context_tokens,
                block_size: r.block_size,
                time_us: r.time_us,
                gbytes_per_s: r.gbytes_per_s,
                ceiling_fraction: r.ceiling_fraction,
                repeats: r.repeat_time_us.len(),
                time_us_median: time,
                ratio_median: ratio.median,
                ratio_low: ratio.low,
                ratio_high: ratio.high,
                ratio_confidence: ratio.confidence,
            });
        }
    }
    Ok(out)
}

/// The 1-minute load average, where `/proc` says: how busy the machine was around the run.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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
    in_range("repeats", &[args.repeats], MAX_REPEATS)?;
    in_range("run-blocks", &args.run_blocks, MAX_RUN_BLOCKS)?;
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

fn print_table(
    res: &BenchResult,
    rows: &[CsvRow<'_>],
    cfg: &BenchConfig,
    llc: Option<u64>,
    load: [Option<f64>; 2],
) {
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
        "streaming-read ceiling: {:.1} GB/s (sum over {} MiB); last-level cache {}; load average {} before, {} after",
        res.ceiling_gbytes_per_s,
        cfg.ceiling_bytes >> 20,
        llc.map_or("unknown".into(), |b| format!("{} MiB", b >> 20)),
        load[0].map_or("unknown".into(), |l| format!("{l:.2}")),
        load[1].map_or("unknown".into(), |l| format!("{l:.2}")),
    );
    let repeats = rows.first().map_or(0, |r| r.repeats);
    let confidence = rows.first().map_or(0.0, |r| r.ratio_confidence);
    println!(
        "times: fastest call; ratios /c: median of {repeats} side-by-side repeats [interval for \
         the median, confidence {:.1}%{}]",
        confidence * 100.0,
        if confidence < CONFIDENCE {
            format!(": {:.0}% needs 6 repeats or more", CONFIDENCE * 100.0)
        } else {
            String::new()
        }
    );
    println!(
        "{:>5} {:>8} {:>5} {:>9} {:>10} {:>10} {:>10} {:>21} {:>21} {:>6} {:>6} {:>5}",
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
    let ratio = |r: &CsvRow<'_>| {
        format!(
            "{:.3} [{:.3}, {:.3}]",
            r.ratio_median, r.ratio_low, r.ratio_high
        )
    };
    let mut at = 0;
    for set in rows.chunk_by(|a, b| {
        (a.batch, a.context_tokens, a.block_size) == (b.batch, b.context_tokens, b.block_size)
    }) {
        let bytes = &res.kv_bytes[at..at + set.len()];
        at += set.len();
        let [p, x, c, runs @ ..] = set else { continue };
        println!(
            "{:>5} {:>8} {:>5} {:>9.1} {:>10.1} {:>10.1} {:>10.1} {:>21} {:>21} {:>6.1} {:>5.1}% {:>5}",
            p.batch,
            p.context_tokens,
            p.block_size,
            bytes[0] as f64 / (1u64 << 20) as f64,
            p.time_us,
            x.time_us,
            c.time_us,
            ratio(p),
            ratio(x),
            p.gbytes_per_s,
            p.ceiling_fraction * 100.0,
            if llc.is_some_and(|l| bytes[0] > l) {
                "yes"
            } else {
                "no"
            }
        );
        for r in runs {
            println!("{:>63} {:>21} {:>21}", r.cache, "", ratio(r));
        }
    }
}
