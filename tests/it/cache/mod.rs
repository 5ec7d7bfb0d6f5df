//! The cache managers through their own API and the engine's trait: the paged and contiguous
//! managers, the hybrid (grouped) paged manager, placement, prefix scopes, eviction policies and
//! FP8 KV.

mod contiguous;
mod eviction_policies;
mod hybrid;
mod kv_fp8;
mod model;
mod paged;
mod paged_check_incremental;
mod placement;
mod prefix_scope;
