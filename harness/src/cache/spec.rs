//! The one way a cache manager is built: a [`CacheSpec`] says what a run needs of it, and
//! [`build`] picks the manager. Every field is what the scenario (or a test) decided; nothing
//! here chooses between summed and hybrid, which is the scenario's `cache.manager` resolved
//! against the model and the backend.

use kvbench_baselines::manager::{ContiguousCache, GroupedContiguous};
use kvbench_cache_api::{CacheMode, KvCacheManager};

use super::hybrid::{EvictProtected, HybridKv, HybridLayout};
use super::{EvictionPolicy, PagedCache, PagedConfig, Placement, TierConfig};

/// What one manager is built from. `total_slots`, `block_size`, `prefix_cache`, `placement` and
/// `tiers` size the summed managers; a hybrid spec's managers take their sizes from its layout.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSpec {
    pub mode: CacheMode,
    /// Token slots. Paged: `total_slots / block_size` blocks (a remainder is unused);
    /// contiguous: one arena of `total_slots`.
    pub total_slots: u64,
    /// Tokens a paged block holds (contiguous has no blocks).
    pub block_size: u32,
    /// Whether the summed paged manager publishes full blocks for prefix hits.
    pub prefix_cache: bool,
    /// Where the summed paged manager puts a sequence's next block (the contiguous arena has its
    /// own placement).
    pub placement: Placement,
    /// Which cached prefix block the paged manager (summed or hybrid) evicts first; contiguous
    /// has no prefix cache.
    pub eviction: EvictionPolicy,
    /// Lower tiers below the summed paged manager's device blocks (`TierConfig::default()`:
    /// none). Contiguous has no prefix cache, so no tiers; nor has the hybrid manager.
    pub tiers: TierConfig,
    /// `Some`: the grouped pair (`cache.manager` resolved to `hybrid`); `None`: the summed pair.
    pub hybrid: Option<HybridSpec>,
}

/// What the grouped pair needs beyond the shared fields: both of its modes are built from one
/// layout, so that they share their tables, their page size and their accounting unit.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridSpec {
    pub layout: HybridLayout,
    /// Tokens the contiguous baseline's sliding rings hold beyond their window: what one
    /// sequence can write while a step reading the window has not retired (the caller knows the
    /// steps in flight; see `experiment::manager::ring_tokens`).
    pub ring_tokens: u32,
    /// Whether a start may evict cached pages of a block a running sequence still holds in
    /// another table (`cache.evict_protected`).
    pub evict_protected: EvictProtected,
    /// A recurrent model's state checkpoint interval in blocks (`cache.checkpoint_every_blocks`,
    /// 0: none).
    pub checkpoint_every_blocks: u32,
}

impl CacheSpec {
    /// The summed manager of `mode` with the default placement (LIFO), eviction (LRU) and no
    /// lower tiers.
    pub fn new(mode: CacheMode, total_slots: u64, block_size: u32, prefix_cache: bool) -> Self {
        CacheSpec {
            mode,
            total_slots,
            block_size,
            prefix_cache,
            placement: Placement::default(),
            eviction: EvictionPolicy::default(),
            tiers: TierConfig::default(),
            hybrid: None,
        }
    }

    pub fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    pub fn with_eviction(mut self, eviction: EvictionPolicy) -> Self {
        self.eviction = eviction;
        self
    }

    pub fn with_tiers(mut self, tiers: TierConfig) -> Self {
        self.tiers = tiers;
        self
    }

    pub fn with_hybrid(mut self, hybrid: HybridSpec) -> Self {
        self.hybrid = Some(hybrid);
        self
    }

    /// The same spec for the other cache mode (a run builds both from one spec).
    pub fn with_mode(mut self, mode: CacheMode) -> Self {
        self.mode = mode;
        self
    }
}

/// The manager `spec` describes. Summed: the paged manager (`PagedCache`, block size at least
/// 1, at most `u32::MAX - 1` blocks) with its prefix cache and tiers, or the contiguous
/// baseline (`ContiguousCache`). Hybrid: `HybridKv` over the layout, or the grouped contiguous
/// baseline (`GroupedContiguous`) over the layout's grouped pool.
pub fn build(spec: &CacheSpec) -> Box<dyn KvCacheManager> {
    match (&spec.hybrid, spec.mode) {
        (None, CacheMode::Paged) => {
            let block_size = spec.block_size.max(1);
            let total_blocks =
                (spec.total_slots / u64::from(block_size)).min(u64::from(u32::MAX - 1)) as u32;
            Box::new(PagedCache::with_tiers(
                PagedConfig {
                    total_blocks,
                    block_size,
                    prefix_cache: spec.prefix_cache,
                    placement: spec.placement,
                },
                spec.eviction,
                spec.tiers,
            ))
        }
        (None, CacheMode::Contiguous) => Box::new(ContiguousCache::new(spec.total_slots)),
        (Some(h), CacheMode::Paged) => Box::new(
            HybridKv::new(h.layout.clone())
                .with_eviction(spec.eviction)
                .with_evict_protected(h.evict_protected)
                .with_checkpoints(h.checkpoint_every_blocks),
        ),
        (Some(h), CacheMode::Contiguous) => Box::new(GroupedContiguous::new(
            h.layout.grouped_pool(),
            h.ring_tokens,
        )),
    }
}
