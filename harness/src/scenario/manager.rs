//! `cache.manager`: which pair of cache managers a run uses. `summed` is the pair every run had
//! before layer groups (one slot a token, every layer's bytes summed); `hybrid` is the grouped
//! pair (a block table per layout table over one page pool, and the contiguous baseline that
//! reserves a sliding table's window, not `max_seq_len`); `auto` picks `hybrid` wherever it
//! changes what a sequence holds and nothing it lacks is asked for.
//!
//! The hybrid manager has a prefix cache of its own (a hit only where every table holds the
//! prefix: a sliding table the blocks of its window, a recurrent model none), but no lower
//! tiers, so an explicit `hybrid` with a lower tier is refused here, before any work. What needs
//! the backend (cuda maps one block table a sequence; `sim` and `cpu` address each table) is
//! refused by the run's set-up, which knows it.

use serde::{Deserialize, Serialize};

use super::error::KeyProblem;
use super::types::Scenario;
use crate::model::{LayerGroup, ModelShape};

/// The scenario's choice (`cache.manager`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ManagerChoice {
    /// `hybrid` where the model's layers keep tokens differently, on `sim`, without a lower
    /// tier; `summed` otherwise.
    #[default]
    Auto,
    Hybrid,
    Summed,
}

/// The managers a run really uses, once the choice met the model and the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheManager {
    /// Paged and contiguous managers over one slot a token of every layer's summed bytes.
    Summed,
    /// `HybridKv` (paged) and `GroupedContiguous` over one grouped page pool.
    Hybrid,
}

impl CacheManager {
    /// The word the summary and the report header use.
    pub fn name(self) -> &'static str {
        match self {
            CacheManager::Summed => "summed",
            CacheManager::Hybrid => "hybrid",
        }
    }
}

/// What a backend can do with the grouped managers, which is all `cache.manager` needs to know
/// of it (the scenario does not name backends; the run's set-up maps its backend to this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HybridSupport {
    /// Its address translation maps one block table a sequence (`cuda`): summed only.
    Unsupported,
    /// It addresses each layout table and runs `hybrid` where the scenario writes it (`cpu`);
    /// `auto` stays `summed`.
    Explicit,
    /// It addresses each layout table, and `auto` picks `hybrid` on it (`sim`).
    Preferred,
}

pub(super) fn is_auto(c: &ManagerChoice) -> bool {
    *c == ManagerChoice::Auto
}

/// Whether the grouped managers hold a sequence of `shape` differently from summed slots: a
/// sliding or recurrent group, or paged groups of differing per-token bytes (a page then holds
/// more tokens of the thinner group).
pub fn layers_keep_tokens_differently(shape: &ModelShape) -> bool {
    let groups = shape.groups();
    if groups
        .iter()
        .any(|g| matches!(g, LayerGroup::Sliding { .. } | LayerGroup::Recurrent { .. }))
    {
        return true;
    }
    let mut per_layer = groups
        .iter()
        .filter_map(|g| g.bytes_per_token_per_layer(shape.tp, shape.kv_dtype))
        .filter(|&b| b > 0);
    let first = per_layer.next();
    per_layer.any(|b| Some(b) != first)
}

impl Scenario {
    /// The managers `auto` resolves to on a backend that does `backend` with the grouped
    /// managers; `hybrid` and `summed` as written (an explicit `hybrid` the backend cannot run
    /// is refused by the run's set-up, which names the backend).
    pub fn cache_manager(&self, shape: &ModelShape, backend: HybridSupport) -> CacheManager {
        match self.cache.manager {
            ManagerChoice::Summed => CacheManager::Summed,
            ManagerChoice::Hybrid => CacheManager::Hybrid,
            ManagerChoice::Auto => {
                let tiered = self.cache.host_tier.is_some() || self.cache.disk_tier.is_some();
                // On cpu a recurrent model's prefix hits need the hybrid manager's state
                // checkpoints; without the prefix cache the summed pair stays.
                let recurrent_hits = backend == HybridSupport::Explicit
                    && self.scheduler.prefix_cache
                    && shape
                        .groups()
                        .iter()
                        .any(|g| matches!(g, LayerGroup::Recurrent { .. }));
                if (backend == HybridSupport::Preferred || recurrent_hits)
                    && !tiered
                    && layers_keep_tokens_differently(shape)
                {
                    CacheManager::Hybrid
                } else {
                    CacheManager::Summed
                }
            }
        }
    }

    /// An explicit `hybrid` asks for nothing the grouped managers lack.
    pub(super) fn check_manager(&self, p: &mut Vec<KeyProblem>) {
        if self.cache.manager != ManagerChoice::Hybrid {
            return;
        }
        for (tier, written) in [
            ("cache.host_tier", self.cache.host_tier.is_some()),
            ("cache.disk_tier", self.cache.disk_tier.is_some()),
        ] {
            if written {
                p.push(KeyProblem::new(
                    "cache.manager",
                    format!(
                        "\"hybrid\" has no lower tiers; remove [{tier}], or use \
                         cache.manager = \"summed\""
                    ),
                ));
            }
        }
    }
}
