//! The paged KV cache manager (PagedAttention-style).
//!
//! # Lifecycle of one physical block
//!
//! - **Creation.** All blocks exist from [`PagedCache::new`] on, `Free`, ref count 0.
//! - **Taking a reference.** `start` maps fresh blocks for the uncached part of the prompt
//!   (ref 1 each) and revives prefix hits (a `Cached` or `Pending` block goes back to ref 1, a
//!   `Mapped` one gains a reference); `append` maps a fresh block when the last one is full;
//!   `fork` adds one reference to every block of the parent.
//! - **Copy-on-write.** `append` into a partially filled block whose ref count is above 1 maps a
//!   fresh block for the writer, returns the copy (`src_slot = old × block_size`, `len` = filled
//!   slots) and drops the writer's reference on the shared block.
//! - **Dropping references.** `release` (finish, cancel, preempt) drops one reference per table
//!   entry, tail block first. The last reference moves the block to `Pending`, fenced on the
//!   newest in-flight step (or straight to `Cached`/`Free` when nothing is in flight).
//! - **Handing out again.** A `Pending` block becomes `Cached` (it carries a prefix key, and goes
//!   to the eviction policy's set) or `Free` only after every step up to its fence retired.
//!   New content is written only into `Free` blocks or evicted `Cached` ones (the policy's victim
//!   first, `cache.eviction`;
//!   eviction unpublishes the key — and, with lower tiers, offloads the block first: `tier.rs`).
//!   A prefix hit may map a `Cached` or `Pending` block again
//!   because its content is immutable and identical.
//! - **The prefix cache holds no reference.** A cached block has ref count 0; the index only
//!   names it. So the invariant is: ref count = number of block-table entries naming the block.
//!
//! All state transitions live in `block.rs`; the state itself in `state.rs`, the steps the
//! operations share in `paged_ops.rs`; this file is the `KvCacheManager` implementation.

use std::sync::Arc;

use kvbench_cache_api::{
    Accounting, AllocError, CacheMode, CopyOp, Fault, KeyedTokens, KvCacheManager, PrefixHit,
    PrefixStats, Probe, ReleaseReason, SeqId, SeqLayout, StartRequest, Started, StepId, Tier,
    TierHits, TierOp, TierStats,
};

use super::check::{check_paged, quiescent_paged};
use super::state::PagedCache;
use super::table::Seq;
use super::tier::{carried, Tiers};

impl KvCacheManager for PagedCache {
    fn mode(&self) -> CacheMode {
        CacheMode::Paged
    }

    fn block_size(&self) -> u32 {
        self.bs()
    }

    fn probe_start(&self, req: &StartRequest<'_>) -> Probe {
        match self.plan_start(req) {
            Ok(plan) => {
                let onload_blocks = plan
                    .hits
                    .iter()
                    .filter(|h| h.loc.tier != Tier::Device)
                    .count() as u32;
                Probe {
                    cached_tokens: plan.hits.len() as u32 * self.bs(),
                    new_slots: u64::from(plan.new_blocks) * u64::from(self.bs()),
                    fits: plan.new_blocks <= plan.available_blocks,
                    onload_tokens: onload_blocks * self.bs(),
                }
            }
            Err(_) => Probe::default(),
        }
    }

