//! A run's lower tiers, from the scenario to the two places that need them: the paged cache
//! manager (how many blocks each tier holds, how it offloads and evicts) and the backend
//! ([`TierSetup`]: pool sizes, onload mode, the disk's link). The contiguous baseline gets none.
//!
//! Capacity → blocks: `⌊capacity bytes ÷ (block_size × KV bytes per token)⌋` — a tier slot
//! holds one device block, all layers' K and V — from the first capacity listed (a list is for
//! comparisons; one run uses one).

use kvbench_cache_api::{CacheMode, OffloadMode};

use super::{ExperimentError, Setup};
use crate::backend::{DiskLink, TierSetup};
use crate::cache::{EvictionPolicy, TierConfig};
use crate::model::ModelShape;
use crate::scenario::Scenario;

/// What one mode's run gets of the scenario's tiers (all zero: none).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TierPlan {
    pub host_blocks: u32,
    pub disk_blocks: u32,
    pub offload: OffloadMode,
    pub host_eviction: EvictionPolicy,
    pub disk_eviction: EvictionPolicy,
    /// What the backend is told.
    pub setup: TierSetup,
}

impl TierPlan {
    /// What the paged cache manager is told.
    pub fn config(&self) -> TierConfig {
        TierConfig {
            host_blocks: self.host_blocks,
            disk_blocks: self.disk_blocks,
            offload: self.offload,
            host_eviction: self.host_eviction,
            disk_eviction: self.disk_eviction,
        }
    }
}

/// Blocks of `block_size` tokens of `shape` that `capacity` (a size with units) holds, by the
/// scenario check's one conversion (`scenario::tier_capacity_blocks`); `key` names the
/// scenario field in errors.
pub fn capacity_blocks(
    key: &str,
    capacity: &str,
    block_size: u32,
    shape: &ModelShape,
) -> Result<u32, ExperimentError> {
    let bytes = crate::units::parse_bytes(capacity)
        .map_err(|e| ExperimentError::Scenario(format!("{key}: {e}")))?;
    crate::scenario::tier_capacity_blocks(shape, block_size, bytes)
        .map_err(|e| ExperimentError::Scenario(format!("{key}: {e}")))
}

/// The tiers of `scenario` for a `mode` run (none for contiguous, none without
/// `cache.host_tier`).
pub fn plan(
    scenario: &Scenario,
    setup: &Setup,
    mode: CacheMode,
) -> Result<TierPlan, ExperimentError> {
    let cache = &scenario.cache;
    let Some(host) = cache
        .host_tier
        .as_ref()
        .filter(|_| mode == CacheMode::Paged)
    else {
        if cache.disk_tier.is_some() && cache.host_tier.is_none() {
            return Err(ExperimentError::Scenario(
                "cache.disk_tier: needs a cache.host_tier above it".into(),
            ));
        }
        return Ok(TierPlan::default());
    };
    let (bs, shape) = (scenario.block_size(), &setup.model);
    let first = |key: &str, list: &[String]| {
        list.first()
            .cloned()
            .ok_or_else(|| ExperimentError::Scenario(format!("{key}: no capacity given")))
    };
    let host_capacity = first("cache.host_tier.capacity", host.capacity.as_slice())?;
    let host_blocks = capacity_blocks("cache.host_tier.capacity", &host_capacity, bs, shape)?;
    let (disk_blocks, disk, disk_eviction) = match &cache.disk_tier {
        Some(d) => (
            capacity_blocks("cache.disk_tier.capacity", &d.capacity, bs, shape)?,
            Some(DiskLink {
                read_bytes_per_s: d.read_bytes_per_s,
                write_bytes_per_s: d.write_bytes_per_s,
                latency_s: d.latency_us / 1e6,
            }),
            d.eviction,
        ),
        None => (0, None, EvictionPolicy::default()),
    };
    Ok(TierPlan {
        host_blocks,
        disk_blocks,
        offload: host.offload,
        host_eviction: host.eviction,
        disk_eviction,
        setup: TierSetup {
            host_blocks,
            disk_blocks,
            onload: host.onload,
            disk,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_whole_blocks_of_a_device_block_s_bytes() {
        // Llama-3-8B: 16 tokens × 128 KiB = 2 MiB a block: 1 GiB is 512 blocks, 3 MiB one.
        let kvb = &ModelShape::llama3_8b();
        assert_eq!(capacity_blocks("k", "1 GiB", 16, kvb).expect("fits"), 512);
        assert_eq!(capacity_blocks("k", "3 MiB", 16, kvb).expect("fits"), 1);
        let err = capacity_blocks("cache.host_tier.capacity", "1 MiB", 16, kvb)
            .expect_err("under a block")
            .to_string();
        assert!(
            err.contains("cache.host_tier.capacity") && err.contains("no block"),
            "{err}"
        );
        let err = capacity_blocks("k", "lots", 16, kvb)
            .expect_err("no size")
            .to_string();
        assert!(err.starts_with("k: "), "{err}");
        let err = capacity_blocks("k", "1024 TiB", 1, kvb)
            .expect_err("too many")
            .to_string();
        assert!(err.contains("at most"), "{err}");
    }
}
