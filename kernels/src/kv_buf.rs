//! KV storage that starts on a boundary the hardware cares about.
//!
//! A `Vec` of a few MiB comes from the system allocator's `mmap` path, whose pointer lies 16
//! bytes past a page boundary (glibc's chunk header). With that, every 4 KiB f32 row and every
//! 512 B head slice of it straddles one cache line more than it needs (9 lines for 8), every
//! 32-byte load at an odd 16 B boundary splits across two lines, and huge-page advice reaches
//! only from the next 2 MiB boundary up to the last whole one. [`KvBuf`] is allocated with an
//! explicit alignment instead: [`LINE_BYTES`] always, and [`HUGE_PAGE_BYTES`] (its length rounded
//! up to whole huge pages, all of it advised for transparent huge pages on Linux) once it spans
//! at least two huge pages, so the paged and the contiguous layout sit the same way against lines
//! and pages whatever slot they start at.
//!
//! **Invariant:** a buffer's first element is 64-byte aligned, and 2 MiB aligned from 4 MiB up
//! (the tests below).

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Cache-line size every buffer starts on (x86-64 and most Arm cores).
pub const LINE_BYTES: usize = 64;
/// Transparent huge page size on x86-64 Linux.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// An owned, aligned, initialised run of `E`: a `Vec` that cannot grow, whose first element
/// starts on [`KvBuf::align_bytes`].
pub struct KvBuf<E> {
    ptr: NonNull<E>,
    len: usize,
    /// The allocation's layout (size rounded up to the alignment); `None` when nothing was
    /// allocated (zero bytes).
    layout: Option<Layout>,
}

// SAFETY: `KvBuf` owns its elements exactly like a `Vec<E>` (unique pointer, no sharing), so it
// is `Send`/`Sync` whenever `E` is.
unsafe impl<E: Send> Send for KvBuf<E> {}
// SAFETY: as above; shared access hands out only `&[E]`.
unsafe impl<E: Sync> Sync for KvBuf<E> {}

/// The alignment a buffer of `bytes` gets: whole huge pages once it spans two, else a line.
pub fn align_for(bytes: usize) -> usize {
    if bytes >= 2 * HUGE_PAGE_BYTES {
        HUGE_PAGE_BYTES
    } else {
        LINE_BYTES
    }
}

impl<E: Copy> KvBuf<E> {
    /// `n` copies of `fill`. Panics, as `Vec` does, when `n` elements overflow `isize` bytes;
    /// aborts through [`alloc::handle_alloc_error`] when memory runs out.
    pub fn filled(n: usize, fill: E) -> Self {
        let b = Self::uninit(n);
        for i in 0..n {
            // SAFETY: `i < n` and the allocation holds at least `n` elements of `E`, aligned.
            unsafe { b.ptr.as_ptr().add(i).write(fill) };
        }
        b
    }

    /// A copy of `xs` in aligned storage.
    pub fn from_slice(xs: &[E]) -> Self {
        let b = Self::uninit(xs.len());
        // SAFETY: the allocation holds `xs.len()` elements and is fresh, so the ranges are
        // disjoint; `E: Copy`, so a bitwise copy is a copy.
        unsafe { std::ptr::copy_nonoverlapping(xs.as_ptr(), b.ptr.as_ptr(), xs.len()) };
        b
    }

    /// Room for `n` elements, not yet written: only `filled` and `from_slice`, which write every
    /// element before handing the buffer out, may call it.
    fn uninit(n: usize) -> Self {
        let bytes = n
            .checked_mul(std::mem::size_of::<E>())
            .expect("KvBuf: capacity overflow");
        if bytes == 0 {
            return KvBuf {
                ptr: NonNull::dangling(),
                len: n,
                layout: None,
            };
        }
        let align = align_for(bytes).max(std::mem::align_of::<E>());
        let layout = bytes
            .checked_next_multiple_of(align)
            .and_then(|size| Layout::from_size_align(size, align).ok())
            .expect("KvBuf: capacity overflow");
        // SAFETY: `layout` has a non-zero size (bytes > 0).
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw.cast::<E>()) else {
            alloc::handle_alloc_error(layout)
        };
        #[cfg(target_os = "linux")]
        if align == HUGE_PAGE_BYTES {
            // SAFETY: [raw, raw + layout.size()) is the allocation just made, 2 MiB aligned and
            // a whole number of huge pages long; MADV_HUGEPAGE is only a hint and changes no
            // contents (refused on kernels without THP, which is fine).
            unsafe {
                libc::madvise(
                    raw.cast::<libc::c_void>(),
                    layout.size(),
                    libc::MADV_HUGEPAGE,
                );
            }
        }
        KvBuf {
            ptr,
            len: n,
            layout: Some(layout),
        }
    }

    /// The alignment the first element starts on, in bytes.
    pub fn align_bytes(&self) -> usize {
        self.layout.map_or(std::mem::align_of::<E>(), |l| l.align())
    }
}

