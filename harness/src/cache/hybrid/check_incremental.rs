//! `HybridKv`'s invariant check made incremental: what changed since the last check, and a
//! full walk every `touched::walk_period` checks (64, or a page in 8 on a larger pool).
//!
//! The full walk (`kv_check::check_full`) visits every page of the pool and every page of every
//! table, and with checks every step that was 20–30× the summed manager's cost a sequence a
//! step: the hybrid pool has a page per table per block. Most of it is unchanged from one step
//! to the next. This keeps, from the last check, what the full walk recomputes — each page's
//! references from the tables, its places on the free list and the fence queue, the written
//! tokens its holders give it, whether it is cached-free and indexed, and a copy of every
//! sequence's entry — and brings it up to date from two sources:
//!
//! - the pages the pool says changed (`pool.rs` touches a page at every transition it makes);
//! - the sequences, every one compared with its copy (a slice comparison a table), so a table
//!   changed by any path — a planted fault included — is seen; what differs is diffed block by
//!   block and its pages are re-examined.
//!
//! The free list is compared with its copy from the start (it changes at its end) and the fence
//! queue is walked whole (it holds what the steps in flight released). Each re-examined page
//! gets the full walk's own per-page checks (`check.rs`' `check_page`), each changed sequence
//! its per-sequence ones, and the counters (fenced, cached-free, indexed, live slots, states)
//! are compared every time. So what a full walk would report first is reported at the same
//! check. Anything the copies cannot follow (a page out of range, holders of one page
//! disagreeing on its written tokens) falls back to a full walk at once, and any problem found
//! makes the next check a full walk too, so a violation keeps being reported as before.

use std::collections::BTreeMap;

use kvbench_cache_api::{GroupTable, SeqId};

use super::kv::HybridKv;
use super::pool::{Freed, PageId};
use super::table::SeqEntry;
use crate::cache::touched::walk_period;

/// The tables' holders of one page by the written tokens each gives it: two distinct counts at
/// most (holders of a page agree — a prefix hit shares full blocks, a fork copies its parent's
/// lengths, a write into a shared partial page copies it first); a third falls back to a full
/// walk.
#[derive(Debug, Clone, Copy, Default)]
struct Holders {
    written: [u32; 2],
    count: [u32; 2],
    block_tokens: u32,
}

impl Holders {
    fn max_written(&self) -> Option<u32> {
        (0..2)
            .filter(|&i| self.count[i] > 0)
            .map(|i| self.written[i])
            .max()
    }

    fn live(&self, page_slots: u64) -> u64 {
        self.max_written().map_or(0, |w| {
            u64::from(w) * page_slots / u64::from(self.block_tokens.max(1))
        })
    }

    fn add(&mut self, written: u32, block_tokens: u32) -> Option<()> {
        if self.count == [0, 0] {
            self.block_tokens = block_tokens;
        } else if self.block_tokens != block_tokens {
            return None;
        }
        let i = (0..2)
            .find(|&i| self.count[i] > 0 && self.written[i] == written)
            .or_else(|| (0..2).find(|&i| self.count[i] == 0))?;
        self.written[i] = written;
        self.count[i] = self.count[i].checked_add(1)?;
        Some(())
    }

    fn remove(&mut self, written: u32) -> Option<()> {
        let i = (0..2).find(|&i| self.count[i] > 0 && self.written[i] == written)?;
        self.count[i] -= 1;
        Some(())
    }
}

/// Of a sequence's `w` written tokens, those in its block `b` of `bt` tokens.
#[inline]
fn written_in(w: u64, b: u64, bt: u64) -> u32 {
    w.saturating_sub(b * bt).min(bt) as u32
}

/// What the last check saw, kept to check only what changed since.
#[derive(Debug, Clone, Default)]
pub(crate) struct Incremental {
    /// Whether the state below describes the manager as of the last check (`false`: the next
    /// check walks everything and rebuilds it).
    ready: bool,
    checks: u64,
    /// Full walks run (tests read it).
    pub(crate) full_walks: u64,
    seqs: BTreeMap<SeqId, SeqEntry>,
    refs: Vec<u32>,
    holders: Vec<Holders>,
    /// Σ over pages of their holders' written tokens in slots: the live slots recomputed.
    live_slots: u64,
    on_free: Vec<u32>,
    free_copy: Vec<PageId>,
    fenced: Vec<u32>,
    fenced_list: Vec<PageId>,
    cached: Vec<bool>,
    cached_total: u64,
    indexed: Vec<bool>,
    indexed_total: u64,
    dirty: Vec<PageId>,
    dirty_mark: Vec<bool>,
    /// Per table of the sequence being diffed, whether it differs from its copy (reused).
    moved: Vec<bool>,
}

