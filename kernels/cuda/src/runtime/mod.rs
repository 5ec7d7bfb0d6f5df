//! The runtime seam: device memory, pinned host memory, the stream, events, kernel launches and
//! cuBLAS `GemmEx`, with two implementations — the GPU through cudarc ([`real`]) and the
//! emulated device ([`crate::emu`]). Everything above it (`device`, `model`, the harness's
//! `cuda` backend) is written once against these types, so the same host code runs on both.

pub mod entry;
pub(crate) mod real;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::ValidAsZeroBits;
use cudarc::driver::{
    CudaEvent, CudaSlice, DeviceRepr, LaunchArgs, PinnedHostSlice, PushKernelArg,
};

use crate::device::Gpu;
use crate::emu::blas::{Gemm, GemmType};
use crate::emu::device::EmuParam;
use crate::emu::kernels::Dim3;
use crate::emu::memory::Region;
use crate::emu::stream::EmuEvent;
use crate::emu::EmuDevice;
use crate::error::CudaError;

/// Element types that live in device buffers.
pub trait Elem: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + 'static {}
impl Elem for f32 {}
impl Elem for u16 {}
impl Elem for i32 {}
impl Elem for i64 {}
impl Elem for u32 {}

fn emu_err(call: &'static str) -> impl FnOnce(String) -> CudaError {
    move |message| CudaError::Driver { call, message }
}

fn bytes_of<T: Elem>(n: usize) -> usize {
    n * std::mem::size_of::<T>()
}

/// `[at, at + n)` inside a buffer of `len` elements, or an error (never cudarc's panic).
fn check_range(at: usize, n: usize, len: usize, what: &str) -> Result<(), CudaError> {
    match at.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(CudaError::Shape(format!(
            "{what}: elements [{at}, {at}+{n}) of a buffer of {len}"
        ))),
    }
}

pub(crate) enum Rt {
    Real(real::RealRt),
    Emu(Arc<EmuDevice>),
}

impl Rt {
    fn owned(&self) -> &Arc<Owned> {
        match self {
            Rt::Real(r) => &r.owned,
            Rt::Emu(d) => &d.owned,
        }
    }
}

/// kvbench's own device allocations, counted where they are made and dropped: the exact half
/// of the memory ledger. The driver's `cuMemGetInfo` moves for reasons of its own (a local-memory
/// reserve, library workspaces, another process), so a leak is judged on this count, never on
/// the free-memory figure alone.
#[derive(Debug, Default)]
pub struct Owned {
    live_allocations: AtomicU64,
    live_bytes: AtomicU64,
    allocated_bytes: AtomicU64,
    freed_bytes: AtomicU64,
}

/// A reading of [`Owned`]: live allocations and bytes as requested (before any rounding), and
/// the bytes ever allocated and freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnedBytes {
    pub live_allocations: u64,
    pub live_bytes: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
}

