//! The contiguous KV cache baseline: one arena of token slots; each started sequence reserves one
//! contiguous region of `reserve_tokens` (first-fit, coalescing on free). No sharing: `fork`
//! copies the region. Released regions obey the same fence rule as paged blocks.
//!
//! Lifecycle of a region: `start`/`fork` carve it from the lowest free extent that fits; `fill`
//! and `append` write inside it (`append` past the reservation is `NoSpace`: the engine caps
//! output by reservation); `release` fences it on the newest in-flight step, and it rejoins the
//! free extents (merged with its neighbours) once every step up to that fence has retired.

mod arena;
mod by_id;
mod check;
mod grouped;
mod grouped_check;
mod grouped_seq;

pub use grouped::GroupedContiguous;

use std::collections::BTreeMap;

use kvbench_cache_api::fence::FenceQueue;
use kvbench_cache_api::{
    Accounting, AllocError, CacheMode, CopyOp, Fault, KvCacheManager, PrefixStats, Probe,
    ReleaseReason, SeqId, SeqLayout, StartRequest, Started, StepId,
};

use arena::Arena;
use by_id::{ById, Placed};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub base_slot: u64,
    pub capacity_tokens: u32,
    /// Token positions mapped (prompt + appended).
    pub len_tokens: u32,
    pub filled_tokens: u32,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Faults {
    pub early_reuse: bool,
    pub leak: bool,
    pub leaked_once: bool,
    pub bad_layout: bool,
}

#[derive(Debug)]
pub struct ContiguousCache {
    pub(crate) arena: Arena,
    /// BTreeMap: invariant reports iterate in sequence order.
    pub(crate) seqs: BTreeMap<SeqId, Region>,
    /// Where each live region lies, by id: what `layout` reads (kept with `seqs`).
    pub(crate) by_id: ById,
    /// Released regions (base, len) withheld behind fences.
    pub(crate) fence: FenceQueue<(u64, u64)>,
    pub(crate) pending_slots: u64,
    pub(crate) faults: Faults,
    /// With the early-reuse fault: regions freed at once, with the fence they ignored.
    pub(crate) early_freed: Vec<(u64, u64, StepId)>,
    pub(crate) violations: Vec<String>,
}

impl ContiguousCache {
    pub fn new(total_slots: u64) -> Self {
        ContiguousCache {
            arena: Arena::new(total_slots),
            seqs: BTreeMap::new(),
            by_id: ById::default(),
            fence: FenceQueue::new(),
            pending_slots: 0,
            faults: Faults::default(),
            early_freed: Vec::new(),
            violations: Vec::new(),
        }
    }

    /// Reserved slots of `seq` (its region's capacity).
    pub fn reservation(&self, seq: SeqId) -> Option<u32> {
        self.seqs.get(&seq).map(|r| r.capacity_tokens)
    }

    fn reserve_len(req: &StartRequest<'_>) -> u64 {
        u64::from(req.reserve_tokens).max(req.tokens.len() as u64)
    }

    /// Carve a region, noting (with the early-reuse fault armed) if it overlaps storage whose
    /// fence has not retired.
    fn allocate(&mut self, len: u64) -> Option<u64> {
        let base = self.arena.allocate(len)?;
        let fence = &self.fence;
        self.early_freed.retain(|&(_, _, f)| !fence.is_retired(f));
        for &(s, l, f) in &self.early_freed {
            if s < base + len && base < s + l && self.violations.len() < 64 {
                self.violations.push(format!(
                    "slots {base}..{} handed out while slots {s}..{} were fenced on in-flight step {f}",
                    base + len,
                    s + l
                ));
            }
        }
        Some(base)
    }

    /// A region enters `seqs`, and `by_id` with it.
    fn insert_region(&mut self, seq: SeqId, r: Region) {
        self.seqs.insert(seq, r);
        self.by_id.insert(
            seq,
            Placed {
                base_slot: r.base_slot,
                capacity_tokens: r.capacity_tokens,
            },
        );
    }

    /// Where `seq`'s region lies: from `by_id` for the ids it keeps, else from `seqs`.
    #[inline]
    pub(crate) fn placed(&self, seq: SeqId) -> Option<Placed> {
        if ById::covers(seq) {
            return self.by_id.get(seq);
        }
        self.seqs.get(&seq).map(|r| Placed {
            base_slot: r.base_slot,
            capacity_tokens: r.capacity_tokens,
        })
    }

    fn free_region(&mut self, base: u64, len: u64) {
        if let Some(step) = self.fence.newest_in_flight() {
            if self.faults.early_reuse {
                self.early_freed.push((base, len, step));
            } else {
                let handed_back = self.fence.defer((base, len));
                debug_assert!(handed_back.is_none());
                self.pending_slots += len;
                return;
            }
        }
        self.arena.free(base, len);
    }
}

impl KvCacheManager for ContiguousCache {
    fn mode(&self) -> CacheMode {
        CacheMode::Contiguous
    }

    fn block_size(&self) -> u32 {
        1
    }

    fn probe_start(&self, req: &StartRequest<'_>) -> Probe {
        let len = Self::reserve_len(req);
        let fits = !self.seqs.contains_key(&req.seq) && self.arena.find_first_fit(len).is_some();
        Probe {
            cached_tokens: 0,
            new_slots: len,
            fits,
            onload_tokens: 0,
        }
    }

