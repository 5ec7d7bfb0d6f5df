//! `HybridKv`: the hybrid manager behind the engine's [`KvCacheManager`] trait.
//!
//! It drives a [`HybridCache`] through the trait's protocol: `start` maps every prompt token's
//! pages in every table and takes a recurrent state's pages from the same pool; `fill` writes a
//! prefill chunk and trims the sliding tables by the tokens written *before* the chunk (its
//! first queries still read that window); `append` maps and writes one decoded token, copying a
//! shared partial last page first, and trims by the tokens written before it (the step writing
//! it reads them); `fork` shares every page of a filled parent and takes state pages of its
//! own, copied from the parent's (one `CopyOp` a page); `restore` (a swap-in) writes every token
//! at once and trims the sliding tables by all of them; `release` drops everything. A page or
//! state whose last holder lets go while a step is in flight waits on the pool's fence
//! (`pool.rs`), so nothing a running step may touch is handed out again.
//!
//! The prefix cache (`cached.rs`) publishes each table's full blocks as they are written and
//! shares them at start where `prefix_hit_tokens`' rule allows; the rest of the prompt is
//! mapped fresh and written from the hit on. A recurrent model's writes that pass a checkpoint
//! position take a state's pages for the step to save it (`state_checkpoints` names them), and a
//! hit resumes from the deepest indexed checkpoint; both are held by the sequence until the next
//! `begin_step`, when the saved ones are indexed and every one goes cached-free behind that
//! step's fence. A start holds its hit's pages before it takes its state's, so taking the state
//! cannot evict them.
//!
//! **Accounting** is in slots of `page_bytes / page_slots` bytes (the grouped unit of
//! `kvbench_cache_api::grouped`): a held page is `page_slots` slots, `⌊written × page_slots /
//! block_tokens⌋` of them live (a shared page counted once), the rest allocated-unfilled; a
//! held state's pages are `state_slots` live (its bytes, rounded up to slots), the rest of
//! them allocated-unfilled; fenced pages are pending, whatever they held. The pool is
//! `pages × page_slots` slots; a sequence can hold at most every table's pages whole plus its
//! state (`sequence_slots`), and a swap moves the pages holding what a step still reads
//! (`grouped::swap_pages`) plus the state (`swap_slots`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use kvbench_cache_api::{
    Accounting, AllocError, CacheMode, CopyOp, Fault, GroupTable, KeyedTokens, KvCacheManager,
    PrefixStats, Probe, ReleaseReason, SeqId, SeqLayout, StartRequest, Started, StateCheckpoint,
    StateCheckpoints, StepId, TableShape,
};

use serde::{Deserialize, Serialize};

use super::cached::{Lookup, PrefixCache};
use super::check_incremental::Incremental;
use super::error::HybridError;
use super::layout::HybridLayout;
use super::manager::{HybridCache, PageCopy};
use super::pool::PageId;

/// A recurrent-state checkpoint a sequence holds until the next step begins: one that step
/// saves (`publish`: the key and scope it is indexed under once saved), or the one its prefix
/// hit resumes from, which that step restores (`publish: None`).
#[derive(Debug, Clone)]
pub(crate) struct HeldCheckpoint {
    pub(crate) tokens: u64,
    pub(crate) pages: Vec<PageId>,
    pub(crate) publish: Option<(
        crate::cache::prefix::PrefixKey,
        std::sync::Arc<crate::cache::prefix::ScopeInfo>,
    )>,
}

/// The planted bugs of [`Fault`] this manager honours, and how often they took effect.
#[derive(Debug, Clone, Default)]
pub(crate) struct KvFaults {
    pub(crate) leak: bool,
    /// `Leak` fires once: the first release keeps its pages and state.
    pub(crate) leaked_once: bool,
    pub(crate) bad_block_table: bool,
    /// Hits `CheckpointOffByOne` moved a block past their checkpoint.
    pub(crate) checkpoint_shifted: u64,
}

