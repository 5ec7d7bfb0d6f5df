//! Emulated memory: every device allocation and every pinned host buffer in its own `mmap`, with
//! a `PROT_NONE` guard page before it and after it, its end placed against the trailing guard
//! page, filled with NaN words when made, and turned `PROT_NONE` when freed (quarantined, not
//! unmapped at once). A kernel that reads past an allocation or touches freed memory then faults
//! on a protected page (the host kernel build turns that into an error); every copy is checked in
//! software against its allocations before it runs.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Two bf16 NaNs, or one f32 NaN: what unwritten memory holds.
pub const POISON_WORD: u32 = 0x7fc0_7fc0;
/// Allocation start alignment (a `float4` load needs 16 bytes).
const ALIGN_BYTES: usize = 16;
/// Freed regions stay mapped (`PROT_NONE`) until this many bytes of newer ones are freed.
const QUARANTINE_BYTES: usize = 512 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Device,
    Pinned,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Device => "device allocation",
            Kind::Pinned => "pinned host buffer",
        }
    }
}

/// One mapping: `[map_base, map_base + map_len)`, data at `[base, base + bytes)`.
#[derive(Debug)]
pub struct Region {
    pub id: u64,
    pub kind: Kind,
    pub base: usize,
    pub bytes: usize,
    map_base: usize,
    map_len: usize,
    data_start: usize,
    data_len: usize,
    freed: AtomicBool,
}

fn page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl Region {
    fn map(id: u64, kind: Kind, bytes: usize) -> Result<Region, String> {
        let page = page_bytes();
        let data_len = bytes
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or("allocation size overflows")?;
        let map_len = data_len
            .checked_add(2 * page)
            .ok_or("allocation size overflows")?;
        // SAFETY: a fresh anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap of {map_len} bytes failed"));
        }
        let map_base = p as usize;
        let data_start = map_base + page;
        // SAFETY: inside the mapping just made.
        let rc = unsafe {
            libc::mprotect(
                data_start as *mut libc::c_void,
                data_len,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            // SAFETY: unmapping what was mapped above.
            unsafe { libc::munmap(p, map_len) };
            return Err("mprotect failed".into());
        }
        let base = (data_start + data_len - bytes) & !(ALIGN_BYTES - 1);
        let r = Region {
            id,
            kind,
            base,
            bytes,
            map_base,
            map_len,
            data_start,
            data_len,
            freed: AtomicBool::new(false),
        };
        r.poison(0, data_len);
        Ok(r)
    }

    /// Fills `[data_start + from, + len)` with [`POISON_WORD`] (whole words).
    fn poison(&self, from: usize, len: usize) {
        let p = (self.data_start + from) as *mut u32;
        // SAFETY: the data pages are mapped read-write and page aligned; len is whole pages here.
        unsafe { std::slice::from_raw_parts_mut(p, len / 4) }.fill(POISON_WORD);
    }

    pub fn is_freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }

    /// Ok when `[off, off + len)` lies inside this live allocation; else the error a sanitizer
    /// would print, `what` naming the access.
    pub fn check(&self, off: usize, len: usize, what: &str) -> Result<(), String> {
        if self.is_freed() {
            return Err(format!(
                "{what}: use after free of {} #{} ({} bytes)",
                self.kind.name(),
                self.id,
                self.bytes
            ));
        }
        match off.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(format!(
                "{what}: out of bounds: bytes [{off}, {}) of {} #{} ({} bytes)",
                off.saturating_add(len),
                self.kind.name(),
                self.id,
                self.bytes
            )),
        }
    }

    /// Where `addr` lies relative to this allocation, in words.
    pub fn describe(&self, addr: usize) -> String {
        let what = format!("{} #{} ({} bytes)", self.kind.name(), self.id, self.bytes);
        if self.is_freed() {
            format!("inside freed {what}")
        } else if addr < self.base {
            format!("{} bytes before {what}", self.base - addr)
        } else if addr >= self.base + self.bytes {
            format!(
                "{} bytes past the end of {what}",
                addr - (self.base + self.bytes)
            )
        } else {
            format!("at byte {} of {what}", addr - self.base)
        }
    }

    fn contains_mapping(&self, addr: usize) -> bool {
        (self.map_base..self.map_base + self.map_len).contains(&addr)
    }

    /// Marks the region freed and protects its pages; false when it already was.
    fn protect(&self) -> bool {
        if self.freed.swap(true, Ordering::AcqRel) {
            return false;
        }
        // SAFETY: the data pages of this region's own mapping.
        unsafe {
            libc::mprotect(
                self.data_start as *mut libc::c_void,
                self.data_len,
                libc::PROT_NONE,
            )
        };
        true
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, referred to by nothing once the last Arc goes.
        unsafe { libc::munmap(self.map_base as *mut libc::c_void, self.map_len) };
    }
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    /// Every region not yet unmapped (live or quarantined), by mapping start.
    mapped: BTreeMap<usize, Arc<Region>>,
    quarantine: VecDeque<Arc<Region>>,
    quarantine_bytes: usize,
    device_live_bytes: u64,
    device_live: u64,
}

