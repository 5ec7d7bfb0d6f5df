//! The hybrid paged manager: one page pool shared by per-group block tables, for models whose
//! layers do not all keep every token (sliding windows, latent caches, recurrent state).
//!
//! The summed-bytes manager (`cache::paged`) slots every token at the sum of every layer's
//! bytes, so a sliding layer's blocks live as long as the sequence and recurrent state is not in
//! the budget. Here (`layout.rs` states the grouping rule and its waste) each table's blocks
//! follow its own kind: full and MLA tables keep every block, sliding tables release the blocks
//! wholly before the window as the sequence is written, and a sequence's recurrent state is
//! pages of the same pool, taken when it starts (the grouped contiguous baseline instead
//! reserves states up front). `prefix.rs` states what a prefix hit may reuse per kind; `fit.rs`
//! counts what fits against the summed-bytes slots and vLLM's grouping.
//!
//! `HybridCache` (`manager.rs`) is the self-contained manager with its own invariants
//! (`check.rs`), tested against a reference model of the logical blocks and page versions each
//! sequence holds. `HybridKv` (`kv.rs`, invariants in `kv_check.rs`, the every-step check in
//! `check_incremental.rs`) puts it behind the engine's `KvCacheManager` trait — prompts mapped
//! whole at start and trimmed as they are written, fences on every released page and state,
//! grouped accounting in slots, planted faults — and is driven through the trait by the engine
//! where the run selects it; its tests drive it through the trait against a model of blocks,
//! versions, fences and states, and plant each fault. Both models take a state as pages of the
//! pool: a start or fork refused when the pool lacks them, a fork copying page by page, released
//! state pages never handed out before their fence retired. Its prefix cache (`cached.rs`,
//! `cached_free.rs`) publishes each table's full blocks under a chained scoped key and keeps
//! released published pages cached-free in the pool; for a recurrent model it also keeps state
//! checkpoints (pages of the pool too), the only points a hit through the state can resume from.
//!
//! **Invariant:** every page is in exactly one place — the free list, the fence queue, or block
//! tables as many times as its reference count — counting each live sequence's `state_pages`
//! state pages (reference 1, in no table) and the checkpoint pages it holds until the next step
//! begins with them; no page is free while a step in flight at
//! its release runs; each table holds exactly the logical blocks its kind keeps; `HybridKv`'s
//! accounting is conserved, in slots of `page_bytes ÷ page_slots`.

mod cached;
mod cached_free;
mod check;
mod check_incremental;
mod error;
mod fit;
mod kv;
mod kv_check;
mod kv_prefix;
mod layout;
mod manager;
mod pool;
mod prefix;
mod table;

pub use error::HybridError;
pub use fit::{compare_fit, vllm_layers_per_table, FitComparison};
pub use kv::{EvictProtected, HybridKv};

/// Blocks between a recurrent model's state checkpoints when a scenario does not say
/// (`cache.checkpoint_every_blocks`). A checkpoint costs a whole state (Qwen3-Next: 37.7 MiB,
/// about 100 blocks of its KV), so a checkpoint every block fills the pool with states and
/// evicts the KV they belong to. 64 blocks (1,024 tokens at 16 a block) had the best hit rate
/// of the intervals measured on conversation traffic and the same as 32 on shared 1,024-token
/// prompts with a quarter of the pool (docs/layer-groups.md has the table).
pub const DEFAULT_CHECKPOINT_EVERY_BLOCKS: u32 = 64;
pub use layout::{HybridLayout, LayoutError, TableKind, TableSpec};
pub use manager::{HybridCache, HybridFault, PageCopy};
pub use pool::PageId;
pub use prefix::{block_step, prefix_hit_tokens};
pub use table::GroupTable;
