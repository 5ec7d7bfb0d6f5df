//! The steps the paged manager's operations share: plan a start, take a fresh block (unpublishing
//! an evicted one), publish full blocks (prompt and generated) and, with the bad-block-table fault
//! armed, corrupt a layout. Builds on `state.rs`; `paged.rs` calls it.

use kvbench_cache_api::{AllocError, BlockLoc, SeqId, StartRequest, Tier};

use super::block::BlockState;
use super::prefix::{PrefixKey, Published, ScopeInfo};
use super::state::PagedCache;
use super::table::StartPlan;
use super::tier::{Carried, PlannedHit};

/// At most this many violation messages are kept (a fault can repeat on every step).
const MAX_VIOLATIONS: usize = 64;

impl PagedCache {
    /// Record a protocol error or fault effect for `check_invariants` to report.
    pub(super) fn note_violation(&mut self, what: String) {
        if self.violations.len() < MAX_VIOLATIONS {
            self.violations.push(what);
        }
    }

    pub(super) fn bs(&self) -> u32 {
        self.pool.block_size
    }

    pub(super) fn plan_start(&self, req: &StartRequest<'_>) -> Result<StartPlan, AllocError> {
        if self.seqs.contains_key(&req.seq) {
            return Err(AllocError::DuplicateSeq(req.seq));
        }
        let bs = self.bs();
        let len = req.tokens.len() as u64;
        let total_needed = len.div_ceil(u64::from(bs));
        if total_needed > u64::from(self.pool.total_blocks()) {
            return Err(AllocError::TooLarge {
                needed_slots: total_needed * u64::from(bs),
                total_slots: u64::from(self.pool.total_blocks()) * u64::from(bs),
            });
        }
        let scope = if self.config.prefix_cache {
            req.scope.and_then(ScopeInfo::new)
        } else {
            None
        };
        // The last prompt token is always recomputed to produce logits.
        let max_blocks = if len > 0 {
            ((len - 1) / u64::from(bs)) as usize
        } else {
            0
        };
        let (hits, missed) = match &scope {
            Some(s) if len > 0 => self.lookup_chain(s, req.tokens, max_blocks),
            _ => (Vec::new(), false),
        };
        let device_hits = hits.iter().filter(|h| h.loc.tier == Tier::Device).count() as u32;
        let revived_cached = hits
            .iter()
            .filter(|h| {
                h.loc.tier == Tier::Device
                    && self.pool.meta[h.loc.slot as usize].state == BlockState::Cached
            })
            .count() as u32;
        Ok(StartPlan {
            scope,
            new_blocks: total_needed as u32 - device_hits,
            available_blocks: self.pool.allocatable_blocks() - revived_cached,
            total_blocks_needed: total_needed as u32,
            hits,
            missed,
        })
    }

    /// The prompt's leading full blocks found, at most `max_blocks`: the device index alone
    /// without tiers; with tiers the chain continues block by block into the host tier, then
    /// disk (a hit at depth i needs hits at 0..i, in whatever tier), each hit verified by
    /// tokens, scope and parent. Also says whether the chain stopped on a miss.
    fn lookup_chain(
        &self,
        scope: &ScopeInfo,
        tokens: &[u32],
        max_blocks: usize,
    ) -> (Vec<PlannedHit>, bool) {
        let bs = self.bs();
        let device = |slot| BlockLoc {
            tier: Tier::Device,
            slot,
        };
        let Some(tiers) = &self.tiers else {
            let hits: Vec<PlannedHit> = self
                .index
                .lookup(scope, tokens, bs, max_blocks)
                .into_iter()
                .map(|(b, key)| PlannedHit {
                    loc: device(b),
                    key,
                })
                .collect();
            return (hits, false);
        };
        let mut hits = Vec::new();
        let mut parent: Option<PrefixKey> = None;
        for chunk in tokens.chunks_exact(bs as usize).take(max_blocks) {
            let key = self.index.block_key(parent.as_ref(), scope, chunk);
            let verify = |p: &Published| self.index.verify(p, parent.as_ref(), scope, chunk);
            let loc = match self.index.get(&key) {
                Some(p) if verify(p) => Some(device(p.block)),
                _ => tiers.lookup(&key, verify),
            };
            let Some(loc) = loc else {
                return (hits, true);
            };
            hits.push(PlannedHit { loc, key });
            parent = Some(key);
        }
        (hits, false)
    }

