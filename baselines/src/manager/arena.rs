//! Free extents of one slot arena: first-fit placement, coalescing on free.

use std::collections::BTreeMap;

/// Free extents keyed by start slot. Invariant: non-empty, non-overlapping, and never adjacent
/// (adjacent extents are always merged).
#[derive(Debug, Clone)]
pub(crate) struct Arena {
    total_slots: u64,
    free: BTreeMap<u64, u64>,
    free_slots: u64,
}

impl Arena {
    pub fn new(total_slots: u64) -> Self {
        let mut free = BTreeMap::new();
        if total_slots > 0 {
            free.insert(0, total_slots);
        }
        Arena {
            total_slots,
            free,
            free_slots: total_slots,
        }
    }

    pub fn total_slots(&self) -> u64 {
        self.total_slots
    }

    pub fn free_slots(&self) -> u64 {
        self.free_slots
    }

    /// Lowest-addressed extent of at least `len` slots.
    pub fn find_first_fit(&self, len: u64) -> Option<u64> {
        self.free.iter().find(|(_, &l)| l >= len).map(|(&s, _)| s)
    }

    pub fn largest_extent(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// Take `len` slots at the start of the first extent that fits.
    pub fn allocate(&mut self, len: u64) -> Option<u64> {
        let start = self.find_first_fit(len)?;
        let extent = self.free.remove(&start)?;
        if extent > len {
            self.free.insert(start + len, extent - len);
        }
        self.free_slots -= len;
        Some(start)
    }

    /// Return `[start, start + len)`, merging with neighbours. The range must be allocated.
    pub fn free(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut s, mut l) = (start, len);
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "double free of slot {start}");
            if ps + pl == start {
                self.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            l += nl;
        }
        self.free.insert(s, l);
        self.free_slots += len;
    }

    /// Extents in address order.
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&s, &l)| (s, l))
    }
}

/// A checker's problems as its result: the first 20, joined, or `Ok` when there are none.
pub(crate) fn verdict(mut problems: Vec<String>) -> Result<(), String> {
    problems.truncate(20);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// What holds a range of the arena, named in the tiling check's messages only (a label
/// formatted for every range at every check was most of a check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    Seq(u64),
    /// Released while this step was in flight.
    Pending(u64),
    Free,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Seq(id) => write!(f, "seq {id}"),
            Holder::Pending(step) => write!(f, "pending on step {step}"),
            Holder::Free => f.write_str("free"),
        }
    }
}

/// The arena's tiling invariant, shared by both contiguous managers: the held `ranges` (start,
/// length, what holds it), the pending ones and the free extents cover `0..total_slots` exactly
/// once, no two free extents meet unmerged, and `accounting` is conserved. `unit` names the arena's unit in messages
/// ("slot", "page"); problems are appended to `problems`.
pub(crate) fn check_tiling(
    arena: &Arena,
    mut ranges: Vec<(u64, u64, Holder)>,
    unit: &str,
    accounting: kvbench_cache_api::Accounting,
    problems: &mut Vec<String>,
) {
    let mut free = 0;
    for (s, l) in arena.extents() {
        free += l;
        ranges.push((s, l, Holder::Free));
    }
    if free != arena.free_slots() {
        problems.push(format!(
            "free extents sum to {free} {unit}s, counter says {}",
            arena.free_slots()
        ));
    }
    ranges.retain(|r| r.1 > 0);
    ranges.sort_by_key(|r| r.0);
    let mut cursor = 0u64;
    let mut prev_free = false;
    for (s, l, what) in &ranges {
        if *s < cursor {
            problems.push(format!(
                "{what} at {unit} {s} overlaps the range ending at {cursor}"
            ));
        } else if *s > cursor {
            problems.push(format!("{unit}s {cursor}..{s} belong to nothing"));
        }
        let is_free = *what == Holder::Free;
        if is_free && prev_free && *s == cursor {
            problems.push(format!(
                "free extents meet at {unit} {s} without being merged"
            ));
        }
        prev_free = is_free;
        cursor = cursor.max(s + l);
    }
    if cursor != arena.total_slots() {
        problems.push(format!(
            "ranges end at {unit} {cursor}, the arena has {} {unit}s",
            arena.total_slots()
        ));
    }
    if !accounting.is_conserved() {
        problems.push(format!("accounting not conserved: {accounting:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_and_coalescing() {
        let mut a = Arena::new(100);
        assert_eq!(a.allocate(10), Some(0));
        assert_eq!(a.allocate(20), Some(10));
        assert_eq!(a.allocate(30), Some(30));
        a.free(10, 20);
        assert_eq!(a.largest_extent(), 40);
        assert_eq!(
            a.allocate(15),
            Some(10),
            "first fit takes the hole, not the tail"
        );
        a.free(0, 10);
        a.free(10, 15);
        a.free(30, 30);
        assert_eq!(a.extents().collect::<Vec<_>>(), vec![(0, 100)]);
        assert_eq!(a.free_slots(), 100);
    }
}
