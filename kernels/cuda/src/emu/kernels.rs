//! The real `.cu` kernels compiled for the host (first version: no host build yet, every
//! launch answers `UnknownKernel`; the signatures are the contract with the emulated runtime).

use std::ffi::c_void;

/// A CUDA launch dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum EmuKernelError {
    #[error("no host build of kernel {0}")]
    UnknownKernel(String),
    #[error("kernel {kernel}: {reason}")]
    BadLaunch { kernel: String, reason: String },
    /// A kernel thread touched a protected page (a guard page around a device allocation, or freed memory).
    #[error("kernel {kernel}: invalid {} at address {addr:#x}", if *.write { "write" } else { "access" })]
    Fault {
        kernel: String,
        addr: usize,
        write: bool,
    },
}

/// Every kernel name the host build provides (the same names NVRTC programs export).
pub fn kernel_names() -> &'static [&'static str] {
    &[]
}

/// Runs `kernel` to completion on the calling thread: every block of `grid` in turn, each block's
/// block.x*block.y*block.z CUDA threads as fibers (OS threads in the ThreadSanitizer build),
/// `__syncthreads` a real barrier, warp operations warp-synchronous.
/// # Safety
/// `params[i]` points at the value of the kernel's i-th parameter (CUDA's `kernelParams` convention);
/// pointer parameters hold host addresses valid for every access a correct kernel makes.
pub unsafe fn launch(
    kernel: &str,
    grid: Dim3,
    block: Dim3,
    dynamic_shared_bytes: u32,
    params: &[*mut c_void],
) -> Result<(), EmuKernelError> {
    let _ = (grid, block, dynamic_shared_bytes, params);
    Err(EmuKernelError::UnknownKernel(kernel.to_string()))
}