impl Owned {
    fn add(&self, bytes: u64) {
        self.live_allocations.fetch_add(1, Ordering::Relaxed);
        self.live_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.allocated_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn sub(&self, bytes: u64) {
        self.live_allocations.fetch_sub(1, Ordering::Relaxed);
        self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.freed_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn read(&self) -> OwnedBytes {
        OwnedBytes {
            live_allocations: self.live_allocations.load(Ordering::Relaxed),
            live_bytes: self.live_bytes.load(Ordering::Relaxed),
            allocated_bytes: self.allocated_bytes.load(Ordering::Relaxed),
            freed_bytes: self.freed_bytes.load(Ordering::Relaxed),
        }
    }
}

/// A device allocation of `len` elements of `T`.
pub struct DevBuf<T: Elem> {
    inner: DevInner<T>,
    /// The runtime's count of kvbench's allocations, given this one's bytes back on drop.
    owned: Arc<Owned>,
}

enum DevInner<T: Elem> {
    Real(CudaSlice<T>),
    Emu {
        region: Arc<Region>,
        dev: Arc<EmuDevice>,
        len: usize,
    },
}

impl<T: Elem> DevBuf<T> {
    pub fn len(&self) -> usize {
        match &self.inner {
            DevInner::Real(s) => s.len(),
            DevInner::Emu { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn real(&self) -> Result<&CudaSlice<T>, CudaError> {
        match &self.inner {
            DevInner::Real(s) => Ok(s),
            DevInner::Emu { .. } => Err(CudaError::Shape(
                "an emulated buffer given to the GPU runtime".into(),
            )),
        }
    }

    pub(crate) fn real_mut(&mut self) -> Result<&mut CudaSlice<T>, CudaError> {
        match &mut self.inner {
            DevInner::Real(s) => Ok(s),
            DevInner::Emu { .. } => Err(CudaError::Shape(
                "an emulated buffer given to the GPU runtime".into(),
            )),
        }
    }

    pub(crate) fn region(&self) -> Result<&Arc<Region>, CudaError> {
        match &self.inner {
            DevInner::Emu { region, .. } => Ok(region),
            DevInner::Real(_) => Err(CudaError::Shape(
                "a GPU buffer given to the emulated runtime".into(),
            )),
        }
    }
}

impl<T: Elem> Drop for DevBuf<T> {
    fn drop(&mut self) {
        self.owned.sub(bytes_of::<T>(self.len()) as u64);
        if let DevInner::Emu { region, dev, .. } = &self.inner {
            dev.free_device(region.clone());
        }
    }
}

/// Page-locked host memory of `len` elements (swap buffers, fetched logits).
pub struct HostBuf<T: Elem> {
    inner: HostInner<T>,
}

enum HostInner<T: Elem> {
    Real(PinnedHostSlice<T>),
    Emu {
        region: Arc<Region>,
        dev: Arc<EmuDevice>,
        len: usize,
    },
}

impl<T: Elem> HostBuf<T> {
    pub fn len(&self) -> usize {
        match &self.inner {
            HostInner::Real(s) => s.len(),
            HostInner::Emu { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The contents. Only meaningful once every copy into it completed (an event recorded
    /// after those copies was waited on): on the emulated device an early read sees NaN.
    pub fn as_slice(&self) -> Result<&[T], CudaError> {
        match &self.inner {
            HostInner::Real(s) => s.as_slice().map_err(CudaError::driver("pinned memory")),
            // SAFETY: the region holds `len` elements of T, aligned, for the life of self.
            HostInner::Emu { region, len, .. } => {
                Ok(unsafe { std::slice::from_raw_parts(region.base as *const T, *len) })
            }
        }
    }

    pub fn as_mut_slice(&mut self) -> Result<&mut [T], CudaError> {
        match &mut self.inner {
            HostInner::Real(s) => s.as_mut_slice().map_err(CudaError::driver("pinned memory")),
            // SAFETY: as above, borrowed mutably through self.
            HostInner::Emu { region, len, .. } => {
                Ok(unsafe { std::slice::from_raw_parts_mut(region.base as *mut T, *len) })
            }
        }
    }
}

impl<T: Elem> Drop for HostBuf<T> {
    fn drop(&mut self) {
        if let HostInner::Emu { region, dev, .. } = &self.inner {
            if let Err(e) = dev.free_pinned(region) {
                eprintln!("cuda-emu: {e}");
            }
        }
    }
}

/// A stream event: recorded on the GPU's stream, complete once the stream passed it.
pub struct Event {
    inner: EvInner,
}

enum EvInner {
    Real(CudaEvent, (real::ElapsedFn, entry::ElapsedCall)),
    Emu(EmuEvent, Arc<EmuDevice>),
}

impl Event {
    pub fn synchronize(&self) -> Result<(), CudaError> {
        match &self.inner {
            EvInner::Real(e, _) => e
                .synchronize()
                .map_err(CudaError::driver("cuEventSynchronize")),
            EvInner::Emu(e, d) => e
                .synchronize(&d.stream)
                .map_err(emu_err("cuEventSynchronize")),
        }
    }

    /// Whether the stream passed the event (an error counts as done: `synchronize` says it).
    pub fn is_complete(&self) -> bool {
        match &self.inner {
            EvInner::Real(e, _) => e.try_is_complete().unwrap_or(true),
            EvInner::Emu(e, d) => e.is_complete(&d.stream),
        }
    }

    /// Milliseconds from `self` to `end` (both complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
        match (&self.inner, &end.inner) {
            (EvInner::Real(a, f), EvInner::Real(b, _)) => real::elapsed_ms(*f, a, b),
            (EvInner::Emu(a, d), EvInner::Emu(b, _)) => {
                let call = d.entry().elapsed.name();
                a.elapsed_ms(b).map_err(emu_err(call))
            }
            _ => Err(CudaError::Shape("events of two runtimes".into())),
        }
    }
}

/// A device buffer as a kernel argument, whatever its element type.
pub trait KernelBuf {
    fn push_real<'a>(&'a self, b: &mut LaunchArgs<'a>) -> Result<(), CudaError>;
    fn emu_region(&self) -> Result<Arc<Region>, CudaError>;
}

impl<T: Elem> KernelBuf for DevBuf<T> {
    fn push_real<'a>(&'a self, b: &mut LaunchArgs<'a>) -> Result<(), CudaError> {
        b.arg(self.real()?);
        Ok(())
    }

    fn emu_region(&self) -> Result<Arc<Region>, CudaError> {
        self.region().cloned()
    }
}

/// One kernel argument, in the kernel's parameter order.
pub enum Arg<'a> {
    Buf(&'a dyn KernelBuf),
    I32(i32),
    I64(i64),
    U32(u32),
    F32(f32),
}

/// An A or B operand of `GemmEx`.
#[derive(Clone, Copy)]
pub enum GemmIn<'a> {
    F32(&'a DevBuf<f32>),
    /// bf16 bits.
    Bf16(&'a DevBuf<u16>),
}

impl GemmIn<'_> {
    fn ty(&self) -> GemmType {
        match self {
            GemmIn::F32(_) => GemmType::F32,
            GemmIn::Bf16(_) => GemmType::Bf16,
        }
    }

    fn len(&self) -> usize {
        match self {
            GemmIn::F32(b) => b.len(),
            GemmIn::Bf16(b) => b.len(),
        }
    }

    fn region(&self) -> Result<Arc<Region>, CudaError> {
        match self {
            GemmIn::F32(b) => b.region().cloned(),
            GemmIn::Bf16(b) => b.region().cloned(),
        }
    }
}

/// One `cublasGemmEx` call, column-major: `C = alpha · op(A) · op(B) + beta · C`, op(A) `m × k`,
/// op(B) `k × n`, offsets in elements, compute and C f32.
pub struct GemmArgs<'a> {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub beta: f32,
    pub a: GemmIn<'a>,
    pub a_off: usize,
    pub lda: usize,
    pub b: GemmIn<'a>,
    pub b_off: usize,
    pub ldb: usize,
    pub c: &'a mut DevBuf<f32>,
    pub c_off: usize,
    pub ldc: usize,
}

impl GemmArgs<'_> {
    fn shape(&self) -> Gemm {
        Gemm {
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            m: self.m,
            n: self.n,
            k: self.k,
            alpha: self.alpha,
            beta: self.beta,
            ab_type: self.a.ty(),
            a: 0,
            lda: self.lda,
            b: 0,
            ldb: self.ldb,
            c: 0,
            ldc: self.ldc,
        }
    }

    /// The operands' spans checked against their buffers (cuBLAS itself would read past them).
    fn check(&self) -> Result<Gemm, CudaError> {
        if self.a.ty() != self.b.ty() {
            return Err(CudaError::Shape(
                "GemmEx: A and B of different types".into(),
            ));
        }
        let g = self.shape();
        let (sa, sb, sc) = g.spans().map_err(CudaError::Shape)?;
        check_range(self.a_off, sa, self.a.len(), "GemmEx A")?;
        check_range(self.b_off, sb, self.b.len(), "GemmEx B")?;
        check_range(self.c_off, sc, self.c.len(), "GemmEx C")?;
        Ok(g)
    }
}

/// A device buffer of `n` elements (at least one) on `rt`, zeroed in stream order.
pub(crate) fn zeros_in<T: Elem>(rt: &Rt, n: usize) -> Result<DevBuf<T>, CudaError> {
    let n = n.max(1);
    let buf = DevBuf {
        owned: rt.owned().clone(),
        inner: match rt {
            Rt::Real(r) => DevInner::Real(r.zeros(n)?),
            Rt::Emu(d) => DevInner::Emu {
                region: d
                    .alloc(bytes_of::<T>(n), true)
                    .map_err(emu_err("cuMemAlloc"))?,
                dev: d.clone(),
                len: n,
            },
        },
    };
    buf.owned.add(bytes_of::<T>(n) as u64);
    Ok(buf)
}

impl Gpu {
    /// The driver entry points this device's runs take (the emulated device's by its reported
    /// version).
    pub fn entry_points(&self) -> entry::EntryPoints {
        match &self.rt {
            Rt::Real(r) => r.entry,
            Rt::Emu(d) => d.entry(),
        }
    }

    /// kvbench's own device allocations on this device, counted exactly.
    pub fn owned(&self) -> OwnedBytes {
        self.rt.owned().read()
    }

    /// A planted leak (`--inject-fault device-leak`): `bytes` of device memory allocated and
    /// never freed, as a forgotten buffer would be. Counted in [`Gpu::owned`] like any other.
    pub fn leak_for_fault(&self, bytes: usize) -> Result<(), CudaError> {
        let b = self.zeros::<u16>(bytes.div_ceil(2))?;
        std::mem::forget(b);
        Ok(())
    }

    /// The emulated device behind this `Gpu`, if it is one.
    pub fn emulated(&self) -> Option<&Arc<EmuDevice>> {
        match &self.rt {
            Rt::Emu(d) => Some(d),
            Rt::Real(_) => None,
        }
    }

    /// A device buffer of `n` elements (at least one), zeroed in stream order.
    pub fn zeros<T: Elem>(&self, n: usize) -> Result<DevBuf<T>, CudaError> {
        zeros_in(&self.rt, n)
    }

    /// A new device buffer holding `host` (one zero element when `host` is empty).
    pub fn upload<T: Elem>(&self, host: &[T]) -> Result<DevBuf<T>, CudaError> {
        let mut b = self.zeros::<T>(host.len())?;
        self.htod(host, &mut b, 0)?;
        Ok(b)
    }

    /// Copies pageable `host` to `dst` at element `at` (the source is taken at the call, as the
    /// driver stages pageable memory before returning).
    pub fn htod<T: Elem>(
        &self,
        host: &[T],
        dst: &mut DevBuf<T>,
        at: usize,
    ) -> Result<(), CudaError> {
        if host.is_empty() {
            return Ok(());
        }
        check_range(at, host.len(), dst.len(), "host-to-device copy")?;
        match &self.rt {
            Rt::Real(r) => r.htod(host, dst.real_mut()?, at),
            Rt::Emu(d) => {
                // SAFETY: plain-old-data elements viewed as bytes.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        host.as_ptr() as *const u8,
                        bytes_of::<T>(host.len()),
                    )
                };
                d.htod(bytes.to_vec(), dst.region()?, bytes_of::<T>(at))
                    .map_err(emu_err("cuMemcpyHtoD"))
            }
        }
    }

    /// Copies `n` elements from `src` at `src_at` to `dst` at `dst_at`, in stream order.
    pub fn dtod<T: Elem>(
        &self,
        src: &DevBuf<T>,
        src_at: usize,
        dst: &mut DevBuf<T>,
        dst_at: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        check_range(src_at, n, src.len(), "device-to-device copy source")?;
        check_range(dst_at, n, dst.len(), "device-to-device copy destination")?;
        match &self.rt {
            Rt::Real(r) => r.dtod(src.real()?, src_at, dst.real_mut()?, dst_at, n),
            Rt::Emu(d) => d
                .copy(
                    src.region()?,
                    bytes_of::<T>(src_at),
                    dst.region()?,
                    bytes_of::<T>(dst_at),
                    bytes_of::<T>(n),
                    "device-to-device copy",
                )
                .map_err(emu_err("cuMemcpyDtoD")),
        }
    }

    /// Queues the copy of `n` elements of `src` at `src_at` into pinned `dst` at `dst_at`. The
    /// host may read them only after waiting on an event recorded after this call.
    pub fn dtoh_async<T: Elem>(
        &self,
        src: &DevBuf<T>,
        src_at: usize,
        dst: &mut HostBuf<T>,
        dst_at: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        check_range(src_at, n, src.len(), "device-to-host copy source")?;
        check_range(dst_at, n, dst.len(), "device-to-host copy destination")?;
        match (&self.rt, &mut dst.inner) {
            (Rt::Real(r), HostInner::Real(h)) => r.dtoh_pinned(src.real()?, src_at, h, dst_at, n),
            (Rt::Emu(d), HostInner::Emu { region, .. }) => d
                .copy(
                    src.region()?,
                    bytes_of::<T>(src_at),
                    region,
                    bytes_of::<T>(dst_at),
                    bytes_of::<T>(n),
                    "device-to-host copy",
                )
                .map_err(emu_err("cuMemcpyDtoH")),
            _ => Err(CudaError::Shape("pinned memory of another runtime".into())),
        }
    }

    /// Queues the copy of `n` elements of pinned `src` at `src_at` into `dst` at `dst_at`; `src`
    /// must stay alive (and unchanged) until the stream passed the copy.
    pub fn htod_async<T: Elem>(
        &self,
        src: &HostBuf<T>,
        src_at: usize,
        dst: &mut DevBuf<T>,
        dst_at: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        check_range(src_at, n, src.len(), "host-to-device copy source")?;
        check_range(dst_at, n, dst.len(), "host-to-device copy destination")?;
        match (&self.rt, &src.inner) {
            (Rt::Real(r), HostInner::Real(h)) => {
                r.htod_pinned(h, src_at, dst.real_mut()?, dst_at, n)
            }
            (Rt::Emu(d), HostInner::Emu { region, .. }) => d
                .copy(
                    region,
                    bytes_of::<T>(src_at),
                    dst.region()?,
                    bytes_of::<T>(dst_at),
                    bytes_of::<T>(n),
                    "host-to-device copy",
                )
                .map_err(emu_err("cuMemcpyHtoD")),
            _ => Err(CudaError::Shape("pinned memory of another runtime".into())),
        }
    }

    /// Waits for the stream and returns `dev`'s contents.
    pub fn download<T: Elem>(&self, dev: &DevBuf<T>) -> Result<Vec<T>, CudaError> {
        match &self.rt {
            Rt::Real(r) => r.download(dev.real()?),
            Rt::Emu(d) => {
                let bytes = d
                    .read_now(dev.region()?, 0, bytes_of::<T>(dev.len()))
                    .map_err(emu_err("cuMemcpyDtoH"))?;
                let mut out = vec![T::default(); dev.len()];
                // SAFETY: `bytes` holds exactly len elements' bytes; T is plain old data.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        out.as_mut_ptr() as *mut u8,
                        bytes.len(),
                    )
                };
                Ok(out)
            }
        }
    }

    /// Page-locked host memory for `n` elements (at least one).
    pub fn pinned_buf<T: Elem>(&self, n: usize) -> Result<HostBuf<T>, CudaError> {
        let n = n.max(1);
        Ok(HostBuf {
            inner: match &self.rt {
                Rt::Real(r) => HostInner::Real(r.pinned(n)?),
                Rt::Emu(d) => HostInner::Emu {
                    region: d
                        .alloc_pinned(bytes_of::<T>(n))
                        .map_err(emu_err("cuMemHostAlloc"))?,
                    dev: d.clone(),
                    len: n,
                },
            },
        })
    }

    pub fn sync(&self) -> Result<(), CudaError> {
        match &self.rt {
            Rt::Real(r) => r.sync(),
            Rt::Emu(d) => d
                .stream
                .synchronize()
                .map_err(emu_err("cuStreamSynchronize")),
        }
    }

    /// `cuMemGetInfo`: (free, total) bytes of this device.
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        match &self.rt {
            Rt::Real(r) => r.mem_info(),
            Rt::Emu(d) => Ok(d.mem_info()),
        }
    }