/// The hybrid paged manager as the engine drives it (see the module doc).
#[derive(Debug)]
pub struct HybridKv {
    pub(crate) cache: HybridCache,
    pub(crate) shapes: Vec<TableShape>,
    /// Slots one sequence's recurrent state counts for live (0 without a recurrent group).
    pub(crate) state_slots: u64,
    /// Pages one sequence's recurrent state takes from the pool (0 without a recurrent group).
    pub(crate) state_pages: u64,
    pub(crate) faults: KvFaults,
    /// With `BadBlockTable` armed: the corrupted tables `layout` hands out instead.
    pub(crate) bad_layouts: BTreeMap<SeqId, Vec<GroupTable>>,
    pub(crate) bad_layouts_read: Cell<u64>,
    /// Protocol errors and planted bugs seen as they happened, reported by `check_invariants`.
    pub(crate) violations: Vec<String>,
    pub(crate) prefix: PrefixCache,
    /// What the last invariant check saw, so the next checks only what changed.
    pub(crate) incremental: RefCell<Incremental>,
    /// Whether a start may evict a protected block's cached pages (`cache.evict_protected`).
    pub(crate) evict_protected: EvictProtected,
    /// Per sequence, the checkpoints it holds until the next step begins.
    pub(crate) checkpoints_held: BTreeMap<SeqId, Vec<HeldCheckpoint>>,
    /// Per sequence started from a checkpoint: which, and the tokens the hit claims.
    pub(crate) resume: BTreeMap<SeqId, StateCheckpoint>,
    /// Checkpoints saved (published) so far.
    pub(crate) checkpoints_saved: u64,
    /// Prefix hits that resumed from a checkpoint.
    pub(crate) checkpoint_resumes: u64,
    /// Checkpoint pages in the pool as each step began: the most, the sum and the steps.
    pub(crate) checkpoint_pages_peak: u64,
    pub(crate) checkpoint_page_steps: u128,
    pub(crate) steps_begun: u64,
}

/// Whether a start may evict the cached pages of a *protected* block — one a running sequence
/// still holds in another table, typically a shared prompt's sliding pages released behind the
/// window while its full pages stay held (`cache.evict_protected`, the hybrid manager only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictProtected {
    /// Any allocation may, once no wholly cached-free block is left (the historical behaviour).
    #[default]
    Always,
    /// Only a running sequence growing (a fill, an append) may; a start (an admission or a
    /// swap-in) takes free pages and unprotected blocks' pages only, and waits otherwise.
    ToGrow,
}

impl EvictProtected {
    pub fn name(self) -> &'static str {
        match self {
            EvictProtected::Always => "always",
            EvictProtected::ToGrow => "to_grow",
        }
    }
}

impl HybridKv {
    pub fn new(layout: HybridLayout) -> HybridKv {
        let pool = layout.paged_pool();
        HybridKv {
            shapes: pool.shapes,
            state_slots: pool.state.slots_per_sequence(),
            state_pages: u64::from(pool.state.pages_per_sequence()),
            cache: HybridCache::new(layout),
            faults: KvFaults::default(),
            bad_layouts: BTreeMap::new(),
            bad_layouts_read: Cell::new(0),
            violations: Vec::new(),
            prefix: PrefixCache::default(),
            incremental: RefCell::new(Incremental::default()),
            evict_protected: EvictProtected::Always,
            checkpoints_held: BTreeMap::new(),
            resume: BTreeMap::new(),
            checkpoints_saved: 0,
            checkpoint_resumes: 0,
            checkpoint_pages_peak: 0,
            checkpoint_page_steps: 0,
            steps_begun: 0,
        }
    }

    /// Keep a recurrent model's state every `every_blocks` blocks (0: never, so no prefix hit;
    /// ignored without a recurrent group): a block here is the grain of a hit, the least
    /// common multiple of the tables' block tokens (the block size when every table stores the
    /// same bytes a token).
    pub fn with_checkpoints(mut self, every_blocks: u32) -> HybridKv {
        let layout = self.cache.layout();
        self.prefix.checkpoint_tokens = if layout.state_bytes_per_sequence == 0 {
            0
        } else {
            super::prefix::block_step(layout).saturating_mul(u64::from(every_blocks))
        };
        self
    }

    /// Tokens between two checkpoints (0: none kept).
    pub fn checkpoint_tokens(&self) -> u64 {
        self.prefix.checkpoint_tokens
    }

