//! The emulated device: its memory ([`super::memory`]), one asynchronous stream
//! ([`super::stream`]), copies checked against their allocations, kernel launches through the
//! host build of the real kernels ([`super::kernels`]) with faults mapped to the allocation and
//! the parameter, cuBLAS `GemmEx` on the CPU ([`super::blas`]), and a `cuMemGetInfo` that counts
//! live allocations, so the ledger reconciles on it as on a GPU.
//!
//! Left alone, that `cuMemGetInfo` is exact, which a driver's never is; with driver noise
//! ([`EmuConfig::noise_seed`], `--emu-driver-noise`) it moves as a driver's does, seeded: a
//! local-memory reserve that grows on each kernel's first launch, a cuBLAS workspace taken at the
//! first GEMM, and another process that allocates in the middle of the run. The device also
//! reports a driver version ([`EmuConfig::driver_version`], `--emu-driver`) and hides the entry
//! points that version lacks ([`crate::runtime::entry`]).

use std::collections::BTreeSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::blas::Gemm;
use super::kernels::{self, Dim3, EmuKernelError};
use super::memory::{Kind, Memory, Region, POISON_WORD};
use super::stream::{Delays, Stream};
use crate::runtime::entry::{self, EntryPoints};
use crate::runtime::Owned;

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
    /// The driver's CUDA version the device reports (13000 = 13.0); entry points newer than it
    /// are hidden.
    pub driver_version: i32,
    /// Seeds the driver's own use of memory (`None`: `cuMemGetInfo` counts allocations only).
    pub noise_seed: Option<u64>,
}

impl EmuConfig {
    pub fn new(seed: u64) -> EmuConfig {
        EmuConfig {
            seed,
            min_delay_us: 0,
            max_delay_us: 200,
            delay_one_in: 16,
            total_bytes: 80 << 30,
            driver_version: 13000,
            noise_seed: None,
        }
    }
}

/// Bounds of the emulated driver's own memory moves (each drawn from the noise seed).
pub mod noise {
    /// A kernel's first launch grows the local-memory reserve by 1..=this many MiB.
    pub const FIRST_LAUNCH_MAX_MIB: u64 = 4;
    /// The first GEMM takes cuBLAS's workspace, MiB.
    pub const BLAS_WORKSPACE_MIB: u64 = 4;
    /// Another process allocates 8..=this many MiB...
    pub const OTHER_PROCESS_MAX_MIB: u64 = 64;
    /// ...at one launch from this one (past a small model's warm-up, so inside its run)...
    pub const OTHER_PROCESS_FROM_LAUNCH: u64 = 200;
    /// ...up to this many launches later.
    pub const OTHER_PROCESS_SPREAD: u64 = 300;
}

