//! One lower tier's pool of slots: each slot's metadata, the key index and the eviction set.
//! The state transitions it offers are the ones the parent module's docs list; which of them
//! happen when is the parent's (`Tiers`) to decide.

use super::*;

/// A slot's state, derived from its metadata (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    Free,
    Held,
    Pinned,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct SlotMeta {
    pub key: Option<PrefixKey>,
    /// Pins of pending onloads (the slot is out of the eviction set while above 0).
    pub pins: u32,
    /// Pins `stale-onload` skipped: the slot stayed evictable.
    pub ghost_pins: u32,
    /// Position in its prefix chain, and hits served from this slot: what a policy weighs.
    pub depth: u32,
    pub hits: u32,
}

impl SlotMeta {
    pub fn state(&self) -> SlotState {
        match (self.key, self.pins) {
            (None, _) => SlotState::Free,
            (Some(_), 0) => SlotState::Held,
            (Some(_), _) => SlotState::Pinned,
        }
    }
}

/// What an offload carries into a tier: the block's identity, as the index keeps it.
pub(crate) struct Carried {
    pub key: PrefixKey,
    pub entry: Published,
    pub depth: u32,
    pub hits: u32,
}

/// One tier's slots, index, eviction order and counters. Metadata grows with use: a slot's
/// record exists once it was first taken (a 600 GiB disk tier of 16 KiB blocks has 39 million
/// slots, and a run of a few requests touches a handful), so `slots` holds the slots touched,
/// `0..slots.len()`, and the untouched rest are free without a record.
#[derive(Debug)]
pub(crate) struct TierPool {
    pub tier: Tier,
    /// Records of the slots touched so far (`0..slots.len()`).
    pub slots: Vec<SlotMeta>,
    capacity: u32,
    /// Touched slots that are free again, popped from the back before an untouched one is
    /// taken (lowest first): the order a full free list `capacity-1..=0` would give.
    free: Vec<u32>,
    evict: AnyEvictor,
    index: HashMap<PrefixKey, Published, BuildHasherDefault<KeyHasher>>,
    pub stats: TierStats,
    /// Slots reused while a ghost pin was outstanding: `stale-onload` fired.
    pub stale_reuses: u64,
    /// The first such slots, for `check_invariants` to report (as `early-reuse` is reported).
    pub stale_slots: Vec<u32>,
}

impl TierPool {
    pub fn new(tier: Tier, capacity: u32, eviction: EvictionPolicy) -> Self {
        TierPool {
            tier,
            slots: Vec::new(),
            capacity,
            free: Vec::new(),
            evict: eviction.build(0),
            index: HashMap::default(),
            stats: TierStats {
                tier: Some(tier),
                capacity_blocks: u64::from(capacity),
                ..TierStats::default()
            },
            stale_reuses: 0,
            stale_slots: Vec::new(),
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Free slots: those freed again and those never touched.
    pub fn free_slots(&self) -> u64 {
        self.free.len() as u64 + u64::from(self.capacity) - self.slots.len() as u64
    }

    pub fn contains(&self, key: &PrefixKey) -> bool {
        self.index.contains_key(key)
    }

    pub fn get(&self, key: &PrefixKey) -> Option<&Published> {
        self.index.get(key)
    }

    /// Every held key with its entry (for the invariant check).
    pub fn entries(&self) -> impl Iterator<Item = (&PrefixKey, &Published)> {
        self.index.iter()
    }

    /// The touched slots that are free again (an untouched slot is free without being listed).
    pub fn free_list(&self) -> &[u32] {
        &self.free
    }

    pub fn eviction_order(&self) -> Vec<u32> {
        self.evict.order()
    }

    /// A slot for new content: a free one, else the policy's victim (unpublished here; its
    /// identity is returned so the caller may pass it down). `None` when every slot is pinned.
    pub fn take_slot(&mut self) -> Option<(u32, Option<Carried>)> {
        if let Some(s) = self.free.pop() {
            return Some((s, None));
        }
        if (self.slots.len() as u64) < u64::from(self.capacity) {
            let s = self.slots.len() as u32;
            self.slots.push(SlotMeta::default());
            return Some((s, None));
        }
        let s = self.evict.pop_victim()?;
        let m = &mut self.slots[s as usize];
        if m.ghost_pins > 0 {
            self.stale_reuses += 1;
            if self.stale_slots.len() < 8 {
                self.stale_slots.push(s);
            }
        }
        let key = m.key.take()?;
        let (depth, hits) = (m.depth, m.hits);
        self.stats.evicted_blocks += 1;
        self.stats.used_blocks -= 1;
        let entry = self.index.remove(&key)?;
        Some((
            s,
            Some(Carried {
                key,
                entry,
                depth,
                hits,
            }),
        ))
    }

    /// Write `c` into `slot` (just taken): `Held`, evictable, indexed.
    pub fn put(&mut self, slot: u32, c: Carried) {
        let m = &mut self.slots[slot as usize];
        m.key = Some(c.key);
        m.depth = c.depth;
        m.hits = c.hits;
        let info = Evictable {
            depth: m.depth,
            hits: m.hits,
            shared: m.hits > 0,
        };
        if m.pins == 0 {
            self.evict.insert(slot, info);
        }
        let mut entry = c.entry;
        entry.block = slot;
        self.index.insert(c.key, entry);
        self.stats.offloaded_blocks += 1;
        self.stats.used_blocks += 1;
        self.stats.peak_used_blocks = self.stats.peak_used_blocks.max(self.stats.used_blocks);
    }

    /// An onload reads `slot`: out of the eviction set until unpinned (`ghost`: the fault keeps
    /// it evictable and only records the pin).
    pub fn pin(&mut self, slot: u32, ghost: bool) {
        let m = &mut self.slots[slot as usize];
        m.hits = m.hits.saturating_add(1);
        if ghost {
            m.ghost_pins += 1;
            return;
        }
        if m.pins == 0 && m.key.is_some() {
            self.evict.remove(slot);
        }
        m.pins += 1;
    }

    pub fn unpin(&mut self, slot: u32, ghost: bool) {
        let m = &mut self.slots[slot as usize];
        if ghost {
            m.ghost_pins = m.ghost_pins.saturating_sub(1);
            return;
        }
        m.pins = m.pins.saturating_sub(1);
        if m.pins == 0 && m.key.is_some() {
            let info = Evictable {
                depth: m.depth,
                hits: m.hits,
                shared: m.hits > 0,
            };
            self.evict.insert(slot, info);
        }
    }

    /// Every held (unpinned) slot back to free; pinned ones keep their content for the onloads
    /// that read them. Counted as evictions (the balance `used = offloaded − evicted` holds).
    pub fn flush(&mut self) {
        for s in self.evict.order() {
            self.evict.remove(s);
            if let Some(key) = self.slots[s as usize].key.take() {
                self.index.remove(&key);
                self.stats.evicted_blocks += 1;
                self.stats.used_blocks -= 1;
            }
            self.free.push(s);
        }
    }

    /// The slot holding `key` if its stored tokens, scope and parent match (as a device hit).
    pub fn lookup(&self, key: &PrefixKey, verify: impl Fn(&Published) -> bool) -> Option<u32> {
        self.index.get(key).filter(|p| verify(p)).map(|p| p.block)
    }
}
