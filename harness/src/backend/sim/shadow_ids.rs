//! Stream id → index in the shadow payload's stream table. Engine ids are dense stream indices,
//! so a plain vector answers them with one load (this lookup runs for every scheduled stream of
//! every step); ids beyond that fall back to a map.

use std::collections::HashMap;

use kvbench_cache_api::SeqId;

/// Ids below this are looked up in the dense vector (at most 64 MiB of it).
const DENSE_IDS: u64 = 1 << 24;
const NONE: u32 = u32::MAX;

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

#[cfg(test)]
mod tests {
    use super::*;

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