    /// Checkpoints saved so far, and those the index keeps now (tests read it).
    pub fn checkpoint_counts(&self) -> (u64, usize) {
        (self.checkpoints_saved, self.prefix.checkpoints_kept())
    }

    /// `seq` wrote positions `before .. upto` by computing them: take a checkpoint's pages for
    /// each checkpoint position past `before` up to `upto` that the index lacks, while the pool
    /// has them (a checkpoint is a cache: one that does not fit is not kept).
    fn take_checkpoints(&mut self, seq: SeqId, before: u64, upto: u64) {
        let ct = self.prefix.checkpoint_tokens;
        if ct == 0 || self.state_pages == 0 {
            return;
        }
        let mut c = (before / ct + 1) * ct;
        while c <= upto {
            let tokens = c;
            c += ct;
            let Some(publish) = self.prefix.checkpoint_key(seq, tokens) else {
                continue;
            };
            let pool = &mut self.cache.pool;
            if u64::from(pool.available()) < self.state_pages {
                break;
            }
            let mut pages = Vec::with_capacity(self.state_pages as usize);
            for _ in 0..self.state_pages {
                // No tokens a page: a checkpoint counts no live slots and is always "full".
                match pool.take(0) {
                    Ok(p) => pages.push(p),
                    Err(e) => {
                        self.violations
                            .push(format!("checkpoint of seq {seq} at {tokens}: {e:?}"));
                        break;
                    }
                }
            }
            if let Some(entry) = self.cache.seqs.get_mut(&seq) {
                entry.checkpoint.extend_from_slice(&pages);
            }
            self.checkpoints_held
                .entry(seq)
                .or_default()
                .push(HeldCheckpoint {
                    tokens,
                    pages,
                    publish: Some(publish),
                });
        }
        self.prefix.sync(&mut self.cache.pool);
    }

    /// A step began: the checkpoints it saves are indexed, and every checkpoint page held for
    /// it goes back behind its fence (cached-free if indexed).
    fn settle_checkpoints(&mut self) {
        for (seq, held) in std::mem::take(&mut self.checkpoints_held) {
            let Some(entry) = self.cache.seqs.get_mut(&seq) else {
                continue;
            };
            entry.checkpoint.clear();
            for h in held {
                if let Some(publish) = h.publish {
                    let pool = &mut self.cache.pool;
                    if self
                        .prefix
                        .publish_checkpoint(pool, seq, h.tokens, publish, &h.pages)
                    {
                        self.checkpoints_saved += 1;
                    }
                }
                for page in h.pages {
                    if let Err(e) = self.cache.pool.drop_ref(page) {
                        self.violations
                            .push(format!("checkpoint page {page} of seq {seq}: {e:?}"));
                    }
                }
            }
        }
    }

    /// The layout the manager was built from.
    pub fn hybrid_layout(&self) -> &HybridLayout {
        self.cache.layout()
    }

    /// The plain data the grouped contiguous baseline of the same run is built from (its
    /// states reserved up front, where this manager takes them from its pool).
    pub fn grouped_pool(&self) -> kvbench_cache_api::GroupedPool {
        self.cache.layout().grouped_pool()
    }

    /// The table shapes every sequence's layout names, in the layout's order.
    pub fn shapes(&self) -> &[TableShape] {
        &self.shapes
    }

    /// The underlying manager (read-only: pages, references, tables).
    pub fn cache(&self) -> &HybridCache {
        &self.cache
    }

    /// The pages of `seq`'s recurrent state (empty without a recurrent group).
    pub fn state_pages(&self, seq: SeqId) -> Option<&[u32]> {
        self.cache.seqs.get(&seq).map(|e| e.state.as_slice())
    }

    /// Tokens mapped for `seq` (a started prompt is mapped whole before it is written).
    pub fn mapped_tokens(&self, seq: SeqId) -> Option<u64> {
        self.cache.tokens(seq)
    }

    pub(crate) fn page_slots(&self) -> u64 {
        u64::from(self.cache.layout.block_size)
    }

    /// Pages a start of `prompt_tokens` takes: every table's, mapped whole, and the state's.
    fn start_pages(&self, prompt_tokens: u64) -> u64 {
        self.shapes
            .iter()
            .map(|s| prompt_tokens.div_ceil(u64::from(s.block_tokens.max(1))))
            .fold(self.state_pages, u64::saturating_add)
    }