impl<E> Deref for KvBuf<E> {
    type Target = [E];
    fn deref(&self) -> &[E] {
        // SAFETY: `ptr` points at `len` initialised elements (or is dangling and aligned with
        // `len` elements of zero bytes in all), owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<E> DerefMut for KvBuf<E> {
    fn deref_mut(&mut self) -> &mut [E] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<E> Drop for KvBuf<E> {
    fn drop(&mut self) {
        // Only `E: Copy` buffers are ever made, so no element needs dropping.
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `filled` with exactly this layout, freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr().cast::<u8>(), layout) };
        }
    }
}

impl<E: Copy> Clone for KvBuf<E> {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl<E: Copy> Default for KvBuf<E> {
    fn default() -> Self {
        Self::uninit(0)
    }
}

impl<E: Copy> From<Vec<E>> for KvBuf<E> {
    fn from(v: Vec<E>) -> Self {
        Self::from_slice(&v)
    }
}

impl<E: fmt::Debug> fmt::Debug for KvBuf<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn addr<E>(b: &KvBuf<E>) -> usize {
        b.as_ptr() as usize
    }

    #[test]
    fn small_buffers_start_on_a_cache_line() {
        for n in [1usize, 3, 16, 1000, 1 << 18] {
            let b = KvBuf::filled(n, 1.5f32);
            assert_eq!(addr(&b) % LINE_BYTES, 0, "{n} f32");
            assert_eq!(b.align_bytes(), LINE_BYTES, "{n} f32");
            assert_eq!(b.len(), n);
            assert!(b.iter().all(|&x| x == 1.5));
            let h = KvBuf::filled(n, bf16::from_f32(2.0));
            assert_eq!(addr(&h) % LINE_BYTES, 0, "{n} bf16");
            assert!(h.iter().all(|x| x.to_f32() == 2.0));
        }
    }

    #[test]
    fn large_buffers_start_on_a_huge_page() {
        // Exactly two huge pages, and an odd size above (its tail rounded up to a whole page).
        for n in [HUGE_PAGE_BYTES / 2, HUGE_PAGE_BYTES + 12_345] {
            let b = KvBuf::filled(n, -0.25f32);
            assert_eq!(addr(&b) % HUGE_PAGE_BYTES, 0, "{n} f32");
            assert_eq!(b.align_bytes(), HUGE_PAGE_BYTES);
            assert_eq!(b.len(), n);
            assert_eq!((b[0], b[n - 1]), (-0.25, -0.25));
        }
        // One element below the threshold stays line aligned.
        let below = KvBuf::filled(HUGE_PAGE_BYTES / 2 - 1, 0f32);
        assert_eq!(below.align_bytes(), LINE_BYTES);
        assert_eq!(addr(&below) % LINE_BYTES, 0);
    }

    #[test]
    fn empty_copies_and_writes_behave_like_a_vec() {
        let e = KvBuf::<f32>::default();
        assert!(e.is_empty());
        assert_eq!(addr(&e) % std::mem::align_of::<f32>(), 0);
        let mut b = KvBuf::from(vec![1.0f32, 2.0, 3.0]);
        b[1] = 5.0;
        b.copy_within(0..2, 1);
        assert_eq!(&b[..], &[1.0, 1.0, 5.0]);
        let c = b.clone();
        assert_eq!(&c[..], &b[..]);
        assert_eq!(addr(&c) % LINE_BYTES, 0);
        assert_ne!(addr(&c), addr(&b));
        assert_eq!(format!("{c:?}"), "[1.0, 1.0, 5.0]");
    }
}
