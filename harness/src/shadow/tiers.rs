//! The shadow payload through the lower tiers: tag stores for host and disk slots, and the
//! transfers between them and the device (`StepPlan::tier_ops`). An offload copies a device
//! block's tags into a tier slot, a move to disk copies a host slot's, an onload copies a tier
//! slot's into a device block — so an onloaded block carries exactly the tags that were
//! offloaded, and the per-reader checks ([`Shadow::complete`]) find a wrong onload as a wrong
//! tag, like a wrong copy. Tier transfers are shadowed for flat paged runs only: the grouped
//! managers have no lower tier.
//!
//! **Pinned while the step is in flight.** Ops run in order at the start of their step, so an
//! offload reads its device block before anything of its step reuses it. An onload's tier slot
//! is protected differently: the manager must not write it until the step the onload belongs to
//! has retired (a device may run the transfer late, overlapping the compute). The shadow keeps
//! each onload pending from its submit to its step's completion; a write into its tier slot in
//! that window (a later op of the same step, or of a step submitted while it is in flight) is
//! copied through to the onloaded device block, as an onload running late would have copied it.
//! The block's readers then see the new tags — a wrong tag where they expected their own.
//!
//! **Cost.** Stores are allocated page by page on first write, like the device's; a run without
//! tier ops pays one emptiness test per submit and per completion.

use kvbench_cache_api::{BlockLoc, Tier, TierOp};

use super::*;

/// An onload of an in-flight step.
#[derive(Debug, Clone, Copy)]
struct Pending {
    from: BlockLoc,
    block: u32,
    tokens: u32,
    step: u64,
}

/// The lower tiers' tags: slot `s` of a tier holds tags `s × block_size ..` of its store.
#[derive(Debug, Default)]
pub(super) struct TierStores {
    host_blocks: u32,
    disk_blocks: u32,
    /// Made at the first step, when the block size is known (paged runs only).
    host: Option<LazyArray<Tag>>,
    disk: Option<LazyArray<Tag>>,
    pending: Vec<Pending>,
    /// One block's tags on their way.
    buf: Vec<Tag>,
}

impl TierStores {
    pub fn new(host_blocks: u32, disk_blocks: u32) -> TierStores {
        TierStores {
            host_blocks,
            disk_blocks,
            ..TierStores::default()
        }
    }

    /// Whether an onload of an in-flight step is waiting for its step to complete.
    #[inline]
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.host.as_ref().map_or(0, LazyArray::allocated_bytes)
            + self.disk.as_ref().map_or(0, LazyArray::allocated_bytes)
    }

    fn store(&self, tier: Tier) -> Option<&LazyArray<Tag>> {
        match tier {
            Tier::Device => None,
            Tier::Host => self.host.as_ref(),
            Tier::Disk => self.disk.as_ref(),
        }
    }

    fn store_mut(&mut self, tier: Tier) -> Option<&mut LazyArray<Tag>> {
        match tier {
            Tier::Device => None,
            Tier::Host => self.host.as_mut(),
            Tier::Disk => self.disk.as_mut(),
        }
    }

    fn capacity_blocks(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Device => 0,
            Tier::Host => self.host_blocks,
            Tier::Disk => self.disk_blocks,
        }
    }
}

fn describe(op: &TierOp) -> String {
    let what = if op.to.tier == Tier::Device {
        "onload"
    } else if op.from.tier == Tier::Device {
        "offload"
    } else {
        "move"
    };
    let side = |l: BlockLoc| match l.tier {
        Tier::Device => format!("device block {}", l.slot),
        t => format!("{} slot {}", t.name(), l.slot),
    };
    format!(
        "{what} of {} tokens {} → {}",
        op.tokens,
        side(op.from),
        side(op.to)
    )
}

impl Shadow {
    /// Make the tier stores once the block size is known (paged runs).
    pub(super) fn ensure_tier_stores(&mut self, block_size: u32) {
        for tier in [Tier::Host, Tier::Disk] {
            let blocks = self.tiers.capacity_blocks(tier);
            if blocks == 0 {
                continue;
            }
            let len = u64::from(blocks) * u64::from(block_size);
            match LazyArray::zeroed(len) {
                Some(a) => match tier {
                    Tier::Host => self.tiers.host = Some(a),
                    _ => self.tiers.disk = Some(a),
                },
                None => self.violation(format!(
                    "the shadow payload tracks at most {MAX_ENTRIES} slots, the {} tier has \
                     {len} (run with --no-shadow)",
                    tier.name()
                )),
            }
        }
    }

