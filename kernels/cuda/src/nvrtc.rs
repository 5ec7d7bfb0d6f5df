//! NVRTC: the library's version and compiling a program for one GPU architecture to a CUBIN.
//! The CI gate ([`compile`] for every program and `sm_80`/`sm_90`) fails on any warning too:
//! warnings (spills included, through `--warn-on-spills`) are returned separately from the log.
//! A program is compiled once per process ([`crate::nvrtc_cache`]).

use std::ffi::CString;
use std::time::Instant;

use cudarc::nvrtc::{result, sys};

use crate::libs::{guarded, CudaLib, LibError};
use crate::nvrtc_cache::{self, CacheKey};
use crate::source::ProgramId;

/// Architectures every program is compiled for in CI and by `kvbench doctor`.
pub const CHECK_ARCHS: [&str; 2] = ["sm_80", "sm_90"];

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Lib(#[from] LibError),
    #[error("NVRTC failed compiling {program} for {arch}: {status}\n{log}")]
    Failed {
        program: String,
        arch: String,
        status: String,
        log: String,
    },
}

/// A compiled program.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub program: String,
    pub arch: String,
    pub cubin: Vec<u8>,
    /// NVRTC's log (empty when it had nothing to say).
    pub log: String,
    /// Lines of the log that are warnings.
    pub warnings: Vec<String>,
    pub seconds: f64,
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32), LibError> {
    guarded(CudaLib::Nvrtc, || {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map(|()| (major, minor))
            .map_err(|e| LibError::Panicked {
                lib: CudaLib::Nvrtc,
                message: format!("nvrtcVersion: {e:?}"),
            })
    })?
}

/// The options every program is compiled with.
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-lineinfo".into(),
        "--ptxas-options=--warn-on-spills".into(),
    ]
}

/// Compiles `program` for `arch` (`sm_90`, ...) to a CUBIN, at most once per process (and once
/// per cache folder where `KVBENCH_KERNEL_CACHE` names one): see [`crate::nvrtc_cache`].
pub fn compile(program: ProgramId, arch: &str) -> Result<Compiled, CompileError> {
    compile_source(program.name(), &program.source(), arch)
}

/// Compiles any CUDA C text (`program` names it in errors), through the process-wide cache.
pub fn compile_source(program: &str, source: &str, arch: &str) -> Result<Compiled, CompileError> {
    let (major, minor) = version()?;
    let compiler = format!("{major}.{minor}");
    let options = options(arch);
    let key = CacheKey {
        program,
        arch,
        source,
        options: &options,
        compiler: &compiler,
    };
    let dir = nvrtc_cache::dir_from_env();
    nvrtc_cache::global().get_or_compile(&key, dir.as_deref(), || {
        compile_uncached(program, source, arch)
    })
}

/// The lines of an NVRTC log that are warnings.
pub fn warning_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.to_ascii_lowercase().contains("warning"))
        .map(String::from)
        .collect()
}

/// One NVRTC compilation, no cache.
pub fn compile_uncached(program: &str, source: &str, arch: &str) -> Result<Compiled, CompileError> {
    let t = Instant::now();
    let nul = |what: &str| CompileError::Failed {
        program: program.to_string(),
        arch: arch.to_string(),
        status: format!("{what} contains a NUL byte"),
        log: String::new(),
    };
    let src = CString::new(source).map_err(|_| nul("source"))?;
    let name = CString::new(format!("{program}.cu")).map_err(|_| nul("name"))?;
    let opts = options(arch);
    let fail = |status: String, log: String| CompileError::Failed {
        program: program.to_string(),
        arch: arch.to_string(),
        status,
        log,
    };
    let out = guarded(
        CudaLib::Nvrtc,
        || -> Result<(Vec<u8>, String), CompileError> {
            let prog = result::create_program(&src, Some(&name))
                .map_err(|e| fail(format!("{e:?}"), String::new()))?;
            // SAFETY: `prog` is a live program from create_program, destroyed once below.
            let compiled = unsafe { result::compile_program(prog, &opts) };
            let log = unsafe { result::get_program_log(prog) }
                .map(|v| {
                    let bytes: Vec<u8> = v
                        .iter()
                        .take_while(|&&c| c != 0)
                        .map(|&c| c as u8)
                        .collect();
                    String::from_utf8_lossy(&bytes).trim().to_string()
                })
                .unwrap_or_default();
            let cubin = match compiled {
                Ok(()) => unsafe { cubin(prog) },
                Err(e) => Err(format!("{e:?}")),
            };
            // SAFETY: destroyed exactly once.
            let _ = unsafe { result::destroy_program(prog) };
            match cubin {
                Ok(c) => Ok((c, log)),
                Err(status) => Err(fail(status, log)),
            }
        },
    )??;
    let (cubin, log) = out;
    let warnings = warning_lines(&log);
    Ok(Compiled {
        program: program.to_string(),
        arch: arch.to_string(),
        cubin,
        log,
        warnings,
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// # Safety
/// `prog` is a successfully compiled, live NVRTC program.
unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size)
        .result()
        .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))?;
    let mut buf = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _)
        .result()
        .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))?;
    Ok(buf)
}

/// True when `cubin` carries a symbol named `kernel` (its ELF string table holds the name).
pub fn defines(cubin: &[u8], kernel: &str) -> bool {
    let needle = [kernel.as_bytes(), &[0u8]].concat();
    cubin.windows(needle.len()).any(|w| w == needle.as_slice())
}

/// Compiles every program for every architecture in [`CHECK_ARCHS`], in parallel (NVRTC is
/// thread-safe), in (arch, program) order.
pub fn compile_all() -> Vec<(String, ProgramId, Result<Compiled, CompileError>)> {
    let jobs: Vec<(&str, ProgramId)> = CHECK_ARCHS
        .iter()
        .flat_map(|&a| ProgramId::ALL.into_iter().map(move |p| (a, p)))
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|&(arch, p)| s.spawn(move || compile(p, arch)))
            .collect();
        jobs.iter()
            .zip(handles)
            .map(|(&(arch, p), h)| {
                let r = h.join().unwrap_or_else(|_| {
                    Err(CompileError::Lib(LibError::Panicked {
                        lib: CudaLib::Nvrtc,
                        message: "compile thread panicked".into(),
                    }))
                });
                (arch.to_string(), p, r)
            })
            .collect()
    })
}
