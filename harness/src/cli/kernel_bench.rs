//! `kvbench kernel-bench`: decode attention, paged vs contiguous over the same bytes, next to a
//! streaming-read ceiling measured in the same run. Writes `kernel_bench.csv` under `--out`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use crate::backend::cpu::bench::{last_level_cache_bytes, run_grid, BenchConfig, BenchResult};
use crate::backend::BackendKind;
use crate::model::ModelShape;
use kvbench_kernels::AttnDims;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Compute backend (`auto` = cpu; `cuda` needs a GPU).
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendKind,
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
    /// Block sizes (comma-separated), overriding the grid.
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
    match args.backend.resolve() {
        BackendKind::Cpu => {}
        BackendKind::Cuda => return super::kernel_bench_cuda::run(&args.cuda_args()),
        other => bail!(
            "kernel-bench: backend {} has no attention kernels in this build (use --backend cpu)",
            other.name()
        ),
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
    let pick = |given: &[usize], quick: &[usize], full: &[usize]| -> Vec<usize> {
        if !given.is_empty() {
            given.to_vec()
        } else if args.quick {
            quick.to_vec()
        } else {
            full.to_vec()
        }
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
    if cfg.batches.contains(&0) || cfg.contexts.contains(&0) || cfg.block_sizes.contains(&0) {
        bail!("kernel-bench: batch, context and block size must be positive");
    }
    let res = run_grid(&cfg).context("kernel-bench")?;
    print_table(&res, &cfg, llc);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("kernel_bench.csv");
        let mut w =
            csv::Writer::from_path(&path).with_context(|| format!("writing {}", path.display()))?;
        for r in &res.rows {
            w.serialize(r)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        w.flush()
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
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
        "{:>5} {:>8} {:>5} {:>9} {:>11} {:>11} {:>8} {:>8} {:>8} {:>8}",
        "batch",
        "context",
        "block",
        "KV MiB",
        "paged us",
        "contig us",
        "paged/c",
        "GB/s",
        "ceil %",
        "> LLC"
    );
    for (pair, bytes) in res.rows.chunks(2).zip(res.kv_bytes.chunks(2)) {
        let [p, c] = pair else { continue };
        println!(
            "{:>5} {:>8} {:>5} {:>9.1} {:>11.1} {:>11.1} {:>8.3} {:>8.1} {:>7.1}% {:>8}",
            p.batch,
            p.context_tokens,
            p.block_size,
            bytes[0] as f64 / (1u64 << 20) as f64,
            p.time_us,
            c.time_us,
            p.time_us / c.time_us,
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
