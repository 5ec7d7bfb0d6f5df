//! The runtime on a GPU: cudarc's context, one stream (event tracking off), the modules NVRTC
//! compiled, and a cuBLAS handle on that stream. Every call maps a failure to [`CudaError`].

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::cublas::{result as cublas, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchConfig, PinnedHostSlice, PushKernelArg,
};

use super::entry::{self, ElapsedCall, EntryPoints};
use super::{Arg, Elem, GemmArgs, GemmIn, Owned};
use crate::error::CudaError;
use crate::libs::{guarded, CudaLib};

pub(crate) struct RealRt {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub functions: HashMap<String, CudaFunction>,
    blas: OnceLock<CudaBlas>,
    pub owned: Arc<Owned>,
    pub entry: EntryPoints,
    pub elapsed: ElapsedFn,
}

/// `cuEventElapsedTime` or `_v2` (one signature), looked up by kvbench itself: cudarc's binding
/// always names `_v2` and panics where the driver lacks it.
pub(crate) type ElapsedFn =
    unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

/// The installed driver's entry points ([`entry::resolve`] over the symbols libcuda exports),
/// with the event-timing call to use.
pub(crate) fn entry_points() -> Result<(EntryPoints, ElapsedFn), CudaError> {
    let found = crate::libs::open(CudaLib::Driver)?;
    let version = crate::device::driver_version()?;
    // SAFETY: the driver library is already loaded (`open`); this takes another reference.
    let lib = unsafe { libloading::Library::new(&found.path) }
        .map_err(|e| CudaError::NoDevice(format!("reopening {}: {e}", found.path.display())))?;
    let has = |name: &str| {
        // SAFETY: only the symbol's presence is asked.
        unsafe { lib.get::<*const std::ffi::c_void>(name.as_bytes()) }.is_ok()
    };
    let points = entry::resolve(version, has)?;
    // SAFETY: both names have this signature in every driver that exports them.
    let f = unsafe { lib.get::<ElapsedFn>(points.elapsed.name().as_bytes()) }
        .map(|s| *s)
        .map_err(|e| CudaError::NoDevice(format!("{}: {e}", points.elapsed.name())))?;
    // The library stays loaded for the process (libcuda is never unloaded).
    std::mem::forget(lib);
    Ok((points, f))
}

fn blas_err(call: &'static str) -> impl FnOnce(cublas::CublasError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

impl RealRt {
    pub fn new(
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        functions: HashMap<String, CudaFunction>,
        (entry, elapsed): (EntryPoints, ElapsedFn),
    ) -> RealRt {
        RealRt {
            ctx,
            stream,
            functions,
            blas: OnceLock::new(),
            owned: Arc::default(),
            entry,
            elapsed,
        }
    }

    pub fn zeros<T: Elem>(&self, n: usize) -> Result<CudaSlice<T>, CudaError> {
        self.stream
            .alloc_zeros::<T>(n)
            .map_err(CudaError::driver("cuMemAlloc"))
    }

    pub fn htod<T: Elem>(
        &self,
        host: &[T],
        dst: &mut CudaSlice<T>,
        at: usize,
    ) -> Result<(), CudaError> {
        self.stream
            .memcpy_htod(host, &mut dst.slice_mut(at..at + host.len()))
            .map_err(CudaError::driver("cuMemcpyHtoD"))
    }

    pub fn dtod<T: Elem>(
        &self,
        src: &CudaSlice<T>,
        a: usize,
        dst: &mut CudaSlice<T>,
        b: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        self.stream
            .memcpy_dtod(&src.slice(a..a + n), &mut dst.slice_mut(b..b + n))
            .map_err(CudaError::driver("cuMemcpyDtoD"))
    }

    pub fn dtoh_pinned<T: Elem>(
        &self,
        src: &CudaSlice<T>,
        a: usize,
        dst: &mut PinnedHostSlice<T>,
        b: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        // The destination sliced to n: cudarc copies the destination's whole length.
        let h = dst.as_mut_slice().map_err(CudaError::driver("pinned"))?;
        self.stream
            .memcpy_dtoh(&src.slice(a..a + n), &mut h[b..b + n])
            .map_err(CudaError::driver("cuMemcpyDtoH"))
    }

    pub fn htod_pinned<T: Elem>(
        &self,
        src: &PinnedHostSlice<T>,
        a: usize,
        dst: &mut CudaSlice<T>,
        b: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        let h = src.as_slice().map_err(CudaError::driver("pinned"))?;
        self.stream
            .memcpy_htod(&h[a..a + n], &mut dst.slice_mut(b..b + n))
            .map_err(CudaError::driver("cuMemcpyHtoD"))
    }

    pub fn download<T: Elem>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        self.stream
            .clone_dtoh(dev)
            .map_err(CudaError::driver("cuMemcpyDtoH"))
    }

    pub fn pinned<T: Elem>(&self, n: usize) -> Result<PinnedHostSlice<T>, CudaError> {
        // SAFETY: read only after a copy into it completed (callers wait on an event).
        unsafe { self.ctx.alloc_pinned_with_flags::<T>(n, 0) }
            .map_err(CudaError::driver("cuMemHostAlloc"))
    }

    pub fn sync(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))
    }

    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        guarded(CudaLib::Driver, || self.ctx.mem_get_info())?
            .map(|(f, t)| (f as u64, t as u64))
            .map_err(CudaError::driver("cuMemGetInfo"))
    }

    /// Hands the default memory pool's unused memory back to the device. cudarc allocates from
    /// that pool (`cuMemAllocAsync`) wherever the device has pools; a freed buffer returns to
    /// the pool, and only this makes `cuMemGetInfo` see it. The stream is synchronized first.
    pub fn release_freed(&self) -> Result<(), CudaError> {
        if !self.ctx.has_async_alloc() {
            return Ok(());
        }
        guarded(CudaLib::Driver, || {
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: a valid out-pointer and this context's device.
            unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
                .result()
                .map_err(CudaError::driver("cuDeviceGetDefaultMemPool"))?;
            // SAFETY: `pool` is the device's default pool; trimming frees only unused memory.
            unsafe { sys::cuMemPoolTrimTo(pool, 0) }
                .result()
                .map_err(CudaError::driver("cuMemPoolTrimTo"))
        })?
    }
}

