//! The emulated device: its memory ([`super::memory`]), one asynchronous stream
//! ([`super::stream`]), copies checked against their allocations, kernel launches through the
//! host build of the real kernels ([`super::kernels`]) with faults mapped to the allocation and
//! the parameter, cuBLAS `GemmEx` on the CPU ([`super::blas`]), and a `cuMemGetInfo` that counts
//! live allocations, so the ledger reconciles on it as on a GPU.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::blas::Gemm;
use super::kernels::{self, Dim3, EmuKernelError};
use super::memory::{Kind, Memory, Region, POISON_WORD};
use super::stream::{Delays, Stream};

/// How the emulated device behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmuConfig {
    /// Seeds the completion delays (`--emu-seed`).
    pub seed: u64,
    /// Shortest and longest delay of a delayed operation.
    pub min_delay_us: u64,
    pub max_delay_us: u64,
    /// One operation in this many is delayed.
    pub delay_one_in: u64,
    /// The device memory `cuMemGetInfo` reports.
    pub total_bytes: u64,
}

impl EmuConfig {
    pub fn new(seed: u64) -> EmuConfig {
        EmuConfig {
            seed,
            min_delay_us: 0,
            max_delay_us: 200,
            delay_one_in: 16,
            total_bytes: 80 << 30,
        }
    }
}

/// A kernel parameter as the emulated launch receives it.
pub enum EmuParam {
    /// A pointer into this allocation (its base address).
    Buf(Arc<Region>),
    /// A scalar's bytes, little-endian, in the low bytes of a word.
    Scalar(u64),
}

pub struct EmuDevice {
    pub config: EmuConfig,
    pub mem: Arc<Memory>,
    pub stream: Stream,
    copied_bytes: AtomicU64,
}

fn poison_bytes(addr: usize, len: usize) {
    let w = POISON_WORD.to_le_bytes();
    for i in 0..len {
        // SAFETY: callers pass a range checked against a live allocation.
        unsafe { *((addr + i) as *mut u8) = w[(addr + i) % 4] };
    }
}

fn copy_bytes(src: usize, dst: usize, len: usize) {
    // SAFETY: callers pass ranges checked against live allocations (`ptr::copy` allows overlap).
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
}

impl EmuDevice {
    pub fn new(config: EmuConfig) -> Result<Arc<EmuDevice>, String> {
        let stream = Stream::new(Delays {
            seed: config.seed,
            min_delay_us: config.min_delay_us,
            max_delay_us: config.max_delay_us,
            delay_one_in: config.delay_one_in,
        })?;
        Ok(Arc::new(EmuDevice {
            config,
            mem: Arc::new(Memory::default()),
            stream,
            copied_bytes: AtomicU64::new(0),
        }))
    }

    /// Bytes moved by copies enqueued so far (host↔device and device↔device).
    pub fn copied_bytes(&self) -> u64 {
        self.copied_bytes.load(Ordering::Relaxed)
    }

    /// (free, total) as `cuMemGetInfo` would say: total minus live allocations.
    pub fn mem_info(&self) -> (u64, u64) {
        let (_, used) = self.mem.device_live();
        let total = self.config.total_bytes;
        (total.saturating_sub(used), total)
    }

    /// A device allocation of `bytes`, poisoned; zeroed in stream order when `zero`.
    pub fn alloc(&self, bytes: usize, zero: bool) -> Result<Arc<Region>, String> {
        if bytes as u64 > self.mem_info().0 {
            return Err(format!(
                "out of emulated device memory: {bytes} bytes asked, {} free",
                self.mem_info().0
            ));
        }
        let r = self.mem.alloc(Kind::Device, bytes)?;
        if zero {
            let d = r.clone();
            self.stream.enqueue(Box::new(move || {
                d.check(0, d.bytes, "memset")?;
                // SAFETY: the whole live allocation, checked above.
                unsafe { std::ptr::write_bytes(d.base as *mut u8, 0, d.bytes) };
                Ok(())
            }))?;
        }
        Ok(r)
    }

    /// Pinned host memory of `bytes`, poisoned.
    pub fn alloc_pinned(&self, bytes: usize) -> Result<Arc<Region>, String> {
        self.mem.alloc(Kind::Pinned, bytes)
    }

    /// Frees a device allocation in stream order (as `cuMemFreeAsync`).
    pub fn free_device(&self, r: Arc<Region>) {
        let mem = self.mem.clone();
        let d = r.clone();
        if self.stream.enqueue(Box::new(move || mem.free(&d))).is_err() {
            // A failed stream runs nothing more: free now.
            let _ = self.mem.free(&r);
        }
    }

    /// Frees pinned host memory now (as `cuMemFreeHost`): a copy still queued on it then fails
    /// as a use after free.
    pub fn free_pinned(&self, r: &Arc<Region>) -> Result<(), String> {
        self.mem.free(r)
    }

    /// Copies `src` (pageable host memory, taken now, as the driver stages it) to `dst` at byte
    /// `off`.
    pub fn htod(&self, src: Vec<u8>, dst: &Arc<Region>, off: usize) -> Result<(), String> {
        let what = "host-to-device copy";
        dst.check(off, src.len(), what)?;
        self.count(src.len());
        let d = dst.clone();
        self.stream
            .enqueue(Box::new(move || {
                d.check(off, src.len(), what)?;
                copy_bytes(src.as_ptr() as usize, d.base + off, src.len());
                Ok(())
            }))
            .map(drop)
    }