/// A change the copies cannot follow: walk everything.
struct Fallback;

impl Incremental {
    fn dirty(&mut self, page: PageId) {
        if let Some(m) = self.dirty_mark.get_mut(page as usize) {
            if !*m {
                *m = true;
                self.dirty.push(page);
            }
        }
    }

    /// Page `page`'s holders changed by `change`; the live slots follow, the page is
    /// re-examined.
    fn holders_of(
        &mut self,
        page: PageId,
        ps: u64,
        change: impl FnOnce(&mut Holders) -> Option<()>,
    ) -> Result<(), Fallback> {
        let h = self.holders.get_mut(page as usize).ok_or(Fallback)?;
        let before = h.live(ps);
        change(h).ok_or(Fallback)?;
        let after = h.live(ps);
        self.live_slots = self.live_slots - before + after;
        self.dirty(page);
        Ok(())
    }

    fn holder(
        &mut self,
        page: PageId,
        written: u32,
        bt: u32,
        ps: u64,
        add: bool,
    ) -> Result<(), Fallback> {
        self.holders_of(page, ps, |h| {
            if add {
                h.add(written, bt)
            } else {
                h.remove(written)
            }
        })?;
        let r = &mut self.refs[page as usize];
        *r = if add {
            r.checked_add(1).ok_or(Fallback)?
        } else {
            r.checked_sub(1).ok_or(Fallback)?
        };
        Ok(())
    }

    /// A holder of `page` whose written tokens went from `from` to `to` (the decode's block of
    /// each table): a removal and an addition, the reference count left as it is.
    fn holder_moved(
        &mut self,
        page: PageId,
        (from, to): (u32, u32),
        bt: u32,
        ps: u64,
    ) -> Result<(), Fallback> {
        self.holders_of(page, ps, |h| {
            h.remove(from)?;
            h.add(to, bt)
        })
    }

    fn state_ref(&mut self, page: PageId, add: bool) -> Result<(), Fallback> {
        let r = self.refs.get_mut(page as usize).ok_or(Fallback)?;
        *r = if add {
            r.checked_add(1).ok_or(Fallback)?
        } else {
            r.checked_sub(1).ok_or(Fallback)?
        };
        self.dirty(page);
        Ok(())
    }