    fn total_slots(&self) -> u64 {
        u64::from(self.cache.pool.pages()).saturating_mul(self.page_slots())
    }

    fn free_page_slots(&self) -> u64 {
        u64::from(self.cache.pool.free_count()) * self.page_slots()
    }

    /// A hybrid error as the trait's: space in slots, protocol errors by name.
    fn alloc_error(&self, seq: SeqId, e: HybridError) -> AllocError {
        match e {
            HybridError::UnknownSeq(s) => AllocError::UnknownSeq(s),
            HybridError::DuplicateSeq(s) => AllocError::DuplicateSeq(s),
            HybridError::OutOfPages { needed, .. } => AllocError::NoSpace {
                needed_slots: needed.saturating_mul(self.page_slots()),
                available_slots: self.free_page_slots(),
            },
            HybridError::Overflow(reason) | HybridError::Corrupt(reason) => {
                AllocError::InvalidOp { seq, reason }
            }
        }
    }

    fn copy_ops(&self, copies: &[PageCopy]) -> Vec<CopyOp> {
        let ps = self.page_slots();
        copies
            .iter()
            .map(|c| CopyOp {
                src_slot: u64::from(c.src) * ps,
                dst_slot: u64::from(c.dst) * ps,
                len_tokens: self.cache.layout.block_size,
            })
            .collect()
    }

    /// With `BadBlockTable` armed, give `seq` a layout whose first held page is one of no table
    /// of its own.
    fn refresh_bad_layout(&mut self, seq: SeqId) {
        if !self.faults.bad_block_table {
            return;
        }
        let Some(entry) = self.cache.seqs.get(&seq) else {
            self.bad_layouts.remove(&seq);
            return;
        };
        let pages = self.cache.pool.pages();
        let mut bad = entry.tables.clone();
        let Some((table, first)) = bad
            .iter_mut()
            .find_map(|t| t.pages.first().copied().map(|p| (t, p)))
        else {
            self.bad_layouts.remove(&seq);
            return;
        };
        let holds = |p: u32| entry.tables.iter().any(|t| t.pages.contains(&p));
        let mut wrong = (first + 1) % pages;
        for _ in 0..pages {
            if !holds(wrong) {
                break;
            }
            wrong = (wrong + 1) % pages;
        }
        table.pages.set(0, wrong);
        self.bad_layouts.insert(seq, bad);
    }

    /// Pages a start with `hit` takes fresh (the blocks after the hit over every table, and
    /// the state's), and whether they can be had now (the hit's own cached-free pages
    /// excluded).
    fn fresh_pages(&self, prompt_tokens: u64, hit: &Lookup) -> (u64, bool) {
        let h = hit.hit_tokens;
        let pages = self
            .shapes
            .iter()
            .map(|s| {
                let bt = u64::from(s.block_tokens.max(1));
                prompt_tokens.div_ceil(bt) - h / bt
            })
            .fold(self.state_pages, u64::saturating_add);
        let shared: Vec<u32> = hit.all_pages().collect();
        let avail = match self.evict_protected {
            EvictProtected::Always => self.cache.pool.available_except(&shared),
            EvictProtected::ToGrow => self.cache.pool.available_to_start(&shared),
        };
        (pages, pages <= u64::from(avail))
    }

