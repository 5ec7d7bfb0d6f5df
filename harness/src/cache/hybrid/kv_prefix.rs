//! `HybridKv`'s prefix-cache settings and what its tests read of it: the eviction policy a run
//! chooses (`cache.eviction`), the planted prefix-cache bug, the cached-free pages in eviction
//! order and the keys hashed. Kept apart from `kv.rs`, the trait implementation.

use crate::cache::evict::Evictable;
use crate::cache::EvictionPolicy;

use super::kv::{EvictProtected, HybridKv};
use super::manager::HybridFault;
use super::pool::PageId;

impl HybridKv {
    /// Cached-free pages are evicted in `policy`'s order (`lru` when not said). Set before any
    /// page is cached: the order starts empty.
    pub fn with_eviction(mut self, policy: EvictionPolicy) -> HybridKv {
        self.cache.pool.set_eviction(policy);
        self
    }

    /// Whether a start may evict a protected block's cached pages (`cache.evict_protected`).
    pub fn with_evict_protected(mut self, evict: EvictProtected) -> HybridKv {
        self.evict_protected = evict;
        self
    }

    /// Evictable pages of protected blocks (tests read it).
    pub fn protected_pages(&self) -> usize {
        self.cache.pool.cached.protected_pages_recounted().1
    }

    /// Plant a bug (tests only: proves the checks catch it). `PublishEarly` is the prefix
    /// cache's; the others are the bare manager's.
    pub fn plant_fault(&mut self, fault: HybridFault) {
        match fault {
            HybridFault::PublishEarly => self.prefix.publish_early = true,
            HybridFault::KeepOutOfWindow => self.cache.plant_fault(fault),
        }
    }

    /// Blocks the planted `PublishEarly` published before they were written.
    pub fn published_early(&self) -> u64 {
        self.prefix.published_early
    }

    /// blake3 block keys the prefix cache computed so far (each block of a sequence's chain
    /// once, however often it is probed).
    pub fn prefix_keys_hashed(&self) -> u64 {
        self.prefix.keys_hashed()
    }

    /// The cached-free pages the policy may evict now, first victim first, with what it weighs
    /// (fenced ones join once their step retired).
    pub fn eviction_order(&self) -> Vec<(PageId, Evictable)> {
        let cached = &self.cache.pool.cached;
        cached
            .order()
            .into_iter()
            .map(|p| (p, cached.info(p).unwrap_or_default()))
            .collect()
    }

    /// The logical block `page` is published in: (publishing sequence, tokens up to its end).
    /// Its pages in every table leave the cache together.
    pub fn eviction_block(&self, page: PageId) -> Option<(u64, u64)> {
        self.cache.pool.cached.block_of(page)
    }

    /// Whether cached-free `page` waits behind the wholly cached-free blocks because a table
    /// still holds a page of its block.
    pub fn eviction_protected(&self, page: PageId) -> bool {
        self.cache.pool.cached.is_protected(page)
    }

    /// Every invariant recomputed from the whole state, as the run's end does (the engine's
    /// `check_invariants` is incremental).
    pub fn check_invariants_full(&self) -> Result<(), String> {
        super::kv_check::check_full(self)
    }

    /// Full walks the invariant checks ran so far (the first check, then every
    /// `touched::walk_period`-th, and the check after any problem).
    pub fn invariant_full_walks(&self) -> u64 {
        self.incremental.borrow().full_walks
    }

    /// Whether `page` is cached-free (published, in no table).
    pub fn is_cached_free(&self, page: PageId) -> bool {
        self.cache.pool.is_cached_free(page)
    }
}