    /// One table's blocks from `old` (at `ow` tokens written) to `new` (at `nw`): the blocks
    /// whose page or written tokens differ move their holder.
    #[allow(clippy::too_many_arguments)]
    fn diff_table(
        &mut self,
        old: &GroupTable,
        ow: u64,
        new: &GroupTable,
        nw: u64,
        bt: u32,
        ps: u64,
    ) -> Result<(), Fallback> {
        let b64 = u64::from(bt.max(1));
        let at = |t: &GroupTable, b: u64| -> Option<PageId> {
            b.checked_sub(t.first_block)
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| t.pages.get(i).copied())
        };
        let w_of = |w: u64, b: u64| written_in(w, b, b64);
        let (lo, hi) = (
            old.first_block.max(new.first_block),
            old.end_block().min(new.end_block()),
        );
        let (start, end) = (
            old.first_block.min(new.first_block),
            old.end_block().max(new.end_block()),
        );
        let same_mid = lo < hi && {
            let o = &old.pages[(lo - old.first_block) as usize..(hi - old.first_block) as usize];
            let n = &new.pages[(lo - new.first_block) as usize..(hi - new.first_block) as usize];
            o == n
        };
        let mut ranges = [(0u64, 0u64); 3];
        if same_mid {
            ranges[0] = (start, lo);
            ranges[1] = (hi, end);
            if ow != nw {
                let (a, b) = (ow.min(nw) / b64, ow.max(nw).div_ceil(b64));
                ranges[2] = (a.max(lo), b.min(hi));
            }
        } else {
            ranges[0] = (start, end);
        }
        for (from, to) in ranges {
            for b in from..to {
                let (op, np) = (at(old, b), at(new, b));
                let (owb, nwb) = (w_of(ow, b), w_of(nw, b));
                if op == np && (op.is_none() || owb == nwb) {
                    continue;
                }
                if let Some(p) = op {
                    self.holder(p, owb, bt, ps, false)?;
                }
                if let Some(p) = np {
                    self.holder(p, nwb, bt, ps, true)?;
                }
            }
        }
        Ok(())
    }

    /// A table that did not change while its sequence's written tokens went from `ow` to `nw`
    /// (a decode, for every table of every sequence at every step): only the blocks whose
    /// written tokens moved move their holder — what [`Incremental::diff_table`] does for equal
    /// tables, without comparing them again.
    fn written_moved(
        &mut self,
        table: &GroupTable,
        (ow, nw): (u64, u64),
        bt: u32,
        ps: u64,
    ) -> Result<(), Fallback> {
        let b64 = u64::from(bt.max(1));
        let w_of = |w: u64, b: u64| written_in(w, b, b64);
        let from = (ow.min(nw) / b64).max(table.first_block);
        let to = ow.max(nw).div_ceil(b64).min(table.end_block());
        for b in from..to {
            let (owb, nwb) = (w_of(ow, b), w_of(nw, b));
            if owb == nwb {
                continue;
            }
            let p = table.pages[(b - table.first_block) as usize];
            self.holder_moved(p, (owb, nwb), bt, ps)?;
        }
        Ok(())
    }

    /// `old` (the copy; none for a new sequence) becomes `new` (none once released); `true`
    /// when anything of it changed. `moved` gets, per table, whether it differs from its copy:
    /// each table is compared once, here, and the copy updated from this.
    fn diff_seq(
        &mut self,
        old: Option<&SeqEntry>,
        new: Option<&SeqEntry>,
        block_tokens: &[u32],
        ps: u64,
        moved: &mut Vec<bool>,
    ) -> Result<bool, Fallback> {
        let empty = SeqEntry::default();
        let (o, n) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
        let tables = block_tokens.len();
        for e in [old, new].into_iter().flatten() {
            if e.tables.len() != tables {
                return Err(Fallback);
            }
        }
        let mut changed = o.tokens != n.tokens
            || o.written != n.written
            || o.trimmed != n.trimmed
            || o.state != n.state
            || o.checkpoint != n.checkpoint
            || old.is_none() != new.is_none();
        let none = GroupTable::default();
        moved.clear();
        for (t, &bt) in block_tokens.iter().enumerate() {
            let ot = o.tables.get(t).unwrap_or(&none);
            let nt = n.tables.get(t).unwrap_or(&none);
            let same = ot == nt;
            moved.push(!same);
            if same {
                if o.written != n.written {
                    self.written_moved(nt, (o.written, n.written), bt, ps)?;
                }
                continue;
            }
            changed = true;
            self.diff_table(ot, o.written, nt, n.written, bt, ps)?;
        }
        if o.state != n.state {
            for &p in &o.state {
                self.state_ref(p, false)?;
            }
            for &p in &n.state {
                self.state_ref(p, true)?;
            }
        }
        if o.checkpoint != n.checkpoint {
            for &p in &o.checkpoint {
                self.state_ref(p, false)?;
            }
            for &p in &n.checkpoint {
                self.state_ref(p, true)?;
            }
        }
        Ok(changed)
    }

    /// Bring the copies up to date with `kv`; the sequences whose entry changed.
    fn update(&mut self, kv: &HybridKv) -> Result<Vec<SeqId>, Fallback> {
        let cache = &kv.cache;
        let pool = &cache.pool;
        let ps = kv.page_slots();
        for page in pool.touched.borrow_mut().take() {
            self.dirty(page);
        }
        let block_tokens: Vec<u32> = cache
            .layout
            .tables
            .iter()
            .map(|s| s.block_tokens.max(1))
            .collect();
        // Sequences: released ones give back what they counted, new and changed ones diffed.
        let gone: Vec<SeqId> = self
            .seqs
            .keys()
            .filter(|s| !cache.seqs.contains_key(s))
            .copied()
            .collect();
        let mut moved = std::mem::take(&mut self.moved);
        for seq in gone {
            if let Some(old) = self.seqs.remove(&seq) {
                self.diff_seq(Some(&old), None, &block_tokens, ps, &mut moved)?;
            }
        }
        let mut changed = Vec::new();
        for (&seq, entry) in &cache.seqs {
            // Taken out and put back in place: a removal and an insertion rebalanced the map
            // for every sequence at every check. (On a fallback the next walk rebuilds it all.)
            let old = self.seqs.get_mut(&seq).map(std::mem::take);
            if self.diff_seq(old.as_ref(), Some(entry), &block_tokens, ps, &mut moved)? {
                changed.push(seq);
            }
            let mut copy = old.unwrap_or_default();
            copy.tokens = entry.tokens;
            copy.written = entry.written;
            copy.trimmed = entry.trimmed;
            copy.state.clone_from(&entry.state);
            copy.checkpoint.clone_from(&entry.checkpoint);
            copy.tables
                .resize_with(entry.tables.len(), GroupTable::default);
            for ((c, t), _) in copy
                .tables
                .iter_mut()
                .zip(&entry.tables)
                .zip(&moved)
                .filter(|(_, &m)| m)
            {
                c.first_block = t.first_block;
                c.pages.clone_from(&t.pages);
            }
            match self.seqs.get_mut(&seq) {
                Some(slot) => *slot = copy,
                None => {
                    self.seqs.insert(seq, copy);
                }
            }
        }
        self.moved = moved;
        // The free list: it grows and shrinks at its end, so compare from the start.
        let free = pool.free_pages();
        let n = free.len().min(self.free_copy.len());
        let mut same = 0;
        while same + 256 <= n && free[same..same + 256] == self.free_copy[same..same + 256] {
            same += 256;
        }
        while same < n && free[same] == self.free_copy[same] {
            same += 1;
        }
        for i in same..self.free_copy.len() {
            let p = self.free_copy[i];
            self.on_free[p as usize] -= 1;
            self.dirty(p);
        }
        self.free_copy.truncate(same);
        for &p in &free[same..] {
            let c = self.on_free.get_mut(p as usize).ok_or(Fallback)?;
            *c += 1;
            self.free_copy.push(p);
            self.dirty(p);
        }
        // The fence queue, walked whole.
        for p in std::mem::take(&mut self.fenced_list) {
            self.fenced[p as usize] = 0;
            self.dirty(p);
        }
        for (_, item) in pool.fence.pending() {
            let Freed::Page(p) = *item;
            let c = self.fenced.get_mut(p as usize).ok_or(Fallback)?;
            *c += 1;
            self.fenced_list.push(p);
            self.dirty(p);
        }
        // Cached-free and indexed, for the re-examined pages.
        for i in 0..self.dirty.len() {
            let p = self.dirty[i];
            let cached = pool.is_cached_free(p);
            if cached != self.cached[p as usize] {
                self.cached[p as usize] = cached;
                self.cached_total = if cached {
                    self.cached_total + 1
                } else {
                    self.cached_total - 1
                };
            }
            let indexed = kv.prefix.indexed(p).is_some();
            if indexed != self.indexed[p as usize] {
                self.indexed[p as usize] = indexed;
                self.indexed_total = if indexed {
                    self.indexed_total + 1
                } else {
                    self.indexed_total - 1
                };
            }
        }
        Ok(changed)
    }

    /// Forget everything and take `kv` as it is now (after a full walk checked it).
    fn rebuild(&mut self, kv: &HybridKv) -> Result<(), Fallback> {
        let pages = kv.cache.pool.pages() as usize;
        *self = Incremental {
            checks: self.checks,
            full_walks: self.full_walks,
            refs: vec![0; pages],
            holders: vec![Holders::default(); pages],
            on_free: vec![0; pages],
            fenced: vec![0; pages],
            cached: vec![false; pages],
            indexed: vec![false; pages],
            dirty_mark: vec![false; pages],
            ..Incremental::default()
        };
        for p in 0..pages as PageId {
            self.dirty(p);
        }
        self.update(kv)?;
        self.clear_dirty();
        self.ready = true;
        Ok(())
    }

    fn clear_dirty(&mut self) {
        for &p in &self.dirty {
            self.dirty_mark[p as usize] = false;
        }
        self.dirty.clear();
    }
}

