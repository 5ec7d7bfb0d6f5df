//! The hybrid manager's invariants, recomputed from its state: every page in exactly one place
//! (the free list once, the fence queue once, or block tables as many times as its reference
//! count says; no page free while a step in flight at its release is still running), each
//! table holding exactly the logical blocks its kind keeps (every mapped block for full and
//! MLA; for sliding, from the block the window of the trimmed-to tokens reaches, so no sliding
//! table holds a block wholly out of the window of what is written), and one recurrent state
//! per live sequence, its pages held by it alone (counted here as references like a table's).
//! The prefix cache's pages: a cached-free page is published, in no table,
//! neither free nor fenced, and evictable only once the step in flight at its release retired;
//! the cached-free count is the pages marked so; and a published page is a full block, every
//! token of it written (publishing a block a chunk has not written yet would hand a later
//! prompt positions nobody wrote).

use kvbench_cache_api::SeqId;

use super::manager::HybridCache;
use super::pool::{Freed, PageId};
use super::table::SeqEntry;

impl HybridCache {
    /// Every violation found, described; empty when the state is consistent.
    pub fn check_invariants(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let pages = self.pool.pages() as usize;
        let mut counted = vec![0u64; pages];
        for (&seq, entry) in &self.seqs {
            if !self.check_seq(seq, entry, &mut bad) {
                continue;
            }
            for (t, table) in entry.tables.iter().enumerate() {
                for &page in &table.pages {
                    match counted.get_mut(page as usize) {
                        Some(c) => *c += 1,
                        None => bad.push(format!("seq {seq} table {t}: page {page} out of range")),
                    }
                }
            }
            for &page in &entry.state {
                match counted.get_mut(page as usize) {
                    Some(c) => *c += 1,
                    None => bad.push(format!("seq {seq} state: page {page} out of range")),
                }
            }
            for &page in &entry.checkpoint {
                match counted.get_mut(page as usize) {
                    Some(c) => *c += 1,
                    None => bad.push(format!("seq {seq} checkpoint: page {page} out of range")),
                }
            }
        }
        let mut free_seen = vec![false; pages];
        for &page in self.pool.free_pages() {
            match free_seen.get_mut(page as usize) {
                Some(true) => bad.push(format!("page {page} is on the free list twice")),
                Some(seen) => *seen = true,
                None => bad.push(format!("free page {page} out of range")),
            }
            let fence = self.pool.release_fence(page);
            if fence != 0 && !self.pool.fence.is_retired(fence) {
                bad.push(format!(
                    "page {page} is free while step {fence}, in flight at its release, has not retired"
                ));
            }
        }
        let mut pending_seen = vec![false; pages];
        let mut fenced_pages = 0u32;
        for (_, item) in self.pool.fence.pending() {
            match *item {
                Freed::Page(page) => {
                    fenced_pages += 1;
                    match pending_seen.get_mut(page as usize) {
                        Some(true) => bad.push(format!("page {page} is fenced twice")),
                        Some(seen) => *seen = true,
                        None => bad.push(format!("fenced page {page} out of range")),
                    }
                }
            }
        }
        if fenced_pages != self.pool.pending_pages() {
            bad.push(format!(
                "{fenced_pages} pages fenced, the counter says {}",
                self.pool.pending_pages()
            ));
        }
        let mut cached_pages = 0u32;
        for page in 0..pages {
            let (count, free, pending) = (counted[page], free_seen[page], pending_seen[page]);
            if self.check_page(page as u32, count, free, pending, &mut bad) {
                cached_pages += 1;
            }
        }
        if cached_pages != self.pool.cached_count() {
            bad.push(format!(
                "{cached_pages} pages cached-free, the eviction order holds {}",
                self.pool.cached_count()
            ));
        }
        self.check_states(&mut bad);
        bad
    }

