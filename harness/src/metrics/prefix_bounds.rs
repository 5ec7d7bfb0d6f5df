//! What a run's prefix hit share is read against: the infinite-cache ceiling and the offline
//! optimum (Belady) at the cache's capacity in blocks — the device's, plus every lower tier's
//! slots where the scenario has tiers (a hit in any tier saves the prefill) — from one pass over the request
//! list (`workload::trace::{access_string, eviction_bounds}`: the same block keys, scopes and
//! hit rule as the paged manager, touching no cache manager). The achieved share beside them is
//! each request's prefix hit at its first admission (`requests.csv`'s `cached_prompt_tokens` of
//! the rows without a parent) over the same looked-up prompt tokens; the gap to the optimum is
//! policy (and the room running sequences hold), the gap from the optimum to the ceiling is
//! capacity.
//!
//! Where the list does not say what a run looks up, no bound is given and the reason is: a
//! multi-turn session's later turn is built during the run from the outputs the run produced, so
//! its prompt is not in the list. Nor on the hybrid manager: its pool holds a page a table, and
//! a sliding table lets a cached block's pages go one by one, so one cache of whole blocks is
//! not its model (its slots counted as blocks made a ceiling of pages, not of prefixes). A list
//! that reads more than [`MAX_BLOCK_READS`] content blocks is left to `kvbench trace stats`
//! rather than held beside the run.

use serde::Serialize;

use crate::scenario::{CacheManager, PrefixScope, Scenario};
use crate::workload::trace::evict::PolicyKind;
use crate::workload::trace::{access_string, eviction_bounds};
use crate::workload::Workload;

/// Block reads the pass replays at most: each costs a key (4 bytes) and a next use (8 bytes),
/// so about 400 MB at this bound.
pub const MAX_BLOCK_READS: u64 = 1 << 25;

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

/// What a hybrid run's prefix hit share is read against: the infinite-cache ceiling alone. It
/// bounds any manager (no cache hits more than one that never evicts), but the offline optimum
/// at a capacity does not bound the hybrid manager, whose sliding tables keep a cached prefix
/// in fewer pages than whole blocks, so it is not given.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefixCeiling {
    /// Blocks of the scenario's block size: a hybrid hit is whole blocks of every table, at
    /// least this long, so the ceiling at this size is at least the hybrid's.
    pub block_tokens: u32,
    /// Prompt tokens of the requests a run looks up (those that fit `max_seq_len`).
    pub lookup_tokens: u64,
    pub ceiling_hit_tokens: u64,
    pub ceiling_hit_rate: f64,
}

/// The ceiling of a hybrid run's request list, or why the list cannot give it (the reasons
/// [`compute`] gives for any manager).
pub fn ceiling(scenario: &Scenario, workload: &Workload) -> Result<PrefixCeiling, String> {
    let s = replayable(scenario, workload)?;
    let b = eviction_bounds(&s, &[1])
        .pop()
        .ok_or_else(|| "no capacity to replay".to_string())?;
    Ok(PrefixCeiling {
        block_tokens: b.block_tokens,
        lookup_tokens: b.lookup_tokens,
        ceiling_hit_tokens: b.ceiling.hit_tokens,
        ceiling_hit_rate: b.ceiling.hit_rate,
    })
}

/// The request list as the bounds pass replays it, or why it cannot be.
fn replayable(
    scenario: &Scenario,
    workload: &Workload,
) -> Result<crate::workload::trace::AccessString, String> {
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
    // Counted from the descriptors (no prompt is made): the string must fit in memory beside
    // the run.
    let reads: u64 = workload
        .requests
        .iter()
        .map(|r| u64::from(r.prompt.content_tokens().min(r.prompt.len_tokens()) / block_tokens))
        .sum();
    if reads > MAX_BLOCK_READS {
        return Err(format!(
            "the request list reads {reads} content blocks, more than the {MAX_BLOCK_READS} the \
             bounds pass holds in memory beside a run; `kvbench trace stats --capacity` computes \
             them on their own"
        ));
    }
    Ok(access_string(
        &workload.requests,
        block_tokens,
        scenario.cache.max_seq_len,
        scope == PrefixScope::Tenant,
    ))
}

