//! Eviction policies replayed over an access string of block keys (dense `u32` ids) at a fixed
//! capacity in blocks: `lru`, `lfu` (ties by recency) and `belady`, the offline optimum (evict
//! the block whose next use is farthest away). Belady is a bound, not a policy: it reads the
//! future through a next-use index made in one backward pass.
//!
//! Model: `lru` and `lfu` page on demand (a miss inserts its block, evicting one when full);
//! `belady` may also decline to insert (when the missed block's own next use is the farthest).
//! A hit is an access whose block was resident. That MIN is optimal over every choice of
//! evictions and bypasses, so its hit count bounds every policy's on the same string. Ties of
//! next use (never used again) go to the larger key id: a block first seen later.
//!
//! Memory: each policy holds per-resident-key state (a map and an ordered set, O(log C) an
//! access); the only per-access array is the next-use index (one `usize` an access), and the
//! access string itself, which the caller owns.

use std::collections::{BTreeSet, HashMap};

/// Next use after each position: `next[i]` is the next position holding `keys[i]`, or
/// `usize::MAX` when it is never used again. One backward pass, per-key state `last`.
pub fn next_uses(keys: &[u32]) -> Vec<usize> {
    let mut last: HashMap<u32, usize> = HashMap::new();
    let mut next = vec![usize::MAX; keys.len()];
    for (i, &k) in keys.iter().enumerate().rev() {
        if let Some(n) = last.insert(k, i) {
            next[i] = n;
        }
    }
    next
}

/// One eviction policy at a fixed capacity.
pub trait Policy {
    /// Access `key` at position `pos` of the string (next used at `next`, `usize::MAX` never).
    /// Returns whether it was a hit; a miss inserts it, evicting one block when full.
    fn access(&mut self, key: u32, pos: usize, next: usize) -> bool;
}

/// Least recently used: evict the block whose last access is oldest.
pub struct Lru {
    capacity: usize,
    stamp: HashMap<u32, usize>,
    order: BTreeSet<(usize, u32)>,
}

impl Lru {
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity,
            stamp: HashMap::new(),
            order: BTreeSet::new(),
        }
    }
}

impl Policy for Lru {
    fn access(&mut self, key: u32, pos: usize, _next: usize) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let hit = match self.stamp.insert(key, pos) {
            Some(old) => {
                self.order.remove(&(old, key));
                true
            }
            None => {
                if self.stamp.len() > self.capacity {
                    if let Some((_, k)) = self.order.pop_first() {
                        self.stamp.remove(&k);
                    }
                }
                false
            }
        };
        self.order.insert((pos, key));
        hit
    }
}

/// Least frequently used (accesses since it was inserted), ties by recency (oldest goes).
pub struct Lfu {
    capacity: usize,
    state: HashMap<u32, (u64, usize)>,
    order: BTreeSet<(u64, usize, u32)>,
}

impl Lfu {
    pub fn new(capacity: usize) -> Self {
        Lfu {
            capacity,
            state: HashMap::new(),
            order: BTreeSet::new(),
        }
    }
}

impl Policy for Lfu {
    fn access(&mut self, key: u32, pos: usize, _next: usize) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let (count, hit) = match self.state.get(&key) {
            Some(&(c, t)) => {
                self.order.remove(&(c, t, key));
                (c.saturating_add(1), true)
            }
            None => {
                if self.state.len() >= self.capacity {
                    if let Some((_, _, k)) = self.order.pop_first() {
                        self.state.remove(&k);
                    }
                }
                (1, false)
            }
        };
        self.state.insert(key, (count, pos));
        self.order.insert((count, pos, key));
        hit
    }
}

/// The offline optimum (Belady's MIN): evict the resident block used farthest in the future,
/// or keep the missed block out when it is that block.
pub struct Belady {
    capacity: usize,
    next_of: HashMap<u32, usize>,
    order: BTreeSet<(usize, u32)>,
}

impl Belady {
    pub fn new(capacity: usize) -> Self {
        Belady {
            capacity,
            next_of: HashMap::new(),
            order: BTreeSet::new(),
        }
    }
}

impl Policy for Belady {
    fn access(&mut self, key: u32, _pos: usize, next: usize) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let hit = match self.next_of.get(&key) {
            Some(&old) => {
                self.order.remove(&(old, key));
                true
            }
            None => {
                if self.next_of.len() >= self.capacity {
                    // Full: the block itself is a candidate (kept out when its own next use is
                    // the farthest), so the bound also covers policies that decline to cache.
                    match self.order.last() {
                        Some(&far) if far > (next, key) => {
                            self.order.pop_last();
                            self.next_of.remove(&far.1);
                        }
                        _ => return false,
                    }
                }
                false
            }
        };
        self.next_of.insert(key, next);
        self.order.insert((next, key));
        hit
    }
}

/// The policies `trace stats` reports, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    Lru,
    Lfu,
    Belady,
    /// Room for every block: the ceiling, nothing evicted.
    Infinite,
}

impl PolicyKind {
    /// The policies replayed at a finite capacity.
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::Belady];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Lfu => "lfu",
            PolicyKind::Belady => "belady",
            PolicyKind::Infinite => "infinite",
        }
    }

    pub fn make(self, capacity: usize) -> Box<dyn Policy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::new(capacity)),
            PolicyKind::Lfu => Box::new(Lfu::new(capacity)),
            PolicyKind::Belady => Box::new(Belady::new(capacity)),
            PolicyKind::Infinite => Box::new(Lru::new(usize::MAX)),
        }
    }
}

/// Replay `keys` through `policy`, calling `on_access(pos, hit)` for each access.
pub fn replay(
    policy: &mut dyn Policy,
    keys: &[u32],
    next: &[usize],
    mut on_access: impl FnMut(usize, bool),
) {
    for (pos, (&k, &n)) in keys.iter().zip(next).enumerate() {
        let hit = policy.access(k, pos, n);
        on_access(pos, hit);
    }
}

/// Hits of `kind` at `capacity` blocks on `keys` (the plain paging count).
pub fn hits(kind: PolicyKind, keys: &[u32], capacity: usize) -> usize {
    let next = next_uses(keys);
    let mut p = kind.make(capacity);
    let mut n = 0;
    replay(p.as_mut(), keys, &next, |_, hit| n += usize::from(hit));
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn textbook_string() {
        // 7 0 1 2 0 3 0 4 2 3 0 3 2 at 3 frames: demand-paging MIN has 7 misses of 13; keeping
        // 4 (never used again) out saves the miss on 0 after it: 6. LRU 9.
        let s = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2];
        assert_eq!(s.len() - hits(PolicyKind::Belady, &s, 3), 6);
        assert_eq!(s.len() - hits(PolicyKind::Lru, &s, 3), 9);
        assert_eq!(next_uses(&[1, 2, 1]), vec![2, usize::MAX, usize::MAX]);
    }
}
