//! The lazy array the shadow keeps its tags in: one [`Tag`] per KV slot, allocated page by page on
//! first touch, so memory follows the slots a run actually writes, not the size of the pool (a
//! 141 GB device with a tiny model has hundreds of millions of slots). Its pages come from
//! `slabs.rs`; the reverse index (`readers.rs`) and the grouped cell store use the same array.

use std::ptr::NonNull;

use slabs::Slabs;

pub(super) mod readers;
mod slabs;

/// What a slot holds in place of K/V: which position, which token, and who wrote it — a writer
/// number ([`Writers`](super::ids::Writers)) that names the writing
/// stream for messages and its reuse scope for the checks. 12 bytes a slot: the scope and the
/// stream id are looked up through the writer number rather than carried in every slot, so a
/// block of 16 tags takes three cache lines, not four.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Tag {
    pub pos: u32,
    pub token: u32,
    /// Writer number of the writing stream (its scope and id, in `Writers`).
    pub writer: u32,
}

impl Tag {
    /// A slot nothing was ever written to: all zeros, so that a page of the store comes from
    /// the allocator already zeroed ([`LazyArray::zeroed`]) rather than filled line by line —
    /// the fill pushed every line out of the cache before the first tag was stored there, so
    /// each was missed twice. No writer has number 0 (`ids.rs` numbers from 1).
    pub const EMPTY: Tag = Tag {
        pos: 0,
        token: 0,
        writer: 0,
    };
}

// SAFETY: three `u32`s, no padding (`repr(C)`, 12 bytes); all zeros is a valid `Tag`, the empty one.
unsafe impl bytemuck::Zeroable for Tag {}

/// `summary.json`'s `allocated_bytes` counts pages of tags: their size is part of the format.
const _: () = assert!(std::mem::size_of::<Tag>() == 12);

const PAGE_BITS: u32 = 16;
const PAGE: usize = 1 << PAGE_BITS;
/// Entries a page of a [`LazyArray`] holds: a run of entries aligned to a divisor of this lies
/// in one page, allocated whole once any of its entries was written.
pub(crate) const PAGE_ENTRIES: u64 = PAGE as u64;
/// Larger pools are refused (the top-level table alone would not be small any more).
pub(crate) const MAX_ENTRIES: u64 = 1 << 38;
/// What a page's place in the page table costs, allocated or not.
const PAGE_TABLE_ENTRY_BYTES: usize = std::mem::size_of::<Option<NonNull<Tag>>>();

/// A fixed-length array whose pages are allocated on first write; unwritten entries read as
/// `empty`. Its pages live in slabs mapped on huge-page boundaries (`slabs.rs`): the
/// kernel fills them a huge page at a time instead of 4 KiB at a time.
#[derive(Debug)]
pub(crate) struct LazyArray<T: Copy> {
    /// Each page's first entry once allocated: `PAGE` initialised entries in a slab of `slabs`,
    /// no two pages overlapping.
    pages: Vec<Option<NonNull<T>>>,
    slabs: Slabs,
    len: u64,
    empty: T,
    /// Whether `empty` is all zeros, so that a page is used as it comes (a fresh mapping, which
    /// the kernel zeroes at the first write to each of its pages) where a fill would write every
    /// line first and push them out of the cache before their first real write.
    zeroed: bool,
}

// SAFETY: a `LazyArray` owns its pages outright (the pointers lead only into its own slabs), as
// a `Vec<Box<[T]>>` would; sending it sends them.
unsafe impl<T: Copy + Send> Send for LazyArray<T> {}

impl<T: Copy> LazyArray<T> {
    /// An array of `len` entries reading `empty` until written; pages filled with `empty`.
    pub fn new(len: u64, empty: T) -> Option<Self> {
        Self::with_pages(len, empty, false)
    }

    /// An array of `len` entries reading all zeros until written; pages come zeroed.
    pub fn zeroed(len: u64) -> Option<Self>
    where
        T: bytemuck::Zeroable,
    {
        Self::with_pages(len, T::zeroed(), true)
    }