    /// A copy of `len` bytes between two allocations (device or pinned), in stream order. A
    /// pinned destination is poisoned now, so a read before the copy completes sees NaN.
    pub fn copy(
        &self,
        src: &Arc<Region>,
        src_off: usize,
        dst: &Arc<Region>,
        dst_off: usize,
        len: usize,
        what: &'static str,
    ) -> Result<(), String> {
        src.check(src_off, len, what)?;
        dst.check(dst_off, len, what)?;
        if dst.kind == Kind::Pinned {
            poison_bytes(dst.base + dst_off, len);
        }
        self.count(len);
        let (s, d) = (src.clone(), dst.clone());
        self.stream
            .enqueue(Box::new(move || {
                s.check(src_off, len, what)?;
                d.check(dst_off, len, what)?;
                copy_bytes(s.base + src_off, d.base + dst_off, len);
                Ok(())
            }))
            .map(drop)
    }

    /// Waits for the stream, then reads `len` bytes of `src` at `off`.
    pub fn read_now(&self, src: &Arc<Region>, off: usize, len: usize) -> Result<Vec<u8>, String> {
        src.check(off, len, "device-to-host copy")?;
        self.count(len);
        self.stream.synchronize()?;
        src.check(off, len, "device-to-host copy")?;
        let mut out = vec![0u8; len];
        copy_bytes(src.base + off, out.as_mut_ptr() as usize, len);
        Ok(out)
    }

    fn count(&self, len: usize) {
        self.copied_bytes.fetch_add(len as u64, Ordering::Relaxed);
    }

    /// Queues `kernel` on the stream. At run time every pointer parameter must still be live;
    /// a fault inside the kernel is reported with the allocation and parameter it hit.
    pub fn launch(
        &self,
        kernel: &str,
        grid: Dim3,
        block: Dim3,
        shared_bytes: u32,
        params: Vec<EmuParam>,
    ) -> Result<(), String> {
        let name = kernel.to_string();
        let mem = self.mem.clone();
        self.stream
            .enqueue(Box::new(move || {
                let mut words: Vec<u64> = Vec::with_capacity(params.len());
                for (i, p) in params.iter().enumerate() {
                    words.push(match p {
                        EmuParam::Buf(r) => {
                            r.check(0, 0, &format!("kernel {name} parameter {i}"))?;
                            r.base as u64
                        }
                        EmuParam::Scalar(v) => *v,
                    });
                }
                let ptrs: Vec<*mut c_void> = words
                    .iter_mut()
                    .map(|w| w as *mut u64 as *mut c_void)
                    .collect();
                // SAFETY: each pointer parameter is the base of a live allocation; the kernel's
                // accesses past them land on guard pages, which `launch` turns into `Fault`.
                let r = unsafe { kernels::launch(&name, grid, block, shared_bytes, &ptrs) };
                r.map_err(|e| describe_fault(&mem, &params, e))
            }))
            .map(drop)
    }

    /// Queues a GEMM; `regions` are (allocation, byte offset) of A, B and C, checked against
    /// the call's spans now and again when it runs.
    pub fn gemm(&self, g: Gemm, regions: [(Arc<Region>, usize); 3]) -> Result<(), String> {
        let (sa, sb, sc) = g.spans()?;
        let e = g.ab_type.bytes();
        let spans = [sa * e, sb * e, sc * 4];
        let names = ["GemmEx A", "GemmEx B", "GemmEx C"];
        for ((r, off), (s, n)) in regions.iter().zip(spans.iter().zip(names)) {
            r.check(*off, *s, n)?;
        }
        self.stream
            .enqueue(Box::new(move || {
                for ((r, off), (s, n)) in regions.iter().zip(spans.iter().zip(names)) {
                    r.check(*off, *s, n)?;
                }
                let g = Gemm {
                    a: regions[0].0.base + regions[0].1,
                    b: regions[1].0.base + regions[1].1,
                    c: regions[2].0.base + regions[2].1,
                    ..g
                };
                // SAFETY: every operand's span checked against its live allocation above.
                unsafe { g.run() };
                Ok(())
            }))
            .map(drop)
    }

    /// Live device allocations (id, bytes): empty once everything was freed.
    pub fn leaks(&self) -> Vec<(u64, usize)> {
        self.mem.live_device_regions()
    }
}

/// A kernel error in the words of a memory checker: which allocation the address belongs to and
/// which parameter pointed into it.
fn describe_fault(mem: &Memory, params: &[EmuParam], e: EmuKernelError) -> String {
    let EmuKernelError::Fault {
        kernel,
        addr,
        write,
    } = &e
    else {
        return e.to_string();
    };
    let access = if *write { "write" } else { "read" };
    let Some(r) = mem.find(*addr) else {
        return format!("kernel {kernel}: invalid {access} at {addr:#x}, in no allocation");
    };
    let param = params
        .iter()
        .position(|p| matches!(p, EmuParam::Buf(b) if b.id == r.id))
        .map_or("no parameter points into it".to_string(), |i| {
            format!("through parameter {i}")
        });
    format!(
        "kernel {kernel}: invalid {access} at {addr:#x}: {} ({param})",
        r.describe(*addr)
    )
}