    /// The step's tier transfers, in order, before its copies, swaps and streams.
    #[inline(never)]
    pub(super) fn tier_ops(&mut self, ops: &[TierOp], step: u64) {
        for op in ops {
            self.tier_op(op, step);
        }
    }

    fn tier_op(&mut self, op: &TierOp, step: u64) {
        if let Err(why) = self.tier_op_fits(op) {
            self.violation(format!("step {step}: {}: {why}", describe(op)));
            return;
        }
        let mut buf = std::mem::take(&mut self.tiers.buf);
        self.read_block(op.from, op.tokens, &mut buf);
        match op.to.tier {
            // From a lower tier (both ends in one tier was refused).
            Tier::Device => {
                self.report.onloads += 1;
                self.store_device_block(op.to.slot, &buf, step);
                self.tiers.pending.push(Pending {
                    from: op.from,
                    block: op.to.slot,
                    tokens: op.tokens,
                    step,
                });
            }
            tier => {
                self.report.offloads += 1;
                let base = u64::from(op.to.slot) * u64::from(self.grain);
                if let Some(store) = self.tiers.store_mut(tier) {
                    for (j, &t) in buf.iter().enumerate() {
                        if let Some(x) = store.get_mut(base + j as u64) {
                            *x = t;
                        }
                    }
                }
                if self.tiers.has_pending() {
                    self.onload_late(op.to, step);
                }
            }
        }
        self.tiers.buf = buf;
    }

    /// Why `op` cannot be carried out as stated, if it cannot.
    fn tier_op_fits(&self, op: &TierOp) -> Result<(), String> {
        if self.mode != Some(CacheMode::Paged) {
            return Err("lower tiers hold paged blocks, this run is contiguous".into());
        }
        if op.tokens > self.grain {
            return Err(format!("a block holds {} tokens", self.grain));
        }
        if op.from.tier == op.to.tier {
            return Err("both ends are in the same tier".into());
        }
        for end in [op.from, op.to] {
            let (blocks, what) = match end.tier {
                Tier::Device => (
                    self.tags.len() / u64::from(self.grain),
                    "the device".to_string(),
                ),
                t => {
                    if self.tiers.store(t).is_none() {
                        return Err(format!("the run set up no {} tier", t.name()));
                    }
                    (
                        u64::from(self.tiers.capacity_blocks(t)),
                        format!("the {} tier", t.name()),
                    )
                }
            };
            if u64::from(end.slot) >= blocks {
                return Err(format!("{what} has {blocks} blocks"));
            }
        }
        Ok(())
    }

    /// Tags of the first `tokens` slots of block `at` into `out` (cleared first).
    fn read_block(&self, at: BlockLoc, tokens: u32, out: &mut Vec<Tag>) {
        out.clear();
        let base = u64::from(at.slot) * u64::from(self.grain);
        let store = match at.tier {
            Tier::Device => Some(&self.tags),
            t => self.tiers.store(t),
        };
        out.extend((0..u64::from(tokens)).map(|j| {
            store
                .and_then(|s| s.get(base + j))
                .copied()
                .unwrap_or(Tag::EMPTY)
        }));
    }

    /// Tags into device block `block` from its first slot on. One look at the reverse index: a
    /// block nobody's checked context covers (a fresh one, almost always) takes a blind store,
    /// otherwise tag by tag through [`Shadow::write`], which invalidates what it must.
    fn store_device_block(&mut self, block: u32, tags: &[Tag], step: u64) {
        let g = u64::from(block);
        let base = g * u64::from(self.grain);
        if self.readers.unread(g) {
            for (j, &t) in tags.iter().enumerate() {
                if let Some(x) = self.tags.get_mut(base + j as u64) {
                    *x = t;
                }
            }
            self.report.written_slots += tags.len() as u64;
        } else {
            for (j, &t) in tags.iter().enumerate() {
                self.write(base + j as u64, t, u32::MAX, step);
            }
        }
    }

    /// Tier slot `at` was just written: every onload from it still in flight copies its new
    /// content, as an onload that ran after the write would have.
    fn onload_late(&mut self, at: BlockLoc, step: u64) {
        let mut buf = Vec::new();
        for i in 0..self.tiers.pending.len() {
            let p = self.tiers.pending[i];
            if p.from != at {
                continue;
            }
            self.read_block(p.from, p.tokens, &mut buf);
            self.store_device_block(p.block, &buf, step);
        }
    }

    /// Step `completed - 1` completed: its onloads have run.
    #[inline(never)]
    pub(super) fn tier_step_done(&mut self) {
        let done = self.completed;
        self.tiers.pending.retain(|p| p.step >= done);
    }
}
