//! The shadow payload's numbering of streams: stream id → index in its stream table
//! ([`SeqIndex`]; engine ids are dense stream indices, so a plain vector answers them with one
//! load — this lookup runs for every scheduled stream of every step — and ids beyond that fall
//! back to a map), and the writer numbers a tag carries ([`Writers`]).

use std::collections::HashMap;

use kvbench_cache_api::SeqId;

/// Ids below this are looked up in the dense vector (at most 64 MiB of it).
const DENSE_IDS: u64 = 1 << 24;
const NONE: u32 = u32::MAX;
/// A writer number no stream has: what a stream's tags carry once the numbers are spent, so
/// that they read as an unknown writer's.
pub(crate) const NO_WRITER: u32 = u32::MAX;

#[derive(Debug, Default)]
pub(crate) struct SeqIndex {
    dense: Vec<u32>,
    sparse: HashMap<SeqId, u32>,
}

impl SeqIndex {
    #[inline]
    pub fn get(&self, id: SeqId) -> Option<u32> {
        if id < DENSE_IDS {
            self.dense.get(id as usize).copied().filter(|&i| i != NONE)
        } else {
            self.sparse.get(&id).copied()
        }
    }

    pub fn insert(&mut self, id: SeqId, idx: u32) {
        if id < DENSE_IDS {
            if self.dense.len() <= id as usize {
                self.dense.resize(id as usize + 1, NONE);
            }
            self.dense[id as usize] = idx;
        } else {
            self.sparse.insert(id, idx);
        }
    }

    pub fn remove(&mut self, id: SeqId) {
        if id < DENSE_IDS {
            if let Some(x) = self.dense.get_mut(id as usize) {
                *x = NONE;
            }
        } else {
            self.sparse.remove(&id);
        }
    }
}

/// Every stream registered in the run (a fork too), by writer number: its reuse scope, which a
/// reader's check compares, and its id, which violation messages name. A tag carries the writer
/// number in place of both, so a slot is 12 bytes and not 20. Numbers are never reused: a tag
/// outlives its writer (a released block, a prefix hit, a lower tier), so the table keeps every
/// writer of the run, 12 bytes each. Numbers start at 1: 0 is the empty tag's
/// ([`Tag::EMPTY`](super::store::Tag::EMPTY) is all zeros), and [`NO_WRITER`] is
/// nobody's either (the number tags carry once the numbers are spent).
#[derive(Debug, Default)]
pub(crate) struct Writers {
    scope: Vec<u32>,
    id: Vec<SeqId>,
}

impl Writers {
    /// A new writer number for stream `id` of reuse scope `scope`, or `None` once the numbers
    /// (all of `u32` but 0 and [`NO_WRITER`]) are spent.
    pub fn add(&mut self, id: SeqId, scope: u32) -> Option<u32> {
        let n = u32::try_from(self.scope.len() + 1)
            .ok()
            .filter(|&n| n < NO_WRITER)?;
        self.scope.push(scope);
        self.id.push(id);
        Some(n)
    }

    /// The reuse scope writer `w` wrote under (`None` for the empty tag's number and
    /// [`NO_WRITER`]).
    #[inline(always)]
    pub fn scope(&self, w: u32) -> Option<u32> {
        self.scope.get((w as usize).wrapping_sub(1)).copied()
    }

    /// The stream id of writer `w`.
    pub fn id(&self, w: u32) -> Option<SeqId> {
        self.id.get((w as usize).wrapping_sub(1)).copied()
    }

    /// Bytes the table holds, counted in `allocated_bytes`.
    pub fn allocated_bytes(&self) -> u64 {
        (self.scope.len() * (std::mem::size_of::<u32>() + std::mem::size_of::<SeqId>())) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_numbers_name_their_stream_and_scope_and_the_empty_number_none() {
        let mut w = Writers::default();
        assert_eq!(w.add(7, 3), Some(1), "0 is the empty tag's number");
        assert_eq!(
            w.add(7, 9),
            Some(2),
            "the same stream registered again: a new number"
        );
        assert_eq!((w.scope(1), w.id(1)), (Some(3), Some(7)));
        assert_eq!((w.scope(2), w.id(2)), (Some(9), Some(7)));
        assert_eq!((w.scope(0), w.id(0)), (None, None), "the empty tag's");
        assert_eq!((w.scope(3), w.id(NO_WRITER)), (None, None));
        assert_eq!(w.scope(NO_WRITER), None);
        assert_eq!(w.allocated_bytes(), 24);
    }

    #[test]
    fn dense_and_sparse_ids_insert_look_up_and_remove() {
        let mut ix = SeqIndex::default();
        for (id, idx) in [(3, 0), (0, 1), (DENSE_IDS + 5, 2), (u64::MAX, 3)] {
            assert_eq!(ix.get(id), None);
            ix.insert(id, idx);
            assert_eq!(ix.get(id), Some(idx));
        }
        assert_eq!(ix.get(1), None, "a gap in the dense ids is absent");
        ix.remove(3);
        ix.remove(u64::MAX);
        ix.remove(1 << 20); // never inserted: nothing happens
        assert_eq!((ix.get(3), ix.get(u64::MAX)), (None, None));
        assert_eq!((ix.get(0), ix.get(DENSE_IDS + 5)), (Some(1), Some(2)));
    }
}
