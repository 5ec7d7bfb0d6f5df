//! Memory for the shadow's lazy arrays (`store/mod.rs`): pages carved from slabs mapped on a
//! huge-page boundary, so the kernel fills them a huge page at a time rather than 4 KiB at a time.
//!
//! A page of tags is 768 KiB. Allocated on its own, it is a fresh mapping the kernel fills 4 KiB
//! at a time on first touch: 192 page faults a page. A slab maps eight pages at once, starting on
//! a 2 MiB boundary and advised for transparent huge pages, so the kernel fills it a huge page at a
//! time. The kernel still commits only the huge pages a write touches, so a slab costs memory as
//! its pages are used, give or take one huge page at each end of what was written.
//!
//! Pages are handed out and never returned: a slab is unmapped when the [`Slabs`] that mapped it
//! drops, which is when its array drops. Every page comes zeroed (a fresh anonymous mapping reads
//! zeros); an array whose empty entry is not all zeros fills each page as it takes it.

use std::ptr::NonNull;

/// Pages a slab holds. For 12-byte tags, 8 pages are 6 MiB: exactly three huge pages.
const SLAB_PAGES: usize = 8;
/// Transparent huge page size on x86-64 Linux; slabs start on a multiple of it.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// The slabs of one array and how many pages of the newest one are handed out.
#[derive(Debug)]
pub(crate) struct Slabs {
    maps: Vec<Map>,
    page_bytes: usize,
    used: usize,
}

impl Slabs {
    pub fn new(page_bytes: usize) -> Self {
        Slabs {
            maps: Vec::new(),
            page_bytes,
            used: SLAB_PAGES,
        }
    }

    /// A fresh page of `page_bytes`, all zeros, aligned to at least 64 bytes (a page's bytes
    /// are a multiple of 64: 2^16 entries), valid until `self` drops. Aborts through
    /// [`std::alloc::handle_alloc_error`] when memory runs out, as a `Box` would.
    pub fn page(&mut self) -> NonNull<u8> {
        if self.used == SLAB_PAGES {
            self.maps.push(Map::new(self.page_bytes * SLAB_PAGES));
            self.used = 0;
        }
        let map = self.maps.last().expect("a slab was just mapped");
        let at = self.used * self.page_bytes;
        self.used += 1;
        // SAFETY: `at + page_bytes <= page_bytes * SLAB_PAGES`, the slab's length, so the offset
        // stays inside the mapping and the result is non-null.
        unsafe { NonNull::new_unchecked(map.ptr.as_ptr().add(at)) }
    }
}

/// One mapping of `bytes`, unmapped on drop.
#[derive(Debug)]
struct Map {
    ptr: NonNull<u8>,
    bytes: usize,
}

impl Map {
    #[cfg(target_os = "linux")]
    fn new(bytes: usize) -> Map {
        // Map a huge page more than asked and start at the first 2 MiB boundary inside.
        let Some(reserve) = bytes.checked_add(HUGE_PAGE_BYTES) else {
            oom(bytes)
        };
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            oom(bytes)
        }
        let base = raw as usize;
        let start = base.next_multiple_of(HUGE_PAGE_BYTES);
        let (head, tail) = (start - base, base + reserve - (start + bytes));
        // SAFETY: `[base, start)` and `[start + bytes, base + reserve)` lie inside the mapping
        // just made and nothing points into them; unmapping them leaves `[start, start + bytes)`.
        // MADV_HUGEPAGE is a hint that changes no contents (refused where the kernel has no
        // transparent huge pages, which is fine: the slab is then filled 4 KiB at a time).
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((start + bytes) as *mut libc::c_void, tail);
            }
            libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
        }
        Map {
            ptr: NonNull::new(start as *mut u8).expect("mmap returned a mapping"),
            bytes,
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn new(bytes: usize) -> Map {
        let layout = layout(bytes);
        // SAFETY: `layout` has a non-zero size (a slab holds pages of 2^16 entries).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        match NonNull::new(raw) {
            Some(ptr) => Map { ptr, bytes },
            None => std::alloc::handle_alloc_error(layout),
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the slab mapped (or allocated) in `Map::new` with exactly these bytes; every
        // page handed out of it belongs to the array that owns these slabs, which is dropping.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast::<libc::c_void>(), self.bytes);
        }
        #[cfg(not(target_os = "linux"))]
        unsafe {
            std::alloc::dealloc(self.ptr.as_ptr(), layout(self.bytes));
        }
    }
}

fn layout(bytes: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(bytes.max(1), 64).expect("slab layout")
}

/// Out of memory (or address space) for a slab: the same end as a `Box` that cannot allocate.
#[cold]
fn oom(bytes: usize) -> ! {
    std::alloc::handle_alloc_error(layout(bytes))
}

// SAFETY: a `Map` owns its mapping outright (no other handle to it exists); moving it to another
// thread moves that ownership.
unsafe impl Send for Map {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_zeroed_disjoint_and_aligned() {
        let page_bytes = 3 << 16;
        let mut s = Slabs::new(page_bytes);
        let pages: Vec<NonNull<u8>> = (0..SLAB_PAGES + 3).map(|_| s.page()).collect();
        assert_eq!(s.maps.len(), 2, "a second slab once the first is used up");
        for (k, p) in pages.iter().enumerate() {
            assert!((p.as_ptr() as usize).is_multiple_of(64), "page {k} aligned");
            // SAFETY: the page is `page_bytes` long and lives while `s` does.
            let bytes = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), page_bytes) };
            assert!(bytes.iter().all(|&b| b == 0), "page {k} zeroed");
            bytes.fill(k as u8 + 1);
        }
        for (k, p) in pages.iter().enumerate() {
            // SAFETY: as above.
            let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), page_bytes) };
            assert!(
                bytes.iter().all(|&b| b == k as u8 + 1),
                "page {k} kept its own bytes: pages do not overlap"
            );
        }
        #[cfg(target_os = "linux")]
        assert!(
            s.maps
                .iter()
                .all(|m| (m.ptr.as_ptr() as usize).is_multiple_of(HUGE_PAGE_BYTES)),
            "slabs start on a huge-page boundary"
        );
    }
}
