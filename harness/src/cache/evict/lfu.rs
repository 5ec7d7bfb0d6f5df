//! Fewest prefix hits goes first; among equal counts, the least recently made evictable. A hit
//! takes a block out of the set and its next release brings it back with one more hit, so
//! popular prompt heads outlive one-off tails. O(log n) an operation: an ordered set of
//! `(hits, arrival, slot)`, and each slot's key to find it again.

use std::collections::BTreeSet;

use super::{Evictable, Evictor};

#[derive(Debug, Clone)]
pub struct Lfu {
    order: BTreeSet<(u32, u64, u32)>,
    /// The key each slot in the set was inserted under.
    keys: Vec<Option<(u32, u64)>>,
    clock: u64,
}

impl Lfu {
    pub fn new(capacity: u32) -> Self {
        Lfu {
            order: BTreeSet::new(),
            keys: vec![None; capacity as usize],
            clock: 0,
        }
    }
}

impl Evictor for Lfu {
    fn insert(&mut self, slot: u32, info: Evictable) {
        self.clock += 1;
        let key = (info.hits, self.clock);
        if slot as usize >= self.keys.len() {
            // Built for fewer slots (a lower tier's grow with use).
            self.keys.resize(slot as usize + 1, None);
        }
        self.keys[slot as usize] = Some(key);
        self.order.insert((key.0, key.1, slot));
    }

    fn remove(&mut self, slot: u32) {
        if let Some((h, t)) = self.keys.get_mut(slot as usize).and_then(Option::take) {
            self.order.remove(&(h, t, slot));
        }
    }

    fn pop_victim(&mut self) -> Option<u32> {
        let (_, _, slot) = self.order.pop_first()?;
        self.keys[slot as usize] = None;
        Some(slot)
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn contains(&self, slot: u32) -> bool {
        self.keys.get(slot as usize).is_some_and(Option::is_some)
    }

    fn order(&self) -> Vec<u32> {
        self.order.iter().map(|&(_, _, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(n: u32) -> Evictable {
        Evictable {
            hits: n,
            ..Evictable::default()
        }
    }

    #[test]
    fn fewest_hits_first_then_oldest() {
        let mut l = Lfu::new(8);
        l.insert(0, hits(2));
        l.insert(1, hits(0));
        l.insert(2, hits(1));
        l.insert(3, hits(0));
        assert_eq!(l.order(), vec![1, 3, 2, 0]);
        // A hit on 1 takes it out; released again it carries one hit, behind 2 (older).
        l.remove(1);
        l.insert(1, hits(1));
        assert_eq!(l.order(), vec![3, 2, 1, 0]);
        assert_eq!(l.pop_victim(), Some(3));
        assert_eq!(l.len(), 3);
    }
}
