//! One GPU — real or emulated — and typed launches of every kernel. Opening a real one is the
//! only place the driver is touched here; every failure is a [`CudaError`]. Launches take device
//! buffers whose indices the caller checked on the host ([`crate::launch`]); the kernels
//! themselves do no bounds checks.
//!
//! By job: this file opens the device ([`Gpu::open`], [`Gpu::emulated_open`]); [`kv`] holds
//! the KV layers (allocation, writes, slot copies); [`attention`] the attention launches;
//! [`swap`] pinned host memory and swaps. The memory, stream and launch primitives are the
//! runtime seam's ([`crate::runtime`]).

mod attention;
mod kv;
mod swap;

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};
use cudarc::nvrtc::Ptx;

pub use attention::{tile_rows, Addressing, Rows, Tiles, Workspace, ATTN_QROWS};
pub use kv::{DevLayer, KvBuf};
pub use swap::PinnedKv;

use crate::emu::{EmuConfig, EmuDevice};
use crate::error::CudaError;
use crate::libs::{guarded, CudaLib};
use crate::nvrtc;
use crate::runtime::{real::RealRt, DevBuf, Rt};
use crate::source::ProgramId;

/// What the driver says about device 0.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: usize,
    pub l2_bytes: usize,
    pub total_mem_bytes: usize,
    /// `cuDriverGetVersion`: 13000 = 13.0.
    pub driver_version: i32,
}