    /// Share the hit's pages into `seq`'s (just started, empty) tables: it holds `h` tokens,
    /// written and trimmed.
    fn share_hit(&mut self, seq: SeqId, hit: &Lookup) -> Result<(), HybridError> {
        let cache = &mut self.cache;
        let entry = cache
            .seqs
            .get_mut(&seq)
            .ok_or(HybridError::UnknownSeq(seq))?;
        for (table, (first, pages)) in entry.tables.iter_mut().zip(&hit.pages) {
            for &page in pages {
                if cache.pool.is_cached_free(page) {
                    cache.pool.revive(page)?;
                } else {
                    cache.pool.share(page)?;
                    cache.pool.count_hit(page);
                }
                table.pages.push(page);
            }
            table.first_block = *first;
        }
        entry.tokens = hit.hit_tokens;
        entry.written = hit.hit_tokens;
        entry.trimmed = hit.hit_tokens;
        if let Some(pages) = &hit.checkpoint {
            for &page in pages {
                if cache.pool.is_cached_free(page) {
                    cache.pool.revive(page)?;
                } else {
                    cache.pool.share(page)?;
                    cache.pool.count_hit(page);
                }
            }
            entry.checkpoint.extend_from_slice(pages);
            let first = pages
                .first()
                .copied()
                .ok_or(HybridError::Corrupt("a checkpoint of no pages"))?;
            self.checkpoints_held
                .entry(seq)
                .or_default()
                .push(HeldCheckpoint {
                    tokens: hit.hit_tokens,
                    pages: pages.clone(),
                    publish: None,
                });
            self.resume.insert(
                seq,
                StateCheckpoint {
                    tokens: hit.hit_tokens,
                    page: first,
                },
            );
            self.faults.checkpoint_shifted += u64::from(hit.shifted);
            self.checkpoint_resumes += 1;
        }
        Ok(())
    }

    /// Publish `seq`'s newly full blocks (before any trim), then forget what the pool evicted.
    fn publish(&mut self, seq: SeqId) {
        if let Some(entry) = self.cache.seqs.get(&seq) {
            self.prefix
                .publish(&self.cache.layout, &mut self.cache.pool, seq, entry);
        }
    }

    /// Record the writes `SkipCow` let into shared pages since `before`.
    fn note_skipped(&mut self, seq: SeqId, before: u64) {
        let skipped = self.cache.skipped_copies - before;
        if skipped > 0 {
            self.violations.push(format!(
                "append of seq {seq} wrote {skipped} shared partial pages without copy-on-write"
            ));
        }
    }
}

impl KvCacheManager for HybridKv {
    fn mode(&self) -> CacheMode {
        CacheMode::Paged
    }

    fn block_size(&self) -> u32 {
        self.cache.layout.block_size
    }

    fn probe_start(&self, req: &StartRequest<'_>) -> Probe {
        if self.cache.seqs.contains_key(&req.seq) {
            return Probe::default();
        }
        let hit = self
            .prefix
            .lookup(&self.cache.layout, req.seq, req.scope, req.tokens);
        let (pages, fits) = self.fresh_pages(req.tokens.len() as u64, &hit);
        Probe {
            cached_tokens: u32::try_from(hit.hit_tokens).unwrap_or(u32::MAX),
            new_slots: pages.saturating_mul(self.page_slots()),
            fits,
            onload_tokens: 0,
        }
    }

    fn start(&mut self, req: &StartRequest<'_>) -> Result<Started, AllocError> {
        if self.cache.seqs.contains_key(&req.seq) {
            return Err(AllocError::DuplicateSeq(req.seq));
        }
        let prompt = req.tokens.len() as u64;
        let pages = self.start_pages(prompt);
        let needed_slots = pages.saturating_mul(self.page_slots());
        if pages > u64::from(self.cache.pool.pages()) {
            return Err(AllocError::TooLarge {
                needed_slots,
                total_slots: self.total_slots(),
            });
        }
        let hit = self
            .prefix
            .lookup(&self.cache.layout, req.seq, req.scope, req.tokens);
        let (fresh, fits) = self.fresh_pages(prompt, &hit);
        if !fits {
            let a = self.accounting();
            return Err(AllocError::NoSpace {
                needed_slots: fresh.saturating_mul(self.page_slots()),
                available_slots: a.free_slots + a.cached_free_slots,
            });
        }
        // Checked above: the fresh pages can be had (without a protected block's, where
        // those are kept), so this cannot refuse; if it did, the start is undone (the shared
        // pages go back where they were, cached-free or shared).
        let keep = self.evict_protected == EvictProtected::ToGrow;
        self.cache.pool.keep_protected(keep);
        // The hit's pages are held before the state's are taken, which may evict.
        let mapped = self.cache.start_stateless(req.seq).and_then(|()| {
            self.share_hit(req.seq, &hit)
                .and_then(|()| self.cache.take_state_of(req.seq))
                .and_then(|()| self.cache.map(req.seq, prompt - hit.hit_tokens))
                .inspect_err(|_| {
                    let _ = self.cache.release(req.seq);
                })
        });
        self.cache.pool.keep_protected(false);
        if let Err(e) = mapped {
            self.checkpoints_held.remove(&req.seq);
            self.resume.remove(&req.seq);
            self.prefix.sync(&mut self.cache.pool);
            return Err(self.alloc_error(req.seq, e));
        }
        self.prefix.sync(&mut self.cache.pool);
        if hit.scope.is_some() {
            let st = &mut self.prefix.stats;
            st.lookups += 1;
            st.lookup_tokens += prompt;
            st.hit_tokens += hit.hit_tokens;
            st.hit_blocks += hit.hits.len() as u64;
        }
        self.prefix
            .track(&self.cache.layout, req.seq, req.tokens, &hit);
        self.refresh_bad_layout(req.seq);
        Ok(Started {
            cached_tokens: u32::try_from(hit.hit_tokens).unwrap_or(u32::MAX),
            hits: hit.hits,
            ..Started::default()
        })
    }