/// The driver's own memory on a noisy emulated device.
#[derive(Default)]
struct DriverNoise {
    kernels_seen: BTreeSet<String>,
    blas_ready: bool,
    launches: u64,
    /// The launch at which another process allocates, and how much.
    other_at_launch: u64,
    other_pending_bytes: u64,
    draws: u64,
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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
    /// kvbench's allocations, as the runtime seam counts them.
    pub(crate) owned: Arc<Owned>,
    entry: EntryPoints,
    noise: Option<Mutex<DriverNoise>>,
    /// What the emulated driver holds for itself, and what another process holds.
    driver_bytes: AtomicU64,
    other_process_bytes: AtomicU64,
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
        let version = config.driver_version;
        let entry = entry::resolve(version, |n| entry::emulated_has(version, n))
            .map_err(|e| e.to_string())?;
        let noise = config.noise_seed.map(|seed| {
            let r = splitmix(seed ^ 0x6f74_6865_7270_726f);
            Mutex::new(DriverNoise {
                other_at_launch: noise::OTHER_PROCESS_FROM_LAUNCH + r % noise::OTHER_PROCESS_SPREAD,
                other_pending_bytes: (8 + (r >> 20) % (noise::OTHER_PROCESS_MAX_MIB - 7)) << 20,
                ..DriverNoise::default()
            })
        });
        Ok(Arc::new(EmuDevice {
            config,
            mem: Arc::new(Memory::default()),
            stream,
            copied_bytes: AtomicU64::new(0),
            owned: Arc::default(),
            entry,
            noise,
            driver_bytes: AtomicU64::new(0),
            other_process_bytes: AtomicU64::new(0),
        }))
    }

    /// The entry points runs on this device take (by its reported driver version).
    pub fn entry(&self) -> EntryPoints {
        self.entry
    }

    /// (driver's own bytes, another process's bytes) the noisy device holds now.
    pub fn noise_bytes(&self) -> (u64, u64) {
        (
            self.driver_bytes.load(Ordering::Relaxed),
            self.other_process_bytes.load(Ordering::Relaxed),
        )
    }

    /// A launch of `kernel` (or a GEMM, `None`) as the noisy driver sees it: a first launch grows
    /// the reserve, the first GEMM takes a workspace, and another process allocates at its turn.
    fn driver_sees(&self, kernel: Option<&str>) {
        let Some(n) = &self.noise else {
            return;
        };
        let mut n = n.lock().unwrap_or_else(|e| e.into_inner());
        let seed = self.config.noise_seed.unwrap_or(0);
        n.launches += 1;
        let grow = match kernel {
            Some(k) if n.kernels_seen.insert(k.to_string()) => {
                n.draws += 1;
                (1 + splitmix(seed.wrapping_add(n.draws)) % noise::FIRST_LAUNCH_MAX_MIB) << 20
            }
            None if !n.blas_ready => {
                n.blas_ready = true;
                noise::BLAS_WORKSPACE_MIB << 20
            }
            _ => 0,
        };
        self.driver_bytes.fetch_add(grow, Ordering::Relaxed);
        if n.launches == n.other_at_launch {
            let b = std::mem::take(&mut n.other_pending_bytes);
            self.other_process_bytes.fetch_add(b, Ordering::Relaxed);
        }
    }

    /// Bytes moved by copies enqueued so far (host↔device and device↔device).
    pub fn copied_bytes(&self) -> u64 {
        self.copied_bytes.load(Ordering::Relaxed)
    }

    /// (free, total) as `cuMemGetInfo` would say: total minus live allocations, minus the
    /// driver's own and another process's memory on a noisy device.
    pub fn mem_info(&self) -> (u64, u64) {
        let (_, used) = self.mem.device_live();
        let (driver, other) = self.noise_bytes();
        let total = self.config.total_bytes;
        (
            total.saturating_sub(used.saturating_add(driver).saturating_add(other)),
            total,
        )
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
        self.driver_sees(Some(kernel));
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
        self.driver_sees(None);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(seed: u64) -> Arc<EmuDevice> {
        EmuDevice::new(EmuConfig {
            noise_seed: Some(seed),
            ..EmuConfig::new(1)
        })
        .expect("device")
    }

    /// A kernel's first launch grows the reserve and later ones do not; the first GEMM takes the
    /// workspace; another process allocates at its seeded launch; all of it from the seed alone.
    #[test]
    fn driver_noise_moves_free_memory_as_a_driver_does_from_its_seed() {
        let seed = 42;
        eprintln!("driver noise seed {seed}");
        let (a, b) = (noisy(seed), noisy(seed));
        let free0 = a.mem_info().0;
        a.driver_sees(Some("k"));
        let free1 = a.mem_info().0;
        assert!(free1 < free0 && free0 - free1 <= noise::FIRST_LAUNCH_MAX_MIB << 20);
        a.driver_sees(Some("k"));
        assert_eq!(a.mem_info().0, free1, "a second launch takes nothing");
        a.driver_sees(None);
        assert_eq!(free1 - a.mem_info().0, noise::BLAS_WORKSPACE_MIB << 20);
        for _ in 0..noise::OTHER_PROCESS_FROM_LAUNCH + noise::OTHER_PROCESS_SPREAD {
            a.driver_sees(Some("k"));
        }
        let (_, other) = a.noise_bytes();
        assert!((8 << 20..=noise::OTHER_PROCESS_MAX_MIB << 20).contains(&other));
        for k in [Some("k"), Some("k"), None] {
            b.driver_sees(k);
        }
        for _ in 0..noise::OTHER_PROCESS_FROM_LAUNCH + noise::OTHER_PROCESS_SPREAD {
            b.driver_sees(Some("k"));
        }
        assert_eq!(
            a.mem_info(),
            b.mem_info(),
            "the same seed, the same figures"
        );
        let quiet = EmuDevice::new(EmuConfig::new(1)).expect("device");
        quiet.driver_sees(Some("k"));
        assert_eq!(quiet.mem_info().0, quiet.config.total_bytes);
    }

    #[test]
    fn an_older_reported_driver_takes_the_older_timing_call() {
        let d = EmuDevice::new(EmuConfig {
            driver_version: 12040,
            ..EmuConfig::new(1)
        })
        .expect("device");
        assert_eq!(d.entry().elapsed, crate::runtime::entry::ElapsedCall::V1);
    }
}