impl GpuInfo {
    /// The NVRTC architecture for this device (`sm_90`).
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// The installed driver's CUDA version (`cuDriverGetVersion`), without touching any device.
pub fn driver_version() -> Result<i32, CudaError> {
    guarded(CudaLib::Driver, || {
        let mut v = 0;
        // SAFETY: a valid out-pointer; cuDriverGetVersion needs no cuInit.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map(|()| v)
            .map_err(CudaError::driver("cuDriverGetVersion"))
    })?
}

fn context(ordinal: usize) -> Result<(Arc<CudaContext>, GpuInfo), CudaError> {
    guarded(CudaLib::Driver, || -> Result<_, CudaError> {
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice(format!("{e:?}")))?;
        let attr = |a| {
            ctx.attribute(a)
                .map_err(CudaError::driver("cuDeviceGetAttribute"))
        };
        let info = GpuInfo {
            name: ctx.name().map_err(CudaError::driver("cuDeviceGetName"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(CudaError::driver("compute capability"))?,
            sm_count: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                as usize,
            l2_bytes: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            total_mem_bytes: ctx
                .total_mem()
                .map_err(CudaError::driver("cuDeviceTotalMem"))?,
            driver_version: driver_version()?,
        };
        Ok((ctx, info))
    })?
}

/// Device 0's description, or why there is none.
pub fn probe() -> Result<GpuInfo, CudaError> {
    context(0).map(|(_, info)| info)
}

pub struct Gpu {
    pub info: GpuInfo,
    pub(crate) rt: Rt,
    pub(crate) dummy_i32: DevBuf<i32>,
    pub(crate) dummy_i64: DevBuf<i64>,
    pub(crate) dummy_f32: DevBuf<f32>,
}

/// A one-dimensional grid of `n` blocks (checked against the device's x limit).
pub(crate) fn u32_of(n: usize, what: &str) -> Result<u32, CudaError> {
    crate::launch::grid(n, 1, 1, what).map(|g| g.0)
}

pub(crate) fn i32_of(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Shape(format!("{what} {n} exceeds i32")))
}

impl Gpu {
    /// Opens device 0 and compiles every program for its architecture.
    pub fn open() -> Result<Gpu, CudaError> {
        let (ctx, info) = context(0)?;
        // The driver's entry points and NVRTC's version before any compile: an old driver is
        // refused (or its older calls taken) here, in one line, never by a panic mid-run.
        let entry = crate::runtime::real::entry_points()?;
        let nvrtc = nvrtc::version()?;
        if let Some(w) = crate::runtime::entry::check_nvrtc(info.driver_version, nvrtc)
            .map_err(CudaError::NoDevice)?
        {
            eprintln!("kvbench: warning: {w}");
        }
        let arch = info.arch();
        let mut functions = HashMap::new();
        // The three programs compile in parallel (NVRTC is thread-safe; ~10 s each alone).
        let compiled: Vec<Result<nvrtc::Compiled, nvrtc::CompileError>> = std::thread::scope(|s| {
            let hs: Vec<_> = ProgramId::ALL
                .iter()
                .map(|&p| {
                    let arch = &arch;
                    s.spawn(move || nvrtc::compile(p, arch))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(nvrtc::CompileError::Lib(crate::LibError::Panicked {
                            lib: CudaLib::Nvrtc,
                            message: "compile thread panicked".into(),
                        }))
                    })
                })
                .collect()
        });
        for (p, compiled) in ProgramId::ALL.into_iter().zip(compiled) {
            let compiled = compiled?;
            let module = guarded(CudaLib::Driver, || {
                ctx.load_module(Ptx::from_binary(compiled.cubin.clone()))
            })?
            .map_err(CudaError::driver("cuModuleLoadData"))?;
            for k in p.kernels() {
                let f = module
                    .load_function(&k)
                    .map_err(CudaError::driver("cuModuleGetFunction"))?;
                functions.insert(k, f);
            }
        }
        // One stream, in order: the safe API's per-buffer event tracking is for multi-stream
        // use and would add an event per launch argument. Not the legacy default stream: CUDA
        // graphs cannot capture it. With tracking off, the host orders its reads of pinned
        // memory by the events it records itself (after the copies).
        // SAFETY: nothing has been allocated on this context yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(CudaError::driver("cuStreamCreate"))?;
        Self::with_runtime(info, Rt::Real(RealRt::new(ctx, stream, functions, entry)))
    }

    /// The emulated device (`--backend cuda-emu`): host memory, a worker-thread stream with
    /// seeded delays, the host build of the kernels, a CPU `GemmEx`.
    pub fn emulated_open(config: EmuConfig) -> Result<Gpu, CudaError> {
        let dev = EmuDevice::new(config).map_err(CudaError::NoDevice)?;
        let info = GpuInfo {
            name: "cuda-emu (emulated on the host CPU)".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            l2_bytes: 50 << 20,
            total_mem_bytes: config.total_bytes as usize,
            driver_version: config.driver_version,
        };
        Self::with_runtime(info, Rt::Emu(dev))
    }

    fn with_runtime(info: GpuInfo, rt: Rt) -> Result<Gpu, CudaError> {
        use crate::runtime::zeros_in;
        Ok(Gpu {
            info,
            dummy_i32: zeros_in(&rt, 1)?,
            dummy_i64: zeros_in(&rt, 1)?,
            dummy_f32: zeros_in(&rt, 1)?,
            rt,
        })
    }

    /// The real runtime's context and stream (CUDA graphs in the benchmark); `None` emulated.
    pub(crate) fn real(&self) -> Option<&RealRt> {
        match &self.rt {
            Rt::Real(r) => Some(r),
            Rt::Emu(_) => None,
        }
    }

    /// Fills the first `words` 32-bit words of `buf` with `word`.
    pub fn fill_words<T: crate::runtime::Elem>(
        &self,
        buf: &mut DevBuf<T>,
        words: usize,
        word: u32,
    ) -> Result<(), CudaError> {
        if words * 4 > buf.len() * std::mem::size_of::<T>() {
            return Err(CudaError::Shape("fill past the end of a buffer".into()));
        }
        use crate::runtime::Arg;
        self.launch(
            "fill_words",
            crate::model::ops::flat_grid(words),
            (256, 1, 1),
            0,
            &[Arg::Buf(buf), Arg::I64(words as i64), Arg::U32(word)],
        )
    }

    /// The read-bandwidth ceiling kernel over `buf` (whole 16-byte vectors); `out` holds one
    /// word per block.
    pub fn read_ceiling(&self, buf: &DevBuf<u32>, out: &mut DevBuf<u32>) -> Result<(), CudaError> {
        use crate::runtime::Arg;
        let n_vec = (buf.len() / 4) as i64;
        let blocks = out.len().min(65535) as u32;
        self.launch(
            "read_ceiling",
            (blocks, 1, 1),
            (512, 1, 1),
            0,
            &[Arg::Buf(buf), Arg::I64(n_vec), Arg::Buf(out)],
        )
    }
}
