//! The pool's cached-free pages: published pages no table references, kept for prefix hits, and
//! which of them goes first when the pool needs a page (`cache.eviction`).
//!
//! The order is the summed manager's: `cache::evict`'s policies (`lru`, `lfu`, `priority`
//! behind [`AnyEvictor`]) over logical blocks (below), told what each is worth as it becomes
//! evictable ([`Evictable`]: its depth in its key chain, the prefix hits it served, whether it
//! was shared by one). A page released while a step that may read it is in flight is cached-free
//! but not evictable: it waits here, in release order, and joins the policy's set when that
//! step retired — as the summed pool settles a pending block — so the policy only ever pops a
//! page that can be handed out now. A prefix hit may still share a fenced page (its content is
//! what the step reads).
//!
//! A logical block's pages leave together: a hit needs every table's page of a block (a full
//! table's, or a sliding table's inside the window), so the policy orders *blocks*, not pages —
//! one entry a block, weighed as the summed manager weighs its one block (its depth, the hits
//! it served: a hit shares every table's page of it at once, so the most any page of it
//! served; shared by one) — and its victim is a whole block: every evictable cached-free page of
//! it goes at once. Ordering pages one by one let `lfu` and `priority` split a block (a sliding
//! page out of a hit's window is never hit, so it sorted apart from the full pages of the same
//! block) and cut their hit rate to a third of the summed manager's. A block whose cached-free
//! pages wait while a table still holds another page of it — a sliding page trimmed out of the
//! window while its sequence still holds the block in the full tables — is *protected*: the
//! policy pops it only when no wholly cached-free block is left (and then only its cached-free
//! pages), and it joins the first set, as the most recent, when the block's last held page goes.
//! Without this a shared prompt's sliding pages, released mid-prefill, were evicted long before
//! their full pages and cut every later hit of that prompt to nothing. A block is what one
//! sequence published up to one token position, in every table.
//!
//! The protected set's evictable pages are counted as blocks move, so that under
//! `cache.evict_protected = "to_grow"` a start's probe and allocation can leave protected blocks
//! alone (`keep_protected` while `HybridKv::start` maps; `pool.rs`' `available_to_start` also
//! leaves out the blocks the start's own hit is about to hold).
//!
//! **Invariant** (checked by `kv_check.rs`' full walk): the cached-free pages are the first set,
//! the protected set and the pages still waiting for their release's step; the eviction order
//! is the first set's, then the protected set's; the protected count equals a recount.
//!
//! This file only orders; `pool.rs` owns every page transition and tells it what happened.

use std::collections::{BTreeMap, HashMap};

use crate::cache::evict::{AnyEvictor, Evictable, EvictionPolicy, Evictor};

use super::pool::PageId;

/// A logical block: the sequence that published it and the tokens up to its end.
pub(crate) type BlockGroup = (u64, u64);

/// Which of the policy's sets a block is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Set {
    /// No evictable page: in neither.
    #[default]
    None,
    Evict,
    Protected,
}

