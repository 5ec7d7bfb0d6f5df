//! Storage of the shadow payload: one [`Tag`] per KV slot and, per grain of slots, the sequences
//! whose checked context covers it. Both are allocated page by page on first touch, so memory
//! follows the slots a run actually writes, not the size of the pool (a 141 GB device with a tiny
//! model has hundreds of millions of slots).

/// What a slot holds in place of K/V: who wrote it, for which position, which token, under which
/// reuse scope. 16 bytes a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag {
    /// Low 32 bits of the writing sequence id (for messages; checks compare the other fields).
    pub writer: u32,
    pub pos: u32,
    pub token: u32,
    /// Interned reuse scope of the writer (see `Scopes`).
    pub scope: u32,
}

impl Tag {
    /// A slot nothing was ever written to.
    pub const EMPTY: Tag = Tag {
        writer: u32::MAX,
        pos: u32::MAX,
        token: u32::MAX,
        scope: u32::MAX,
    };
}

/// A sequence whose checked context covers (part of) a grain: its index in the shadow's
/// sequence table and the chunk of its layout that lies there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    pub seq: u32,
    pub chunk: u32,
}

const PAGE_BITS: u32 = 16;
const PAGE: usize = 1 << PAGE_BITS;
/// Larger pools are refused (the top-level table alone would not be small any more).
pub(crate) const MAX_ENTRIES: u64 = 1 << 38;

/// A fixed-length array whose pages are allocated on first write; unwritten entries read as
/// `empty`.
#[derive(Debug)]
pub(crate) struct LazyArray<T: Clone> {
    pages: Vec<Option<Box<[T]>>>,
    len: u64,
    empty: T,
}

impl<T: Clone> LazyArray<T> {
    pub fn new(len: u64, empty: T) -> Option<Self> {
        if len > MAX_ENTRIES {
            return None;
        }
        let pages = len.div_ceil(PAGE as u64) as usize;
        let mut v = Vec::new();
        v.resize_with(pages, || None);
        Some(LazyArray {
            pages: v,
            len,
            empty,
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The entry, or `None` past the end.
    #[inline]
    pub fn get(&self, i: u64) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        match &self.pages[(i >> PAGE_BITS) as usize] {
            Some(p) => Some(&p[(i as usize) & (PAGE - 1)]),
            None => Some(&self.empty),
        }
    }

    /// The entry for writing (allocating its page), or `None` past the end.
    #[inline]
    pub fn get_mut(&mut self, i: u64) -> Option<&mut T> {
        if i >= self.len {
            return None;
        }
        let page = self.pages[(i >> PAGE_BITS) as usize]
            .get_or_insert_with(|| vec![self.empty.clone(); PAGE].into_boxed_slice());
        Some(&mut page[(i as usize) & (PAGE - 1)])
    }

    /// Bytes allocated so far.
    pub fn allocated_bytes(&self) -> u64 {
        let pages = self.pages.iter().filter(|p| p.is_some()).count() as u64;
        pages * (PAGE * std::mem::size_of::<T>()) as u64
            + (self.pages.len() * std::mem::size_of::<Option<Box<[T]>>>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_entries_read_empty_and_writes_stick() {
        let mut a = LazyArray::new(3 * PAGE as u64 + 5, Tag::EMPTY).expect("fits");
        assert_eq!(a.get(0), Some(&Tag::EMPTY));
        let table = 4 * std::mem::size_of::<Option<Box<[Tag]>>>() as u64;
        assert_eq!(
            a.allocated_bytes(),
            table,
            "nothing but the page table before a write"
        );
        let t = Tag {
            writer: 1,
            pos: 2,
            token: 3,
            scope: 4,
        };
        *a.get_mut(PAGE as u64 + 7).expect("in range") = t;
        assert_eq!(a.get(PAGE as u64 + 7), Some(&t));
        assert_eq!(a.get(PAGE as u64 + 8), Some(&Tag::EMPTY));
        assert_eq!(
            a.allocated_bytes(),
            table + (PAGE * 16) as u64,
            "one page allocated"
        );
        assert_eq!(a.get(a.len()), None);
        assert!(a.get_mut(a.len()).is_none());
        assert!(LazyArray::new(MAX_ENTRIES + 1, 0u8).is_none());
    }
}