    fn start(&mut self, req: &StartRequest<'_>) -> Result<Started, AllocError> {
        let plan = self.plan_start(req)?;
        if plan.new_blocks > plan.available_blocks {
            return Err(AllocError::NoSpace {
                needed_slots: u64::from(plan.new_blocks) * u64::from(self.bs()),
                available_slots: u64::from(plan.available_blocks) * u64::from(self.bs()),
            });
        }
        let bs = self.bs();
        // Lower-tier hits are pinned before any fresh block is taken: the offloads those takes
        // cause must not overwrite a slot this start is about to onload.
        let mut onloads = Vec::new();
        if let Some(tiers) = self.tiers.as_mut() {
            for (i, h) in plan.hits.iter().enumerate() {
                if h.loc.tier != Tier::Device {
                    if let Some(entry) = tiers.pin_hit(h.loc, &h.key) {
                        onloads.push((i, entry));
                    }
                }
            }
            tiers.count_lookups(&plan.hits, plan.missed);
        }
        for h in plan.hits.iter().filter(|h| h.loc.tier == Tier::Device) {
            self.pool.revive(h.loc.slot);
        }
        let mut blocks = Vec::with_capacity(plan.total_blocks_needed as usize);
        let mut hits = Vec::with_capacity(plan.hits.len());
        let mut tier_hits = TierHits::default();
        let mut onloads = onloads.into_iter().peekable();
        for (i, h) in plan.hits.iter().enumerate() {
            let block = if h.loc.tier == Tier::Device {
                h.loc.slot
            } else {
                let fresh = self
                    .take_fresh(blocks.last().copied())
                    .ok_or_else(|| self.no_space(1))?;
                // The onload writes the whole block before anything reads it.
                self.pool.note_written(fresh, bs);
                if let Some((_, entry)) = onloads.next_if(|(j, _)| *j == i) {
                    self.publish_onloaded(fresh, h.key, i as u32, entry);
                }
                if let Some(t) = self.tiers.as_mut() {
                    t.onload(h.loc, fresh, req.seq);
                }
                match h.loc.tier {
                    Tier::Disk => tier_hits.disk_tokens += bs,
                    _ => tier_hits.host_tokens += bs,
                }
                fresh
            };
            blocks.push(block);
            if let (Some(p), Some(scope)) = (self.index.get(&h.key), &plan.scope) {
                hits.push(PrefixHit {
                    block,
                    tokens: bs,
                    scope: scope.key.clone(),
                    publisher: p.publisher,
                });
            }
        }
        let fresh_blocks = plan.total_blocks_needed - plan.hits.len() as u32;
        for _ in 0..fresh_blocks {
            // Checked above: enough free or evictable blocks.
            let block = self
                .take_fresh(blocks.last().copied())
                .ok_or_else(|| self.no_space(1))?;
            blocks.push(block);
        }
        let cached_tokens = plan.hits.len() as u32 * bs;
        if plan.scope.is_some() {
            let stats = &mut self.index.stats;
            stats.lookups += 1;
            stats.lookup_tokens += req.tokens.len() as u64;
            stats.hit_blocks += plan.hits.len() as u64;
            stats.hit_tokens += u64::from(cached_tokens);
        }
        let prompt: Arc<[u32]> = if plan.scope.is_some() {
            req.tokens.into()
        } else {
            Arc::from([])
        };
        self.seqs.insert(
            req.seq,
            Seq {
                blocks: blocks.into(),
                len_tokens: req.tokens.len() as u32,
                filled_tokens: cached_tokens,
                prompt,
                generated: Vec::new(),
                scope: plan.scope,
                keyed_blocks: plan.hits.len() as u32,
                last_key: plan.hits.last().map(|h| h.key),
                bad_layout: None,
            },
        );
        self.refresh_bad_layout(req.seq);
        Ok(Started {
            cached_tokens,
            hits,
            tier_hits,
        })
    }

    fn fill(&mut self, seq_id: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        let bs = self.bs();
        let seq = self
            .seqs
            .get_mut(&seq_id)
            .ok_or(AllocError::UnknownSeq(seq_id))?;
        let new_filled = seq
            .filled_tokens
            .checked_add(n_tokens)
            .filter(|&f| f <= seq.len_tokens)
            .ok_or(AllocError::InvalidOp {
                seq: seq_id,
                reason: "fill past the started tokens",
            })?;
        if n_tokens == 0 {
            return Ok(());
        }
        let first = seq.filled_tokens / bs;
        let last = (new_filled - 1) / bs;
        for bi in first..=last {
            let written = (new_filled - bi * bs).min(bs);
            let block = seq.blocks[bi as usize];
            if self.pool.meta[block as usize].ref_count > 1 {
                // Unreachable through the API (fork needs a filled parent; hits are full blocks).
                self.violations.push(format!(
                    "fill of seq {seq_id} wrote block {block}, which is shared"
                ));
            }
            self.pool.note_written(block, written);
        }
        seq.filled_tokens = new_filled;
        self.publish_full_blocks(seq_id);
        Ok(())
    }