    /// One sequence's own invariants (its lengths in order, each table holding exactly the
    /// blocks its kind keeps, a state of the layout's pages held by it alone); `false` when its
    /// tables do not match the layout (nothing more of it can be read).
    pub(crate) fn check_seq(&self, seq: SeqId, entry: &SeqEntry, bad: &mut Vec<String>) -> bool {
        if entry.tables.len() != self.layout.tables.len() {
            bad.push(format!(
                "seq {seq}: {} tables, layout has {}",
                entry.tables.len(),
                self.layout.tables.len()
            ));
            return false;
        }
        if !(entry.trimmed <= entry.written && entry.written <= entry.tokens) {
            bad.push(format!(
                "seq {seq}: trimmed {} written {} mapped {} out of order",
                entry.trimmed, entry.written, entry.tokens
            ));
        }
        for (t, (spec, table)) in self.layout.tables.iter().zip(&entry.tables).enumerate() {
            let end = entry.tokens.div_ceil(u64::from(spec.block_tokens.max(1)));
            let first = spec.held_blocks(entry.trimmed).0.min(end);
            if (table.first_block, table.end_block()) != (first, end) {
                bad.push(format!(
                    "seq {seq} table {t} ({:?}) holds blocks {}..{} at {} tokens ({} written, trimmed at {}), should hold {first}..{end}",
                    spec.kind,
                    table.first_block,
                    table.end_block(),
                    entry.tokens,
                    entry.written,
                    entry.trimmed
                ));
            }
        }
        if entry.state.len() != self.pool.state_pages() as usize {
            bad.push(format!(
                "seq {seq}: a state of {} pages, the layout's takes {}",
                entry.state.len(),
                self.pool.state_pages()
            ));
        }
        for &page in &entry.state {
            if self.pool.refs(page) != Some(1) {
                bad.push(format!("seq {seq}: state page {page} is shared"));
            }
        }
        true
    }

    /// One recurrent state per live sequence of a recurrent model, none otherwise.
    pub(crate) fn check_states(&self, bad: &mut Vec<String>) {
        let live = self.seqs.len() as u64;
        let held = self.pool.states_held() as u64;
        let want = if self.pool.state_pages() == 0 {
            0
        } else {
            live
        };
        if held != want {
            bad.push(format!(
                "{held} recurrent states held for {live} sequences ({} pages a state)",
                self.pool.state_pages()
            ));
        }
    }

    /// One page's invariants, given how many table (and state) references to it the
    /// sequences hold (`count`) and whether it is on the free list or the fence queue; `true`
    /// when it is cached-free. (A free page's release fence is checked by the caller, which
    /// walks the free list.)
    pub(crate) fn check_page(
        &self,
        id: PageId,
        count: u64,
        free: bool,
        pending: bool,
        bad: &mut Vec<String>,
    ) -> bool {
        let page = id as usize;
        if self.pool.is_published(id) {
            let (w, bt) = (self.pool.written(id), self.pool.block_tokens(id));
            if w != bt {
                bad.push(format!(
                    "published page {page} holds {} of its {} tokens written",
                    w.unwrap_or(0),
                    bt.unwrap_or(0)
                ));
            }
        }
        if self.pool.is_cached_free(id) {
            let fence = self.pool.release_fence(id);
            let in_flight = fence != 0 && !self.pool.fence.is_retired(fence);
            if in_flight && self.pool.cached.is_evictable(id) && !self.pool.ignore_fence {
                bad.push(format!(
                    "cached-free page {page} is evictable while step {fence}, in flight at its release, has not retired"
                ));
            }
        }
        let refs = self.pool.refs(page as u32).unwrap_or(0) as u64;
        if free && pending {
            bad.push(format!("page {page} is both free and fenced"));
        }
        if (free || pending) && count > 0 {
            bad.push(format!(
                "page {page} is {} and in {count} tables",
                if free { "free" } else { "fenced" }
            ));
        }
        let cached = self.pool.is_cached_free(page as u32);
        if cached && (free || pending || count > 0 || !self.pool.is_published(page as u32)) {
            bad.push(format!(
                "cached-free page {page}: published {}, free {free}, fenced {pending}, in {count} tables",
                self.pool.is_published(page as u32)
            ));
        }
        if self.pool.is_published(page as u32) && (free || pending) {
            bad.push(format!("page {page} is published and free or fenced"));
        }
        if !free && !pending && !cached && count == 0 {
            bad.push(format!(
                "page {page} is neither free nor in any table (leaked)"
            ));
        }
        if refs != count {
            bad.push(format!(
                "page {page}: {refs} references counted, {count} in tables"
            ));
        }
        cached
    }

    /// What is still held when nothing should be: sequences, pages out of the pool, states.
    pub fn check_quiescent(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if !self.seqs.is_empty() {
            bad.push(format!("{} sequences still held", self.seqs.len()));
        }
        // Cached-free pages are reclaimable on demand: quiescent, like free ones.
        if self.pool.free_count() + self.pool.cached_count() != self.pool.pages() {
            bad.push(format!(
                "{} of {} pages neither free nor cached-free ({} fenced)",
                self.pool.pages() - self.pool.free_count() - self.pool.cached_count(),
                self.pool.pages(),
                self.pool.pending_pages()
            ));
        }
        if self.pool.states_held() != 0 {
            bad.push(format!(
                "{} recurrent states still held",
                self.pool.states_held()
            ));
        }
        if self.pool.fence.in_flight_len() > 0 {
            let steps: Vec<_> = self.pool.fence.in_flight().collect();
            bad.push(format!("steps still in flight: {steps:?}"));
        }
        bad
    }
}
