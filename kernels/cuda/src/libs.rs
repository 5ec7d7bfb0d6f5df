//! Finding and opening the CUDA libraries at run time: the driver (`libcuda`), NVRTC and cuBLAS.
//!
//! Nothing is linked at build time. cudarc opens its libraries by bare name and panics when none
//! is found; this module opens them first — by full path where needed — and turns absence into a
//! [`LibError`] that names the library. Once a library is open under its soname (say
//! `libnvrtc.so.12` from a Python wheel's folder), cudarc's own `dlopen("libnvrtc.so.12")` finds
//! the loaded copy, so wheel-installed NVRTC works with no `LD_LIBRARY_PATH`.
//!
//! Search order per library: the folders in `KVBENCH_CUDA_LIB_DIR` (colon-separated), the system
//! loader's own search (bare sonames), then the NVIDIA wheel folders inside every Python
//! site-packages folder found (`python3 -c 'import sys; print(sys.path)'`, plus common prefixes).

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One of the CUDA libraries kvbench uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaLib {
    Driver,
    Nvrtc,
    Cublas,
}

impl CudaLib {
    pub const ALL: [CudaLib; 3] = [CudaLib::Driver, CudaLib::Nvrtc, CudaLib::Cublas];

    pub fn name(self) -> &'static str {
        match self {
            CudaLib::Driver => "CUDA driver (libcuda)",
            CudaLib::Nvrtc => "NVRTC (libnvrtc)",
            CudaLib::Cublas => "cuBLAS (libcublas)",
        }
    }

    /// The short key used by `KVBENCH_CUDA_HIDE` and in messages: driver, nvrtc, cublas.
    pub fn key(self) -> &'static str {
        match self {
            CudaLib::Driver => "driver",
            CudaLib::Nvrtc => "nvrtc",
            CudaLib::Cublas => "cublas",
        }
    }

    /// Sonames tried, in the order cudarc (built with `cuda-13000`) tries them — the
    /// unversioned name first — so that the system loader's choice here is cudarc's too.
    pub fn sonames(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &["libcuda.so", "libcuda.so.1"],
            CudaLib::Nvrtc => &["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"],
            CudaLib::Cublas => &["libcublas.so", "libcublas.so.13", "libcublas.so.12"],
        }
    }

    /// Folders, relative to a site-packages folder, where NVIDIA's wheels put the library.
    fn wheel_dirs(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &[],
            CudaLib::Nvrtc => &[
                "nvidia/cu13/lib",
                "nvidia/cuda_nvrtc/lib",
                "nvidia/cu12/lib",
            ],
            CudaLib::Cublas => &["nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cu12/lib"],
        }
    }

    /// A symbol every version exports, used to ask the loader where the library came from.
    fn probe_symbol(self) -> &'static CStr {
        match self {
            CudaLib::Driver => c"cuInit",
            CudaLib::Nvrtc => c"nvrtcVersion",
            CudaLib::Cublas => c"cublasGetProperty",
        }
    }
}

/// Why a CUDA library cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibError {
    #[error("{} not found (tried {tried}); install it or point KVBENCH_CUDA_LIB_DIR at its folder", .lib.name())]
    Missing { lib: CudaLib, tried: String },
    #[error("{} hidden by KVBENCH_CUDA_HIDE", .lib.name())]
    Hidden { lib: CudaLib },
    #[error("{} failed inside cudarc: {message}", .lib.name())]
    Panicked { lib: CudaLib, message: String },
}

/// A library that is open for the rest of the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub lib: CudaLib,
    /// The file the loader actually mapped.
    pub path: PathBuf,
    /// How it was found: `KVBENCH_CUDA_LIB_DIR`, `system loader` or `python package`.
    pub via: &'static str,
}