    fn append(&mut self, seq_id: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let bs = self.bs();
        let seq = self
            .seqs
            .get(&seq_id)
            .ok_or(AllocError::UnknownSeq(seq_id))?;
        if seq.filled_tokens != seq.len_tokens {
            return Err(AllocError::InvalidOp {
                seq: seq_id,
                reason: "append before the prompt is filled",
            });
        }
        let pos = seq.len_tokens;
        let (bi, offset) = ((pos / bs) as usize, pos % bs);
        let mut copies = Vec::new();
        if offset == 0 {
            let block = self
                .take_fresh(seq.blocks.last().copied())
                .ok_or_else(|| self.no_space(1))?;
            self.pool.note_written(block, 1);
            let seq = self
                .seqs
                .get_mut(&seq_id)
                .ok_or(AllocError::UnknownSeq(seq_id))?;
            seq.blocks.push(block);
        } else {
            let shared = seq.blocks[bi];
            if self.pool.meta[shared as usize].ref_count > 1 && !self.faults.skip_cow {
                let before = bi.checked_sub(1).map(|i| seq.blocks[i]);
                let fresh = self.take_fresh(before).ok_or_else(|| self.no_space(1))?;
                copies.push(CopyOp {
                    src_slot: u64::from(shared) * u64::from(bs),
                    dst_slot: u64::from(fresh) * u64::from(bs),
                    len_tokens: offset,
                });
                self.pool.note_written(fresh, offset + 1);
                self.pool.drop_ref(shared);
                if let Some(seq) = self.seqs.get_mut(&seq_id) {
                    seq.blocks.set(bi, fresh);
                }
            } else {
                if self.pool.meta[shared as usize].ref_count > 1 {
                    self.faults.skipped_copies += 1;
                    self.note_violation(format!(
                        "append of seq {seq_id} wrote slot {offset} of block {shared} shared by {} holders \
                         without copy-on-write",
                        self.pool.meta[shared as usize].ref_count
                    ));
                }
                self.pool.note_written(shared, offset + 1);
            }
        }
        let seq = self
            .seqs
            .get_mut(&seq_id)
            .ok_or(AllocError::UnknownSeq(seq_id))?;
        seq.len_tokens += 1;
        seq.filled_tokens += 1;
        self.refresh_bad_layout(seq_id);
        Ok(copies)
    }

    fn append_token(&mut self, seq_id: SeqId, token: u32) -> Result<Vec<CopyOp>, AllocError> {
        let position = self.seqs.get(&seq_id).map(|s| s.len_tokens);
        let copies = self.append(seq_id)?;
        let bs = self.bs();
        if let (Some(position), Some(seq)) = (position, self.seqs.get_mut(&seq_id)) {
            // Keys follow the known tokens only: once an `append` came without its token (the
            // step that sampled it still in flight), every later token would be keyed one
            // position off, naming a block that holds another token. The chain stops there.
            let known = (seq.prompt.len() + seq.generated.len()) as u32;
            if seq.scope.is_some() && known == position {
                seq.generated.push(token);
                if seq.filled_tokens.is_multiple_of(bs) {
                    self.publish_full_blocks(seq_id);
                }
            }
        }
        Ok(copies)
    }

