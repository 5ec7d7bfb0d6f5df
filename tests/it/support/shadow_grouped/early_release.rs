//! A test double: sliding tables released one block too early.

use std::collections::BTreeMap;

use kvbench_cache_api::grouped::readable_from;
use kvbench_cache_api::{
    Accounting, AllocError, CacheMode, CopyOp, Fault, GroupTable, GroupedPool, KvCacheManager,
    PrefixStats, Probe, ReleaseReason, SeqId, SeqLayout, StartRequest, Started, StepId, TierOp,
    TierStats,
};

/// Hands out the inner manager's layouts with every sliding table's first needed block dropped
/// (the block holding the first position the window of the last written token reads), as a
/// manager that releases one block too early would. Every other call reaches the inner manager
/// as it is (a restore, a swap's price, a token appended), so only the cut is planted.
pub struct EarlyRelease {
    pub inner: Box<dyn KvCacheManager>,
    pub shapes: Vec<kvbench_cache_api::TableShape>,
    pub page_slots: u32,
    pub tables: BTreeMap<SeqId, Vec<GroupTable>>,
    pub fired: u64,
}

impl EarlyRelease {
    pub fn new(inner: Box<dyn KvCacheManager>, pool: &GroupedPool) -> EarlyRelease {
        EarlyRelease {
            inner,
            shapes: pool.shapes.clone(),
            page_slots: pool.page_slots,
            tables: BTreeMap::new(),
            fired: 0,
        }
    }

    /// Recompute every live sequence's handed-out tables from the inner manager's.
    pub fn refresh(&mut self) {
        let ids: Vec<SeqId> = self.tables.keys().copied().collect();
        for seq in ids {
            let Some(SeqLayout::Grouped { tables, .. }) = self.inner.layout(seq) else {
                self.tables.remove(&seq);
                continue;
            };
            let written = u64::from(self.inner.seq_tokens(seq).unwrap_or(0));
            let mut out = tables.to_vec();
            for (t, shape) in out.iter_mut().zip(&self.shapes) {
                if shape.window.is_none() {
                    continue;
                }
                let needed = readable_from(shape, written) / u64::from(shape.block_tokens.max(1));
                let early = needed + 1;
                if early > t.first_block && early < t.end_block() {
                    let drop = (early - t.first_block) as usize;
                    t.pages.drain_front(drop);
                    t.first_block = early;
                    self.fired += 1;
                }
            }
            self.tables.insert(seq, out);
        }
    }

    pub fn track(&mut self, seq: SeqId) {
        self.tables.insert(seq, Vec::new());
        self.refresh();
    }
}

impl KvCacheManager for EarlyRelease {
    fn mode(&self) -> CacheMode {
        self.inner.mode()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn probe_start(&self, req: &StartRequest<'_>) -> Probe {
        self.inner.probe_start(req)
    }
    fn start(&mut self, req: &StartRequest<'_>) -> Result<Started, AllocError> {
        let r = self.inner.start(req)?;
        self.track(req.seq);
        Ok(r)
    }
    fn fill(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        self.inner.fill(seq, n_tokens)?;
        self.refresh();
        Ok(())
    }
    fn restore(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        self.inner.restore(seq, n_tokens)?;
        self.refresh();
        Ok(())
    }
    fn swap_slots(&self, seq: SeqId, tokens: u32) -> u64 {
        self.inner.swap_slots(seq, tokens)
    }
    fn append(&mut self, seq: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.inner.append(seq)?;
        self.refresh();
        Ok(r)
    }
    fn append_token(&mut self, seq: SeqId, token: u32) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.inner.append_token(seq, token)?;
        self.refresh();
        Ok(r)
    }
    fn append_cost(&self, seq: SeqId) -> u64 {
        self.inner.append_cost(seq)
    }
    fn sequence_slots(&self, tokens: u64, reserve_tokens: u32) -> u64 {
        self.inner.sequence_slots(tokens, reserve_tokens)
    }
    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.inner.fork(parent, child)?;
        self.track(child);
        Ok(r)
    }
    fn release(&mut self, seq: SeqId, why: ReleaseReason) -> Result<(), AllocError> {
        self.inner.release(seq, why)?;
        self.tables.remove(&seq);
        self.refresh();
        Ok(())
    }
    fn begin_step(&mut self) -> StepId {
        self.inner.begin_step()
    }
    fn retire_step(&mut self, step: StepId) {
        self.inner.retire_step(step);
        self.refresh();
    }
    fn layout(&self, seq: SeqId) -> Option<SeqLayout<'_>> {
        let tables = self.tables.get(&seq)?;
        Some(SeqLayout::Grouped {
            page_slots: self.page_slots,
            shapes: &self.shapes,
            tables,
        })
    }
    fn seq_tokens(&self, seq: SeqId) -> Option<u32> {
        self.inner.seq_tokens(seq)
    }
    fn accounting(&self) -> Accounting {
        self.inner.accounting()
    }
    fn prefix_stats(&self) -> PrefixStats {
        self.inner.prefix_stats()
    }
    fn largest_free_extent(&self) -> u64 {
        self.inner.largest_free_extent()
    }
    fn flush_prefix_cache(&mut self) {
        self.inner.flush_prefix_cache();
    }
    fn drain_tier_ops(&mut self, out: &mut Vec<TierOp>) {
        self.inner.drain_tier_ops(out);
    }
    fn tier_stats(&self) -> Vec<TierStats> {
        self.inner.tier_stats()
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.inner.check_invariants()
    }
    fn assert_quiescent(&self) -> Result<(), String> {
        self.inner.assert_quiescent()
    }
    fn inject_fault(&mut self, fault: Fault) {
        self.inner.inject_fault(fault);
    }
    fn fault_fired(&self) -> u64 {
        self.fired
    }
}
