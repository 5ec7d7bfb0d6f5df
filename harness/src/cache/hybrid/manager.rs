//! `HybridCache`: one shared page pool, one block table per layout table per sequence, and the
//! lifecycle of a sequence's pages — mapped, written, shared by a fork (copy-on-write of a
//! partial last block when either side appends), released wholly out of a sliding window once
//! written past it, released at the end. Recurrent state is pages of the pool, taken at start
//! or fork (a fork's copied from its parent's) and given back at release. An operation either succeeds whole or is refused
//! with nothing changed.
//!
//! Mapping (`map`), writing (`write`) and trimming (`trim`) are separate steps so the trait
//! manager ([`super::HybridKv`]) can map a prompt whole at start and trim its sliding tables
//! only as chunks are written; `append` is the three at once.

use std::collections::BTreeMap;

use kvbench_cache_api::SeqId;

use super::error::HybridError;
use super::layout::{HybridLayout, TableKind};
use super::pool::{PageId, PagePool};
use super::table::{GroupTable, SeqEntry};

/// A bug the property tests plant to prove they catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HybridFault {
    /// Sliding tables keep blocks that left the window.
    KeepOutOfWindow,
    /// The prefix cache publishes every block a sequence has mapped, not only the ones it has
    /// written: a prompt's blocks are in the index (and a later prompt may share them) while
    /// the chunk that writes them has not run. Only [`super::HybridKv`] honours it (the bare
    /// manager has no prefix cache); the invariants catch a published page not fully written.
    PublishEarly,
}

/// A page the backend must copy before the step writes into `dst` (copy-on-write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageCopy {
    pub table: usize,
    pub src: PageId,
    pub dst: PageId,
}

#[derive(Debug, Clone)]
pub struct HybridCache {
    pub(crate) layout: HybridLayout,
    pub(crate) pool: PagePool,
    pub(crate) seqs: BTreeMap<SeqId, SeqEntry>,
    pub(crate) copies: Vec<PageCopy>,
    pub(crate) fault: Option<HybridFault>,
    /// Test fault (the trait's `SkipCow`): write into a shared partial block in place.
    pub(crate) skip_cow: bool,
    /// Writes `skip_cow` let into a shared block.
    pub(crate) skipped_copies: u64,
}

impl HybridCache {
    pub fn new(layout: HybridLayout) -> HybridCache {
        HybridCache {
            pool: PagePool::new(
                layout.pages,
                layout.block_size,
                layout.state_pages_per_sequence,
            ),
            layout,
            seqs: BTreeMap::new(),
            copies: Vec::new(),
            fault: None,
            skip_cow: false,
            skipped_copies: 0,
        }
    }

    /// Plant a bug (tests only: proves the checks catch it).
    pub fn plant_fault(&mut self, fault: HybridFault) {
        self.fault = Some(fault);
    }

    pub fn layout(&self) -> &HybridLayout {
        &self.layout
    }

    pub fn free_pages(&self) -> u32 {
        self.pool.free_count()
    }

    /// Pages neither free nor pending behind a fence.
    pub fn used_pages(&self) -> u32 {
        self.pool.held_pages()
    }

    /// References to `page` from block tables (`None` out of range).
    pub fn page_refs(&self, page: PageId) -> Option<u32> {
        self.pool.refs(page)
    }

    /// Recurrent state bytes held now (in pages of the pool).
    pub fn state_bytes_held(&self) -> u64 {
        self.layout
            .state_bytes_per_sequence
            .saturating_mul(self.pool.states_held() as u64)
    }

