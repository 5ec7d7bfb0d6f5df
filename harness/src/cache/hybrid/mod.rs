//! The hybrid paged manager: one page pool shared by per-group block tables, for models whose
//! layers do not all keep every token (sliding windows, latent caches, recurrent state).
//!
//! The summed-bytes manager (`cache::paged`) slots every token at the sum of every layer's
//! bytes, so a sliding layer's blocks live as long as the sequence and recurrent state is not in
//! the budget. Here (`layout.rs` states the grouping rule and its waste) each table's blocks
//! follow its own kind: full and MLA tables keep every block, sliding tables release the blocks
//! wholly before the window as the sequence grows, and recurrent state is reserved per sequence
//! outside the pool. `prefix.rs` states what a prefix hit may reuse per kind; `fit.rs` counts
//! what fits against the summed-bytes slots and vLLM's grouping.
//!
//! Not wired into the engine, the backends or `sim` yet: a self-contained piece with its own
//! invariants (`check.rs`) and tests (`tests/cache_hybrid.rs`).

mod check;
mod error;
mod fit;
mod layout;
mod manager;
mod pool;
mod prefix;
mod table;

pub use error::HybridError;
pub use fit::{compare_fit, vllm_layers_per_table, FitComparison};
pub use layout::{HybridLayout, LayoutError, TableKind, TableSpec};
pub use manager::{HybridCache, HybridFault, PageCopy};
pub use pool::PageId;
pub use prefix::prefix_hit_tokens;
pub use table::GroupTable;
