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
//! A logical block's pages leave together: a hit needs every table's page of a block (a full
//! table's, or a sliding table's inside the window), so a cached-free page whose block still
//! has a page held in another table — a sliding page trimmed out of the window while its
//! sequence still holds the block in the full tables — is *protected*: the policy pops it only
//! when no page of a wholly cached-free block is left, and it joins the policy's set (with the
//! rest of its block, as the most recent) when the block's last held page goes. Without this a
//! shared prompt's sliding pages, released mid-prefill, were evicted long before their full
//! pages and cut every later hit of that prompt to nothing. A block is what one sequence
//! published up to one token position, in every table.
//!
//! This file only orders; `pool.rs` owns every page transition and tells it what happened.

use std::collections::{BTreeMap, HashMap};

use crate::cache::evict::{AnyEvictor, Evictable, EvictionPolicy, Evictor};

use super::pool::PageId;

/// A logical block: the sequence that published it and the tokens up to its end.
pub(crate) type BlockGroup = (u64, u64);

/// The published pages of one logical block and how many of them a table holds.
#[derive(Debug, Clone, Default)]
struct Group {
    held: u32,
    pages: Vec<PageId>,
}

#[derive(Debug, Clone)]
pub(crate) struct CachedFree {
    /// The evictable cached-free pages of blocks no table holds, in the policy's order.
    evict: AnyEvictor,
    /// The evictable cached-free pages whose block a table still holds, in the policy's order:
    /// popped only when `evict` is empty.
    protected: AnyEvictor,
    /// Whether each evictable page is in `protected` (else `evict`).
    in_protected: Vec<bool>,
    /// Each published page's block.
    group: Vec<Option<BlockGroup>>,
    groups: HashMap<BlockGroup, Group>,
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
            protected: policy.build(pages),
            in_protected: vec![false; pages as usize],
            group: vec![None; pages as usize],
            groups: HashMap::new(),
            fenced: BTreeMap::new(),
            tick: vec![0; pages as usize],
            info: vec![Evictable::default(); pages as usize],
            clock: 0,
        }
    }

    /// Cached-free pages, fenced or not.
    pub(crate) fn len(&self) -> usize {
        self.evict.len() + self.protected.len() + self.fenced.len()
    }

    /// Cached-free pages the policy may pop now.
    pub(crate) fn evictable_len(&self) -> usize {
        self.evict.len() + self.protected.len()
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

    /// `page` (held) was published as block `depth` of its table's chain, a page of logical
    /// block `group`: nothing hit it yet.
    pub(crate) fn published(&mut self, page: PageId, depth: u64, group: BlockGroup) {
        let Some(i) = self.info.get_mut(page as usize) else {
            return;
        };
        *i = Evictable {
            depth: u32::try_from(depth).unwrap_or(u32::MAX),
            hits: 0,
            shared: false,
        };
        self.leave_group(page, true);
        self.group[page as usize] = Some(group);
        let g = self.groups.entry(group).or_default();
        g.held += 1;
        g.pages.push(page);
    }

    /// `page` leaves its block (evicted or unpublished); `held` if a table still held it.
    fn leave_group(&mut self, page: PageId, held: bool) {
        let Some(key) = self.group.get_mut(page as usize).and_then(Option::take) else {
            return;
        };
        let Some(g) = self.groups.get_mut(&key) else {
            return;
        };
        g.pages.retain(|&p| p != page);
        if held {
            g.held = g.held.saturating_sub(1);
        }
        if g.pages.is_empty() {
            self.groups.remove(&key);
        } else if held && g.held == 0 {
            self.release_group(key);
        }
    }

    /// No table holds block `key` any more: its protected pages join the policy's set.
    fn release_group(&mut self, key: BlockGroup) {
        let Some(g) = self.groups.get(&key) else {
            return;
        };
        for &p in &g.pages {
            let i = p as usize;
            if self.in_protected[i] {
                self.in_protected[i] = false;
                self.protected.remove(p);
                self.evict.insert(p, self.info[i]);
            }
        }
    }

    /// A table holds block `key` again: its evictable pages are protected.
    fn hold_group(&mut self, key: BlockGroup) {
        let Some(g) = self.groups.get(&key) else {
            return;
        };
        for &p in &g.pages {
            let i = p as usize;
            let evictable = self.tick[i] != 0 && !self.fenced.contains_key(&self.tick[i]);
            if evictable && !self.in_protected[i] {
                self.in_protected[i] = true;
                self.evict.remove(p);
                self.protected.insert(p, self.info[i]);
            }
        }
    }

    /// `page` joins the policy's sets: protected while its block is held elsewhere.
    fn make_evictable(&mut self, page: PageId) {
        let i = page as usize;
        let held = self.group[i]
            .and_then(|k| self.groups.get(&k))
            .is_some_and(|g| g.held > 0);
        self.in_protected[i] = held;
        if held {
            self.protected.insert(page, self.info[i]);
        } else {
            self.evict.insert(page, self.info[i]);
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
            self.make_evictable(page);
        }
        if let Some(key) = self.group[i] {
            if let Some(g) = self.groups.get_mut(&key) {
                g.held = g.held.saturating_sub(1);
                if g.held == 0 {
                    self.release_group(key);
                }
            }
        }
    }

    /// `page` leaves the cached-free set for a table (a prefix hit); `false` if it was not in it.
    pub(crate) fn remove(&mut self, page: PageId) -> bool {
        let Some(&t) = self.tick.get(page as usize).filter(|&&t| t != 0) else {
            return false;
        };
        let i = page as usize;
        if self.fenced.remove(&t).is_none() {
            if self.in_protected[i] {
                self.protected.remove(page);
            } else {
                self.evict.remove(page);
            }
        }
        self.in_protected[i] = false;
        self.tick[i] = 0;
        if let Some(key) = self.group[i] {
            if let Some(g) = self.groups.get_mut(&key) {
                g.held += 1;
                if g.held == 1 {
                    self.hold_group(key);
                }
            }
        }
        true
    }

    /// The policy's victim, out of the cache (its worth forgotten).
    pub(crate) fn pop_victim(&mut self) -> Option<PageId> {
        let page = match self.evict.pop_victim() {
            Some(p) => p,
            None => self.protected.pop_victim()?,
        };
        self.forget(page);
        Some(page)
    }

    fn forget(&mut self, page: PageId) {
        let i = page as usize;
        self.tick[i] = 0;
        self.in_protected[i] = false;
        self.info[i] = Evictable::default();
        self.leave_group(page, false);
    }

    /// A published page left the cache without being evicted (a flush of a held page).
    pub(crate) fn unpublished(&mut self, page: PageId) {
        if let Some(i) = self.info.get_mut(page as usize) {
            *i = Evictable::default();
            self.leave_group(page, true);
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
            self.make_evictable(page);
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
        let mut order = self.evict.order();
        order.extend(self.protected.order());
        order
    }

    /// `page`'s logical block while it is published (tests only).
    pub(crate) fn block_of(&self, page: PageId) -> Option<BlockGroup> {
        self.group.get(page as usize).copied().flatten()
    }

    /// Whether `page` is evictable but protected: its block is held in a table (tests only).
    pub(crate) fn is_protected(&self, page: PageId) -> bool {
        self.in_protected
            .get(page as usize)
            .copied()
            .unwrap_or(false)
    }

    /// What the policy weighs for `page` now.
    pub(crate) fn info(&self, page: PageId) -> Option<Evictable> {
        self.info.get(page as usize).copied()
    }
}