    pub fn states_held(&self) -> u32 {
        self.pool.states_held()
    }

    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied()
    }

    pub fn tokens(&self, seq: SeqId) -> Option<u64> {
        self.seqs.get(&seq).map(|e| e.tokens)
    }

    /// `seq`'s table for layout table `table`.
    pub fn table(&self, seq: SeqId, table: usize) -> Option<&GroupTable> {
        self.seqs.get(&seq)?.tables.get(table)
    }

    /// The copies the last operations asked for, oldest first.
    pub fn take_copies(&mut self) -> Vec<PageCopy> {
        std::mem::take(&mut self.copies)
    }

    /// A new sequence of no tokens (its recurrent state's pages taken).
    pub fn start(&mut self, seq: SeqId) -> Result<(), HybridError> {
        if self.seqs.contains_key(&seq) {
            return Err(HybridError::DuplicateSeq(seq));
        }
        let state = self.pool.take_state()?;
        let entry = SeqEntry {
            tables: vec![GroupTable::default(); self.layout.tables.len()],
            state,
            ..SeqEntry::default()
        };
        self.seqs.insert(seq, entry);
        Ok(())
    }

    /// A new sequence of no tokens and, for now, no state: a start that shares a prefix hit
    /// takes the hit's pages before the state's ([`Self::take_state_of`]), so that taking the
    /// state cannot evict them.
    pub(crate) fn start_stateless(&mut self, seq: SeqId) -> Result<(), HybridError> {
        if self.seqs.contains_key(&seq) {
            return Err(HybridError::DuplicateSeq(seq));
        }
        let entry = SeqEntry {
            tables: vec![GroupTable::default(); self.layout.tables.len()],
            ..SeqEntry::default()
        };
        self.seqs.insert(seq, entry);
        Ok(())
    }

    /// `seq`'s recurrent state's pages, taken now (after [`Self::start_stateless`]).
    pub(crate) fn take_state_of(&mut self, seq: SeqId) -> Result<(), HybridError> {
        if !self.seqs.contains_key(&seq) {
            return Err(HybridError::UnknownSeq(seq));
        }
        let state = self.pool.take_state()?;
        if let Some(entry) = self.seqs.get_mut(&seq) {
            entry.state = state;
        }
        Ok(())
    }

    /// Pages `append(seq, n)` (or `map(seq, n)`) would take: a copy of each shared partial
    /// last block it writes into, and every new logical block (a prefill chunk's blocks live
    /// until it is written, even those the window leaves behind at its end).
    pub fn pages_needed(&self, seq: SeqId, n: u64) -> Result<u64, HybridError> {
        let entry = self.seqs.get(&seq).ok_or(HybridError::UnknownSeq(seq))?;
        let new_tokens = entry
            .tokens
            .checked_add(n)
            .ok_or(HybridError::Overflow("tokens"))?;
        let mut needed = 0u64;
        for (spec, table) in self.layout.tables.iter().zip(&entry.tables) {
            let bt = spec.block_tokens as u64;
            let cow = u64::from(n > 0 && self.needs_cow(entry.tokens, bt, table));
            let fresh = new_tokens.div_ceil(bt) - entry.tokens.div_ceil(bt);
            needed = needed
                .checked_add(cow + fresh)
                .ok_or(HybridError::Overflow("pages needed"))?;
        }
        Ok(needed)
    }

    /// Whether writing position `tokens` of a table with `bt`-token blocks copies its last page
    /// first: a partial last block that another sequence shares.
    pub(crate) fn needs_cow(&self, tokens: u64, bt: u64, table: &GroupTable) -> bool {
        let partial = !tokens.is_multiple_of(bt);
        let shared = table
            .last_page()
            .and_then(|p| self.pool.refs(p))
            .is_some_and(|r| r > 1);
        // Counted even with `skip_cow` armed: the planted bug is the write, not the estimate.
        partial && shared
    }

    /// Map `n` more positions of `seq`: a copy of each shared partial last block (the copies
    /// returned), fresh pages for new blocks. Nothing is trimmed or written.
    pub(crate) fn map(&mut self, seq: SeqId, n: u64) -> Result<Vec<PageCopy>, HybridError> {
        let needed = self.pages_needed(seq, n)?;
        let free = self.pool.available();
        if needed > free as u64 {
            return Err(HybridError::OutOfPages { needed, free });
        }
        let Some(entry) = self.seqs.get_mut(&seq) else {
            return Err(HybridError::UnknownSeq(seq));
        };
        let old = entry.tokens;
        let new_tokens = old + n; // checked by pages_needed
        let mut copies = Vec::new();
        for (t, (spec, table)) in self.layout.tables.iter().zip(&mut entry.tables).enumerate() {
            let bt = spec.block_tokens as u64;
            if n > 0 && old % bt != 0 {
                if let Some(last) = table.pages.last().copied() {
                    if self.pool.refs(last).is_some_and(|r| r > 1) {
                        if self.skip_cow {
                            self.skipped_copies += 1;
                        } else {
                            let dst = self.pool.take(spec.block_tokens)?;
                            let carried = self.pool.written(last).unwrap_or(0);
                            self.pool.note_written(dst, carried)?;
                            copies.push(PageCopy {
                                table: t,
                                src: last,
                                dst,
                            });
                            self.pool.drop_ref(last)?;
                            table.pages.set(table.pages.len() - 1, dst);
                        }
                    }
                }
            }
            for _ in old.div_ceil(bt)..new_tokens.div_ceil(bt) {
                table.pages.push(self.pool.take(spec.block_tokens)?);
            }
        }
        entry.tokens = new_tokens;
        Ok(copies)
    }

    /// The first `upto` mapped positions of `seq` are written (at least those written before).
    pub(crate) fn write(&mut self, seq: SeqId, upto: u64) -> Result<(), HybridError> {
        let entry = self
            .seqs
            .get_mut(&seq)
            .ok_or(HybridError::UnknownSeq(seq))?;
        if upto > entry.tokens || upto < entry.written {
            return Err(HybridError::Corrupt(
                "write outside the mapped, unwritten tokens",
            ));
        }
        let from = entry.written;
        for (spec, table) in self.layout.tables.iter().zip(&entry.tables) {
            let bt = spec.block_tokens as u64;
            for block in from / bt..upto.div_ceil(bt) {
                let Some(i) = block
                    .checked_sub(table.first_block)
                    .and_then(|i| usize::try_from(i).ok())
                else {
                    continue; // trimmed: only ever behind `trimmed ≤ from`
                };
                let Some(&page) = table.pages.get(i) else {
                    return Err(HybridError::Corrupt("write past the mapped blocks"));
                };
                let in_page = (upto - block * bt).min(bt) as u32;
                self.pool.note_written(page, in_page)?;
            }
        }
        entry.written = upto;
        Ok(())
    }

    /// Sliding tables let go of the blocks wholly before the window of the first `upto`
    /// written tokens (`upto ≤ written`; a smaller `upto` than before changes nothing).
    pub(crate) fn trim(&mut self, seq: SeqId, upto: u64) -> Result<(), HybridError> {
        let entry = self
            .seqs
            .get_mut(&seq)
            .ok_or(HybridError::UnknownSeq(seq))?;
        if upto > entry.written {
            return Err(HybridError::Corrupt("trim past the written tokens"));
        }
        let upto = upto.max(entry.trimmed);
        if self.fault != Some(HybridFault::KeepOutOfWindow) {
            for (spec, table) in self.layout.tables.iter().zip(&mut entry.tables) {
                if !matches!(spec.kind, TableKind::Sliding { .. }) {
                    continue;
                }
                let (first, _) = spec.held_blocks(upto);
                let gone = first.saturating_sub(table.first_block);
                let gone = usize::try_from(gone).map_err(|_| HybridError::Overflow("blocks"))?;
                for page in table.pages.drain_front(gone) {
                    self.pool.drop_ref(page)?;
                }
                table.first_block = table.first_block.max(first);
            }
        }
        entry.trimmed = upto;
        Ok(())
    }

    /// `n` more tokens of `seq`, mapped and written: copy-on-write of shared partial last
    /// blocks, fresh pages for new blocks, then the sliding tables' blocks that left the window
    /// go back.
    pub fn append(&mut self, seq: SeqId, n: u64) -> Result<(), HybridError> {
        let copies = self.map(seq, n)?;
        self.copies.extend(copies);
        let tokens = self.seqs.get(&seq).map_or(0, |e| e.tokens);
        self.write(seq, tokens)?;
        self.trim(seq, tokens)
    }

    /// `child` shares every page `parent` holds (and gets a recurrent state of its own, a copy
    /// of the parent's: its copies are queued as [`HybridCache::take_copies`] hands out).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), HybridError> {
        let copies = self.fork_copies(parent, child)?;
        self.copies.extend(copies);
        Ok(())
    }

    /// [`HybridCache::fork`], returning the copies of the parent's state pages into the
    /// child's (table index `layout.tables.len()`: no table's).
    pub(crate) fn fork_copies(
        &mut self,
        parent: SeqId,
        child: SeqId,
    ) -> Result<Vec<PageCopy>, HybridError> {
        if self.seqs.contains_key(&child) {
            return Err(HybridError::DuplicateSeq(child));
        }
        let mut entry = self
            .seqs
            .get(&parent)
            .ok_or(HybridError::UnknownSeq(parent))?
            .clone();
        let state = self.pool.take_state()?;
        let copies = entry
            .state
            .iter()
            .zip(&state)
            .map(|(&src, &dst)| PageCopy {
                table: self.layout.tables.len(),
                src,
                dst,
            })
            .collect();
        entry.state = state;
        // The parent's checkpoints stay the parent's.
        entry.checkpoint.clear();
        for table in &entry.tables {
            for &page in &table.pages {
                self.pool.share(page)?;
            }
        }
        self.seqs.insert(child, entry);
        Ok(copies)
    }

    /// Every page and the state of `seq` go back (behind the fence of the steps in flight).
    /// Tail first, as the summed manager releases: a block's last page goes (and the block
    /// joins the eviction order) deepest block first, so under `lru` a sequence's prefix
    /// blocks are evicted after its tail, never its head (which every later hit needs) first.
    pub fn release(&mut self, seq: SeqId) -> Result<(), HybridError> {
        let entry = self.seqs.remove(&seq).ok_or(HybridError::UnknownSeq(seq))?;
        for table in entry.tables {
            for page in table.pages.into_iter().rev() {
                self.pool.drop_ref(page)?;
            }
        }
        for &page in &entry.checkpoint {
            self.pool.drop_ref(page)?;
        }
        if entry.state.is_empty() {
            // A start undone before it took its state.
            return Ok(());
        }
        self.pool.drop_state(&entry.state)
    }
}
