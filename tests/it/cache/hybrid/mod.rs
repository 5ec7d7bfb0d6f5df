//! The hybrid paged manager: operation strings against reference models, its layouts, prefix
//! cache, eviction and incremental invariant check.

mod check_incremental;
mod checkpoints;
mod early_release;
mod evict_protected;
mod kv;
mod layout;
mod manager;
mod prefix;
mod prefix_evict;
mod prefix_policies;
mod supersede;