    /// Take a block for new content (placed after `after`, the sequence's previous block),
    /// unpublishing it if it was an evicted cached block.
    pub(super) fn take_fresh(&mut self, after: Option<u32>) -> Option<u32> {
        let (block, evicted) = self.pool.take_fresh(after)?;
        if let Some(ev) = evicted {
            let entry = self.index.remove(&ev.key);
            self.index.stats.evictions += 1;
            if let (Some(tiers), Some(entry)) = (self.tiers.as_mut(), entry) {
                // Emitted now: before whatever op (onload, copy, the step's writes) reuses it.
                tiers.offload_evicted(
                    block,
                    Carried {
                        key: ev.key,
                        entry,
                        depth: ev.depth,
                        hits: ev.hits,
                    },
                );
            }
        }
        Some(block)
    }

    /// Publish the fresh device block an onload fills as a hit block (content identical to the
    /// lower tier's copy, which stays: the tiers are inclusive).
    pub(super) fn publish_onloaded(
        &mut self,
        block: u32,
        key: PrefixKey,
        depth: u32,
        entry: Published,
    ) {
        if self.index.contains(&key) {
            // A different device block already sits under this key (it failed verification):
            // leave this one unpublished rather than orphan the other.
            return;
        }
        self.pool.touch(block);
        let m = &mut self.pool.meta[block as usize];
        m.key = Some(key);
        m.depth = depth;
        m.hits = 1;
        self.index.insert(key, Published { block, ..entry });
    }

    pub(super) fn no_space(&self, needed_blocks: u32) -> AllocError {
        AllocError::NoSpace {
            needed_slots: u64::from(needed_blocks) * u64::from(self.bs()),
            available_slots: u64::from(self.pool.allocatable_blocks()) * u64::from(self.bs()),
        }
    }

    /// Publish newly full blocks of `seq_id` whose token ids are known (prompt, then generated).
    pub(super) fn publish_full_blocks(&mut self, seq_id: SeqId) {
        let bs = self.bs();
        let Some(seq) = self.seqs.get_mut(&seq_id) else {
            return;
        };
        let Some(scope) = seq.scope.clone() else {
            return;
        };
        let full_blocks = seq.filled_tokens / bs;
        let known_blocks = (seq.prompt.len() + seq.generated.len()) as u32 / bs;
        let mut straddle = Vec::new();
        while seq.keyed_blocks < full_blocks.min(known_blocks) {
            let i = seq.keyed_blocks as usize;
            let (lo, hi) = (i * bs as usize, (i + 1) * bs as usize);
            let p = seq.prompt.len();
            let chunk: &[u32] = if hi <= p {
                &seq.prompt[lo..hi]
            } else if lo >= p {
                &seq.generated[lo - p..hi - p]
            } else {
                straddle.clear();
                straddle.extend_from_slice(&seq.prompt[lo..]);
                straddle.extend_from_slice(&seq.generated[..hi - p]);
                &straddle
            };
            let key = self.index.block_key(seq.last_key.as_ref(), &scope, chunk);
            let block = seq.blocks[i];
            let meta = &mut self.pool.meta[block as usize];
            if meta.key.is_none() && !self.index.contains(&key) {
                meta.key = Some(key);
                self.pool.touched.get_mut().touch(block);
                meta.depth = i as u32;
                self.index.insert(
                    key,
                    Published {
                        block,
                        parent: seq.last_key,
                        tokens: chunk.into(),
                        scope: scope.clone(),
                        publisher: seq_id,
                    },
                );
                if let Some(t) = self.tiers.as_mut() {
                    t.note_published(block, key);
                }
            }
            seq.last_key = Some(key);
            seq.keyed_blocks += 1;
        }
    }

    /// With the bad-block-table fault armed, give `seq` a layout whose first logical block names a
    /// physical block outside its table.
    pub(super) fn refresh_bad_layout(&mut self, seq_id: SeqId) {
        if !self.faults.bad_block_table {
            return;
        }
        let total = self.pool.total_blocks();
        let Some(seq) = self.seqs.get_mut(&seq_id) else {
            return;
        };
        seq.bad_layout = seq.blocks.first().map(|&first| {
            let mut wrong = (first + 1) % total;
            for _ in 0..total {
                if !seq.blocks.contains(&wrong) {
                    break;
                }
                wrong = (wrong + 1) % total;
            }
            let mut bad = seq.blocks.clone();
            bad.set(0, wrong);
            bad
        });
    }
}