/// The published pages of one logical block, how many of them a table holds, how many are
/// evictable now, and what the policy weighs for the block.
#[derive(Debug, Clone, Default)]
struct Group {
    key: BlockGroup,
    held: u32,
    pages: Vec<PageId>,
    evictable: u32,
    info: Evictable,
    set: Set,
    /// Its evictable pages as counted in `CachedFree::protected_pages` (all of them while it is
    /// protected, none otherwise).
    counted: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct CachedFree {
    /// Blocks with evictable pages that no table holds, in the policy's order (by block id).
    evict: AnyEvictor,
    /// Blocks with evictable pages that a table still holds, in the policy's order: popped
    /// only when `evict` is empty.
    protected: AnyEvictor,
    /// Blocks by id (an id is reused once its block has no published page left, so ids stay
    /// below the pool's page count: every live block has a published page of its own).
    blocks: Vec<Group>,
    free_ids: Vec<u32>,
    ids: HashMap<BlockGroup, u32>,
    /// Each published page's block id.
    group: Vec<Option<u32>>,
    /// Whether each page is cached-free and in its block's policy entry (not fenced).
    evictable: Vec<bool>,
    evictable_pages: usize,
    /// Cached-free pages released while a step was in flight, by release tick, until it retires.
    fenced: BTreeMap<u64, PageId>,
    /// Evictable pages of protected blocks (a table still holds a page of their block).
    protected_pages: usize,
    /// While set, `pop_victims` leaves protected blocks alone (`EvictProtected::ToGrow`: a
    /// start is being mapped).
    pub(crate) keep_protected: bool,
    /// Each cached-free page's release tick (0: not cached-free).
    tick: Vec<u64>,
    /// Prefix hits each published page served (reset when the page leaves the cache).
    hits: Vec<u32>,
    clock: u64,
}

impl CachedFree {
    pub(crate) fn new(pages: u32, policy: EvictionPolicy) -> CachedFree {
        CachedFree {
            evict: policy.build(pages),
            protected: policy.build(pages),
            blocks: Vec::new(),
            free_ids: Vec::new(),
            ids: HashMap::new(),
            group: vec![None; pages as usize],
            evictable: vec![false; pages as usize],
            evictable_pages: 0,
            fenced: BTreeMap::new(),
            protected_pages: 0,
            keep_protected: false,
            tick: vec![0; pages as usize],
            hits: vec![0; pages as usize],
            clock: 0,
        }
    }

    /// Cached-free pages, fenced or not.
    pub(crate) fn len(&self) -> usize {
        self.evictable_pages + self.fenced.len()
    }

    /// Cached-free pages the policy may pop now.
    pub(crate) fn evictable_len(&self) -> usize {
        self.evictable_pages
    }

    /// Evictable pages whose block no table holds: what a start may evict when protected
    /// blocks are kept (`EvictProtected::ToGrow`).
    pub(crate) fn unprotected_len(&self) -> usize {
        self.evictable_pages - self.protected_pages
    }

    /// Evictable pages of unprotected blocks among the blocks of `pages`: a prefix hit sharing
    /// `pages` makes their blocks held, so a start that hits them cannot evict any of them when
    /// protected blocks are kept.
    pub(crate) fn unprotected_in_blocks_of(&self, pages: &[PageId]) -> usize {
        let mut ids: Vec<u32> = pages
            .iter()
            .filter_map(|&p| self.group.get(p as usize).copied().flatten())
            .filter(|&id| self.blocks[id as usize].set == Set::Evict)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.iter()
            .map(|&id| self.blocks[id as usize].evictable as usize)
            .sum()
    }

    /// Recomputed from the blocks (the invariant check compares it with the counter).
    pub(crate) fn protected_pages_recounted(&self) -> (usize, usize) {
        let walked = self
            .blocks
            .iter()
            .filter(|g| g.set == Set::Protected)
            .map(|g| g.evictable as usize)
            .sum();
        (walked, self.protected_pages)
    }

    /// Block `id`'s share of `protected_pages` brought up to date with its set and count.
    fn recount(&mut self, id: u32) {
        let g = &mut self.blocks[id as usize];
        let now = if g.set == Set::Protected {
            g.evictable
        } else {
            0
        };
        self.protected_pages = self.protected_pages - g.counted as usize + now as usize;
        g.counted = now;
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
        self.evictable.get(page as usize).copied().unwrap_or(false)
    }

    /// Take block `id` out of whichever set holds it.
    fn unset(&mut self, id: u32) {
        match self.blocks[id as usize].set {
            Set::None => {}
            Set::Evict => self.evict.remove(id),
            Set::Protected => self.protected.remove(id),
        }
        self.blocks[id as usize].set = Set::None;
        self.recount(id);
    }

    /// Put block `id` in the set it belongs in now (none without an evictable page; protected
    /// while a table holds a page of it). A block already in its set keeps its place.
    fn place(&mut self, id: u32) {
        let g = &self.blocks[id as usize];
        let want = if g.evictable == 0 {
            Set::None
        } else if g.held > 0 {
            Set::Protected
        } else {
            Set::Evict
        };
        if want != g.set {
            let info = g.info;
            self.unset(id);
            match want {
                Set::None => {}
                Set::Evict => self.evict.insert(id, info),
                Set::Protected => self.protected.insert(id, info),
            }
            self.blocks[id as usize].set = want;
        }
        self.recount(id);
    }

