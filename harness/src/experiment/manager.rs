//! Which cache managers a run builds (`cache.manager`, resolved by the scenario against the
//! model and what the backend can do with them) and the accounting unit that follows from it:
//! one slot is `kv_bytes_per_token` for the summed pair, [`HybridLayout::slot_bytes`] (a page's
//! bytes ÷ the block size) for the grouped pair, whose two modes are built from one layout so
//! that they share their tables, their page size and their unit. [`spec`] is what
//! `cache::build` is handed for each mode.

use kvbench_cache_api::CacheMode;

use super::tiers::TierPlan;
use super::{ExperimentError, Setup};
use crate::backend::BackendKind;
use crate::cache::hybrid::{EvictProtected, HybridLayout};
use crate::cache::{CacheSpec, HybridSpec};
use crate::model::ModelShape;
use crate::scenario::{CacheManager, HybridSupport, ManagerChoice, Scenario};

/// The managers of a run and what sizes them.
#[derive(Debug, Clone)]
pub struct ManagerSetup {
    pub manager: CacheManager,
    /// Bytes one accounting slot stands for.
    pub slot_bytes: u64,
    /// Slots the managers account over: the larger of the two modes' (the same unless a
    /// contiguous baseline reserves recurrent states).
    pub total_slots: u64,
    /// The grouped layout of a hybrid run.
    pub layout: Option<HybridLayout>,
}

/// What `kind` can do with the grouped managers. Every kind is named, so a new backend decides.
/// `Auto` is resolved before a run is set up; unresolved, it is treated as a backend that maps
/// one block table a sequence.
fn hybrid_support(kind: BackendKind) -> HybridSupport {
    match kind {
        BackendKind::Sim => HybridSupport::Preferred,
        BackendKind::Cpu => HybridSupport::Explicit,
        BackendKind::Cuda | BackendKind::CudaEmu | BackendKind::Auto => HybridSupport::Unsupported,
    }
}

