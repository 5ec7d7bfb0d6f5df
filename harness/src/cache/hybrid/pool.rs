//! The one pool of pages every table of every sequence draws from, with a reference count per
//! page; a sequence's recurrent state is `state_pages` pages of it, taken at start and never
//! shared: **every page and state transition lives here** (free → held by one reference →
//! shared → pending behind a fence when the last reference goes while a step is in flight →
//! free again once that step retired).
//!
//! A step may read or write any page mapped when it began, so a page (or a state) whose last
//! holder lets go while steps are in flight is withheld on the [`FenceQueue`] until they
//! retired; only free pages are handed out. With nothing in flight (the standalone
//! [`super::HybridCache`], which never begins a step) a release frees at once.
//!
//! The pool also keeps how many tokens each held page has written, so the live slots of the
//! accounting are a counter: a page of a table with `block_tokens` tokens counts
//! `⌊written × page_slots / block_tokens⌋` slots live.

use std::cell::RefCell;

use kvbench_cache_api::fence::FenceQueue;
use kvbench_cache_api::StepId;

use crate::cache::evict::EvictionPolicy;
use crate::cache::touched::Touched;

use super::cached_free::{BlockGroup, CachedFree};
use super::error::HybridError;

/// A page's index in the pool.
pub type PageId = u32;

/// What a fence withholds: a page (a recurrent state's pages are withheld one by one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freed {
    Page(PageId),
}

#[derive(Debug, Clone)]
pub(crate) struct PagePool {
    /// Free pages, taken from the end (last freed, first reused).
    free: Vec<PageId>,
    /// References to each page from block tables; 0 when the page is free or pending.
    refs: Vec<u32>,
    /// Tokens written into each held page (0 when free or pending).
    written: Vec<u32>,
    /// Tokens a page of the table holding it holds (0 when free or pending).
    block_tokens: Vec<u32>,
    /// The newest step in flight when the page was last released (0: nothing was).
    release_fence: Vec<StepId>,
    /// Slots one page counts for.
    page_slots: u32,
    /// `Σ ⌊written × page_slots / block_tokens⌋` over held pages.
    live_slots: u64,
    pending_pages: u32,
    /// Pages one recurrent state takes (0: no recurrent group, nothing taken).
    state_pages: u32,
    /// Sequences holding a state (each `state_pages` held pages outside every block table).
    states_held: u32,
    pub(crate) fence: FenceQueue<Freed>,
    /// Test fault: a last reference frees at once even while a step is in flight.
    pub(crate) ignore_fence: bool,
    /// Releases whose fence `ignore_fence` skipped (early reuse fired).
    pub(crate) fences_ignored: u64,
    /// Pages handed out while the step they were released under was in flight.
    pub(crate) early_reuse: Vec<(PageId, StepId)>,
    /// Pages published in the prefix cache: their last reference makes them cached-free.
    published: Vec<bool>,
    /// Cached-free pages, in `cache.eviction`'s order once their release fence retired.
    pub(crate) cached: CachedFree,
    /// Pages with `published` set.
    published_count: u64,
    /// Published pages evicted since the prefix index last looked (it unpublishes them).
    pub(crate) evicted: Vec<PageId>,
    /// Published pages a flush unpublished since the prefix index last looked (not evictions).
    pub(crate) unpublished: Vec<PageId>,
    /// Pages changed since the incremental check last looked (it takes them through `&self`).
    pub(crate) touched: RefCell<Touched>,
}

impl PagePool {
    pub(crate) fn new(pages: u32, page_slots: u32, state_pages: u32) -> PagePool {
        let n = pages as usize;
        PagePool {
            free: (0..pages).rev().collect(),
            refs: vec![0; n],
            written: vec![0; n],
            block_tokens: vec![0; n],
            release_fence: vec![0; n],
            page_slots,
            live_slots: 0,
            pending_pages: 0,
            state_pages,
            states_held: 0,
            fence: FenceQueue::new(),
            ignore_fence: false,
            fences_ignored: 0,
            early_reuse: Vec::new(),
            published: vec![false; n],
            cached: CachedFree::new(pages, EvictionPolicy::Lru),
            published_count: 0,
            evicted: Vec::new(),
            unpublished: Vec::new(),
            touched: RefCell::new(Touched::new(pages)),
        }
    }