    fn with_pages(len: u64, empty: T, zeroed: bool) -> Option<Self> {
        // Slabs hand out pages aligned to 64 bytes.
        if len > MAX_ENTRIES || std::mem::align_of::<T>() > 64 {
            return None;
        }
        let pages = len.div_ceil(PAGE as u64) as usize;
        let mut v = Vec::new();
        v.resize_with(pages, || None);
        Some(LazyArray {
            pages: v,
            slabs: Slabs::new(PAGE * std::mem::size_of::<T>()),
            len,
            empty,
            zeroed,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The entry, or `None` past the end.
    #[inline(always)]
    pub fn get(&self, i: u64) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        match self.page((i >> PAGE_BITS) as usize) {
            Some(p) => Some(&p[(i as usize) & (PAGE - 1)]),
            None => Some(&self.empty),
        }
    }

    /// Page `k` if it is allocated.
    #[inline(always)]
    fn page(&self, k: usize) -> Option<&[T]> {
        let p = (*self.pages.get(k)?)?;
        // SAFETY: an allocated page holds `PAGE` initialised entries in a slab `self` owns, and
        // no other page overlaps it; `&self` keeps it from being written meanwhile.
        Some(unsafe { std::slice::from_raw_parts(p.as_ptr(), PAGE) })
    }

    /// Page `k` for writing if it is allocated.
    #[inline(always)]
    fn allocated_page_mut(&mut self, k: usize) -> Option<&mut [T]> {
        let p = (*self.pages.get(k)?)?;
        // SAFETY: as in `page`; `&mut self` makes this the only access to the page.
        Some(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), PAGE) })
    }

    /// The entry for writing (allocating its page), or `None` past the end.
    #[inline(always)]
    pub fn get_mut(&mut self, i: u64) -> Option<&mut T> {
        if i >= self.len {
            return None;
        }
        self.page_mut(i)?.get_mut((i as usize) & (PAGE - 1))
    }

    /// The page holding entry `i` (in range), allocated if it is not yet.
    #[inline(always)]
    fn page_mut(&mut self, i: u64) -> Option<&mut [T]> {
        let k = (i >> PAGE_BITS) as usize;
        if self.pages.get(k)?.is_none() {
            self.fresh_page(k);
        }
        self.allocated_page_mut(k)
    }

    /// Allocate page `k` (in range, not yet allocated), filled with `empty` unless the array is
    /// zeroed. Out of line: it runs once a page, and inlined it lengthened every store's fast
    /// path.
    #[cold]
    #[inline(never)]
    fn fresh_page(&mut self, k: usize) {
        let p = self.slabs.page().cast::<T>();
        if !self.zeroed {
            // SAFETY: the slab handed out `PAGE * size_of::<T>()` fresh bytes, aligned to 64
            // (at least `T`'s alignment for the entries kept here: checked in `with_pages`),
            // that nothing else points into; each entry is written before any is read.
            unsafe {
                for j in 0..PAGE {
                    p.as_ptr().add(j).write(self.empty);
                }
            }
        }
        self.pages[k] = Some(p);
    }

    /// Entries `i..` up to `max` of them, stopping at the end of `i`'s page (callers loop), or
    /// `None` past the end. An unallocated page yields one `empty` entry at a time: reads of
    /// never-written slots are rare (each one is a violation).
    #[inline]
    pub fn run(&self, i: u64, max: u64) -> Option<&[T]> {
        if i >= self.len || max == 0 {
            return None;
        }
        let n = run_len(i, max, self.len);
        match self.page((i >> PAGE_BITS) as usize) {
            Some(p) => {
                let at = (i as usize) & (PAGE - 1);
                Some(&p[at..at + n])
            }
            None => Some(std::slice::from_ref(&self.empty)),
        }
    }

    /// Entries `i..` up to `max` of them for writing (allocating their page), stopping at the end
    /// of `i`'s page (callers loop), or `None` past the end.
    #[inline]
    pub fn run_mut(&mut self, i: u64, max: u64) -> Option<&mut [T]> {
        if i >= self.len || max == 0 {
            return None;
        }
        let n = run_len(i, max, self.len);
        let at = (i as usize) & (PAGE - 1);
        self.page_mut(i)?.get_mut(at..at + n)
    }

    /// Whether entry `i` is in the array and its page allocated.
    #[inline(always)]
    pub fn is_allocated(&self, i: u64) -> bool {
        i < self.len
            && self
                .pages
                .get((i >> PAGE_BITS) as usize)
                .is_some_and(Option::is_some)
    }

    /// Entries `i .. i + n` for writing when they lie in one page that is already allocated —
    /// the common store, small enough to inline — else `None` (callers go on with
    /// [`LazyArray::run_mut`]).
    #[inline(always)]
    pub fn run_in_page_mut(&mut self, i: u64, n: usize) -> Option<&mut [T]> {
        let at = (i as usize) & (PAGE - 1);
        if i >= self.len || n as u64 > self.len - i || at + n > PAGE {
            return None;
        }
        self.allocated_page_mut((i >> PAGE_BITS) as usize)?
            .get_mut(at..at + n)
    }

    /// Bytes allocated so far.
    pub fn allocated_bytes(&self) -> u64 {
        let pages = self.pages.iter().filter(|p| p.is_some()).count() as u64;
        pages * (PAGE * std::mem::size_of::<T>()) as u64
            + (self.pages.len() * PAGE_TABLE_ENTRY_BYTES) as u64
    }
}

