//! What a run's prefix hit share is read against: the infinite-cache ceiling and the offline
//! optimum (Belady) at the device's cache capacity in blocks, from one pass over the request
//! list (`workload::trace::{access_string, eviction_bounds}`: the same block keys, scopes and
//! hit rule as the paged manager, touching no cache manager). The achieved share beside them is
//! each request's prefix hit at its first admission (`requests.csv`'s `cached_prompt_tokens` of
//! the rows without a parent) over the same looked-up prompt tokens; the gap to the optimum is
//! policy (and the room running sequences hold), the gap from the optimum to the ceiling is
//! capacity.
//!
//! Where the list does not say what a run looks up, no bound is given and the reason is:
//! a multi-turn session's later turn is built during the run from the outputs the run produced,
//! so its prompt is not in the list.

use serde::Serialize;

use crate::scenario::{PrefixScope, Scenario};
use crate::workload::trace::evict::PolicyKind;
use crate::workload::trace::{access_string, eviction_bounds};
use crate::workload::Workload;

/// The bounds of one request list at one capacity, as `summary.json` states them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefixBounds {
    /// The device's cache in blocks (the paged manager's whole pool).
    pub capacity_blocks: u64,
    pub block_tokens: u32,
    /// Prompt tokens of the requests a run looks up (those that fit `max_seq_len`).
    pub lookup_tokens: u64,
    /// An infinite cache: every block ever published is still there.
    pub ceiling_hit_tokens: u64,
    pub ceiling_hit_rate: f64,
    /// The offline optimum at `capacity_blocks`: evict what is used farthest in the future.
    pub optimum_hit_tokens: u64,
    pub optimum_hit_rate: f64,
    /// The same string replayed through `lru` at `capacity_blocks` with nothing else in the
    /// cache: what the run's `lru` would reach if no running sequence held blocks.
    pub replayed_lru_hit_rate: f64,
}

/// The bounds, or why the request list cannot give them.
pub fn compute(
    scenario: &Scenario,
    workload: &Workload,
    total_slots: u64,
) -> Result<PrefixBounds, String> {
    let scope = scenario.scheduler.prefix_scope;
    if !scenario.scheduler.prefix_cache || scope == PrefixScope::None {
        return Err("no prefix cache in this scenario".into());
    }
    if workload
        .requests
        .iter()
        .any(|r| r.session.is_some_and(|t| t.turn > 0))
    {
        return Err(
            "multi-turn sessions: a later turn's prompt is built during the run from \
                    the outputs it produced, so the request list does not hold it"
                .into(),
        );
    }
    let block_tokens = scenario.block_size().max(1);
    let capacity_blocks = total_slots / u64::from(block_tokens);
    let s = access_string(
        &workload.requests,
        block_tokens,
        scenario.cache.max_seq_len,
        scope == PrefixScope::Tenant,
    );
    let b = eviction_bounds(&s, &[capacity_blocks])
        .pop()
        .ok_or_else(|| "no capacity to replay".to_string())?;
    let of = |k: PolicyKind| b.policies.iter().find(|p| p.policy == k).copied();
    let (Some(optimum), Some(lru)) = (of(PolicyKind::Belady), of(PolicyKind::Lru)) else {
        return Err("the replay did not report the offline optimum".into());
    };
    Ok(PrefixBounds {
        capacity_blocks,
        block_tokens,
        lookup_tokens: b.lookup_tokens,
        ceiling_hit_tokens: b.ceiling.hit_tokens,
        ceiling_hit_rate: b.ceiling.hit_rate,
        optimum_hit_tokens: optimum.hit_tokens,
        optimum_hit_rate: optimum.hit_rate,
        replayed_lru_hit_rate: lru.hit_rate,
    })
}
