//! KV cache managers on the harness side: the paged manager with its prefix cache, the hybrid
//! manager (`hybrid`), the one factory that builds every manager from a [`CacheSpec`]
//! (`spec.rs`), and the operation model shared by property tests, fuzzing and `kvbench fuzz`.
//! Below the paged manager's device blocks, optional lower tiers (host, disk:
//! `tier.rs`, configured by [`TierConfig`]) keep evicted prefix blocks for onloading.
//!
//! **Architecture invariant:** nothing here knows about time, devices or scheduling; steps are
//! opaque fence ids (see `kvbench_cache_api::fence`). The contiguous baselines live in
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
mod spec;
mod state;
mod table;
mod tier;
mod touched;

pub use block::BlockAllocator;
pub use evict::EvictionPolicy;
pub use free::Placement;
pub use kvbench_cache_api::CacheMode;
pub use prefix::PrefixKey;
pub use spec::{build, CacheSpec, HybridSpec};
pub use state::{PagedCache, PagedConfig, PlantedBug};
pub use tier::TierConfig;
