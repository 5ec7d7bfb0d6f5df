//! The lower memory tiers of the paged cache (host, and disk below it): every slot state
//! transition of a lower tier lives here, as every device block transition lives in `block.rs`.
//!
//! # Lifecycle of one lower-tier slot
//!
//! A tier is a pool of `capacity_blocks` slots (`0..capacity`); each holds one full published
//! block (all layers' K and V of `block_size` tokens). A slot is in exactly one state:
//! - `Free`: no key; on the tier's free stack.
//! - `Held(key)`: holds the content published under `key`; the tier's index maps `key` to it
//!   (with the parent key, the token ids, the scope and the publisher, so a hit here is verified
//!   exactly like a device hit), and it is in the tier's eviction policy's set.
//! - `Pinned(key)`: held, and an emitted onload reads it. Out of the eviction set until every
//!   step up to the fence of the step the onload was drained into has retired: an onload runs
//!   at the start of its step (possibly asynchronously, overlapping compute), so the slot must
//!   not be overwritten before that step retired. Planted fault `stale-onload` skips the pin
//!   (a *ghost* pin records what the pin would have been, to count the fault firing).
//!
//! Transitions: `Free|Held(victim) → Held` (an offload writes the slot: [`TierPool::take_slot`]
//! then [`TierPool::put`]; the victim's key is dropped, or passed down to the disk tier first),
//! `Held → Pinned` (an onload: [`TierPool::pin`]), `Pinned → Held` (the last pin's fence retired:
//! [`TierPool::unpin`]), `Held → Free` ([`TierPool::flush`]).
//!
//! # Pins and fences
//!
//! An onload's pin is *undrained* from the `start` that emitted it until `drain_tier_ops`, then
//! *drained* until the next `begin_step`, which fences it on the step it returns; `retire_step`
//! releases every pin fenced below the device fence's watermark. So a pin lasts exactly as long
//! as the op's step may run.
//!
//! # Op order
//!
//! Ops are emitted in the order they must run and drained in that order: an evicted device
//! block's offload comes before the onload (or new content) that reuses the block, and a host
//! slot's move to disk comes before the offload that overwrites the slot. A `write_through`
//! offload of a block published while planning step S is emitted by the first drain after
//! `begin_step(S)` (at the end of that batch), so it runs in a later step than the one that
//! wrote the content; a block evicted before then is offloaded by the eviction instead.
//!
//! # Counters
//!
//! Per tier, in blocks: `used = offloaded − evicted` at every moment (a flush counts as
//! evictions); onloads copy (the tiers are inclusive: the slot keeps its content), so they do not
//! enter the balance.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use kvbench_cache_api::{BlockLoc, OffloadMode, SeqId, StepId, Tier, TierOp, TierStats};

use super::evict::{AnyEvictor, Evictable, EvictionPolicy, Evictor};
use super::prefix::{KeyHasher, PrefixKey, Published};

/// The lower tiers a paged cache offloads to (`Default`: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierConfig {
    /// Host-tier slots, one block each (0: no lower tier at all).
    pub host_blocks: u32,
    /// Disk-tier slots below the host tier (0: none; ignored without a host tier).
    pub disk_blocks: u32,
    pub offload: OffloadMode,
    pub host_eviction: EvictionPolicy,
    pub disk_eviction: EvictionPolicy,
}

impl TierConfig {
    pub fn is_enabled(&self) -> bool {
        self.host_blocks > 0
    }
}

/// Where a planned hit is: the device block, or a lower tier's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlannedHit {
    pub loc: BlockLoc,
    pub key: PrefixKey,
}

/// A pin as the fence lists keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pin {
    pub loc: BlockLoc,
    pub ghost: bool,
}