    /// `page` (held) was published as block `depth` of its table's chain, a page of logical
    /// block `group`: nothing hit it yet.
    pub(crate) fn published(&mut self, page: PageId, depth: u64, group: BlockGroup) {
        let i = page as usize;
        if i >= self.hits.len() {
            return;
        }
        self.hits[i] = 0;
        self.leave_group(page, true);
        let id = match self.ids.get(&group) {
            Some(&id) => id,
            None => {
                let fresh = Group {
                    key: group,
                    info: Evictable {
                        depth: u32::try_from(depth).unwrap_or(u32::MAX),
                        hits: 0,
                        shared: false,
                    },
                    ..Group::default()
                };
                let id = match self.free_ids.pop() {
                    Some(id) => {
                        self.blocks[id as usize] = fresh;
                        id
                    }
                    None => {
                        self.blocks.push(fresh);
                        (self.blocks.len() - 1) as u32
                    }
                };
                self.ids.insert(group, id);
                id
            }
        };
        self.group[i] = Some(id);
        let g = &mut self.blocks[id as usize];
        g.held += 1;
        g.pages.push(page);
        self.place(id);
    }

    /// `page` leaves its block (evicted or unpublished; not evictable any more); `held` if a
    /// table still held it.
    fn leave_group(&mut self, page: PageId, held: bool) {
        let Some(id) = self.group.get_mut(page as usize).and_then(Option::take) else {
            return;
        };
        let g = &mut self.blocks[id as usize];
        g.pages.retain(|&p| p != page);
        if held {
            g.held = g.held.saturating_sub(1);
        }
        if g.pages.is_empty() {
            self.unset(id);
            let key = self.blocks[id as usize].key;
            self.ids.remove(&key);
            self.blocks[id as usize] = Group::default();
            self.free_ids.push(id);
        } else {
            self.place(id);
        }
    }

    /// `page` joins its block's policy entry.
    fn make_evictable(&mut self, page: PageId) {
        let i = page as usize;
        self.evictable[i] = true;
        self.evictable_pages += 1;
        if let Some(id) = self.group[i] {
            self.blocks[id as usize].evictable += 1;
            self.place(id);
        }
    }

    /// A prefix hit shared `page`: its block served one more hit (a hit shares every page of a
    /// block it needs at once, so the block's count is the most any of its pages served).
    pub(crate) fn hit(&mut self, page: PageId) {
        let i = page as usize;
        let Some(h) = self.hits.get_mut(i) else {
            return;
        };
        *h = h.saturating_add(1);
        let h = *h;
        let Some(id) = self.group[i] else {
            return;
        };
        let g = &mut self.blocks[id as usize];
        if g.info.hits >= h && g.info.shared {
            return;
        }
        g.info.hits = g.info.hits.max(h);
        g.info.shared = true;
        // Re-weighed: a block in a set goes back in under its new worth.
        let set = g.set;
        if set != Set::None {
            self.unset(id);
            self.place(id);
        }
    }

    /// `page`'s last reference went: cached-free, evictable now unless `fenced`.
    pub(crate) fn insert(&mut self, page: PageId, fenced: bool) {
        let i = page as usize;
        self.clock += 1;
        self.tick[i] = self.clock;
        if let Some(id) = self.group[i] {
            let g = &mut self.blocks[id as usize];
            g.held = g.held.saturating_sub(1);
            self.place(id);
        }
        if fenced {
            self.fenced.insert(self.clock, page);
        } else {
            self.make_evictable(page);
        }
    }

    /// `page` leaves the cached-free set for a table (a prefix hit); `false` if it was not in it.
    pub(crate) fn remove(&mut self, page: PageId) -> bool {
        let Some(&t) = self.tick.get(page as usize).filter(|&&t| t != 0) else {
            return false;
        };
        let i = page as usize;
        let was_evictable = self.fenced.remove(&t).is_none();
        self.tick[i] = 0;
        if was_evictable {
            self.evictable[i] = false;
            self.evictable_pages -= 1;
        }
        if let Some(id) = self.group[i] {
            let g = &mut self.blocks[id as usize];
            if was_evictable {
                g.evictable -= 1;
            }
            g.held += 1;
            self.place(id);
        }
        true
    }

