//! `kvbench doctor`: what this machine offers — CPU and memory, the CUDA driver and its version,
//! the GPU, NVRTC (path and version), cuBLAS — and, wherever NVRTC exists, whether every kernel
//! program compiles for sm_80 and sm_90 (and the GPU's own architecture), with or without a GPU.
//!
//! Exit codes: 0 when every kernel compiled cleanly (or NVRTC is absent and not required);
//! 1 when a kernel failed to compile or compiled with a warning, or a `--require`d piece is
//! missing; 2 for bad arguments.

use std::process::ExitCode;

use anyhow::bail;
use kvbench_cuda::nvrtc::{compile, compile_all, CHECK_ARCHS};
use kvbench_cuda::probe::Probe;
use kvbench_cuda::{CudaLib, ProgramId};

use crate::cli::ExitStatus;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Pieces whose absence is a failure (exit 1): driver, nvrtc, cublas, gpu (comma-separated).
    #[arg(long, value_delimiter = ',')]
    require: Vec<String>,
    /// Skip the kernel compilation (report libraries and devices only).
    #[arg(long)]
    no_compile: bool,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
}

/// NVRTC's CUDA version against the driver's, and on a GPU every program compiled for it and
/// loaded as a run loads it, so a module the driver refuses is found here rather than at the
/// first run. True when something failed.
fn nvrtc_and_modules(probe: &Probe, no_compile: bool) -> bool {
    use kvbench_cuda::runtime::entry;
    let mut failed = false;
    let driver = probe
        .lib(CudaLib::Driver)
        .found
        .is_ok()
        .then(kvbench_cuda::device::driver_version)
        .and_then(Result::ok);
    let nvrtc = probe
        .lib(CudaLib::Nvrtc)
        .found
        .is_ok()
        .then(kvbench_cuda::nvrtc::version)
        .and_then(Result::ok);
    if let (Some(d), Some(n)) = (driver, nvrtc) {
        match entry::check_nvrtc(d, n) {
            Ok(None) => println!(
                "nvrtc vs driver: NVRTC {}.{} <= driver CUDA {}: ok",
                n.0,
                n.1,
                entry::version_name(d)
            ),
            Ok(Some(w)) => println!("nvrtc vs driver: WARN {w}"),
            Err(e) => {
                failed = true;
                println!("nvrtc vs driver: FAIL {e}");
            }
        }
    }
    if probe.gpu.is_ok() && nvrtc.is_some() && !no_compile {
        match kvbench_cuda::device::Gpu::open() {
            Ok(g) => println!(
                "modules: every program compiled for {} and loaded; events timed with {}",
                g.info.arch(),
                g.entry_points().elapsed.name()
            ),
            Err(e) => {
                failed = true;
                println!("modules: FAIL {e}");
            }
        }
    }
    failed
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    for r in &args.require {
        if !["driver", "nvrtc", "cublas", "gpu"].contains(&r.as_str()) {
            bail!("doctor: --require {r}: expected driver, nvrtc, cublas or gpu");
        }
    }
    let cpuinfo = read("/proc/cpuinfo");
    let meminfo = read("/proc/meminfo");
    let threads = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "cpu:     {} ({threads} threads)",
        field(&cpuinfo, "model name").unwrap_or("unknown")
    );
    let mem_kib: u64 = field(&meminfo, "MemTotal")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    println!("memory:  {:.1} GiB", mem_kib as f64 / (1u64 << 20) as f64);

    let probe = Probe::run();
    for s in &probe.libs {
        let label = match s.lib {
            CudaLib::Driver => "driver: ",
            CudaLib::Nvrtc => "nvrtc:  ",
            CudaLib::Cublas => "cublas: ",
        };
        match &s.found {
            Ok(f) => println!(
                "{label} {} — {} (via {})",
                s.version.as_deref().unwrap_or("version unknown"),
                f.path.display(),
                f.via
            ),
            Err(e) => println!("{label} missing — {e}"),
        }
    }
    match &probe.gpu {
        Ok(g) => println!(
            "gpu:     {} — {}, {} SMs, L2 {} MiB, {:.1} GiB",
            g.name,
            g.arch(),
            g.sm_count,
            g.l2_bytes >> 20,
            g.total_mem_bytes as f64 / (1u64 << 30) as f64
        ),
        Err(e) => println!("gpu:     none — {e}"),
    }

    let mut failed = false;
    if probe.lib(CudaLib::Nvrtc).found.is_ok() && !args.no_compile {
        let mut archs: Vec<String> = CHECK_ARCHS.iter().map(|s| s.to_string()).collect();
        if let Ok(g) = &probe.gpu {
            if !archs.contains(&g.arch()) {
                archs.push(g.arch());
            }
        }
        println!("kernels (NVRTC, every program for {}):", archs.join(", "));
        let mut results = compile_all();
        for arch in archs.iter().filter(|a| !CHECK_ARCHS.contains(&a.as_str())) {
            for p in ProgramId::ALL {
                results.push((arch.clone(), p, compile(p, arch)));
            }
        }
        for (arch, p, r) in results {
            match r {
                Ok(c) if c.warnings.is_empty() => println!(
                    "  ok    {arch} {:<15} {:>3} kernels, {:>8} bytes, {:.1} s",
                    p.name(),
                    p.kernels().len(),
                    c.cubin.len(),
                    c.seconds
                ),
                Ok(c) => {
                    failed = true;
                    println!("  WARN  {arch} {}:\n{}", p.name(), c.log);
                }
                Err(e) => {
                    failed = true;
                    println!("  FAIL  {arch} {}: {e}", p.name());
                }
            }
        }
    }
    failed |= nvrtc_and_modules(&probe, args.no_compile);
    let missing = probe.missing();
    if missing.is_empty() {
        println!("cuda backend: usable");
    } else {
        println!("cuda backend: not usable here — {}", missing.join("; "));
    }
    for r in &args.require {
        let absent = match r.as_str() {
            "driver" => probe.lib(CudaLib::Driver).found.is_err(),
            "nvrtc" => probe.lib(CudaLib::Nvrtc).found.is_err(),
            "cublas" => probe.lib(CudaLib::Cublas).found.is_err(),
            _ => probe.gpu.is_err(),
        };
        if absent {
            println!("required but missing: {r}");
            failed = true;
        }
    }
    if failed {
        return Err(anyhow::Error::new(ExitStatus(1)).context("doctor: a check failed"));
    }
    Ok(ExitCode::SUCCESS)
}
