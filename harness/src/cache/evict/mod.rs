//! Which evictable block goes first: one trait, [`Evictor`], and its policies (`lru`, `lfu`,
//! `priority`), chosen by `cache.eviction`.
//!
//! A policy holds only ordering state over dense ids `0..capacity`: a summed pool's device
//! blocks, a lower tier's slots (each tier with its own policy), the hybrid pool's logical
//! blocks (`hybrid/cached_free.rs`). It never decides *whether* a block is evictable nor changes
//! a block's state: the pool that owns the block (`block.rs`, `tier.rs`, `hybrid/pool.rs`) makes
//! every transition and tells the policy what happened — a block became evictable
//! ([`Evictor::insert`], with what a policy may weigh: [`Evictable`]), it left the evictable set
//! because it was hit or flushed ([`Evictor::remove`]), or the pool needs room
//! ([`Evictor::pop_victim`]). So the same operations give the same accounting under every
//! policy; only which cached content survives differs.
//!
//! Cost: `lru` is an intrusive list (O(1) an operation, two `u32` a slot), `lfu` and `priority`
//! an ordered set (O(log n) an operation, one key a slot). This is the simulator's hot path.

mod lfu;
mod lru;
mod priority;

use serde::{Deserialize, Serialize};

pub use lfu::Lfu;
pub use lru::Lru;
pub use priority::Priority;

/// What the pool knows of a block when it becomes evictable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Evictable {
    /// Position in its prefix chain (0: the first block of a prompt). A child is reachable only
    /// through its parent, so deeper blocks are worth less once their parent is gone.
    pub depth: u32,
    /// Prefix hits this content has served since it was written.
    pub hits: u32,
    /// Whether another sequence has reused it: a shared prompt head (a system prompt), not one
    /// request's private tail.
    pub shared: bool,
}

/// An eviction policy over slots `0..capacity`. The caller guarantees the protocol: `insert`
/// only a slot not in the set, `remove` only one in it; `pop_victim` removes what it returns.
pub trait Evictor {
    /// `slot` became evictable.
    fn insert(&mut self, slot: u32, info: Evictable);
    /// `slot` left the evictable set (a prefix hit revived it, or a flush freed it).
    fn remove(&mut self, slot: u32);
    /// The slot to evict now, removed from the set; `None` when the set is empty.
    fn pop_victim(&mut self) -> Option<u32>;
    /// Slots in the set.
    fn len(&self) -> usize;
    /// Whether `slot` is in the set (the incremental invariant check; O(1)).
    fn contains(&self, slot: u32) -> bool;
    /// Whether the set is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The evictable slots in the order they would be evicted (first victim first): for the
    /// invariant checks and tests, never the hot path.
    fn order(&self) -> Vec<u32>;
}

/// The policy a cache uses (`cache.eviction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicy {
    /// Least recently made evictable goes first (the historical order).
    #[default]
    Lru,
    /// Fewest prefix hits goes first; ties least recently made evictable.
    Lfu,
    /// Unshared blocks before shared ones (keep system prompts), deepest in its chain first
    /// (keep shallow blocks; the cached set stays prefix-closed), then least recent.
    Priority,
}

impl EvictionPolicy {
    pub const ALL: [EvictionPolicy; 3] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Priority,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Priority => "priority",
        }
    }

    /// The policy's ordering state for `capacity` slots (it grows past them as slots are
    /// inserted: a lower tier builds it for none).
    pub fn build(self, capacity: u32) -> AnyEvictor {
        match self {
            EvictionPolicy::Lru => AnyEvictor::Lru(Lru::new(capacity)),
            EvictionPolicy::Lfu => AnyEvictor::Lfu(Lfu::new(capacity)),
            EvictionPolicy::Priority => AnyEvictor::Priority(Priority::new(capacity)),
        }
    }
}

/// One of the policies, dispatched by `match` rather than a vtable (the pool calls it on every
/// release and hit).
#[derive(Debug, Clone)]
pub enum AnyEvictor {
    Lru(Lru),
    Lfu(Lfu),
    Priority(Priority),
}

macro_rules! each {
    ($self:ident, $e:ident => $body:expr) => {
        match $self {
            AnyEvictor::Lru($e) => $body,
            AnyEvictor::Lfu($e) => $body,
            AnyEvictor::Priority($e) => $body,
        }
    };
}

