//! The pool's cached-free pages: published pages no table references, kept for prefix hits, and
//! which of them goes first when the pool needs a page (`cache.eviction`).
//!
//! The order is the summed manager's: `cache::evict`'s policies (`lru`, `lfu`, `priority`
//! behind [`AnyEvictor`]) over page ids, told what each page is worth as it becomes evictable
//! ([`Evictable`]: its depth in its table's key chain, the prefix hits it served, whether it was
//! shared by one). A page released while a step that may read it is in flight is cached-free
//! but not evictable: it waits here, in release order, and joins the policy's set when that
//! step retired — as the summed pool settles a pending block — so the policy only ever pops a
//! page that can be handed out now. A prefix hit may still share a fenced page (its content is
//! what the step reads).
//!
//! This file only orders; `pool.rs` owns every page transition and tells it what happened.

use std::collections::BTreeMap;

use crate::cache::evict::{AnyEvictor, Evictable, EvictionPolicy, Evictor};

use super::pool::PageId;

#[derive(Debug, Clone)]
pub(crate) struct CachedFree {
    /// The evictable cached-free pages, in the policy's order.
    evict: AnyEvictor,
    /// Cached-free pages released while a step was in flight, by release tick, until it retires.
    fenced: BTreeMap<u64, PageId>,
    /// Each cached-free page's release tick (0: not cached-free).
    tick: Vec<u64>,
    /// What the policy weighs, per published page (reset when the page leaves the cache).
    info: Vec<Evictable>,
    clock: u64,
}

impl CachedFree {
    pub(crate) fn new(pages: u32, policy: EvictionPolicy) -> CachedFree {
        CachedFree {
            evict: policy.build(pages),
            fenced: BTreeMap::new(),
            tick: vec![0; pages as usize],
            info: vec![Evictable::default(); pages as usize],
            clock: 0,
        }
    }

    /// Cached-free pages, fenced or not.
    pub(crate) fn len(&self) -> usize {
        self.evict.len() + self.fenced.len()
    }

    /// Cached-free pages the policy may pop now.
    pub(crate) fn evictable_len(&self) -> usize {
        self.evict.len()
    }

    /// Cached-free pages still waiting on the step in flight at their release.
    pub(crate) fn fenced_len(&self) -> usize {
        self.fenced.len()
    }

    pub(crate) fn contains(&self, page: PageId) -> bool {
        self.tick.get(page as usize).is_some_and(|&t| t != 0)
    }

    /// Cached-free and in the policy's set (not waiting on a fence).
    pub(crate) fn is_evictable(&self, page: PageId) -> bool {
        match self.tick.get(page as usize) {
            Some(&t) if t != 0 => !self.fenced.contains_key(&t),
            _ => false,
        }
    }

    /// `page` was published as block `depth` of its table's chain: nothing hit it yet.
    pub(crate) fn published(&mut self, page: PageId, depth: u64) {
        if let Some(i) = self.info.get_mut(page as usize) {
            *i = Evictable {
                depth: u32::try_from(depth).unwrap_or(u32::MAX),
                hits: 0,
                shared: false,
            };
        }
    }

    /// A prefix hit shared `page`.
    pub(crate) fn hit(&mut self, page: PageId) {
        if let Some(i) = self.info.get_mut(page as usize) {
            i.hits = i.hits.saturating_add(1);
            i.shared = true;
        }
    }

    /// `page`'s last reference went: cached-free, evictable now unless `fenced`.
    pub(crate) fn insert(&mut self, page: PageId, fenced: bool) {
        let i = page as usize;
        self.clock += 1;
        self.tick[i] = self.clock;
        if fenced {
            self.fenced.insert(self.clock, page);
        } else {
            self.evict.insert(page, self.info[i]);
        }
    }

    /// `page` leaves the cached-free set for a table (a prefix hit); `false` if it was not in it.
    pub(crate) fn remove(&mut self, page: PageId) -> bool {
        let Some(&t) = self.tick.get(page as usize).filter(|&&t| t != 0) else {
            return false;
        };
        if self.fenced.remove(&t).is_none() {
            self.evict.remove(page);
        }
        self.tick[page as usize] = 0;
        true
    }

    /// The policy's victim, out of the cache (its worth forgotten).
    pub(crate) fn pop_victim(&mut self) -> Option<PageId> {
        let page = self.evict.pop_victim()?;
        self.forget(page);
        Some(page)
    }

    fn forget(&mut self, page: PageId) {
        let i = page as usize;
        self.tick[i] = 0;
        self.info[i] = Evictable::default();
    }

    /// A published page left the cache without being evicted (a flush of a held page).
    pub(crate) fn unpublished(&mut self, page: PageId) {
        if let Some(i) = self.info.get_mut(page as usize) {
            *i = Evictable::default();
        }
    }

    /// The fenced pages whose step retired (`retired(page)`) become evictable, in release order.
    pub(crate) fn unfence(&mut self, retired: impl Fn(PageId) -> bool) {
        let ready: Vec<(u64, PageId)> = self
            .fenced
            .iter()
            .filter(|(_, &p)| retired(p))
            .map(|(&t, &p)| (t, p))
            .collect();
        for (t, page) in ready {
            self.fenced.remove(&t);
            self.evict.insert(page, self.info[page as usize]);
        }
    }

    /// Every cached-free page out of the cache: (page, whether it was still fenced).
    pub(crate) fn drain(&mut self) -> Vec<(PageId, bool)> {
        let mut out: Vec<(PageId, bool)> = Vec::with_capacity(self.len());
        while let Some(page) = self.pop_victim() {
            out.push((page, false));
        }
        for (_, page) in std::mem::take(&mut self.fenced) {
            self.forget(page);
            out.push((page, true));
        }
        out
    }

    /// The evictable pages in the order the policy would evict them (tests and checks only).
    pub(crate) fn order(&self) -> Vec<PageId> {
        self.evict.order()
    }

    /// What the policy weighs for `page` now.
    pub(crate) fn info(&self, page: PageId) -> Option<Evictable> {
        self.info.get(page as usize).copied()
    }
}