    fn fill(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        let entry = self
            .cache
            .seqs
            .get(&seq)
            .ok_or(AllocError::UnknownSeq(seq))?;
        let before = entry.written;
        let upto = before
            .checked_add(u64::from(n_tokens))
            .filter(|&w| w <= entry.tokens)
            .ok_or(AllocError::InvalidOp {
                seq,
                reason: "fill past the started tokens",
            })?;
        if n_tokens == 0 {
            return Ok(());
        }
        self.cache
            .write(seq, upto)
            .map_err(|e| self.alloc_error(seq, e))?;
        self.publish(seq);
        self.cache
            .trim(seq, before)
            .map_err(|e| self.alloc_error(seq, e))?;
        self.take_checkpoints(seq, before, upto);
        self.refresh_bad_layout(seq);
        Ok(())
    }

    /// What its tables keep of `tokens` (a sliding table its window's blocks) and the state's
    /// bytes in slots: what a swap moves.
    fn swap_slots(&self, _seq: SeqId, tokens: u32) -> u64 {
        kvbench_cache_api::grouped::swap_pages(&self.shapes, u64::from(tokens))
            .saturating_mul(self.page_slots())
            .saturating_add(self.state_slots)
    }

    /// A swap-in's tokens are all written at once and the step after it reads only each
    /// sliding table's window of them: write them and trim by all of them, so the blocks
    /// behind the window go back now (fenced) instead of at the next append.
    fn restore(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        let entry = self
            .cache
            .seqs
            .get(&seq)
            .ok_or(AllocError::UnknownSeq(seq))?;
        if entry.written != 0 || u64::from(n_tokens) != entry.tokens {
            return Err(AllocError::InvalidOp {
                seq,
                reason: "restore of other than every started token of a fresh start",
            });
        }
        let upto = u64::from(n_tokens);
        self.cache
            .write(seq, upto)
            .map_err(|e| self.alloc_error(seq, e))?;
        self.publish(seq);
        self.cache
            .trim(seq, upto)
            .map_err(|e| self.alloc_error(seq, e))?;
        self.refresh_bad_layout(seq);
        Ok(())
    }

    fn append(&mut self, seq: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let entry = self
            .cache
            .seqs
            .get(&seq)
            .ok_or(AllocError::UnknownSeq(seq))?;
        if entry.written != entry.tokens {
            return Err(AllocError::InvalidOp {
                seq,
                reason: "append before the prompt is filled",
            });
        }
        let before = entry.written;
        let skipped = self.cache.skipped_copies;
        let copies = self
            .cache
            .map(seq, 1)
            .map_err(|e| self.alloc_error(seq, e))?;
        self.note_skipped(seq, skipped);
        self.prefix.sync(&mut self.cache.pool);
        self.cache
            .write(seq, before + 1)
            .map_err(|e| self.alloc_error(seq, e))?;
        self.publish(seq);
        self.cache
            .trim(seq, before)
            .map_err(|e| self.alloc_error(seq, e))?;
        self.take_checkpoints(seq, before, before + 1);
        self.refresh_bad_layout(seq);
        Ok(self.copy_ops(&copies))
    }