impl Evictor for AnyEvictor {
    fn insert(&mut self, slot: u32, info: Evictable) {
        each!(self, e => e.insert(slot, info))
    }
    fn remove(&mut self, slot: u32) {
        each!(self, e => e.remove(slot))
    }
    fn pop_victim(&mut self) -> Option<u32> {
        each!(self, e => e.pop_victim())
    }
    fn len(&self) -> usize {
        each!(self, e => e.len())
    }
    fn contains(&self, slot: u32) -> bool {
        each!(self, e => e.contains(slot))
    }
    fn order(&self) -> Vec<u32> {
        each!(self, e => e.order())
    }
}

/// A linear-scan model of each policy for the tests: the evictable set as a list of
/// `(slot, info, insertion counter)`, the victim found by scanning for the policy's key. Slow
/// and obviously right.
#[cfg(test)]
pub mod reference {
    use super::{Evictable, EvictionPolicy};

    #[derive(Debug, Default, Clone)]
    pub struct Model {
        entries: Vec<(u32, Evictable, u64)>,
        clock: u64,
    }

    impl Model {
        pub fn insert(&mut self, slot: u32, info: Evictable) {
            self.clock += 1;
            self.entries.push((slot, info, self.clock));
        }
        pub fn remove(&mut self, slot: u32) {
            self.entries.retain(|e| e.0 != slot);
        }
        pub fn pop_victim(&mut self, policy: EvictionPolicy) -> Option<u32> {
            let key = |e: &(u32, Evictable, u64)| -> (u64, u64, u64) {
                match policy {
                    EvictionPolicy::Lru => (0, 0, e.2),
                    EvictionPolicy::Lfu => (u64::from(e.1.hits), e.2, 0),
                    EvictionPolicy::Priority => {
                        (u64::from(e.1.shared), u64::from(u32::MAX - e.1.depth), e.2)
                    }
                }
            };
            let i = (0..self.entries.len()).min_by_key(|&i| key(&self.entries[i]))?;
            Some(self.entries.remove(i).0)
        }
        pub fn len(&self) -> usize {
            self.entries.len()
        }
        pub fn is_empty(&self) -> bool {
            self.entries.is_empty()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reference::Model;
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random insert / remove / pop sequences: every policy pops exactly what the linear-scan
    /// model pops, and `order()` lists the victims in the order `pop_victim` would take them.
    #[test]
    fn every_policy_matches_the_linear_scan_model() {
        let seed: u64 = std::env::var("KVBENCH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_e71c);
        println!("seed {seed} (replay with KVBENCH_SEED={seed})");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for policy in EvictionPolicy::ALL {
            for _round in 0..50 {
                let cap = rng.gen_range(1..40u32);
                let mut e = policy.build(cap);
                let mut m = Model::default();
                let mut inside = vec![false; cap as usize];
                for _ in 0..400 {
                    let slot = rng.gen_range(0..cap);
                    match rng.gen_range(0..4) {
                        0 | 1 if !inside[slot as usize] => {
                            let info = Evictable {
                                depth: rng.gen_range(0..5),
                                hits: rng.gen_range(0..4),
                                shared: rng.gen_bool(0.3),
                            };
                            e.insert(slot, info);
                            m.insert(slot, info);
                            inside[slot as usize] = true;
                        }
                        2 if inside[slot as usize] => {
                            e.remove(slot);
                            m.remove(slot);
                            inside[slot as usize] = false;
                        }
                        _ => {
                            let order = e.order();
                            let got = e.pop_victim();
                            assert_eq!(got, m.pop_victim(policy), "{policy:?} seed {seed}");
                            assert_eq!(got, order.first().copied(), "{policy:?} seed {seed}");
                            if let Some(s) = got {
                                inside[s as usize] = false;
                            }
                        }
                    }
                    assert_eq!(e.len(), m.len(), "{policy:?} seed {seed}");
                }
                // Draining follows `order()` exactly.
                let order = e.order();
                let mut drained = Vec::new();
                while let Some(s) = e.pop_victim() {
                    drained.push(s);
                }
                assert_eq!(drained, order, "{policy:?} seed {seed}");
                assert!(e.is_empty());
            }
        }
    }

    #[test]
    fn names_round_trip_through_serde() {
        for p in EvictionPolicy::ALL {
            let text = serde_json::to_string(&p).expect("serialize");
            assert_eq!(text, format!("\"{}\"", p.name()));
            let back: EvictionPolicy = serde_json::from_str(&text).expect("parse");
            assert_eq!(back, p);
        }
        assert_eq!(EvictionPolicy::default(), EvictionPolicy::Lru);
    }
}