    /// Waits for the stream, then hands freed memory back to the device, so `mem_info` sees it.
    pub fn release_freed(&self) -> Result<(), CudaError> {
        self.sync()?;
        match &self.rt {
            Rt::Real(r) => r.release_freed(),
            Rt::Emu(_) => Ok(()),
        }
    }

    pub fn new_event(&self) -> Result<Event, CudaError> {
        Ok(Event {
            inner: match &self.rt {
                Rt::Real(r) => EvInner::Real(r.new_event()?, (r.elapsed, r.entry.elapsed)),
                Rt::Emu(d) => EvInner::Emu(EmuEvent::default(), d.clone()),
            },
        })
    }

    /// Records `ev` on the stream (it completes once everything queued before it ran).
    pub fn record(&self, ev: &Event) -> Result<(), CudaError> {
        match (&self.rt, &ev.inner) {
            (Rt::Real(r), EvInner::Real(e, _)) => r.record(e),
            (Rt::Emu(d), EvInner::Emu(e, _)) => {
                e.record(&d.stream).map_err(emu_err("cuEventRecord"))
            }
            _ => Err(CudaError::Shape("an event of another runtime".into())),
        }
    }

    /// Queues kernel `name` with `args` in its parameter order.
    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        args: &[Arg<'_>],
    ) -> Result<(), CudaError> {
        match &self.rt {
            Rt::Real(r) => r.launch(name, grid, block, shared_bytes, args),
            Rt::Emu(d) => {
                let mut params = Vec::with_capacity(args.len());
                for a in args {
                    params.push(match a {
                        Arg::Buf(b) => EmuParam::Buf(b.emu_region()?),
                        Arg::I32(v) => EmuParam::Scalar(u64::from(*v as u32)),
                        Arg::I64(v) => EmuParam::Scalar(*v as u64),
                        Arg::U32(v) => EmuParam::Scalar(u64::from(*v)),
                        Arg::F32(v) => EmuParam::Scalar(u64::from(v.to_bits())),
                    });
                }
                let dim = |(x, y, z)| Dim3 { x, y, z };
                d.launch(name, dim(grid), dim(block), shared_bytes, params)
                    .map_err(|message| CudaError::Driver {
                        call: "kernel launch",
                        message,
                    })
            }
        }
    }

    /// Prepares cuBLAS (a handle on the stream) before the first [`gemm_ex`](Self::gemm_ex).
    pub fn init_blas(&self) -> Result<(), CudaError> {
        match &self.rt {
            Rt::Real(r) => r.init_blas(),
            Rt::Emu(_) => Ok(()),
        }
    }

    /// One `cublasGemmEx`, its operands checked against their buffers first.
    pub fn gemm_ex(&self, g: GemmArgs<'_>) -> Result<(), CudaError> {
        let shape = g.check()?;
        match &self.rt {
            Rt::Real(r) => r.gemm_ex(g),
            Rt::Emu(d) => {
                let e = shape.ab_type.bytes();
                let regions = [
                    (g.a.region()?, g.a_off * e),
                    (g.b.region()?, g.b_off * e),
                    (g.c.region()?.clone(), g.c_off * 4),
                ];
                d.gemm(shape, regions).map_err(emu_err("cublasGemmEx"))
            }
        }
    }
}
