//! Invariants of the contiguous cache, recomputed from the regions and extents themselves: live
//! regions, pending regions and free extents tile the arena exactly, and the by-id index
//! (`by_id.rs`) holds exactly the live regions of dense ids, at their base and capacity.

use kvbench_cache_api::{KvCacheManager, SeqLayout};

use super::arena::Holder;
use super::by_id::ById;
use super::ContiguousCache;

pub(crate) fn check(c: &ContiguousCache) -> Result<(), String> {
    let mut problems: Vec<String> = c.violations.clone();
    // Every slot range: live regions, pending regions, free extents. Sorted, they must tile the
    // arena exactly (conservation, no overlap).
    let mut ranges: Vec<(u64, u64, Holder)> = Vec::new();
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
        ranges.push((r.base_slot, u64::from(r.capacity_tokens), Holder::Seq(id)));
    }
    let covered = c.seqs.keys().filter(|&&id| ById::covers(id)).count();
    if c.by_id.live() != covered {
        problems.push(format!(
            "the layout index holds {} regions, but {covered} sequences are live",
            c.by_id.live()
        ));
    }
    for (step, &(s, l)) in c.fence.pending() {
        ranges.push((s, l, Holder::Pending(step)));
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

#[cfg(test)]
mod tests {
    use kvbench_cache_api::{KvCacheManager, ReleaseReason, SeqLayout, StartRequest};

    use super::super::by_id::Placed;
    use super::super::ContiguousCache;

    fn started(ids: &[u64]) -> ContiguousCache {
        let mut c = ContiguousCache::new(256);
        for &seq in ids {
            c.start(&StartRequest {
                seq,
                tokens: &[1, 2, 3],
                scope: None,
                reserve_tokens: 10,
            })
            .expect("fits");
        }
        c
    }

    #[test]
    fn layouts_come_from_the_id_index_and_it_follows_starts_forks_and_releases() {
        let mut c = started(&[0, 5]);
        c.fill(5, 3).expect("filled");
        c.fork(5, 9).expect("forked");
        c.release(0, ReleaseReason::Finish).expect("released");
        assert_eq!(c.by_id.live(), 2);
        for seq in [5, 9] {
            let r = c.seqs[&seq];
            assert_eq!(
                c.layout(seq),
                Some(SeqLayout::Contiguous {
                    base_slot: r.base_slot,
                    capacity_tokens: r.capacity_tokens,
                })
            );
        }
        assert_eq!(c.layout(0), None);
        assert!(super::check(&c).is_ok());
    }

    #[test]
    fn an_index_that_disagrees_with_the_regions_is_named() {
        let mut c = started(&[2, 3]);
        c.by_id.insert(
            3,
            Placed {
                base_slot: 100,
                capacity_tokens: 4,
            },
        );
        let e = super::check(&c).expect_err("moved region");
        assert!(
            e.contains("seq 3: layout base 100") && e.contains("layout capacity 4"),
            "{e}"
        );
        c.by_id.remove(3);
        let e = super::check(&c).expect_err("missing entry");
        assert!(e.contains("seq 3: live, but no contiguous layout"), "{e}");
        assert!(e.contains("the layout index holds 1 regions, but 2"), "{e}");
    }
}
