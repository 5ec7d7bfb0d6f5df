//! Whether the grouped pool of a hybrid run (`cache.manager` resolved to `hybrid`) can hold one
//! longest request.
//!
//! The budget check of every run ([`super::budget`]) counts bytes a token, which is the whole
//! story for the summed managers. The grouped pool is cut differently: it is whole pages, the
//! hybrid paged manager takes a sequence's recurrent state as pages of it, the contiguous
//! baseline reserves the state of `scheduler.max_seqs_per_step` sequences off the budget first,
//! and its sliding rings hold a step's tokens beyond their window. So a budget the summed figure
//! passes can leave a contiguous reservation no room at all, and the run would stall with
//! nothing schedulable instead of being refused.

use kvbench_baselines::manager::GroupedContiguous;

use super::budget::request_need;
use super::error::Diagnostic;
use super::load::locate_in_source;
use super::types::Scenario;
use crate::cache::hybrid::HybridLayout;
use crate::model::ModelShape;
use crate::units::format_bytes;

/// Pages of the grouped pool the longest request takes in each cache mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedNeed {
    pub tokens: u32,
    pub samples: u32,
    pub paged_pages: u64,
    pub contiguous_pages: u64,
}

impl Scenario {
    /// Refuses a hybrid run whose pool (`layout`, cut from `kv_budget_bytes`) cannot hold the
    /// longest request in both cache modes, naming `memory.kv_budget` and the figures: what one
    /// request needs against what the pool holds. `ring_tokens` is what the contiguous
    /// baseline's sliding rings hold beyond their window (`experiment::manager::ring_tokens`).
    /// A request length the scenario check already refuses is left to that check.
    pub fn check_grouped_budget(
        &self,
        shape: &ModelShape,
        layout: &HybridLayout,
        kv_budget_bytes: u64,
        ring_tokens: u32,
    ) -> Result<(), Diagnostic> {
        let Some(need) = grouped_need(self, shape, layout, ring_tokens) else {
            return Ok(());
        };
        let paged_pool = u64::from(layout.pages);
        let contiguous_pool = u64::from(layout.contiguous_pages);
        let states = layout.state_sequences;
        let states_short = states.is_some_and(|n| need.samples > n);
        if need.paged_pages <= paged_pool
            && need.contiguous_pages <= contiguous_pool
            && !states_short
        {
            return Ok(());
        }
        let page = layout.page_bytes;
        let state_part = match states {
            Some(n) => {
                let state_bytes = layout.state_bytes_per_sequence.saturating_mul(u64::from(n));
                format!(
                    "; the contiguous baseline reserves the recurrent state of {n} sequences \
                     (scheduler.max_seqs_per_step, {} each), {state_bytes} bytes ({}), leaving it \
                     {contiguous_pool} pages",
                    format_bytes(layout.state_bytes_per_sequence),
                    format_bytes(state_bytes)
                )
            }
            None => String::new(),
        };
        let message = format!(
            "{kv_budget_bytes} bytes ({}) cannot hold one request in the hybrid managers' pool: \
             {paged_pool} pages of {} ({}){state_part}; the longest ({} tokens x {} \
             continuation(s)) needs {} pages ({}) paged and {} pages ({}) contiguous{}",
            format_bytes(kv_budget_bytes),
            format_bytes(page),
            format_bytes(paged_pool.saturating_mul(page)),
            need.tokens,
            need.samples,
            need.paged_pages,
            format_bytes(need.paged_pages.saturating_mul(page)),
            need.contiguous_pages,
            format_bytes(need.contiguous_pages.saturating_mul(page)),
            if states_short {
                " and one reserved state per continuation"
            } else {
                ""
            }
        );
        Err(locate_in_source(
            self.source.as_deref(),
            "memory.kv_budget",
            message,
        ))
    }
}

/// What the longest request of `s` takes of `layout`'s pages; `None` where its length is
/// invalid (the scenario check says why) or a figure overflows (no pool holds it: all pages).
fn grouped_need(
    s: &Scenario,
    shape: &ModelShape,
    layout: &HybridLayout,
    ring_tokens: u32,
) -> Option<GroupedNeed> {
    let need = request_need(s, shape).ok()?;
    let samples = u64::from(need.samples);
    let contiguous = GroupedContiguous::new(layout.grouped_pool(), ring_tokens)
        .table_pages(need.reserve_tokens)
        .map_or(u64::MAX, |t| t.iter().map(|&p| u64::from(p)).sum());
    // The paged manager takes a sequence's recurrent state as pages of the same pool.
    let paged = layout
        .pages_per_sequence(u64::from(need.tokens))
        .and_then(|p| p.checked_add(u64::from(layout.state_pages_per_sequence)))
        .unwrap_or(u64::MAX);
    Some(GroupedNeed {
        tokens: need.tokens,
        samples: need.samples,
        paged_pages: paged.saturating_mul(samples),
        contiguous_pages: contiguous.saturating_mul(samples),
    })
}