    /// `page` changed state: the incremental check looks at it next time.
    pub(crate) fn touch(&mut self, page: PageId) {
        self.touched.get_mut().touch(page);
    }

    /// Which cached-free page is evicted first (before any page is cached).
    pub(crate) fn set_eviction(&mut self, policy: EvictionPolicy) {
        self.cached = CachedFree::new(self.pages(), policy);
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

    pub(crate) fn pending_pages(&self) -> u32 {
        self.pending_pages
    }

    /// Pages in block tables (or leaked from them): neither free, pending nor cached-free.
    pub(crate) fn held_pages(&self) -> u32 {
        self.pages() - self.free_count() - self.pending_pages - self.cached_count()
    }

    /// Published pages no table references, kept for prefix hits.
    pub(crate) fn cached_count(&self) -> u32 {
        self.cached.len() as u32
    }

    pub(crate) fn published_count(&self) -> u64 {
        self.published_count
    }

    pub(crate) fn is_published(&self, page: PageId) -> bool {
        self.published.get(page as usize).copied().unwrap_or(false)
    }

    pub(crate) fn is_cached_free(&self, page: PageId) -> bool {
        self.cached.contains(page)
    }

    /// `page` (held) is now in the prefix cache as block `depth` of its table's chain, a page of
    /// logical block `group`: its last reference keeps it cached-free.
    pub(crate) fn publish(&mut self, page: PageId, depth: u64, group: BlockGroup) {
        if let Some(p) = self.published.get_mut(page as usize) {
            if !*p {
                self.published_count += 1;
            }
            *p = true;
            self.cached.published(page, depth, group);
            self.touch(page);
        }
    }

    /// A prefix hit shared a held published page (what `lfu` and `priority` weigh).
    pub(crate) fn count_hit(&mut self, page: PageId) {
        self.cached.hit(page);
    }

    /// Cached-free pages that can be evicted and handed out now: those released under no
    /// step still in flight (a fenced one waits, like a pending page).
    fn evictable(&self, except: &[PageId]) -> u32 {
        let excepted = except
            .iter()
            .filter(|&&p| self.cached.is_evictable(p))
            .count();
        (self.cached.evictable_len() - excepted) as u32
    }

    fn fence_clear(&self, page: PageId) -> bool {
        let fence = self.release_fence(page);
        self.ignore_fence || fence == 0 || self.fence.is_retired(fence)
    }

    /// Pages that can be taken now: free ones and evictable cached-free ones.
    pub(crate) fn available(&self) -> u32 {
        self.free_count() + self.evictable(&[])
    }

    /// Pages that can be taken now, not counting the cached-free pages `except` is about to
    /// share.
    pub(crate) fn available_except(&self, except: &[PageId]) -> u32 {
        self.free_count() + self.evictable(except)
    }

    /// Pages a start sharing the cached-free pages `except` can take when protected blocks are
    /// kept (`EvictProtected::ToGrow`): free ones and the evictable pages of blocks no table
    /// holds — less those of the blocks the start's hit is about to hold.
    pub(crate) fn available_to_start(&self, except: &[PageId]) -> u32 {
        let unprotected = self
            .cached
            .unprotected_len()
            .saturating_sub(self.cached.unprotected_in_blocks_of(except));
        self.free_count() + unprotected as u32
    }

    /// While `keep` is set, taking a page evicts no protected block (a start under
    /// `EvictProtected::ToGrow`; `available_to_start` said how much it may take).
    pub(crate) fn keep_protected(&mut self, keep: bool) {
        self.cached.keep_protected = keep;
    }

    /// Evict the eviction policy's victim block — every cached-free page of it whose fence is
    /// clear — onto the free list; `false` when there is none.
    fn evict_one(&mut self) -> bool {
        let victims = self.cached.pop_victims();
        if victims.is_empty() {
            return false;
        }
        for page in victims {
            self.unpublish_free(page);
            self.evicted.push(page);
            self.free.push(page);
        }
        true
    }

    /// A cached-free page (already out of `cached`) is no longer published nor written.
    fn unpublish_free(&mut self, page: PageId) {
        self.touch(page);
        let i = page as usize;
        if self.published[i] {
            self.published_count -= 1;
        }
        self.published[i] = false;
        self.written[i] = 0;
        self.block_tokens[i] = 0;
    }

    /// Every cached-free page leaves the cache: free, or pending behind the fence it was
    /// released under while that step is in flight. Held published pages stay held,
    /// unpublished. None of it is an eviction (`unpublished`, not `evicted`).
    pub(crate) fn flush_cached(&mut self) {
        for (page, _) in self.cached.drain() {
            let clear = self.fence_clear(page);
            self.unpublish_free(page);
            self.unpublished.push(page);
            if clear {
                self.free.push(page);
            } else {
                self.withhold(Freed::Page(page));
            }
        }
        for (i, p) in self.published.iter_mut().enumerate() {
            if *p {
                *p = false;
                self.published_count -= 1;
                self.cached.unpublished(i as PageId);
                self.unpublished.push(i as PageId);
                self.touched.get_mut().touch(i as PageId);
            }
        }
    }

    /// `page` leaves the prefix cache on its own — another page of its checkpoint was evicted
    /// or flushed, or a sequence published its own copy of the same block under the same key
    /// (`cached.rs`' `publish`): cached-free, it is free (or fenced while the step at its
    /// release runs); held, it stays held, unpublished. The caller drops its index entry.
    pub(crate) fn unpublish_page(&mut self, page: PageId) {
        let i = page as usize;
        if !self.published.get(i).copied().unwrap_or(false) {
            return;
        }
        if self.cached.remove(page) {
            self.cached.unpublished(page);
            let clear = self.fence_clear(page);
            self.unpublish_free(page);
            if clear {
                self.free.push(page);
            } else {
                self.withhold(Freed::Page(page));
            }
        } else {
            self.published[i] = false;
            self.published_count -= 1;
            self.cached.unpublished(page);
            self.touch(page);
        }
    }

    /// A cached-free page is referenced again (a prefix hit): held by one reference.
    pub(crate) fn revive(&mut self, page: PageId) -> Result<(), HybridError> {
        let i = page as usize;
        if !self.cached.remove(page) {
            return Err(HybridError::Corrupt(
                "revived a page that is not cached-free",
            ));
        }
        self.cached.hit(page);
        self.touch(page);
        self.refs[i] = 1;
        self.live_slots += self.live_of(i);
        Ok(())
    }

    pub(crate) fn refs(&self, page: PageId) -> Option<u32> {
        self.refs.get(page as usize).copied()
    }

    pub(crate) fn written(&self, page: PageId) -> Option<u32> {
        self.written.get(page as usize).copied()
    }

    /// Tokens a page of the table holding `page` holds (0 when free or pending).
    pub(crate) fn block_tokens(&self, page: PageId) -> Option<u32> {
        self.block_tokens.get(page as usize).copied()
    }

    /// The newest step in flight when `page` was last released (0: none was).
    pub(crate) fn release_fence(&self, page: PageId) -> StepId {
        self.release_fence.get(page as usize).copied().unwrap_or(0)
    }

    pub(crate) fn live_slots(&self) -> u64 {
        self.live_slots
    }

    fn live_of(&self, page: usize) -> u64 {
        let bt = u64::from(self.block_tokens[page].max(1));
        u64::from(self.written[page]) * u64::from(self.page_slots) / bt
    }

    /// A free page for a table whose pages hold `block_tokens` tokens, now held by one
    /// reference with nothing written.
    pub(crate) fn take(&mut self, block_tokens: u32) -> Result<PageId, HybridError> {
        if self.free.is_empty() {
            self.evict_one();
        }
        let page = self
            .free
            .pop()
            .ok_or(HybridError::OutOfPages { needed: 1, free: 0 })?;
        self.touch(page);
        let i = page as usize;
        let fence = self.release_fence[i];
        if fence != 0 && !self.fence.is_retired(fence) {
            self.early_reuse.push((page, fence));
        }
        self.refs[i] = 1;
        self.written[i] = 0;
        self.block_tokens[i] = block_tokens;
        Ok(page)
    }

    /// Slots the cached-free pages hold (their written tokens at their table's block tokens).
    pub(crate) fn cached_slots(&self) -> u64 {
        u64::from(self.cached_count()) * u64::from(self.page_slots)
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
        self.touch(page);
        Ok(())
    }

    /// `page` now holds `tokens` written tokens (at most its block tokens).
    pub(crate) fn note_written(&mut self, page: PageId, tokens: u32) -> Result<(), HybridError> {
        let i = page as usize;
        if self.refs.get(i).copied().unwrap_or(0) == 0 {
            return Err(HybridError::Corrupt("wrote a page nobody holds"));
        }
        self.touch(page);
        let before = self.live_of(i);
        self.written[i] = tokens.min(self.block_tokens[i]);
        self.live_slots = self.live_slots - before + self.live_of(i);
        Ok(())
    }

    /// One reference fewer; when it was the last the page is pending behind the newest step in
    /// flight, or free when none is.
    pub(crate) fn drop_ref(&mut self, page: PageId) -> Result<(), HybridError> {
        let i = page as usize;
        let r = self
            .refs
            .get_mut(i)
            .ok_or(HybridError::Corrupt("dropped page out of range"))?;
        *r = r
            .checked_sub(1)
            .ok_or(HybridError::Corrupt("dropped a free page"))?;
        let last = *r == 0;
        self.touch(page);
        if last && self.published[i] {
            // Kept for prefix hits: its tokens stay, it counts cached-free, not live.
            self.live_slots -= self.live_of(i);
            self.release_fence[i] = self.fence.newest_in_flight().unwrap_or(0);
            let fenced = self.release_fence[i] != 0 && !self.ignore_fence;
            self.cached.insert(page, fenced);
        } else if last {
            self.live_slots -= self.live_of(i);
            self.written[i] = 0;
            self.block_tokens[i] = 0;
            self.release_fence[i] = self.fence.newest_in_flight().unwrap_or(0);
            self.withhold(Freed::Page(page));
        }
        Ok(())
    }

    fn withhold(&mut self, item: Freed) {
        if self.ignore_fence {
            if self.fence.newest_in_flight().is_some() {
                self.fences_ignored += 1;
            }
            self.settle(item);
            return;
        }
        match self.fence.defer(item) {
            Some(item) => self.settle(item),
            None => match item {
                Freed::Page(page) => {
                    self.touch(page);
                    self.pending_pages += 1;
                }
            },
        }
    }

    fn settle(&mut self, item: Freed) {
        match item {
            Freed::Page(page) => {
                self.touch(page);
                self.free.push(page);
            }
        }
    }

    /// A step was submitted; it may touch every page mapped now.
    pub(crate) fn begin_step(&mut self) -> StepId {
        self.fence.begin_step()
    }

    /// `step` completed: what no step in flight may touch any more is free. `false` (nothing
    /// changed) when `step` was not in flight.
    pub(crate) fn retire_step(&mut self, step: StepId) -> bool {
        let mut ready = Vec::new();
        if !self.fence.try_retire(step, &mut ready) {
            return false;
        }
        if self.cached.fenced_len() > 0 {
            let fence = &self.fence;
            let fences = &self.release_fence;
            let unfenced = self
                .cached
                .unfence(|p| fence.is_retired(fences[p as usize]));
            for page in unfenced {
                self.touch(page);
            }
        }
        for item in ready {
            match item {
                Freed::Page(_) => self.pending_pages -= 1,
            }
            self.settle(item);
        }
        true
    }

    /// Pages one recurrent state takes (0 without a recurrent group).
    pub(crate) fn state_pages(&self) -> u32 {
        self.state_pages
    }

    pub(crate) fn states_held(&self) -> u32 {
        self.states_held
    }

    /// A recurrent state's pages, taken from the pool (none without a recurrent group): held by
    /// one reference each, in no block table, nothing written. All or nothing.
    pub(crate) fn take_state(&mut self) -> Result<Vec<PageId>, HybridError> {
        if self.state_pages == 0 {
            return Ok(Vec::new());
        }
        let available = self.available();
        if available < self.state_pages {
            return Err(HybridError::OutOfPages {
                needed: u64::from(self.state_pages),
                free: available,
            });
        }
        let mut pages = Vec::with_capacity(self.state_pages as usize);
        for _ in 0..self.state_pages {
            // Block tokens 1: a state page counts no written tokens, so no live slots here.
            pages.push(self.take(1)?);
        }
        self.states_held += 1;
        Ok(pages)
    }

    /// Give a state's pages back; they are free once the steps in flight retired.
    pub(crate) fn drop_state(&mut self, pages: &[PageId]) -> Result<(), HybridError> {
        if self.state_pages == 0 {
            return Ok(());
        }
        self.states_held = self
            .states_held
            .checked_sub(1)
            .ok_or(HybridError::Corrupt("released a state never taken"))?;
        for &page in pages {
            self.drop_ref(page)?;
        }
        Ok(())
    }
}
