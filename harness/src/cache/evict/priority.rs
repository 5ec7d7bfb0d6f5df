//! Keep what many requests start with: unshared blocks (one request's private content) are
//! evicted before shared ones (a system prompt others reused); within each, the deepest block of
//! its prefix chain first — a child is reachable only through its parent, so evicting leaves
//! first keeps the cached set prefix-closed — and then the least recently made evictable.
//! O(log n) an operation: an ordered set of `(shared, depth from the end, arrival, slot)`.

use std::collections::BTreeSet;

use super::{Evictable, Evictor};

type Key = (bool, u32, u64);

#[derive(Debug, Clone)]
pub struct Priority {
    order: BTreeSet<(Key, u32)>,
    keys: Vec<Option<Key>>,
    clock: u64,
}

impl Priority {
    pub fn new(capacity: u32) -> Self {
        Priority {
            order: BTreeSet::new(),
            keys: vec![None; capacity as usize],
            clock: 0,
        }
    }
}

impl Evictor for Priority {
    fn insert(&mut self, slot: u32, info: Evictable) {
        self.clock += 1;
        let key = (info.shared, u32::MAX - info.depth, self.clock);
        if slot as usize >= self.keys.len() {
            // Built for fewer slots (a lower tier's grow with use).
            self.keys.resize(slot as usize + 1, None);
        }
        self.keys[slot as usize] = Some(key);
        self.order.insert((key, slot));
    }

    fn remove(&mut self, slot: u32) {
        if let Some(key) = self.keys.get_mut(slot as usize).and_then(Option::take) {
            self.order.remove(&(key, slot));
        }
    }

    fn pop_victim(&mut self) -> Option<u32> {
        let (_, slot) = self.order.pop_first()?;
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
        self.order.iter().map(|&(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(depth: u32, shared: bool) -> Evictable {
        Evictable {
            depth,
            hits: u32::from(shared),
            shared,
        }
    }

    #[test]
    fn private_before_shared_deepest_first_then_oldest() {
        let mut p = Priority::new(8);
        p.insert(0, at(0, true)); // a system prompt's head
        p.insert(1, at(1, true));
        p.insert(2, at(0, false));
        p.insert(3, at(3, false));
        p.insert(4, at(3, false));
        assert_eq!(p.order(), vec![3, 4, 2, 1, 0]);
        p.remove(4);
        assert_eq!(p.pop_victim(), Some(3));
        assert_eq!(p.pop_victim(), Some(2));
        assert_eq!(p.order(), vec![1, 0]);
    }
}