/// Whether a test that needs NVRTC (not a GPU) runs here: `Ok(true)` where NVRTC opens (saying
/// from where on stderr), `Ok(false)` where it does not (printing `SKIP: no NVRTC: …`), and the
/// error where `KVBENCH_REQUIRE_NVRTC=1` (CI, which installs the wheel) makes absence a failure.
pub fn nvrtc_or_skip() -> Result<bool, LibError> {
    match open(CudaLib::Nvrtc) {
        Ok(found) => {
            eprintln!("NVRTC: {} (via {})", found.path.display(), found.via);
            Ok(true)
        }
        Err(e) if std::env::var("KVBENCH_REQUIRE_NVRTC").as_deref() == Ok("1") => Err(e),
        Err(e) => {
            eprintln!("SKIP: no NVRTC: {e}");
            Ok(false)
        }
    }
}

/// Opens `lib` (once per process) or says why it cannot be.
pub fn open(lib: CudaLib) -> Result<&'static Found, LibError> {
    static SLOTS: [OnceLock<Result<Found, LibError>>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    if hidden(lib) {
        return Err(LibError::Hidden { lib });
    }
    SLOTS[lib as usize]
        .get_or_init(|| search(lib).map(as_cudarc_opened))
        .as_ref()
        .map_err(Clone::clone)
}

/// `found` with `path` replaced by the file cudarc's own loader mapped, when that differs: the
/// library reported is then the one every call goes to. (cudarc opens by bare name; with a
/// `KVBENCH_CUDA_LIB_DIR` copy open, its `dlopen("libnvrtc.so")` can still find the system's.)
fn as_cudarc_opened(found: Found) -> Found {
    let lib = found.lib;
    let used = std::panic::catch_unwind(|| {
        // SAFETY: cudarc's loaders run the library's initialisers only; a missing library panics
        // (caught here), it never returns an invalid handle.
        let handle = unsafe {
            match lib {
                CudaLib::Driver => cudarc::driver::sys::culib(),
                CudaLib::Nvrtc => cudarc::nvrtc::sys::culib(),
                CudaLib::Cublas => cudarc::cublas::sys::culib(),
            }
        };
        loaded_path(handle, lib.probe_symbol())
    });
    match used {
        Ok(Some(path)) if path != found.path => Found {
            path,
            via: "cudarc's loader (bare name)",
            ..found
        },
        _ => found,
    }
}

/// `KVBENCH_CUDA_HIDE=driver,nvrtc,cublas` makes the named libraries count as absent, so the
/// absent-library paths are tested on machines that have them.
fn hidden(lib: CudaLib) -> bool {
    std::env::var("KVBENCH_CUDA_HIDE")
        .map(|v| v.split(',').any(|k| k.trim() == lib.key()))
        .unwrap_or(false)
}

fn search(lib: CudaLib) -> Result<Found, LibError> {
    let mut tried: Vec<String> = Vec::new();
    let env_dirs: Vec<PathBuf> = std::env::var_os("KVBENCH_CUDA_LIB_DIR")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    for dir in &env_dirs {
        for name in lib.sonames() {
            if let Some(f) = try_open(lib, &dir.join(name), "KVBENCH_CUDA_LIB_DIR", &mut tried) {
                return Ok(f);
            }
        }
    }
    for name in lib.sonames() {
        if let Some(f) = try_open(lib, Path::new(name), "system loader", &mut tried) {
            return Ok(f);
        }
    }
    for site in site_packages() {
        for sub in lib.wheel_dirs() {
            for name in lib.sonames() {
                let p = site.join(sub).join(name);
                if p.exists() {
                    if let Some(f) = try_open(lib, &p, "python package", &mut tried) {
                        return Ok(f);
                    }
                }
            }
        }
    }
    if !lib.wheel_dirs().is_empty() {
        tried.push("NVIDIA wheel folders in Python site-packages".into());
    }
    Err(LibError::Missing {
        lib,
        tried: tried.join(", "),
    })
}