/// The incremental check (see the module doc): a full walk when due, else what changed.
pub(crate) fn check(kv: &HybridKv) -> Result<(), String> {
    let mut inc = kv.incremental.borrow_mut();
    inc.checks += 1;
    if !inc.ready
        || inc
            .checks
            .is_multiple_of(walk_period(kv.cache.pool.pages()))
    {
        return full(kv, &mut inc);
    }
    let changed = match inc.update(kv) {
        Ok(c) => c,
        Err(Fallback) => return full(kv, &mut inc),
    };
    let bad = problems(kv, &inc, &changed);
    inc.clear_dirty();
    if !bad.is_empty() {
        inc.ready = false;
    }
    super::kv_check::into_result(bad)
}

/// A full walk, then the copies rebuilt from it (kept only when it found nothing).
fn full(kv: &HybridKv, inc: &mut Incremental) -> Result<(), String> {
    inc.full_walks += 1;
    let out = super::kv_check::check_full(kv);
    let rebuilt = inc.rebuild(kv).is_ok();
    inc.ready = rebuilt && out.is_ok();
    out
}

/// What a full walk would find, from what changed: the full walk's checks on the changed
/// sequences and the re-examined pages, and every counter.
fn problems(kv: &HybridKv, inc: &Incremental, changed: &[SeqId]) -> Vec<String> {
    let cache = &kv.cache;
    let pool = &cache.pool;
    let mut bad = super::kv_check::recorded(kv);
    for seq in changed {
        if let Some(entry) = cache.seqs.get(seq) {
            cache.check_seq(*seq, entry, &mut bad);
        }
    }
    for &page in &inc.dirty {
        let i = page as usize;
        let (free, fenced) = (inc.on_free[i], inc.fenced[i]);
        if free > 1 {
            bad.push(format!("page {page} is on the free list twice"));
        }
        if fenced > 1 {
            bad.push(format!("page {page} is fenced twice"));
        }
        if free > 0 {
            let fence = pool.release_fence(page);
            if fence != 0 && !pool.fence.is_retired(fence) {
                bad.push(format!(
                    "page {page} is free while step {fence}, in flight at its release, has not retired"
                ));
            }
        }
        cache.check_page(page, u64::from(inc.refs[i]), free > 0, fenced > 0, &mut bad);
        if let Some(w) = inc.holders[i].max_written() {
            let counted = pool.written(page).unwrap_or(0);
            if w != counted {
                bad.push(format!(
                    "page {page}: {w} tokens written by its holders, pool says {counted}"
                ));
            }
        }
        if let Some(points_back) = kv.prefix.indexed(page) {
            if !points_back {
                bad.push(format!(
                    "published page {page}: its index entry names another page"
                ));
            }
            if !pool.is_published(page) {
                bad.push(format!(
                    "page {page} is indexed but the pool has it unpublished"
                ));
            }
        }
    }
    if inc.fenced_list.len() as u64 != u64::from(pool.pending_pages()) {
        bad.push(format!(
            "{} pages fenced, the counter says {}",
            inc.fenced_list.len(),
            pool.pending_pages()
        ));
    }
    if inc.cached_total != u64::from(pool.cached_count()) {
        bad.push(format!(
            "{} pages cached-free, the eviction order holds {}",
            inc.cached_total,
            pool.cached_count()
        ));
    }
    cache.check_states(&mut bad);
    if inc.live_slots != pool.live_slots() {
        bad.push(format!(
            "live page slots {} recomputed, counter {}",
            inc.live_slots,
            pool.live_slots()
        ));
    }
    if inc.indexed_total != pool.published_count() {
        bad.push(format!(
            "{} pages indexed, {} published in the pool",
            inc.indexed_total,
            pool.published_count()
        ));
    }
    super::kv_check::check_layouts(kv, kv.bad_layouts.keys().copied(), &mut bad);
    bad
}
