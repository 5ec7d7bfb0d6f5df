//! The real `.cu` kernels compiled for the host (`build.rs`, `emu/emu_cuda.h`): every kernel
//! name an NVRTC program exports has a host build here, launched with CUDA's conventions
//! (grid, block, `kernelParams`), its CUDA threads run as fibers with real barriers, its blocks
//! in a seeded order, two at a time. A kernel thread that touches a protected page makes the
//! launch return [`EmuKernelError::Fault`].

use std::ffi::{c_char, c_int, c_uint, c_void};

include!(concat!(env!("OUT_DIR"), "/emu_kernels.rs"));

/// A CUDA launch dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    pub fn new(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }
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

/// `emu::LaunchResult` in emu_cuda.h.
#[repr(C)]
struct LaunchResult {
    fault_addr: usize,
    fault_write: c_int,
    reason: [c_char; 256],
}

const LAUNCH_OK: c_int = 0;
const LAUNCH_UNKNOWN: c_int = 1;
const LAUNCH_BAD: c_int = 2;
const LAUNCH_FAULT: c_int = 3;

extern "C" {
    fn emu_kernels_launch(
        program: c_uint,
        kernel: c_uint,
        grid: *const c_uint,
        block: *const c_uint,
        shared: c_uint,
        params: *const *mut c_void,
        nparams: usize,
        res: *mut LaunchResult,
    ) -> c_int;
    fn emu_kv_read_bytes_take() -> u64;
    fn emu_set_block_order(on: c_int, seed: u64);
}

/// The environment variable that sets the emulator's block order: an unsigned seed (each
/// launch's blocks run in an order drawn from it, two in flight, interleaved at barriers), or
/// `off` (one block at a time, in index order). Unset: seed [`DEFAULT_BLOCK_SEED`].
pub const BLOCK_SEED_ENV: &str = "KVBENCH_EMU_BLOCK_SEED";
pub const DEFAULT_BLOCK_SEED: u64 = 0x006b_7662_656e_6368;

/// How the blocks of a launch are scheduled on the emulated device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockOrder {
    /// Seeded order, two blocks in flight, interleaved at barriers (as a GPU may run them).
    Shuffled { seed: u64 },
    /// One block after the other in index order.
    InOrder,
}

impl BlockOrder {
    /// Parses [`BLOCK_SEED_ENV`]'s value.
    pub fn parse(v: &str) -> Result<BlockOrder, String> {
        match v.trim() {
            "off" => Ok(BlockOrder::InOrder),
            t => t
                .parse::<u64>()
                .map(|seed| BlockOrder::Shuffled { seed })
                .map_err(|_| {
                    format!("{BLOCK_SEED_ENV}={v:?}: expected an unsigned integer seed or `off`")
                }),
        }
    }
}

/// Sets the block order of every later launch in the process (over the environment's).
pub fn set_block_order(order: BlockOrder) {
    let _ = block_order_from_env();
    store_block_order(order);
}

fn store_block_order(order: BlockOrder) {
    let (on, seed) = match order {
        BlockOrder::Shuffled { seed } => (1, seed),
        BlockOrder::InOrder => (0, 0),
    };
    // SAFETY: two atomic stores.
    unsafe { emu_set_block_order(on, seed) }
}

/// The environment's block order, applied once before the first launch; an unusable value
/// is every launch's error.
fn block_order_from_env() -> Result<(), String> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let order = match std::env::var(BLOCK_SEED_ENV) {
            Ok(v) => BlockOrder::parse(&v)?,
            Err(std::env::VarError::NotPresent) => BlockOrder::Shuffled {
                seed: DEFAULT_BLOCK_SEED,
            },
            Err(e) => return Err(format!("{BLOCK_SEED_ENV}: {e}")),
        };
        store_block_order(order);
        Ok(())
    })
    .clone()
}

/// The K/V cache bytes the attention kernels read since the last call, over every launch of
/// the process (the emulator counts each global K/V load; a GPU has no such counter). Resets
/// the count: synchronize the stream, take, launch, synchronize, take again.
pub fn take_kv_read_bytes() -> u64 {
    // SAFETY: an atomic exchange, no arguments.
    unsafe { emu_kv_read_bytes_take() }
}

/// Every kernel name the host build provides (the same names NVRTC programs export).
pub fn kernel_names() -> &'static [&'static str] {
    &NAMES
}

/// Runs `kernel` to completion: the blocks of `grid` in a seeded order, two in flight on two
/// lanes interleaved at barriers ([`BlockOrder`], [`BLOCK_SEED_ENV`]), each block's
/// block.x*block.y*block.z CUDA threads as fibers (OS threads in the ThreadSanitizer build),
/// `__syncthreads` a real barrier, warp operations warp-synchronous, a shuffle from a lane
/// the warp lacks or that returned a NaN pattern.
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
    if let Err(reason) = block_order_from_env() {
        return Err(EmuKernelError::BadLaunch {
            kernel: kernel.to_string(),
            reason,
        });
    }
    let Ok(i) = KERNELS.binary_search_by(|e| e.0.cmp(kernel)) else {
        return Err(EmuKernelError::UnknownKernel(kernel.to_string()));
    };
    let (_, program, index) = KERNELS[i];
    let g = [grid.x, grid.y, grid.z];
    let b = [block.x, block.y, block.z];
    let mut res = LaunchResult {
        fault_addr: 0,
        fault_write: 0,
        reason: [0; 256],
    };
    // SAFETY: the arrays live across the call; the parameter pointers are the caller's promise.
    let rc = unsafe {
        emu_kernels_launch(
            program,
            index,
            g.as_ptr(),
            b.as_ptr(),
            dynamic_shared_bytes,
            params.as_ptr(),
            params.len(),
            &mut res,
        )
    };
    match rc {
        LAUNCH_OK => Ok(()),
        LAUNCH_FAULT => Err(EmuKernelError::Fault {
            kernel: kernel.to_string(),
            addr: res.fault_addr,
            write: res.fault_write != 0,
        }),
        LAUNCH_UNKNOWN => Err(EmuKernelError::UnknownKernel(kernel.to_string())),
        LAUNCH_BAD => {
            let bytes: Vec<u8> = res
                .reason
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            Err(EmuKernelError::BadLaunch {
                kernel: kernel.to_string(),
                reason: String::from_utf8_lossy(&bytes).into_owned(),
            })
        }
        other => Err(EmuKernelError::BadLaunch {
            kernel: kernel.to_string(),
            reason: format!("host launcher returned status {other}"),
        }),
    }
}