/// The host tier, the optional disk tier, the ops not yet drained and the pins of onloads.
#[derive(Debug)]
pub(crate) struct Tiers {
    pub host: TierPool,
    pub disk: Option<TierPool>,
    pub offload: OffloadMode,
    pub block_size: u32,
    /// Emitted, not yet drained, in execution order.
    pub ops: Vec<TierOp>,
    /// Pins of onloads in `ops`.
    pub undrained: Vec<Pin>,
    /// Pins of drained onloads, waiting for the `begin_step` of their step.
    pub drained: Vec<Pin>,
    /// Pins fenced on a step.
    pub fenced: BTreeMap<StepId, Vec<Pin>>,
    /// Device blocks published (with their key) since the last `begin_step`: their content is
    /// written by the step being planned, so neither an eviction offload nor a write-through
    /// may read them before that step ran.
    pub fresh: Vec<(u32, PrefixKey)>,
    pub fresh_blocks: HashSet<u32>,
    /// Write-through: blocks whose writing step has begun, offloaded at the next drain.
    pub write_through_due: Vec<(u32, PrefixKey)>,
    /// `stale-onload` armed: onloads do not pin.
    pub skip_pins: bool,
}

impl Tiers {
    pub fn new(cfg: &TierConfig, block_size: u32) -> Option<Self> {
        if !cfg.is_enabled() {
            return None;
        }
        Some(Tiers {
            host: TierPool::new(Tier::Host, cfg.host_blocks, cfg.host_eviction),
            disk: (cfg.disk_blocks > 0)
                .then(|| TierPool::new(Tier::Disk, cfg.disk_blocks, cfg.disk_eviction)),
            offload: cfg.offload,
            block_size,
            ops: Vec::new(),
            undrained: Vec::new(),
            drained: Vec::new(),
            fenced: BTreeMap::new(),
            fresh: Vec::new(),
            fresh_blocks: HashSet::new(),
            write_through_due: Vec::new(),
            skip_pins: false,
        })
    }

    pub fn pool(&self, tier: Tier) -> Option<&TierPool> {
        match tier {
            Tier::Host => Some(&self.host),
            Tier::Disk => self.disk.as_ref(),
            Tier::Device => None,
        }
    }

    fn pool_mut(&mut self, tier: Tier) -> Option<&mut TierPool> {
        match tier {
            Tier::Host => Some(&mut self.host),
            Tier::Disk => self.disk.as_mut(),
            Tier::Device => None,
        }
    }

    /// The lower-tier slot holding `key` (host first, then disk), verified by `verify`.
    pub fn lookup(&self, key: &PrefixKey, verify: impl Fn(&Published) -> bool) -> Option<BlockLoc> {
        if let Some(slot) = self.host.lookup(key, &verify) {
            return Some(BlockLoc {
                tier: Tier::Host,
                slot,
            });
        }
        let disk = self.disk.as_ref()?;
        disk.lookup(key, &verify).map(|slot| BlockLoc {
            tier: Tier::Disk,
            slot,
        })
    }

    /// Count a start's lookups and hits per tier: `hits` in chain order, `missed` whether the
    /// chain ended on a block found nowhere (it was looked up in every tier).
    pub fn count_lookups(&mut self, hits: &[PlannedHit], missed: bool) {
        for h in hits {
            match h.loc.tier {
                Tier::Device => {}
                Tier::Host => {
                    self.host.stats.lookup_blocks += 1;
                    self.host.stats.hit_blocks += 1;
                }
                Tier::Disk => {
                    self.host.stats.lookup_blocks += 1;
                    if let Some(d) = self.disk.as_mut() {
                        d.stats.lookup_blocks += 1;
                        d.stats.hit_blocks += 1;
                    }
                }
            }
        }
        if missed {
            self.host.stats.lookup_blocks += 1;
            if let Some(d) = self.disk.as_mut() {
                d.stats.lookup_blocks += 1;
            }
        }
    }

    /// Pin a planned hit's slot before any fresh block is taken, so no offload the start causes
    /// can overwrite it; returns a copy of the slot's index entry (what the onload publishes).
    pub fn pin_hit(&mut self, loc: BlockLoc, key: &PrefixKey) -> Option<Published> {
        let ghost = self.skip_pins;
        let pool = self.pool_mut(loc.tier)?;
        let e = pool.get(key)?;
        let entry = Published {
            block: loc.slot,
            parent: e.parent,
            tokens: e.tokens.clone(),
            scope: Arc::clone(&e.scope),
            publisher: e.publisher,
        };
        pool.pin(loc.slot, ghost);
        self.undrained.push(Pin { loc, ghost });
        Some(entry)
    }

