//! The one pool of pages every table of every sequence draws from, with a reference count per
//! page: **every page state transition lives here** (free → held by one reference → shared →
//! back to free when the last reference goes).

use super::error::HybridError;

/// A page's index in the pool.
pub type PageId = u32;

#[derive(Debug, Clone)]
pub(crate) struct PagePool {
    /// Free pages, taken from the end (last freed, first reused).
    free: Vec<PageId>,
    /// References to each page from block tables; 0 exactly when the page is free.
    refs: Vec<u32>,
}

impl PagePool {
    pub(crate) fn new(pages: u32) -> PagePool {
        PagePool {
            free: (0..pages).rev().collect(),
            refs: vec![0; pages as usize],
        }
    }

    pub(crate) fn pages(&self) -> u32 {
        self.refs.len() as u32
    }

    pub(crate) fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    pub(crate) fn free_pages(&self) -> &[PageId] {
        &self.free
    }

    pub(crate) fn refs(&self, page: PageId) -> Option<u32> {
        self.refs.get(page as usize).copied()
    }

    /// A free page, now held by one reference.
    pub(crate) fn take(&mut self) -> Result<PageId, HybridError> {
        let page = self
            .free
            .pop()
            .ok_or(HybridError::OutOfPages { needed: 1, free: 0 })?;
        self.refs[page as usize] = 1;
        Ok(page)
    }

    /// One more reference to a held page (a fork sharing it).
    pub(crate) fn share(&mut self, page: PageId) -> Result<(), HybridError> {
        let r = self
            .refs
            .get_mut(page as usize)
            .ok_or(HybridError::Corrupt("shared page out of range"))?;
        if *r == 0 {
            return Err(HybridError::Corrupt("shared a free page"));
        }
        *r = r.checked_add(1).ok_or(HybridError::Overflow("page refs"))?;
        Ok(())
    }

    /// One reference fewer; the page is free again when it was the last.
    pub(crate) fn drop_ref(&mut self, page: PageId) -> Result<(), HybridError> {
        let r = self
            .refs
            .get_mut(page as usize)
            .ok_or(HybridError::Corrupt("dropped page out of range"))?;
        *r = r
            .checked_sub(1)
            .ok_or(HybridError::Corrupt("dropped a free page"))?;
        if *r == 0 {
            self.free.push(page);
        }
        Ok(())
    }
}