    fn append_token(&mut self, seq: SeqId, token: u32) -> Result<Vec<CopyOp>, AllocError> {
        // The token is known before the append publishes the block it completes; a refused
        // append takes it back.
        let position = self.cache.seqs.get(&seq).map_or(0, |e| e.written);
        let pushed = self.prefix.push_token(seq, token, position);
        let out = self.append(seq);
        if out.is_err() && pushed {
            self.prefix.pop_token(seq);
        }
        out
    }

    fn keyed_tokens(&self, seq: SeqId) -> Option<KeyedTokens<'_>> {
        self.prefix.keyed_tokens(seq)
    }

    fn append_cost(&self, seq: SeqId) -> u64 {
        let Some(entry) = self.cache.seqs.get(&seq) else {
            return 0;
        };
        let pages = self
            .cache
            .layout
            .tables
            .iter()
            .zip(&entry.tables)
            .filter(|(spec, table)| {
                let bt = u64::from(spec.block_tokens.max(1));
                entry.tokens % bt == 0 || self.cache.needs_cow(entry.tokens, bt, table)
            })
            .count() as u64;
        pages * self.page_slots()
    }

    /// Every table's pages at `tokens` tokens plus the recurrent state's. A sliding table counts
    /// every block up to `tokens`, not just its window: a prompt is mapped whole before it is
    /// written and trimmed, so a sequence that starts with a `tokens`-token prompt holds them
    /// all at once. For one grown by decoding this over-counts by the blocks behind the window.
    fn sequence_slots(&self, tokens: u64, _reserve_tokens: u32) -> u64 {
        self.start_pages(tokens).saturating_mul(self.page_slots())
    }

    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        if self.cache.seqs.contains_key(&child) {
            return Err(AllocError::DuplicateSeq(child));
        }
        let entry = self
            .cache
            .seqs
            .get(&parent)
            .ok_or(AllocError::UnknownSeq(parent))?;
        if entry.written != entry.tokens {
            // Sharing a half-written page would let two holders write it without a copy.
            return Err(AllocError::InvalidOp {
                seq: parent,
                reason: "fork before the prompt is filled",
            });
        }
        let copies = self
            .cache
            .fork_copies(parent, child)
            .map_err(|e| self.alloc_error(child, e))?;
        self.prefix.sync(&mut self.cache.pool);
        self.prefix.fork(parent, child);
        self.refresh_bad_layout(child);
        Ok(self.copy_ops(&copies))
    }

    fn release(&mut self, seq: SeqId, why: ReleaseReason) -> Result<(), AllocError> {
        if !self.cache.seqs.contains_key(&seq) {
            return Err(AllocError::UnknownSeq(seq));
        }
        self.bad_layouts.remove(&seq);
        // Checkpoints not saved yet go back unindexed with its pages.
        self.checkpoints_held.remove(&seq);
        self.resume.remove(&seq);
        let holds_any = self.state_pages > 0
            || self
                .cache
                .seqs
                .get(&seq)
                .is_some_and(|e| e.tables.iter().any(|t| !t.pages.is_empty()));
        if self.faults.leak && !self.faults.leaked_once && holds_any {
            // Fires once, on a sequence that holds something: it goes, its pages and state
            // stay referenced.
            self.faults.leaked_once = true;
            self.cache.seqs.remove(&seq);
            self.prefix.forget(seq, why);
            return Ok(());
        }
        self.prefix.forget(seq, why);
        self.cache
            .release(seq)
            .map_err(|e| self.alloc_error(seq, e))
    }

    fn begin_step(&mut self) -> StepId {
        let step = self.cache.pool.begin_step();
        self.settle_checkpoints();
        self.prefix.sync(&mut self.cache.pool);
        if self.prefix.checkpoint_tokens > 0 {
            let pages = (self.prefix.checkpoints_kept() as u64).saturating_mul(self.state_pages);
            self.checkpoint_pages_peak = self.checkpoint_pages_peak.max(pages);
            self.checkpoint_page_steps += u128::from(pages);
            self.steps_begun += 1;
        }
        step
    }

    fn retire_step(&mut self, step: StepId) {
        if !self.cache.pool.retire_step(step) {
            self.violations
                .push(format!("retire of step {step}, which is not in flight"));
        }
    }

    fn layout(&self, seq: SeqId) -> Option<SeqLayout<'_>> {
        let entry = self.cache.seqs.get(&seq)?;
        let tables = match self.bad_layouts.get(&seq) {
            Some(bad) => {
                self.bad_layouts_read.set(self.bad_layouts_read.get() + 1);
                bad
            }
            None => &entry.tables,
        };
        Some(SeqLayout::Grouped {
            page_slots: self.cache.layout.block_size,
            shapes: &self.shapes,
            tables,
        })
    }

    fn state_checkpoints(&self, seq: SeqId) -> StateCheckpoints {
        let save = self
            .checkpoints_held
            .get(&seq)
            .into_iter()
            .flatten()
            .filter(|h| h.publish.is_some())
            .filter_map(|h| {
                Some(StateCheckpoint {
                    tokens: h.tokens,
                    page: *h.pages.first()?,
                })
            })
            .collect();
        StateCheckpoints {
            resume: self.resume.get(&seq).copied(),
            save,
        }
    }

    fn seq_tokens(&self, seq: SeqId) -> Option<u32> {
        let written = self.cache.seqs.get(&seq)?.written;
        Some(u32::try_from(written).unwrap_or(u32::MAX))
    }

    fn accounting(&self) -> Accounting {
        let pool = &self.cache.pool;
        let ps = self.page_slots();
        let state_live = u64::from(pool.states_held()) * self.state_slots;
        let live = pool.live_slots() + state_live;
        Accounting {
            total_slots: self.total_slots(),
            live_slots: live,
            allocated_unfilled_slots: (u64::from(pool.held_pages()) * ps).saturating_sub(live),
            cached_free_slots: pool.cached_slots(),
            pending_free_slots: u64::from(pool.pending_pages()) * ps,
            free_slots: self.free_page_slots(),
        }
    }

    fn prefix_stats(&self) -> PrefixStats {
        let page_bytes = u128::from(self.cache.layout.page_bytes);
        let mean_pages = self.checkpoint_page_steps / u128::from(self.steps_begun.max(1));
        PrefixStats {
            checkpoint_tokens: self.prefix.checkpoint_tokens,
            checkpoints_saved: self.checkpoints_saved,
            checkpoint_resumes: self.checkpoint_resumes,
            checkpoint_bytes_peak: u64::try_from(
                u128::from(self.checkpoint_pages_peak).saturating_mul(page_bytes),
            )
            .unwrap_or(u64::MAX),
            checkpoint_bytes_mean: u64::try_from(mean_pages.saturating_mul(page_bytes))
                .unwrap_or(u64::MAX),
            ..self.prefix.stats
        }
    }

    /// The free pages' slots: every page is a whole extent, and a free state holds no token.
    fn largest_free_extent(&self) -> u64 {
        self.free_page_slots()
    }

    fn flush_prefix_cache(&mut self) {
        self.cache.pool.flush_cached();
        self.prefix.sync(&mut self.cache.pool);
    }

    /// Incremental: what changed since the last check, a full walk every
    /// `touched::walk_period` checks (see `check_incremental.rs`).
    fn check_invariants(&self) -> Result<(), String> {
        super::check_incremental::check(self)
    }

    fn assert_quiescent(&self) -> Result<(), String> {
        super::kv_check::quiescent(self)
    }

    fn inject_fault(&mut self, fault: Fault) {
        match fault {
            Fault::SkipCow => self.cache.skip_cow = true,
            Fault::EarlyReuse => self.cache.pool.ignore_fence = true,
            Fault::Leak => self.faults.leak = true,
            Fault::BadBlockTable => {
                self.faults.bad_block_table = true;
                let ids: Vec<SeqId> = self.cache.seqs.keys().copied().collect();
                for id in ids {
                    self.refresh_bad_layout(id);
                }
            }
            // No lower tier to go stale.
            Fault::StaleOnload => {}
            Fault::CheckpointOffByOne => self.prefix.checkpoint_off_by_one = true,
        }
    }

    fn fault_fired(&self) -> u64 {
        self.cache.skipped_copies
            + u64::from(self.faults.leaked_once)
            + self.cache.pool.fences_ignored
            + self.bad_layouts_read.get()
            + self.faults.checkpoint_shifted
    }
}