/// Entries from `i` (< `len`) up to `max`, the end of `i`'s page and `len`.
#[inline]
fn run_len(i: u64, max: u64, len: u64) -> usize {
    let page_end = (i | (PAGE as u64 - 1)) + 1;
    (max.min(page_end - i).min(len - i)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_entries_read_empty_and_writes_stick() {
        let mut a = LazyArray::new(3 * PAGE as u64 + 5, Tag::EMPTY).expect("fits");
        assert_eq!(a.get(0), Some(&Tag::EMPTY));
        let table = 4 * PAGE_TABLE_ENTRY_BYTES as u64;
        assert_eq!(
            a.allocated_bytes(),
            table,
            "nothing but the page table before a write"
        );
        let t = Tag {
            pos: 2,
            token: 3,
            writer: 1,
        };
        *a.get_mut(PAGE as u64 + 7).expect("in range") = t;
        assert_eq!(a.get(PAGE as u64 + 7), Some(&t));
        assert_eq!(a.get(PAGE as u64 + 8), Some(&Tag::EMPTY));
        assert_eq!(
            a.allocated_bytes(),
            table + (PAGE * 12) as u64,
            "one page allocated"
        );
        assert_eq!(a.get(a.len()), None);
        assert!(a.get_mut(a.len()).is_none());
        assert!(LazyArray::new(MAX_ENTRIES + 1, 0u8).is_none());
    }

    #[test]
    fn runs_stop_at_page_ends_and_the_array_end() {
        let len = 2 * PAGE as u64 + 3;
        let mut a = LazyArray::new(len, 0u32).expect("fits");
        // An unallocated page: one empty entry at a time.
        assert_eq!(a.run(5, 100), Some(&[0u32][..]));
        let w = a.run_mut(PAGE as u64 - 2, 10).expect("in range");
        assert_eq!(w.len(), 2, "stops at the page end");
        w.copy_from_slice(&[7, 8]);
        assert_eq!(a.run(PAGE as u64 - 2, 10), Some(&[7u32, 8][..]));
        assert_eq!(a.get(PAGE as u64 - 1), Some(&8));
        assert_eq!(
            a.run_mut(len - 1, 10).map(|r| r.len()),
            Some(1),
            "stops at the end"
        );
        assert_eq!(a.run_mut(2, 3).map(|r| r.len()), Some(3), "stops at max");
        assert!(a.run(len, 1).is_none() && a.run(0, 0).is_none());
        // Within an allocated page only: not in the page before it (never written), not
        // across its end, not past the array's end.
        assert_eq!(a.run_in_page_mut(2, 3).map(|r| r.len()), Some(3));
        assert!(a.run_in_page_mut(PAGE as u64 - 2, 2).is_some());
        assert!(
            a.run_in_page_mut(PAGE as u64 - 2, 3).is_none(),
            "crosses a page"
        );
        assert!(
            a.run_in_page_mut(PAGE as u64 + 5, 1).is_none(),
            "not allocated"
        );
        assert!(a.run_in_page_mut(len - 1, 2).is_none(), "past the end");
        assert!(a.is_allocated(3) && a.is_allocated(len - 1));
        assert!(!a.is_allocated(PAGE as u64 + 5) && !a.is_allocated(len));
        assert!(a.run_mut(len, 1).is_none());
    }
}
