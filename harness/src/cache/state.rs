//! The paged manager's state: its configuration, block pool, prefix index and per-sequence block
//! tables, with the read-only accessors tests and benchmarks use. The lowest layer of the paged
//! manager: `paged_ops.rs` (the steps the operations share), `paged.rs` (the `KvCacheManager`
//! implementation) and `check.rs` (the invariants) all build on it, and it imports none of them.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use kvbench_cache_api::SeqId;

use super::block::BlockPool;
use super::check_incremental::Incremental;
use super::evict::EvictionPolicy;
use super::free::Placement;
use super::prefix::PrefixIndex;
use super::table::{Faults, Seq, SeqIdHasher};
use super::tier::{TierConfig, Tiers};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedConfig {
    pub total_blocks: u32,
    pub block_size: u32,
    /// Publish full prompt blocks and look prompts up (still subject to each request's scope).
    pub prefix_cache: bool,
    /// Where a sequence's next block goes (`lifo` keeps the historical order).
    pub placement: Placement,
}

/// Bugs a test can plant that are not engine-facing [`Fault`](kvbench_cache_api::Fault)s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// Prefix keys and hit verification ignore the scope: one tenant hits another's blocks.
    CrossScopeHit,
}

#[derive(Debug)]
pub struct PagedCache {
    pub(crate) config: PagedConfig,
    /// Which cached block goes first when a fresh one is needed (`cache.eviction`).
    pub(crate) eviction: EvictionPolicy,
    pub(crate) pool: BlockPool,
    pub(crate) index: PrefixIndex,
    pub(crate) seqs: HashMap<SeqId, Seq, BuildHasherDefault<SeqIdHasher>>,
    pub(crate) faults: Faults,
    /// Protocol errors and fault effects seen so far (shared-block writes, unknown retires).
    pub(crate) violations: Vec<String>,
    /// Corrupted layouts handed out by `layout` (bad-block-table fired); a `Cell` because
    /// handing out a layout is a read.
    pub(crate) bad_layouts_read: Cell<u64>,
    /// The lower tiers (`None`: the device cache alone, exactly as without tiers).
    pub(crate) tiers: Option<Tiers>,
    /// What the last invariant check saw (`check_incremental.rs`); a `RefCell` because a check
    /// is a read.
    pub(crate) incremental: RefCell<Incremental>,
}

impl PagedCache {
    pub fn new(config: PagedConfig) -> Self {
        Self::with_eviction(config, EvictionPolicy::Lru)
    }

    /// [`PagedCache::new`] with the eviction policy of its prefix cache.
    pub fn with_eviction(config: PagedConfig, eviction: EvictionPolicy) -> Self {
        Self::with_tiers(config, eviction, TierConfig::default())
    }

    /// [`PagedCache::with_eviction`] with lower tiers below the device (`cache::tier`).
    pub fn with_tiers(config: PagedConfig, eviction: EvictionPolicy, tiers: TierConfig) -> Self {
        PagedCache {
            config,
            eviction,
            pool: BlockPool::new(
                config.total_blocks,
                config.block_size.max(1),
                config.placement,
                eviction,
            ),
            index: PrefixIndex::default(),
            seqs: HashMap::default(),
            faults: Faults::default(),
            violations: Vec::new(),
            bad_layouts_read: Cell::new(0),
            tiers: Tiers::new(&tiers, config.block_size.max(1)),
            incremental: RefCell::new(Incremental::default()),
        }
    }

    pub fn config(&self) -> PagedConfig {
        self.config
    }

    pub fn eviction(&self) -> EvictionPolicy {
        self.eviction
    }

    /// The real block table (not the possibly corrupted `layout`).
    pub fn block_table(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| &s.blocks[..])
    }

    pub fn ref_count(&self, block: u32) -> u32 {
        self.pool
            .meta
            .get(block as usize)
            .map_or(0, |m| m.ref_count)
    }

    /// Whether `block` is published in the prefix index.
    pub fn is_published(&self, block: u32) -> bool {
        self.pool
            .meta
            .get(block as usize)
            .is_some_and(|m| m.key.is_some())
    }

    /// Evictable cached blocks, the next victim first.
    pub fn eviction_order(&self) -> Vec<u32> {
        self.pool.eviction_order()
    }

    pub fn free_blocks(&self) -> u32 {
        self.pool.free_blocks()
    }

    pub fn live_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// The content key `slot` of a lower tier holds now (`None`: free, or no such tier).
    pub fn tier_slot_key(&self, tier: kvbench_cache_api::Tier, slot: u32) -> Option<[u8; 32]> {
        self.tiers
            .as_ref()?
            .pool(tier)?
            .slots
            .get(slot as usize)?
            .key
    }

    /// The content key device block `block` is published under, if any.
    pub fn block_key(&self, block: u32) -> Option<[u8; 32]> {
        self.pool.meta.get(block as usize)?.key
    }

    pub fn plant_bug(&mut self, bug: PlantedBug) {
        match bug {
            PlantedBug::CrossScopeHit => self.index.ignore_scope = true,
        }
    }
}