/// The bounds, or why the request list cannot give them.
pub fn compute(
    scenario: &Scenario,
    workload: &Workload,
    manager: CacheManager,
    total_slots: u64,
    tier_blocks: u64,
) -> Result<PrefixBounds, String> {
    let s = replayable(scenario, workload)?;
    if manager == CacheManager::Hybrid {
        return Err(
            "the hybrid manager caches a page a table, and a sliding table lets a cached \
             block's pages go one by one: one cache of whole blocks does not bound it (run with \
             cache.manager = \"summed\" for the bounds; `ceiling` is the infinite cache's)"
                .into(),
        );
    }
    let block_tokens = s.block_tokens;
    // With lower tiers a hit in any tier saves the prefill: the bounds are those of one cache
    // as large as every tier together (the tiers are inclusive, so this is an upper bound).
    let capacity_blocks = (total_slots / u64::from(block_tokens)).saturating_add(tier_blocks);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Head, Prompt, Recipe, Request};

    fn scenario(overrides: &[&str]) -> Scenario {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-mixed.toml"),
        )
        .expect("scenario");
        let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        crate::scenario::parse_str(&text, None, &o).expect("valid")
    }

    fn list(requests: Vec<Request>) -> Workload {
        Workload {
            requests,
            closed_loop: None,
            workload_hash: String::new(),
            trace: None,
        }
    }

    /// A Mooncake row of `ids.len()` hash ids of `per_id` tokens each, all of it content.
    fn row(id: u64, per_id: u32, ids: usize) -> Request {
        Request {
            id,
            tenant: 0,
            arrival_ms: id as f64,
            prompt: Prompt::Recipe(Recipe {
                seed: 1,
                key: id,
                len_tokens: per_id * ids as u32,
                vocab: 1000,
                head: Head::HashIds {
                    block_tokens: per_id,
                    ids: (0..ids as u64).collect::<Vec<_>>().into_boxed_slice(),
                },
            }),
            prefix_group: None,
            output_tokens: 1,
            samples: 1,
            cancel: None,
            session: None,
        }
    }

    #[test]
    fn two_rows_sharing_ids_are_bounded_at_the_pool_and_without_reuse_say_why() {
        let s = scenario(&[]);
        let bs = u64::from(s.block_size());
        // Two identical 4-id rows of 16-token ids: the second hits all but its last block.
        let w = list(vec![row(0, 16, 4), row(1, 16, 4)]);
        let b = compute(&s, &w, CacheManager::Summed, 64 * bs, 0).expect("bounds");
        assert_eq!(b.capacity_blocks, 64);
        assert_eq!(b.lookup_tokens, 128);
        assert_eq!(b.ceiling_hit_tokens, 3 * bs);
        assert_eq!(b.optimum_hit_tokens, 3 * bs);
        // One block of room: the optimum keeps the first block, and so hits one.
        let tight = compute(&s, &w, CacheManager::Summed, bs, 0).expect("bounds");
        assert_eq!(tight.optimum_hit_tokens, bs);
        assert!(tight.optimum_hit_rate < tight.ceiling_hit_rate);
        // A lower tier's blocks count as room: one device block and two host slots bound like
        // three device blocks.
        let tiered = compute(&s, &w, CacheManager::Summed, bs, 2).expect("bounds");
        assert_eq!(tiered.capacity_blocks, 3);
        assert_eq!(tiered.optimum_hit_tokens, 3 * bs);
        let why = compute(&s, &w, CacheManager::Hybrid, 64 * bs, 0).expect_err("hybrid");
        assert!(why.contains("hybrid") && why.contains("summed"), "{why}");
        let off = scenario(&["scheduler.prefix_cache=false"]);
        assert!(compute(&off, &w, CacheManager::Summed, 64 * bs, 0).is_err());
    }

    #[test]
    fn a_list_too_long_to_replay_beside_the_run_is_refused_by_count_alone() {
        let s = scenario(&[]);
        let bs = s.block_size();
        // Just over half the bound a row, in 4096-token ids (never made: the count is from the
        // descriptors).
        let ids = (MAX_BLOCK_READS / 2 * u64::from(bs) / 4096) as usize + 1;
        let w = list(vec![row(0, 4096, ids), row(1, 4096, ids)]);
        let why = compute(&s, &w, CacheManager::Summed, 1024, 0).expect_err("too long");
        assert!(why.contains("trace stats"), "{why}");
    }
}
