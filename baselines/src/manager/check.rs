//! Invariants of the contiguous cache, recomputed from the regions and extents themselves.

use kvbench_cache_api::{KvCacheManager, SeqLayout};

use super::by_id::ById;
use super::ContiguousCache;

pub(crate) fn check(c: &ContiguousCache) -> Result<(), String> {
    let mut problems: Vec<String> = c.violations.clone();
    // Every slot range: live regions, pending regions, free extents. Sorted, they must tile the
    // arena exactly (conservation, no overlap).
    let mut ranges: Vec<(u64, u64, String)> = Vec::new();
    for (&id, r) in &c.seqs {
        if r.filled_tokens > r.len_tokens || r.len_tokens > r.capacity_tokens {
            problems.push(format!(
                "seq {id}: filled {} / len {} / capacity {}",
                r.filled_tokens, r.len_tokens, r.capacity_tokens
            ));
        }
        match c.layout(id) {
            Some(SeqLayout::Contiguous {
                base_slot,
                capacity_tokens,
            }) => {
                if base_slot != r.base_slot {
                    problems.push(format!(
                        "seq {id}: layout base {base_slot} but region base {}",
                        r.base_slot
                    ));
                }
                if capacity_tokens != r.capacity_tokens {
                    problems.push(format!(
                        "seq {id}: layout capacity {capacity_tokens} but region capacity {}",
                        r.capacity_tokens
                    ));
                }
            }
            _ => problems.push(format!("seq {id}: live, but no contiguous layout")),
        }
        ranges.push((
            r.base_slot,
            u64::from(r.capacity_tokens),
            format!("seq {id}"),
        ));
    }
    let covered = c.seqs.keys().filter(|&&id| ById::covers(id)).count();
    if c.by_id.live() != covered {
        problems.push(format!(
            "the layout index holds {} regions, but {covered} sequences are live",
            c.by_id.live()
        ));
    }
    for (step, &(s, l)) in c.fence.pending() {
        ranges.push((s, l, format!("pending on step {step}")));
    }
    super::arena::check_tiling(&c.arena, ranges, "slot", c.accounting(), &mut problems);
    super::arena::verdict(problems)
}

pub(crate) fn quiescent(c: &ContiguousCache) -> Result<(), String> {
    let mut problems = Vec::new();
    if let Err(e) = check(c) {
        problems.push(e);
    }
    if !c.seqs.is_empty() {
        problems.push(format!(
            "{} live sequences: {:?}",
            c.seqs.len(),
            c.seqs.keys().collect::<Vec<_>>()
        ));
    }
    if c.pending_slots > 0 {
        problems.push(format!("{} slots pending behind fences", c.pending_slots));
    }
    if c.fence.in_flight_len() > 0 {
        problems.push(format!(
            "steps still in flight: {:?}",
            c.fence.in_flight().collect::<Vec<_>>()
        ));
    }
    if c.arena.free_slots() != c.arena.total_slots() {
        problems.push(format!(
            "free {} != total {} slots (leaked or still reserved)",
            c.arena.free_slots(),
            c.arena.total_slots()
        ));
    }
    super::arena::verdict(problems)
}