fn try_open(
    lib: CudaLib,
    path: &Path,
    via: &'static str,
    tried: &mut Vec<String>,
) -> Option<Found> {
    tried.push(path.display().to_string());
    // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions; the
    // handle is leaked on purpose so the library stays mapped for cudarc's later lookups.
    let handle = unsafe { libloading::Library::new(path) }.ok()?;
    let path = loaded_path(&handle, lib.probe_symbol()).unwrap_or_else(|| path.to_path_buf());
    std::mem::forget(handle);
    Some(Found { lib, path, via })
}

/// The file behind a loaded library, from `dladdr` on one of its symbols.
fn loaded_path(handle: &libloading::Library, symbol: &CStr) -> Option<PathBuf> {
    // SAFETY: the symbol is only used as an address for dladdr, never called.
    let sym: libloading::Symbol<'_, *const libc::c_void> =
        unsafe { handle.get(symbol.to_bytes_with_nul()) }.ok()?;
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer; dladdr only reads the address.
    let ok = unsafe { libc::dladdr(*sym, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated file name owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    std::fs::canonicalize(name.to_string_lossy().as_ref()).ok()
}

/// Python site-packages folders: what `python3` reports, then common install prefixes.
pub fn site_packages() -> Vec<PathBuf> {
    static CACHE: OnceLock<Vec<PathBuf>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let mut out: Vec<PathBuf> = Vec::new();
            if let Ok(o) = std::process::Command::new("python3")
                .args([
                    "-c",
                    "import sys; print('\\n'.join(p for p in sys.path if p))",
                ])
                .stderr(std::process::Stdio::null())
                .output()
            {
                if o.status.success() {
                    out.extend(
                        String::from_utf8_lossy(&o.stdout)
                            .lines()
                            .map(PathBuf::from)
                            .filter(|p| p.is_dir()),
                    );
                }
            }
            for prefix in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
                if let Ok(rd) = std::fs::read_dir(prefix) {
                    for e in rd.flatten() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        if n.starts_with("python3") {
                            for sub in ["site-packages", "dist-packages"] {
                                let p = e.path().join(sub);
                                if p.is_dir() {
                                    out.push(p);
                                }
                            }
                        }
                    }
                }
            }
            out.dedup();
            out
        })
        .clone()
}

/// Runs a cudarc call for `lib`, which must be [`open`]; a panic inside (a symbol missing from
/// an older library, cudarc's own checks) comes back as [`LibError::Panicked`].
pub fn guarded<T>(lib: CudaLib, f: impl FnOnce() -> T) -> Result<T, LibError> {
    open(lib)?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|e| {
        let message = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into());
        LibError::Panicked { lib, message }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system loader's pick here must be the one cudarc's loader makes: the same names in
    /// the same order (cudarc tries the unversioned name first).
    #[test]
    fn sonames_are_tried_in_cudarcs_order() {
        for lib in CudaLib::ALL {
            let stem = match lib {
                CudaLib::Driver => "cuda",
                CudaLib::Nvrtc => "nvrtc",
                CudaLib::Cublas => "cublas",
            };
            let cudarc = cudarc::get_lib_name_candidates(stem);
            let at: Vec<usize> = lib
                .sonames()
                .iter()
                .filter_map(|s| cudarc.iter().position(|c| c == s))
                .collect();
            assert!(
                at.windows(2).all(|w| w[0] < w[1]),
                "{:?} in another order than cudarc's {cudarc:?}",
                lib.sonames()
            );
        }
    }

    #[test]
    fn every_soname_is_one_cudarc_also_tries() {
        for lib in CudaLib::ALL {
            let stem = match lib {
                CudaLib::Driver => "cuda",
                CudaLib::Nvrtc => "nvrtc",
                CudaLib::Cublas => "cublas",
            };
            let cudarc = cudarc::get_lib_name_candidates(stem);
            for s in lib.sonames() {
                assert!(
                    cudarc.iter().any(|c| c == s),
                    "{s} not in cudarc's {cudarc:?}"
                );
            }
        }
    }
}
