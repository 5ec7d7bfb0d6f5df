//! The steps the paged manager's operations share: plan a start, take a fresh block (unpublishing
//! an evicted one), publish full blocks (prompt and generated) and, with the bad-block-table fault
//! armed, corrupt a layout. Builds on `state.rs`; `paged.rs` calls it.

use kvbench_cache_api::{AllocError, SeqId, StartRequest};

use super::block::BlockState;
use super::prefix::{Published, ScopeInfo};
use super::state::PagedCache;
use super::table::StartPlan;

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
        let hits = match (&scope, len) {
            (Some(s), 1..) => {
                // The last prompt token is always recomputed to produce logits.
                let max_blocks = ((len - 1) / u64::from(bs)) as usize;
                self.index.lookup(s, req.tokens, bs, max_blocks)
            }
            _ => Vec::new(),
        };
        let revived_cached = hits
            .iter()
            .filter(|(b, _)| self.pool.meta[*b as usize].state == BlockState::Cached)
            .count() as u32;
        Ok(StartPlan {
            scope,
            new_blocks: total_needed as u32 - hits.len() as u32,
            available_blocks: self.pool.allocatable_blocks() - revived_cached,
            total_blocks_needed: total_needed as u32,
            hits,
        })
    }

    /// Take a block for new content (placed after `after`, the sequence's previous block),
    /// unpublishing it if it was an evicted cached block.
    pub(super) fn take_fresh(&mut self, after: Option<u32>) -> Option<u32> {
        let (block, evicted) = self.pool.take_fresh(after)?;
        if let Some(key) = evicted {
            self.index.remove(&key);
            self.index.stats.evictions += 1;
        }
        Some(block)
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
            bad[0] = wrong;
            bad
        });
    }
}