    fn start(&mut self, req: &StartRequest<'_>) -> Result<Started, AllocError> {
        if self.seqs.contains_key(&req.seq) {
            return Err(AllocError::DuplicateSeq(req.seq));
        }
        let len = Self::reserve_len(req);
        if len > self.arena.total_slots() || len > u64::from(u32::MAX) {
            return Err(AllocError::TooLarge {
                needed_slots: len,
                total_slots: self.arena.total_slots(),
            });
        }
        let base = self.allocate(len).ok_or(AllocError::NoSpace {
            needed_slots: len,
            available_slots: self.arena.largest_extent(),
        })?;
        let region = Region {
            base_slot: base,
            capacity_tokens: len as u32,
            len_tokens: req.tokens.len() as u32,
            filled_tokens: 0,
        };
        self.insert_region(req.seq, region);
        Ok(Started::default())
    }

    fn fill(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        let r = self.seqs.get_mut(&seq).ok_or(AllocError::UnknownSeq(seq))?;
        r.filled_tokens = r
            .filled_tokens
            .checked_add(n_tokens)
            .filter(|&f| f <= r.len_tokens)
            .ok_or(AllocError::InvalidOp {
                seq,
                reason: "fill past the started tokens",
            })?;
        Ok(())
    }

    fn append(&mut self, seq: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.seqs.get_mut(&seq).ok_or(AllocError::UnknownSeq(seq))?;
        if r.filled_tokens != r.len_tokens {
            return Err(AllocError::InvalidOp {
                seq,
                reason: "append before the prompt is filled",
            });
        }
        if r.len_tokens >= r.capacity_tokens {
            return Err(AllocError::NoSpace {
                needed_slots: 1,
                available_slots: 0,
            });
        }
        r.len_tokens += 1;
        r.filled_tokens += 1;
        Ok(Vec::new())
    }

    fn append_cost(&self, seq: SeqId) -> u64 {
        match self.seqs.get(&seq) {
            Some(r) if r.len_tokens >= r.capacity_tokens => 1,
            _ => 0,
        }
    }

    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        if self.seqs.contains_key(&child) {
            return Err(AllocError::DuplicateSeq(child));
        }
        let p = *self
            .seqs
            .get(&parent)
            .ok_or(AllocError::UnknownSeq(parent))?;
        if p.filled_tokens != p.len_tokens {
            return Err(AllocError::InvalidOp {
                seq: parent,
                reason: "fork before the prompt is filled",
            });
        }
        let len = u64::from(p.capacity_tokens);
        let base = self.allocate(len).ok_or(AllocError::NoSpace {
            needed_slots: len,
            available_slots: self.arena.largest_extent(),
        })?;
        self.insert_region(
            child,
            Region {
                base_slot: base,
                ..p
            },
        );
        if p.filled_tokens == 0 {
            return Ok(Vec::new());
        }
        Ok(vec![CopyOp {
            src_slot: p.base_slot,
            dst_slot: base,
            len_tokens: p.filled_tokens,
        }])
    }

    fn release(&mut self, seq: SeqId, _why: ReleaseReason) -> Result<(), AllocError> {
        let r = self.seqs.remove(&seq).ok_or(AllocError::UnknownSeq(seq))?;
        self.by_id.remove(seq);
        if self.faults.leak && !self.faults.leaked_once {
            self.faults.leaked_once = true;
            return Ok(());
        }
        self.free_region(r.base_slot, u64::from(r.capacity_tokens));
        Ok(())
    }

    fn begin_step(&mut self) -> StepId {
        self.fence.begin_step()
    }

    fn retire_step(&mut self, step: StepId) {
        let mut released = Vec::new();
        if !self.fence.try_retire(step, &mut released) {
            self.violations
                .push(format!("retire of step {step}, which is not in flight"));
        }
        for (base, len) in released {
            self.pending_slots -= len;
            self.arena.free(base, len);
        }
    }

    fn layout(&self, seq: SeqId) -> Option<SeqLayout<'_>> {
        let r = self.placed(seq)?;
        // The planted bad-block-table fault shifts the region by one slot.
        let base_slot = r.base_slot + u64::from(self.faults.bad_layout);
        Some(SeqLayout::Contiguous {
            base_slot,
            capacity_tokens: r.capacity_tokens,
        })
    }

    fn seq_tokens(&self, seq: SeqId) -> Option<u32> {
        self.seqs.get(&seq).map(|r| r.filled_tokens)
    }

    fn accounting(&self) -> Accounting {
        let (mut live, mut reserved) = (0u64, 0u64);
        for r in self.seqs.values() {
            live += u64::from(r.filled_tokens);
            reserved += u64::from(r.capacity_tokens);
        }
        Accounting {
            total_slots: self.arena.total_slots(),
            live_slots: live,
            allocated_unfilled_slots: reserved - live,
            cached_free_slots: 0,
            pending_free_slots: self.pending_slots,
            free_slots: self.arena.free_slots(),
        }
    }

    fn prefix_stats(&self) -> PrefixStats {
        PrefixStats::default()
    }

    fn largest_free_extent(&self) -> u64 {
        self.arena.largest_extent()
    }

    fn flush_prefix_cache(&mut self) {}

    fn check_invariants(&self) -> Result<(), String> {
        check::check(self)
    }

    fn assert_quiescent(&self) -> Result<(), String> {
        check::quiescent(self)
    }

    fn inject_fault(&mut self, fault: Fault) {
        match fault {
            // Nothing is ever shared, so there is no copy to skip.
            Fault::SkipCow => {}
            Fault::EarlyReuse => self.faults.early_reuse = true,
            Fault::Leak => self.faults.leak = true,
            Fault::BadBlockTable => self.faults.bad_layout = true,
            // The baseline has no lower tier: nothing is ever onloaded.
            Fault::StaleOnload | Fault::CheckpointOffByOne => {}
        }
    }
}