    /// Emit the onload of a pinned hit into the fresh device block `block`.
    pub fn onload(&mut self, from: BlockLoc, block: u32, seq: SeqId) {
        let bs = self.block_size;
        if let Some(pool) = self.pool_mut(from.tier) {
            pool.stats.onloaded_blocks += 1;
        }
        self.ops.push(TierOp {
            from,
            to: BlockLoc {
                tier: Tier::Device,
                slot: block,
            },
            tokens: bs,
            seq: Some(seq),
        });
    }

    /// The device evicted `block` (its identity `c`) to reuse it: offload it unless the host
    /// already holds the key, or the content is not written yet (published this planning step).
    pub fn offload_evicted(&mut self, block: u32, c: Carried) {
        if self.fresh_blocks.contains(&block) {
            // Its writer has not run: nothing to copy. (Rare: released and evicted before the
            // step that fills it.)
            self.fresh_blocks.remove(&block);
            return;
        }
        self.offload(block, c);
    }

    /// Write the device block `block` into the host tier (moving the host's victim to disk).
    fn offload(&mut self, block: u32, c: Carried) {
        if self.host.contains(&c.key) {
            return;
        }
        let Some((slot, victim)) = self.host.take_slot() else {
            // Every host slot is pinned: the block is dropped.
            return;
        };
        if let Some(v) = victim {
            self.pass_down(slot, v);
        }
        self.ops.push(TierOp {
            from: BlockLoc {
                tier: Tier::Device,
                slot: block,
            },
            to: BlockLoc {
                tier: Tier::Host,
                slot,
            },
            tokens: self.block_size,
            seq: None,
        });
        self.host.put(slot, c);
    }

    /// The host is about to overwrite `host_slot`, which held `v`: move it to disk first.
    fn pass_down(&mut self, host_slot: u32, v: Carried) {
        let bs = self.block_size;
        let Some(disk) = self.disk.as_mut() else {
            return;
        };
        if disk.contains(&v.key) {
            return;
        }
        let Some((dslot, _)) = disk.take_slot() else {
            return;
        };
        self.ops.push(TierOp {
            from: BlockLoc {
                tier: Tier::Host,
                slot: host_slot,
            },
            to: BlockLoc {
                tier: Tier::Disk,
                slot: dslot,
            },
            tokens: bs,
            seq: None,
        });
        disk.put(dslot, v);
    }

    /// A device block was published while planning the coming step.
    pub fn note_published(&mut self, block: u32, key: PrefixKey) {
        self.fresh.push((block, key));
        self.fresh_blocks.insert(block);
    }

    /// Move the undrained ops into `out`; their pins now wait for the step's `begin_step`.
    pub fn drain(&mut self, out: &mut Vec<TierOp>) {
        out.append(&mut self.ops);
        self.drained.append(&mut self.undrained);
    }

    /// `begin_step(step)`: fence the drained pins on `step`. Under `write_through`, the blocks
    /// published while planning `step` (it writes them) become due: the next drain offloads
    /// those still published under the same key, so the ops go into a later step — and a run
    /// that ends here leaves no op undrained.
    pub fn begin_step(&mut self, step: StepId) {
        if !self.drained.is_empty() {
            let pins = std::mem::take(&mut self.drained);
            self.fenced.entry(step).or_default().extend(pins);
        }
        self.fresh_blocks.clear();
        let fresh = std::mem::take(&mut self.fresh);
        if self.offload == OffloadMode::WriteThrough {
            self.write_through_due.extend(fresh);
        }
    }

    /// The write-through offloads due at this drain (see [`Tiers::begin_step`]).
    pub fn take_write_through_due(&mut self) -> Vec<(u32, PrefixKey)> {
        std::mem::take(&mut self.write_through_due)
    }

    /// Offload a write-through candidate (the caller checked it is still published).
    pub fn write_through(&mut self, block: u32, c: Carried) {
        self.offload(block, c);
    }