    /// The policy's victim block: its evictable pages, out of the cache (their worth
    /// forgotten); empty when nothing is evictable.
    pub(crate) fn pop_victims(&mut self) -> Vec<PageId> {
        let id = match self.evict.pop_victim() {
            Some(id) => id,
            None if self.keep_protected => return Vec::new(),
            None => match self.protected.pop_victim() {
                Some(id) => id,
                None => return Vec::new(),
            },
        };
        self.blocks[id as usize].set = Set::None;
        self.recount(id);
        let pages: Vec<PageId> = self.blocks[id as usize]
            .pages
            .iter()
            .copied()
            .filter(|&p| self.evictable[p as usize])
            .collect();
        for &page in &pages {
            self.forget(page);
        }
        pages
    }

    fn forget(&mut self, page: PageId) {
        let i = page as usize;
        self.tick[i] = 0;
        self.hits[i] = 0;
        if self.evictable[i] {
            self.evictable[i] = false;
            self.evictable_pages -= 1;
            if let Some(id) = self.group[i] {
                self.blocks[id as usize].evictable -= 1;
            }
        }
        self.leave_group(page, false);
    }

    /// A published page left the cache without being evicted (a flush of a held page).
    pub(crate) fn unpublished(&mut self, page: PageId) {
        if let Some(h) = self.hits.get_mut(page as usize) {
            *h = 0;
            self.leave_group(page, true);
        }
    }

    /// The fenced pages whose step retired (`retired(page)`) become evictable, in release
    /// order; returned.
    pub(crate) fn unfence(&mut self, retired: impl Fn(PageId) -> bool) -> Vec<PageId> {
        let ready: Vec<(u64, PageId)> = self
            .fenced
            .iter()
            .filter(|(_, &p)| retired(p))
            .map(|(&t, &p)| (t, p))
            .collect();
        for &(t, page) in &ready {
            self.fenced.remove(&t);
            self.make_evictable(page);
        }
        ready.into_iter().map(|(_, p)| p).collect()
    }

    /// Every cached-free page out of the cache: (page, whether it was still fenced).
    pub(crate) fn drain(&mut self) -> Vec<(PageId, bool)> {
        let mut out: Vec<(PageId, bool)> = Vec::with_capacity(self.len());
        let keep = std::mem::replace(&mut self.keep_protected, false);
        loop {
            let victims = self.pop_victims();
            if victims.is_empty() {
                break;
            }
            out.extend(victims.into_iter().map(|p| (p, false)));
        }
        self.keep_protected = keep;
        for (_, page) in std::mem::take(&mut self.fenced) {
            self.forget(page);
            out.push((page, true));
        }
        out
    }

    /// The evictable pages in the order the policy would evict them, block by block (tests
    /// and checks only).
    pub(crate) fn order(&self) -> Vec<PageId> {
        let mut order = Vec::with_capacity(self.evictable_pages);
        for id in self.evict.order().into_iter().chain(self.protected.order()) {
            order.extend(
                self.blocks[id as usize]
                    .pages
                    .iter()
                    .copied()
                    .filter(|&p| self.evictable[p as usize]),
            );
        }
        order
    }

    /// `page`'s logical block while it is published (tests only).
    pub(crate) fn block_of(&self, page: PageId) -> Option<BlockGroup> {
        let id = self.group.get(page as usize).copied().flatten()?;
        Some(self.blocks[id as usize].key)
    }

    /// Whether `page` is evictable but protected: its block is held in a table (tests only).
    pub(crate) fn is_protected(&self, page: PageId) -> bool {
        self.is_evictable(page)
            && self.group[page as usize]
                .is_some_and(|id| self.blocks[id as usize].set == Set::Protected)
    }

    /// What the policy weighs for `page` now: its block's worth.
    pub(crate) fn info(&self, page: PageId) -> Option<Evictable> {
        let i = page as usize;
        if i >= self.hits.len() {
            return None;
        }
        Some(match self.group[i] {
            Some(id) => self.blocks[id as usize].info,
            None => Evictable::default(),
        })
    }
}
