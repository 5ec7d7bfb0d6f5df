//! The contiguous baseline's regions by stream id, answering `layout`: the shadow payload asks
//! for every scheduled stream's layout at every step, and a walk of the `seqs` B-tree for each
//! is a hot path it does not need. Engine ids are dense, so a vector indexed by id answers with
//! one load; ids from [`DENSE_IDS`] on are not kept here and the B-tree answers them. `check.rs`
//! compares this copy with the regions.

use kvbench_cache_api::SeqId;

/// Ids below this are kept (at most 64 MiB of entries).
pub(crate) const DENSE_IDS: u64 = 1 << 22;

/// Where a live region lies: what `layout` hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub base_slot: u64,
    pub capacity_tokens: u32,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    base_slot: u64,
    capacity_tokens: u32,
    live: bool,
}

const VACANT: Entry = Entry {
    base_slot: 0,
    capacity_tokens: 0,
    live: false,
};

/// Live regions of ids below [`DENSE_IDS`], by id.
#[derive(Debug, Default)]
pub(crate) struct ById {
    dense: Vec<Entry>,
    live: usize,
}

impl ById {
    /// Whether `seq` is kept here (otherwise only the B-tree knows it).
    #[inline(always)]
    pub fn covers(seq: SeqId) -> bool {
        seq < DENSE_IDS
    }

    /// The region of `seq`, for an id this index covers.
    #[inline]
    pub fn get(&self, seq: SeqId) -> Option<Placed> {
        let e = self.dense.get(usize::try_from(seq).ok()?)?;
        e.live.then_some(Placed {
            base_slot: e.base_slot,
            capacity_tokens: e.capacity_tokens,
        })
    }

    /// `seq` now lives at `p` (ignored for ids this index does not cover).
    pub fn insert(&mut self, seq: SeqId, p: Placed) {
        if !Self::covers(seq) {
            return;
        }
        let i = seq as usize;
        if self.dense.len() <= i {
            self.dense.resize(i + 1, VACANT);
        }
        if !self.dense[i].live {
            self.live += 1;
        }
        self.dense[i] = Entry {
            base_slot: p.base_slot,
            capacity_tokens: p.capacity_tokens,
            live: true,
        };
    }

    /// `seq` has no region any more.
    pub fn remove(&mut self, seq: SeqId) {
        let Some(e) = usize::try_from(seq)
            .ok()
            .and_then(|i| self.dense.get_mut(i))
        else {
            return;
        };
        if e.live {
            self.live -= 1;
        }
        *e = VACANT;
    }

    /// Live entries, which `check.rs` compares with the regions of covered ids.
    pub fn live(&self) -> usize {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_answer_removes_forget_and_far_ids_are_left_to_the_map() {
        let mut ix = ById::default();
        let p = Placed {
            base_slot: 40,
            capacity_tokens: 7,
        };
        assert_eq!(ix.get(3), None);
        ix.insert(3, p);
        assert_eq!((ix.get(3), ix.get(2), ix.live()), (Some(p), None, 1));
        let q = Placed {
            base_slot: 0,
            capacity_tokens: 0,
        };
        ix.insert(0, q);
        assert_eq!(
            (ix.get(0), ix.live()),
            (Some(q), 2),
            "an empty region at slot 0 is live"
        );
        ix.insert(3, q);
        assert_eq!(
            (ix.get(3), ix.live()),
            (Some(q), 2),
            "moved, not counted twice"
        );
        ix.remove(3);
        ix.remove(3);
        ix.remove(1 << 20);
        assert_eq!((ix.get(3), ix.live()), (None, 1));
        assert!(ById::covers(DENSE_IDS - 1) && !ById::covers(DENSE_IDS));
        ix.insert(DENSE_IDS, p);
        assert_eq!((ix.get(DENSE_IDS), ix.live()), (None, 1), "left to the map");
        ix.remove(u64::MAX);
    }
}