    /// Release every pin fenced on a step below `watermark`.
    pub fn retire(&mut self, watermark: StepId) {
        let keep = self.fenced.split_off(&watermark);
        let ready = std::mem::replace(&mut self.fenced, keep);
        for pin in ready.into_values().flatten() {
            if let Some(p) = self.pool_mut(pin.loc.tier) {
                p.unpin(pin.loc.slot, pin.ghost);
            }
        }
    }

    pub fn flush(&mut self) {
        self.host.flush();
        if let Some(d) = self.disk.as_mut() {
            d.flush();
        }
        self.write_through_due.clear();
    }

    pub fn stats(&self) -> Vec<TierStats> {
        let mut v = vec![self.host.stats];
        if let Some(d) = &self.disk {
            v.push(d.stats);
        }
        v
    }

    /// `stale-onload` fired: slots reused while an onload from them may not have run.
    pub fn stale_reuses(&self) -> u64 {
        self.host.stale_reuses + self.disk.as_ref().map_or(0, |d| d.stale_reuses)
    }

    /// Every pin the lists hold, for the checks.
    pub fn all_pins(&self) -> impl Iterator<Item = &Pin> {
        self.undrained
            .iter()
            .chain(&self.drained)
            .chain(self.fenced.values().flatten())
    }

    /// Structural checks of every tier, recomputed from the slots (not from the counters).
    pub fn check(&self, problems: &mut Vec<String>) {
        for pool in std::iter::once(&self.host).chain(self.disk.as_ref()) {
            check_pool(pool, self, problems);
        }
    }

    /// What the incremental device check looks at between its full walks (`check_counters`
    /// is O(1) a tier; `check` walks every slot, and a 64 GiB host tier is 32,768 of them):
    /// slots reused under a pending onload, and the counters that must agree without a walk.
    /// Anything it finds makes the device check run the full walk, `check` included.
    pub fn check_counters(&self, problems: &mut Vec<String>) {
        for pool in std::iter::once(&self.host).chain(self.disk.as_ref()) {
            let name = pool.tier.name();
            for s in &pool.stale_slots {
                problems.push(format!(
                    "{name} slot {s} reused while an onload from it may not have run"
                ));
            }
            let st = &pool.stats;
            let cap = u64::from(pool.capacity());
            let free = pool.free_slots();
            if st.capacity_blocks != cap || st.used_blocks.checked_add(free) != Some(cap) {
                problems.push(format!(
                    "{name}: {} slots used and {free} free of {cap} (capacity counter {})",
                    st.used_blocks, st.capacity_blocks
                ));
            }
            if st.offloaded_blocks.checked_sub(st.evicted_blocks) != Some(st.used_blocks)
                || st.peak_used_blocks < st.used_blocks
                || st.hit_blocks > st.lookup_blocks
            {
                problems.push(format!("{name}: counters out of order: {st:?}"));
            }
        }
    }

    /// After a run: nothing pinned or undrained in any tier.
    pub fn quiescent(&self, problems: &mut Vec<String>) {
        if !self.ops.is_empty() {
            problems.push(format!("{} tier ops never drained", self.ops.len()));
        }
        let pins = self.all_pins().count();
        if pins > 0 {
            problems.push(format!("{pins} lower-tier pins outstanding"));
        }
    }
}