/// The emulated address space of one device.
#[derive(Default)]
pub struct Memory {
    reg: Mutex<Registry>,
}

/// What `cuMemGetInfo` counts per allocation: sizes rounded up to 512 bytes.
pub const DEVICE_ROUND_BYTES: u64 = 512;

fn rounded(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(DEVICE_ROUND_BYTES) * DEVICE_ROUND_BYTES
}

impl Memory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new poisoned region of `bytes`.
    pub fn alloc(&self, kind: Kind, bytes: usize) -> Result<Arc<Region>, String> {
        let mut g = self.lock();
        g.next_id += 1;
        let r = Arc::new(Region::map(g.next_id, kind, bytes)?);
        g.mapped.insert(r.map_base, r.clone());
        if kind == Kind::Device {
            g.device_live_bytes += rounded(bytes);
            g.device_live += 1;
        }
        Ok(r)
    }

    /// Frees `r`: its pages become `PROT_NONE` and it joins the quarantine. A second free is an
    /// error, as `cuMemFree` of a freed pointer is.
    pub fn free(&self, r: &Arc<Region>) -> Result<(), String> {
        if !r.protect() {
            return Err(format!(
                "double free of {} #{} ({} bytes)",
                r.kind.name(),
                r.id,
                r.bytes
            ));
        }
        let mut g = self.lock();
        if r.kind == Kind::Device {
            g.device_live_bytes = g.device_live_bytes.saturating_sub(rounded(r.bytes));
            g.device_live = g.device_live.saturating_sub(1);
        }
        g.quarantine.push_back(r.clone());
        g.quarantine_bytes += r.map_len;
        while g.quarantine_bytes > QUARANTINE_BYTES {
            let Some(old) = g.quarantine.pop_front() else {
                break;
            };
            g.quarantine_bytes -= old.map_len;
            g.mapped.remove(&old.map_base);
        }
        Ok(())
    }

    /// The region whose mapping (guard pages included) holds `addr`.
    pub fn find(&self, addr: usize) -> Option<Arc<Region>> {
        let g = self.lock();
        g.mapped
            .range(..=addr)
            .next_back()
            .map(|(_, r)| r.clone())
            .filter(|r| r.contains_mapping(addr))
    }

    /// (live device allocations, their bytes as `cuMemGetInfo` counts them).
    pub fn device_live(&self) -> (u64, u64) {
        let g = self.lock();
        (g.device_live, g.device_live_bytes)
    }

    /// Every live device allocation, for the teardown report.
    pub fn live_device_regions(&self) -> Vec<(u64, usize)> {
        let g = self.lock();
        g.mapped
            .values()
            .filter(|r| r.kind == Kind::Device && !r.is_freed())
            .map(|r| (r.id, r.bytes))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_poisoned_end_at_a_guard_page_and_free_once() {
        let m = Memory::default();
        let r = m.alloc(Kind::Device, 100).unwrap();
        assert_eq!(r.base % ALIGN_BYTES, 0);
        assert!(r.base + r.bytes <= r.data_start + r.data_len);
        assert!(r.data_start + r.data_len - (r.base + r.bytes) < ALIGN_BYTES);
        // SAFETY: inside the live region.
        let w = unsafe { std::ptr::read(r.base as *const u32) };
        assert_eq!(w, POISON_WORD);
        assert!(r.check(96, 4, "copy").is_ok());
        let e = r.check(96, 8, "copy").unwrap_err();
        assert!(e.contains("out of bounds") && e.contains("#1"), "{e}");
        assert_eq!(m.device_live(), (1, 512));
        m.free(&r).unwrap();
        assert_eq!(m.device_live(), (0, 0));
        assert!(r
            .check(0, 4, "copy")
            .unwrap_err()
            .contains("use after free"));
        assert!(m.free(&r).unwrap_err().contains("double free"));
        let f = m.find(r.base + r.bytes + 8).unwrap();
        assert_eq!(f.id, r.id);
        assert!(f.describe(r.base).contains("freed"));
    }
}
