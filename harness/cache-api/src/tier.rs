//! Lower memory tiers for cached prefix blocks: the plain data the paged manager, the engine and
//! the backends exchange about them.
//!
//! A block evicted from the device's prefix cache may be *offloaded* to the host tier (and from
//! there to a disk tier) instead of being forgotten; a prefix hit found in a lower tier is
//! *onloaded* into a fresh device block before the sequence's prefill continues. The manager
//! decides every move and names both ends as [`BlockLoc`]s; it hands the moves out as
//! [`TierOp`]s (`KvCacheManager::drain_tier_ops`) in the order a backend must perform them, and
//! the backend performs them at the start of the step they were drained into, before that step's
//! copy-on-write copies, swaps and compute.
//!
//! **Invariant (the manager keeps it):** an op's source holds, when the op runs, exactly the
//! content the manager's index says it holds — a device block offloaded is one no in-flight step
//! writes, and a lower-tier slot being onloaded is not handed out again until every step that
//! may read it has retired (the same fence rule as device blocks; planted fault `stale-onload`
//! breaks it on purpose).

use serde::{Deserialize, Serialize};

use crate::SeqId;

/// Where a block's K/V can live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Device,
    Host,
    Disk,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
        }
    }
}

/// One block's place: a device block id, or a slot (dense, `0..capacity_blocks`) of a lower tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockLoc {
    pub tier: Tier,
    pub slot: u32,
}

/// One block moved between tiers. `tokens` is the block size (a published block is always full).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierOp {
    pub from: BlockLoc,
    pub to: BlockLoc,
    pub tokens: u32,
    /// The sequence whose start asked for an onload (it waits for it before its prefill
    /// continues); `None` for offloads, which no request waits for.
    pub seq: Option<SeqId>,
}

impl TierOp {
    /// Device ← lower tier.
    pub fn is_onload(&self) -> bool {
        self.to.tier == Tier::Device && self.from.tier != Tier::Device
    }
}

/// When a cached block's content is written to the host tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffloadMode {
    /// When the device evicts it (write-back): no transfer for content that is never evicted.
    #[default]
    OnEvict,
    /// As soon as the block is full and published (the step after it was written): every
    /// published block crosses the link once, and an eviction later costs nothing.
    WriteThrough,
}

/// Whether a step waits for its onloads before computing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnloadMode {
    /// The step's compute starts after every onload landed: step time = transfers + compute.
    #[default]
    Blocking,
    /// Onloads overlap the step's compute (layer by layer): step time = max(transfers, compute).
    Overlap,
}

/// Prompt tokens a start found in each lower tier (they count in `Started::cached_tokens`
/// too: the prefill does not compute them, but they must be onloaded first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TierHits {
    pub host_tokens: u32,
    pub disk_tokens: u32,
}

impl TierHits {
    pub fn onload_tokens(&self) -> u32 {
        self.host_tokens.saturating_add(self.disk_tokens)
    }
}

/// One lower tier's counters over a run, in blocks (a block holds `block_size` tokens; bytes are
/// blocks × block size × the model's bytes per token, computed by whoever knows the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TierStats {
    pub tier: Option<Tier>,
    pub capacity_blocks: u64,
    /// Blocks looked up in this tier (after a miss in every tier above).
    pub lookup_blocks: u64,
    pub hit_blocks: u64,
    /// Blocks written into this tier (from the tier above).
    pub offloaded_blocks: u64,
    /// Blocks read out of this tier into the device.
    pub onloaded_blocks: u64,
    /// Blocks this tier dropped (or passed down) to make room.
    pub evicted_blocks: u64,
    /// Slots holding a block now, and the most at once.
    pub used_blocks: u64,
    pub peak_used_blocks: u64,
}