fn check_pool(pool: &TierPool, tiers: &Tiers, p: &mut Vec<String>) {
    let name = pool.tier.name();
    let cap = pool.capacity() as usize;
    // Only touched slots have records; a pin or a listed slot past them is an error.
    let touched = pool.slots.len();
    let mut pins = vec![(0u32, 0u32); touched];
    for pin in tiers.all_pins().filter(|x| x.loc.tier == pool.tier) {
        match pins.get_mut(pin.loc.slot as usize) {
            Some(c) if pin.ghost => c.1 += 1,
            Some(c) => c.0 += 1,
            None => p.push(format!(
                "{name} pin names slot {} beyond the tier",
                pin.loc.slot
            )),
        }
    }
    for s in &pool.stale_slots {
        p.push(format!(
            "{name} slot {s} reused while an onload from it may not have run"
        ));
    }
    let (mut free, mut held, mut pinned) = (0u64, 0u64, 0u64);
    for (s, m) in pool.slots.iter().enumerate() {
        match m.state() {
            SlotState::Free => free += 1,
            SlotState::Held => held += 1,
            SlotState::Pinned => pinned += 1,
        }
        if (m.pins, m.ghost_pins) != pins[s] {
            p.push(format!(
                "{name} slot {s}: pins {}/{} (ghost) but the fence lists hold {}/{}",
                m.pins, m.ghost_pins, pins[s].0, pins[s].1
            ));
        }
        if m.key.is_none() && m.pins > 0 {
            p.push(format!("{name} slot {s} is pinned without content"));
        }
        if let Some(key) = &m.key {
            match pool.get(key) {
                Some(e) if e.block == s as u32 => {
                    if e.tokens.len() != tiers.block_size as usize {
                        p.push(format!(
                            "{name} slot {s} holds {} tokens, not a full block",
                            e.tokens.len()
                        ));
                    }
                }
                _ => p.push(format!(
                    "{name} slot {s} carries a key the tier's index does not map to it"
                )),
            }
        }
    }
    // Every key in at most one slot: the index maps each key to one slot, and that slot
    // carries it. (Unsorted: this runs every step under `--check-every 1`.)
    for (key, e) in pool.entries() {
        let s = e.block;
        if pool.slots.get(s as usize).and_then(|m| m.key) != Some(*key) {
            p.push(format!(
                "{name} index names slot {s} which does not carry that key"
            ));
        }
    }
    let mut seen = vec![false; touched];
    for &s in pool.free_list() {
        match seen.get_mut(s as usize) {
            Some(b) if !*b => *b = true,
            _ => p.push(format!(
                "{name} slot {s} is on the free list twice or beyond"
            )),
        }
        if pool.slots.get(s as usize).map(SlotMeta::state) != Some(SlotState::Free) {
            p.push(format!(
                "{name} slot {s} is on the free list but holds a block"
            ));
        }
    }
    let order = pool.eviction_order();
    let mut in_order = vec![false; touched];
    for &s in &order {
        let Some(seen) = in_order.get_mut(s as usize) else {
            p.push(format!(
                "{name} slot {s} is in the eviction order but was never taken"
            ));
            continue;
        };
        if std::mem::replace(seen, true) {
            p.push(format!("{name} slot {s} is in the eviction order twice"));
        }
        if pool.slots[s as usize].state() != SlotState::Held {
            p.push(format!(
                "{name} slot {s} is in the eviction order but not held"
            ));
        }
    }
    if order.len() as u64 != held || pool.free_list().len() as u64 != free {
        p.push(format!(
            "{name}: {held} held slots, {} evictable; {free} free slots, {} on the free list",
            order.len(),
            pool.free_list().len()
        ));
    }
    let st = &pool.stats;
    let used = held + pinned;
    if st.used_blocks != used || st.capacity_blocks != cap as u64 {
        p.push(format!(
            "{name}: {used} slots hold a block but the counter says {} (capacity {})",
            st.used_blocks, st.capacity_blocks
        ));
    }
    if st.offloaded_blocks.checked_sub(st.evicted_blocks) != Some(used) {
        p.push(format!(
            "{name}: offloaded {} − evicted {} != used {used}",
            st.offloaded_blocks, st.evicted_blocks
        ));
    }
    if st.peak_used_blocks < used || st.hit_blocks > st.lookup_blocks {
        p.push(format!("{name}: counters out of order: {st:?}"));
    }
}

/// A device block's identity as a tier keeps it (a copy of the device index entry).
pub(crate) fn carried(key: PrefixKey, e: &Published, depth: u32, hits: u32) -> Carried {
    Carried {
        key,
        entry: Published {
            block: e.block,
            parent: e.parent,
            tokens: e.tokens.clone(),
            scope: Arc::clone(&e.scope),
            publisher: e.publisher,
        },
        depth,
        hits,
    }
}

mod pool;
pub(crate) use pool::{Carried, SlotMeta, SlotState, TierPool};

#[cfg(test)]
mod tests;