    fn keyed_tokens(&self, seq: SeqId) -> Option<KeyedTokens<'_>> {
        let s = self.seqs.get(&seq)?;
        s.scope.as_ref()?;
        Some(KeyedTokens {
            head: &s.prompt,
            tail: &s.generated,
        })
    }

    fn append_cost(&self, seq_id: SeqId) -> u64 {
        let bs = self.bs();
        let Some(seq) = self.seqs.get(&seq_id) else {
            return 0;
        };
        let pos = seq.len_tokens;
        if pos % bs == 0 {
            return u64::from(bs);
        }
        let block = seq.blocks[(pos / bs) as usize];
        if self.pool.meta[block as usize].ref_count > 1 && !self.faults.skip_cow {
            u64::from(bs)
        } else {
            0
        }
    }

    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        if self.seqs.contains_key(&child) {
            return Err(AllocError::DuplicateSeq(child));
        }
        let mut seq = self
            .seqs
            .get(&parent)
            .ok_or(AllocError::UnknownSeq(parent))?
            .clone();
        if seq.filled_tokens != seq.len_tokens {
            // Continuations branch after prefill; sharing a half-written block would let two
            // holders write it without copy-on-write.
            return Err(AllocError::InvalidOp {
                seq: parent,
                reason: "fork before the prompt is filled",
            });
        }
        for &block in &seq.blocks {
            self.pool.add_ref(block);
        }
        seq.bad_layout = None;
        self.seqs.insert(child, seq);
        self.refresh_bad_layout(child);
        Ok(Vec::new())
    }

    fn release(&mut self, seq_id: SeqId, _why: ReleaseReason) -> Result<(), AllocError> {
        let seq = self
            .seqs
            .remove(&seq_id)
            .ok_or(AllocError::UnknownSeq(seq_id))?;
        if self.faults.leak && !self.faults.leaked_once {
            // Fires once: `leaked_once` is the count.
            self.faults.leaked_once = true;
            return Ok(());
        }
        // Tail first, so under `lru` a sequence's prefix blocks are evicted after its tail.
        for &block in seq.blocks.iter().rev() {
            self.pool.drop_ref(block);
        }
        Ok(())
    }

    fn begin_step(&mut self) -> StepId {
        let step = self.pool.begin_step();
        if let Some(tiers) = self.tiers.as_mut() {
            tiers.begin_step(step);
        }
        step
    }

    fn retire_step(&mut self, step: StepId) {
        if !self.pool.retire_step(step) {
            self.violations
                .push(format!("retire of step {step}, which is not in flight"));
        }
        if let Some(tiers) = self.tiers.as_mut() {
            tiers.retire(self.pool.fence.watermark());
        }
    }

    fn layout(&self, seq: SeqId) -> Option<SeqLayout<'_>> {
        let s = self.seqs.get(&seq)?;
        if s.bad_layout.is_some() {
            self.bad_layouts_read.set(self.bad_layouts_read.get() + 1);
        }
        let blocks = s.bad_layout.as_ref().unwrap_or(&s.blocks);
        Some(SeqLayout::Paged {
            block_size: self.bs(),
            blocks,
        })
    }

    fn seq_tokens(&self, seq: SeqId) -> Option<u32> {
        self.seqs.get(&seq).map(|s| s.filled_tokens)
    }

    fn accounting(&self) -> Accounting {
        let bs = u64::from(self.bs());
        let p = &self.pool;
        Accounting {
            total_slots: u64::from(p.total_blocks()) * bs,
            live_slots: p.live_slots,
            allocated_unfilled_slots: u64::from(p.mapped_blocks) * bs - p.live_slots,
            cached_free_slots: u64::from(p.cached_blocks) * bs,
            pending_free_slots: u64::from(p.pending_blocks) * bs,
            free_slots: u64::from(p.free_blocks()) * bs,
        }
    }

    fn prefix_stats(&self) -> PrefixStats {
        self.index.stats
    }

    fn largest_free_extent(&self) -> u64 {
        u64::from(self.pool.free_blocks()) * u64::from(self.bs())
    }

    fn flush_prefix_cache(&mut self) {
        for key in self.pool.flush_cached() {
            self.index.remove(&key);
        }
        if let Some(tiers) = self.tiers.as_mut() {
            tiers.flush();
        }
    }

    fn drain_tier_ops(&mut self, out: &mut Vec<TierOp>) {
        if let Some(tiers) = self.tiers.as_mut() {
            // Write-through: blocks written by a step that has begun since the last drain.
            for (block, key) in tiers.take_write_through_due() {
                let m = &self.pool.meta[block as usize];
                if m.key != Some(key) {
                    continue; // evicted (and offloaded, if need be) meanwhile
                }
                if let Some(e) = self.index.get(&key) {
                    tiers.write_through(block, carried(key, e, m.depth, m.hits));
                }
            }
            tiers.drain(out);
        }
    }

    fn tier_stats(&self) -> Vec<TierStats> {
        self.tiers.as_ref().map_or_else(Vec::new, Tiers::stats)
    }

    fn check_invariants(&self) -> Result<(), String> {
        check_paged(self)
    }

    fn assert_quiescent(&self) -> Result<(), String> {
        quiescent_paged(self)
    }

    fn fault_fired(&self) -> u64 {
        self.faults.skipped_copies
            + u64::from(self.faults.leaked_once)
            + self.pool.fences_ignored
            + self.bad_layouts_read.get()
            + self.tiers.as_ref().map_or(0, Tiers::stale_reuses)
    }

    fn inject_fault(&mut self, fault: Fault) {
        match fault {
            Fault::SkipCow => self.faults.skip_cow = true,
            Fault::EarlyReuse => self.pool.ignore_fence = true,
            Fault::Leak => self.faults.leak = true,
            Fault::BadBlockTable => {
                self.faults.bad_block_table = true;
                let mut ids: Vec<SeqId> = self.seqs.keys().copied().collect();
                ids.sort_unstable();
                for id in ids {
                    self.refresh_bad_layout(id);
                }
            }
            Fault::StaleOnload => {
                if let Some(tiers) = self.tiers.as_mut() {
                    tiers.skip_pins = true;
                }
            }
            // No recurrent-state checkpoints here.
            Fault::CheckpointOffByOne => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use kvbench_cache_api::{KvCacheManager, ReuseScope, ScopeKey, StartRequest};

    use crate::cache::{PagedCache, PagedConfig, Placement};

    fn one_token_blocks() -> PagedCache {
        PagedCache::new(PagedConfig {
            total_blocks: 32,
            block_size: 1,
            prefix_cache: true,
            placement: Placement::Lifo,
        })
    }

    fn scope() -> ScopeKey {
        ScopeKey {
            model: "m".into(),
            tokenizer: "t".into(),
            reuse: ReuseScope::Global,
        }
    }

    /// An append whose token is not known yet (with pipelined steps, the step that sampled it
    /// is still in flight) stops the sequence's keys: the next known token must not key the
    /// block the unknown one was written to, or a prompt with that token would hit a block that
    /// holds another.
    #[test]
    fn an_append_without_its_token_stops_the_keys() {
        let scope = scope();
        let mut cache = one_token_blocks();
        let start = |seq, tokens: &'static [u32]| StartRequest {
            seq,
            tokens,
            scope: Some(&scope),
            reserve_tokens: 8,
        };
        cache.start(&start(1, &[5])).unwrap();
        cache.fill(1, 1).unwrap();
        cache.append(1).unwrap(); // position 1 holds a token still in flight
        cache.append_token(1, 7).unwrap(); // position 2 holds 7
        cache.append_token(1, 9).unwrap();
        let probe = cache.probe_start(&start(2, &[5, 7, 9, 11]));
        assert_eq!(
            probe.cached_tokens, 1,
            "only the prompt's block may hit: [5, 7] was never written at positions 0..2"
        );
        // Known tokens from the start key every block they complete.
        cache.start(&start(3, &[5])).unwrap();
        cache.fill(3, 1).unwrap();
        cache.append_token(3, 7).unwrap();
        cache.append_token(3, 9).unwrap();
        let probe = cache.probe_start(&start(4, &[5, 7, 9, 11]));
        assert_eq!(probe.cached_tokens, 3);
    }
}