/// Milliseconds between two recorded events of one context, through the resolved entry point.
pub(crate) fn elapsed_ms(
    (f, call): (ElapsedFn, ElapsedCall),
    a: &CudaEvent,
    b: &CudaEvent,
) -> Result<f32, CudaError> {
    if a.context() != b.context() {
        return Err(CudaError::Shape("events of two contexts".into()));
    }
    a.context()
        .bind_to_thread()
        .map_err(CudaError::driver("cuCtxSetCurrent"))?;
    a.synchronize()
        .map_err(CudaError::driver("cuEventSynchronize"))?;
    b.synchronize()
        .map_err(CudaError::driver("cuEventSynchronize"))?;
    let mut ms = 0f32;
    // SAFETY: two live events of this context, both complete; a valid out-pointer.
    unsafe { f(&mut ms, a.cu_event(), b.cu_event()) }
        .result()
        .map_err(CudaError::driver(call.name()))?;
    Ok(ms)
}

impl RealRt {
    pub fn new_event(&self) -> Result<CudaEvent, CudaError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(CudaError::driver("cuEventCreate"))
    }

    pub fn record(&self, ev: &CudaEvent) -> Result<(), CudaError> {
        ev.record(&self.stream)
            .map_err(CudaError::driver("cuEventRecord"))
    }

    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        args: &[Arg<'_>],
    ) -> Result<(), CudaError> {
        let f = self
            .functions
            .get(name)
            .ok_or_else(|| CudaError::Shape(format!("no kernel {name} loaded")))?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Buf(buf) => buf.push_real(&mut b)?,
                Arg::I32(v) => {
                    b.arg(v);
                }
                Arg::I64(v) => {
                    b.arg(v);
                }
                Arg::U32(v) => {
                    b.arg(v);
                }
                Arg::F32(v) => {
                    b.arg(v);
                }
            }
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: shared_bytes,
        };
        // SAFETY: every launcher checks its buffers' lengths and indices on the host before
        // calling this ([`crate::launch`], [`crate::model::batch`]); the arguments follow the
        // kernel's parameter list.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(|e| CudaError::Driver {
                call: "cuLaunchKernel",
                message: format!("{name}: {e:?}"),
            })
    }

    pub fn init_blas(&self) -> Result<(), CudaError> {
        if self.blas.get().is_some() {
            return Ok(());
        }
        let h = guarded(CudaLib::Cublas, || CudaBlas::new(self.stream.clone()))?
            .map_err(blas_err("cublasCreate"))?;
        let _ = self.blas.set(h);
        Ok(())
    }

    pub fn gemm_ex(&self, g: GemmArgs<'_>) -> Result<(), CudaError> {
        self.init_blas()?;
        let h = *self
            .blas
            .get()
            .ok_or_else(|| CudaError::Shape("cuBLAS not initialised".into()))?
            .handle();
        let ptr = |x: GemmIn<'_>, off: usize| -> Result<(u64, blas_sys::cudaDataType), CudaError> {
            Ok(match x {
                GemmIn::F32(b) => {
                    let (p, _g) = b.real()?.device_ptr(&self.stream);
                    (p + (off * 4) as u64, blas_sys::cudaDataType::CUDA_R_32F)
                }
                GemmIn::Bf16(b) => {
                    let (p, _g) = b.real()?.device_ptr(&self.stream);
                    (p + (off * 2) as u64, blas_sys::cudaDataType::CUDA_R_16BF)
                }
            })
        };
        let (ap, at) = ptr(g.a, g.a_off)?;
        let (bp, bt) = ptr(g.b, g.b_off)?;
        let (cp, _c) = g.c.real_mut()?.device_ptr_mut(&self.stream);
        let cp = cp + (g.c_off * 4) as u64;
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let int = |n: usize, what: &str| {
            i32::try_from(n).map_err(|_| CudaError::Shape(format!("GEMM {what} {n} exceeds int")))
        };
        // SAFETY: GemmArgs::check verified each operand's span against its buffer; the buffers
        // outlive the call's execution (stream-ordered frees).
        unsafe {
            cublas::gemm_ex(
                h,
                op(g.trans_a),
                op(g.trans_b),
                int(g.m, "m")?,
                int(g.n, "n")?,
                int(g.k, "k")?,
                &g.alpha as *const f32 as *const c_void,
                ap as *const c_void,
                at,
                int(g.lda, "lda")?,
                bp as *const c_void,
                bt,
                int(g.ldb, "ldb")?,
                &g.beta as *const f32 as *const c_void,
                cp as *mut c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                int(g.ldc, "ldc")?,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cublasGemmEx"))
    }
}
