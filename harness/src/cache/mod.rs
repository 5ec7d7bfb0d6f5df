//! KV cache managers on the harness side: the paged manager with its prefix cache, the factory
//! that builds either mode, and the operation model shared by property tests, fuzzing and
//! `kvbench fuzz`. Below the paged manager's device blocks, optional lower tiers (host, disk:
//! `tier.rs`, configured by [`TierConfig`]) keep evicted prefix blocks for onloading.
//!
//! **Architecture invariant:** nothing here knows about time, devices or scheduling; steps are
//! opaque fence ids (see `kvbench_cache_api::fence`). The contiguous baseline lives in
//! `kvbench_baselines::manager`.

mod block;
mod check;
mod check_incremental;
pub mod evict;
mod free;
pub mod fuzz;
pub mod hybrid;
mod paged;
mod paged_ops;
mod prefix;
mod state;
mod table;
mod tier;
mod touched;

pub use block::BlockAllocator;
pub use evict::EvictionPolicy;
pub use free::Placement;
pub use kvbench_cache_api::CacheMode;
pub use prefix::PrefixKey;
pub use state::{PagedCache, PagedConfig, PlantedBug};
pub use tier::TierConfig;

use kvbench_baselines::manager::ContiguousCache;
use kvbench_cache_api::KvCacheManager;

/// Build the manager for `mode` over `total_slots` token slots. Paged: `total_slots / block_size`
/// blocks (a remainder is unused); contiguous: one arena of `total_slots` (block size and prefix
/// caching do not apply).
pub fn build(
    mode: CacheMode,
    total_slots: u64,
    block_size: u32,
    prefix_cache: bool,
) -> Box<dyn KvCacheManager> {
    build_placed(mode, total_slots, block_size, prefix_cache, Placement::Lifo)
}

/// [`build`] with the paged manager's placement policy (the contiguous arena has its own).
pub fn build_placed(
    mode: CacheMode,
    total_slots: u64,
    block_size: u32,
    prefix_cache: bool,
    placement: Placement,
) -> Box<dyn KvCacheManager> {
    build_with(
        mode,
        total_slots,
        block_size,
        prefix_cache,
        placement,
        EvictionPolicy::Lru,
    )
}

/// [`build_placed`] with the paged prefix cache's eviction policy (contiguous has no prefix
/// cache: the policy does not apply to it).
pub fn build_with(
    mode: CacheMode,
    total_slots: u64,
    block_size: u32,
    prefix_cache: bool,
    placement: Placement,
    eviction: EvictionPolicy,
) -> Box<dyn KvCacheManager> {
    build_tiered(
        mode,
        total_slots,
        block_size,
        prefix_cache,
        placement,
        eviction,
        TierConfig::default(),
    )
}

/// [`build_with`] with lower tiers below the paged cache's device blocks (host, and disk below
/// it: `cache::tier`). Contiguous has no prefix cache, so no tiers either; no tiers
/// (`TierConfig::default()`) is exactly [`build_with`].
pub fn build_tiered(
    mode: CacheMode,
    total_slots: u64,
    block_size: u32,
    prefix_cache: bool,
    placement: Placement,
    eviction: EvictionPolicy,
    tiers: TierConfig,
) -> Box<dyn KvCacheManager> {
    match mode {
        CacheMode::Paged => {
            let block_size = block_size.max(1);
            let total_blocks =
                (total_slots / u64::from(block_size)).min(u64::from(u32::MAX - 1)) as u32;
            Box::new(PagedCache::with_tiers(
                PagedConfig {
                    total_blocks,
                    block_size,
                    prefix_cache,
                    placement,
                },
                eviction,
                tiers,
            ))
        }
        CacheMode::Contiguous => Box::new(ContiguousCache::new(total_slots)),
    }
}
