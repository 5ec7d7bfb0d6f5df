//! What this machine offers CUDA-wise, as data: each library found or why not, its version, and
//! device 0. `kvbench doctor` prints it; backend selection reads [`Probe::missing`].

use crate::device::{self, GpuInfo};
use crate::libs::{self, guarded, CudaLib, Found, LibError};
use crate::CudaError;

#[derive(Debug, Clone)]
pub struct LibStatus {
    pub lib: CudaLib,
    pub found: Result<Found, LibError>,
    /// Driver: its CUDA version (13.0); NVRTC and cuBLAS: the library's version.
    pub version: Option<String>,
}

#[derive(Debug)]
pub struct Probe {
    pub libs: Vec<LibStatus>,
    pub gpu: Result<GpuInfo, CudaError>,
}

impl Probe {
    /// Looks at every library and at device 0 (no kernel is compiled).
    pub fn run() -> Probe {
        let libs = CudaLib::ALL
            .into_iter()
            .map(|lib| {
                let found = libs::open(lib).cloned();
                let version = found.as_ref().ok().and_then(|_| version(lib));
                LibStatus {
                    lib,
                    found,
                    version,
                }
            })
            .collect();
        let gpu = device::probe();
        Probe { libs, gpu }
    }

    pub fn lib(&self, lib: CudaLib) -> &LibStatus {
        &self.libs[lib as usize]
    }

    /// What stands between this machine and the `cuda` backend, in the order a user fixes it:
    /// driver, NVRTC, cuBLAS, device. Empty when everything is there.
    pub fn missing(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .libs
            .iter()
            .filter_map(|s| s.found.as_ref().err().map(short))
            .collect();
        if self.lib(CudaLib::Driver).found.is_ok() {
            if let Err(e) = &self.gpu {
                out.push(format!("no usable device ({e})"));
            }
        }
        out
    }
}

fn short(e: &LibError) -> String {
    match e {
        LibError::Missing { lib, .. } => format!("{} not found", lib.name()),
        other => other.to_string(),
    }
}

fn version(lib: CudaLib) -> Option<String> {
    match lib {
        CudaLib::Driver => device::driver_version()
            .ok()
            .map(|v| format!("CUDA {}.{}", v / 1000, (v % 1000) / 10)),
        CudaLib::Nvrtc => crate::nvrtc::version()
            .ok()
            .map(|(a, b)| format!("{a}.{b}")),
        CudaLib::Cublas => guarded(CudaLib::Cublas, || {
            use cudarc::cublas::sys::{cublasGetProperty, libraryPropertyType};
            let mut v = [0i32; 3];
            for (i, t) in [
                libraryPropertyType::MAJOR_VERSION,
                libraryPropertyType::MINOR_VERSION,
                libraryPropertyType::PATCH_LEVEL,
            ]
            .into_iter()
            .enumerate()
            {
                // SAFETY: a valid out-pointer; needs no handle.
                unsafe { cublasGetProperty(t, &mut v[i]) };
            }
            format!("{}.{}.{}", v[0], v[1], v[2])
        })
        .ok(),
    }
}
