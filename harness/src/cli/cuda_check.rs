//! `kvbench cuda-check`: the CUDA kernels' correctness grid against the f64 reference (needs a
//! GPU). Prints one compact table and, with `--out`, writes `cuda_check.csv`.
//!
//! Exit codes: 0 every check passed; 1 a check failed; 2 no usable GPU (the message names what
//! is missing) or bad arguments.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use kvbench_cuda::check::{self, CheckRow};
use kvbench_cuda::device::Gpu;
use kvbench_cuda::emu::EmuConfig;

use crate::cli::ExitStatus;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Folder for cuda_check.csv (created if missing).
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A reduced grid (bf16, GQA 4, head dim 128, block 16; every length), for sanitizer runs.
    #[arg(long)]
    quick: bool,
    /// The device: a GPU, or the emulated device (no GPU needed; the kernels' host build).
    #[arg(long, value_enum, default_value = "cuda")]
    backend: CheckBackend,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum CheckBackend {
    Cuda,
    CudaEmu,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let seed = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(args.seed);
    let gpu = match args.backend {
        CheckBackend::Cuda => Gpu::open().context("cuda-check: no usable GPU")?,
        CheckBackend::CudaEmu => {
            Gpu::emulated_open(EmuConfig::new(seed)).context("cuda-check: the emulated device")?
        }
    };
    println!(
        "cuda-check on {} ({}), seed {seed} (replay: KVBENCH_SEED={seed})",
        gpu.info.name,
        gpu.info.arch()
    );
    let size = if args.quick {
        check::GridSize::Quick
    } else {
        check::GridSize::Full
    };
    let rows = check::run(&gpu, seed, size).context("cuda-check")?;
    print_table(&rows);
    if let Some(dir) = &args.out {
        write_csv(dir, &rows)?;
    }
    let failed = rows.iter().filter(|r| !r.ok).count();
    if failed > 0 {
        for r in rows.iter().filter(|r| !r.ok) {
            println!(
                "FAIL {} {}: error {:e} > {:e}",
                r.kernel, r.case, r.max_abs_err, r.tolerance
            );
        }
        return Err(anyhow::Error::new(ExitStatus(1)).context(format!(
            "cuda-check: {failed} of {} checks failed",
            rows.len()
        )));
    }
    println!("cuda-check: all {} checks passed", rows.len());
    Ok(ExitCode::SUCCESS)
}

/// One line per kernel: checks, failures, largest error, tolerance.
fn print_table(rows: &[CheckRow]) {
    let mut by: BTreeMap<&str, (usize, usize, f64, f64)> = BTreeMap::new();
    for r in rows {
        let e = by
            .entry(r.kernel.as_str())
            .or_insert((0, 0, 0.0, r.tolerance));
        e.0 += 1;
        e.1 += usize::from(!r.ok);
        e.2 = e.2.max(r.max_abs_err);
    }
    println!(
        "{:<12} {:>6} {:>6} {:>12} {:>10}",
        "kernel", "checks", "failed", "max |err|", "tolerance"
    );
    for (k, (n, f, e, t)) in by {
        println!("{k:<12} {n:>6} {f:>6} {e:>12.3e} {t:>10.1e}");
    }
}

fn write_csv(dir: &std::path::Path, rows: &[CheckRow]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("cuda_check.csv");
    let mut w =
        csv::Writer::from_path(&path).with_context(|| format!("writing {}", path.display()))?;
    w.write_record(["kernel", "case", "max_abs_err", "tolerance", "ok"])?;
    for r in rows {
        w.write_record([
            r.kernel.clone(),
            r.case.clone(),
            format!("{:e}", r.max_abs_err),
            format!("{:e}", r.tolerance),
            r.ok.to_string(),
        ])?;
    }
    w.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