/// Resolve `scenario`'s `cache.manager` on `kind` and size it over `kv_budget_bytes` (fixed FP8
/// scale bytes already taken off). A hybrid run's recurrent states are reserved for
/// `scheduler.max_seqs_per_step` sequences by the contiguous baseline only; the paged manager
/// takes them from its pool as sequences start. An explicit `hybrid` the backend or the model cannot run is
/// refused here, before any work, naming the key where the scenario wrote it.
pub fn resolve(
    scenario: &Scenario,
    model: &ModelShape,
    kind: BackendKind,
    kv_budget_bytes: u64,
) -> Result<ManagerSetup, ExperimentError> {
    let refuse = |message: String| {
        let d =
            crate::scenario::locate_in_source(scenario.source.as_deref(), "cache.manager", message);
        ExperimentError::Scenario(d.to_string())
    };
    let support = hybrid_support(kind);
    let manager = scenario.cache_manager(model, support);
    if manager == CacheManager::Summed && scenario.cache.evict_protected != EvictProtected::Always {
        let d = crate::scenario::locate_in_source(
            scenario.source.as_deref(),
            "cache.evict_protected",
            format!(
                "\"{}\" applies to the hybrid manager's protected blocks, and this run uses \
                 the summed managers on {} (as cache.manager, the model or a lower tier \
                 decided); remove the key, or run cache.manager = \"hybrid\" on sim or cpu",
                scenario.cache.evict_protected.name(),
                kind.name()
            ),
        );
        return Err(ExperimentError::Scenario(d.to_string()));
    }
    if let Some(k) = scenario.cache.checkpoint_every_blocks {
        // A key that would change nothing is refused, so a run never looks as if it measured
        // an interval it did not keep.
        let recurrent = model
            .checked_state_bytes_per_sequence()
            .is_some_and(|b| b > 0);
        let why = if manager == CacheManager::Summed {
            Some(format!(
                "state checkpoints are the hybrid manager's, and this run uses the summed managers \
                 on {} (as cache.manager, the model or a lower tier decided)",
                kind.name()
            ))
        } else if !recurrent {
            Some(format!(
                "model {} has no recurrent layer group: there is no state to checkpoint",
                model.name
            ))
        } else if !scenario.scheduler.prefix_cache {
            Some("checkpoints serve prefix hits, and scheduler.prefix_cache is off".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            let d = crate::scenario::locate_in_source(
                scenario.source.as_deref(),
                "cache.checkpoint_every_blocks",
                format!("{k}: {why}; remove the key"),
            );
            return Err(ExperimentError::Scenario(d.to_string()));
        }
    }
    if manager == CacheManager::Summed {
        let slot_bytes = model.kv_bytes_per_token();
        return Ok(ManagerSetup {
            manager,
            slot_bytes,
            total_slots: kv_budget_bytes / slot_bytes.max(1),
            layout: None,
        });
    }
    if support == HybridSupport::Unsupported {
        return Err(refuse(format!(
            "\"hybrid\" runs on the sim and cpu backends only; the {} backend's address \
             translation maps one block table a sequence, not one per layout table (use \
             --backend sim or cpu, or cache.manager = \"summed\")",
            kind.name()
        )));
    }
    let layout = HybridLayout::new(
        model,
        scenario.block_size(),
        kv_budget_bytes,
        scenario.scheduler.max_seqs_per_step,
    )
    .map_err(|e| {
        let how = if scenario.cache.manager == ManagerChoice::Hybrid {
            "use cache.manager = \"summed\""
        } else {
            "set cache.manager = \"summed\""
        };
        refuse(format!(
            "the hybrid layout of model {}: {e} ({how})",
            model.name
        ))
    })?;
    // The paged manager's pool is the whole budget in pages (states taken from it); the
    // contiguous baseline's is the budget less its reserved states, plus those states' slots.
    // The run's slots are the larger, so the backend's per-slot sizes bound both.
    let pool = layout.paged_pool();
    let paged_slots = u64::from(pool.pages)
        .checked_mul(u64::from(pool.page_slots))
        .ok_or_else(|| refuse("the grouped pool's slots overflow".into()))?;
    let contiguous = layout.grouped_pool();
    let reserved_state_slots = u64::from(contiguous.state.reserved_sequences().unwrap_or(0))
        .checked_mul(contiguous.state.slots_per_sequence())
        .ok_or_else(|| refuse("reserved recurrent state slots overflow".into()))?;
    let contiguous_slots = u64::from(contiguous.pages)
        .checked_mul(u64::from(contiguous.page_slots))
        .and_then(|s| s.checked_add(reserved_state_slots))
        .ok_or_else(|| refuse("the grouped pool's slots overflow".into()))?;
    let total_slots = paged_slots.max(contiguous_slots);
    Ok(ManagerSetup {
        manager,
        slot_bytes: pool.slot_bytes,
        total_slots,
        layout: Some(layout),
    })
}

/// The spec of `mode`'s manager in a run of `scenario` set up as `setup`: the grouped pair
/// where the set-up resolved a layout, else the summed pair with `tiers` (the contiguous
/// baseline ignores them). `async_steps` is how the engine will run, which a planted early reuse
/// turns on where the scenario did not: the grouped baseline's rings hold what the steps in
/// flight can write ([`ring_tokens`]).
pub fn spec(
    scenario: &Scenario,
    setup: &Setup,
    mode: CacheMode,
    tiers: &TierPlan,
    async_steps: bool,
) -> CacheSpec {
    let spec = CacheSpec::new(
        mode,
        setup.total_slots,
        scenario.block_size(),
        scenario.scheduler.prefix_cache,
    )
    .with_placement(scenario.cache.placement)
    .with_eviction(scenario.cache.eviction)
    .with_tiers(tiers.config());
    match &setup.layout {
        Some(layout) => spec.with_hybrid(HybridSpec {
            layout: layout.clone(),
            ring_tokens: ring_tokens(setup.max_step_tokens, async_steps),
            evict_protected: scenario.cache.evict_protected,
            // Checkpoints serve prefix hits only: none without the prefix cache.
            checkpoint_every_blocks: match scenario.scheduler.prefix_cache {
                true => scenario
                    .cache
                    .checkpoint_every_blocks
                    .unwrap_or(crate::cache::hybrid::DEFAULT_CHECKPOINT_EVERY_BLOCKS),
                false => 0,
            },
        }),
        None => spec,
    }
}

/// What the grouped baseline's sliding rings hold beyond their window: what one sequence can
/// write while a step reading the window has not retired, the largest step, twice when the
/// engine plans a step while another runs (`async_steps`).
pub fn ring_tokens(max_step_tokens: u32, async_steps: bool) -> u32 {
    let in_flight: u32 = if async_steps { 2 } else { 1 };
    max_step_tokens.saturating_mul(in_flight)
}
