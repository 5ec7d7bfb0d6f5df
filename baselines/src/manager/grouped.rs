//! The grouped contiguous baseline: what a simple server reserves for a model whose layers do
//! not all keep every token. One arena of pages (the grouped pool's); each started sequence
//! reserves one run of consecutive pages (first fit), cut into its tables: a full or latent
//! table the whole reservation, a sliding table a ring for its window and the largest step
//! (see `grouped_seq`), plus one recurrent state when the model has a recurrent group. No
//! sharing: `fork` reserves again and copies pages. Released runs obey the fence rule.
//!
//! The real cost of the baseline is the one this keeps visible: a reservation is sized by the
//! request's reservation, not by what it writes, and it must find one run of free pages
//! (`largest_free_extent`, in slots, is the external fragmentation).
//!
//! A start needs a reserved state when the pool's state is `Reserved` (`NoSpace` while every
//! state is held or pending); a `Paged` pool is the hybrid paged manager's rule and starts
//! nothing here (`TooLarge`). `max_step_tokens` — the largest step times the steps the engine
//! keeps in flight — is what one sequence may write while a step that reads its window is in
//! flight, and sizes the rings. Accounting is in the grouped pool's slots: a held block's
//! written tokens by their share of its page (rounded down) live, the rest of the reservation
//! allocated-unfilled, a held state live, an unheld one free, a run or state released while a
//! step is in flight pending. Planted faults: `early-reuse`, `leak`, `bad-block-table` (the
//! first held page of the first non-empty table moved outside the reservation), each counted by
//! `fault_fired`; `skip-cow` and `stale-onload` have nothing to act on.

use std::cell::Cell;
use std::collections::BTreeMap;

use kvbench_cache_api::fence::FenceQueue;
use kvbench_cache_api::{
    Accounting, AllocError, CacheMode, CopyOp, Fault, GroupTable, GroupedPool, GroupedState,
    KvCacheManager, PrefixStats, Probe, ReleaseReason, SeqId, SeqLayout, StartRequest, Started,
    StepId,
};

use super::arena::Arena;
use super::grouped_seq::{cut_tables, reservation_pages, Reservation, TableCut};

/// What a release hands back once its fence retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Freed {
    pub base_page: u32,
    pub pages: u32,
    pub state: bool,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct GroupedFaults {
    pub early_reuse: bool,
    pub leak: bool,
    pub leaked_once: bool,
    pub bad_layout: bool,
    /// Releases freed at once while a step was in flight (early-reuse fired).
    pub fences_ignored: u64,
}

/// The grouped contiguous baseline; see the module doc.
#[derive(Debug)]
pub struct GroupedContiguous {
    pub(crate) pool: GroupedPool,
    /// Tokens a sequence may write while a step reading its window is in flight: a ring holds
    /// the window plus this many.
    pub(crate) max_step_tokens: u32,
    /// Free pages, first fit, coalescing on free.
    pub(crate) arena: Arena,
    /// BTreeMap: invariant reports iterate in sequence order.
    pub(crate) seqs: BTreeMap<SeqId, Reservation>,
    pub(crate) fence: FenceQueue<Freed>,
    pub(crate) pending_pages: u64,
    pub(crate) pending_states: u64,
    /// Steps begun so far: the next one submitted carries the writes made now.
    pub(crate) steps_begun: u64,
    /// Recurrent states held by live sequences.
    pub(crate) states_held: u64,
    pub(crate) faults: GroupedFaults,
    /// With the early-reuse fault: runs freed at once, with the fence they ignored.
    pub(crate) early_freed: Vec<(u64, u64, StepId)>,
    /// Corrupted layouts handed out (bad-block-table fired); a `Cell` because handing out a
    /// layout is a read.
    pub(crate) bad_layouts_read: Cell<u64>,
    pub(crate) violations: Vec<String>,
}

impl GroupedContiguous {
    /// A baseline over `pool`, whose sliding rings hold `max_step_tokens` beyond their window.
    ///
    /// `max_step_tokens` must cover what one sequence can write while a step that reads its
    /// window has not retired: the largest step, times the steps the engine keeps in flight
    /// when it plans one while another runs. A ring that turns onto positions a step not yet
    /// retired reads is reported by `check_invariants`.
    pub fn new(pool: GroupedPool, max_step_tokens: u32) -> GroupedContiguous {
        GroupedContiguous {
            arena: Arena::new(u64::from(pool.pages)),
            pool,
            max_step_tokens: max_step_tokens.max(1),
            seqs: BTreeMap::new(),
            fence: FenceQueue::new(),
            pending_pages: 0,
            pending_states: 0,
            steps_begun: 0,
            states_held: 0,
            faults: GroupedFaults::default(),
            early_freed: Vec::new(),
            bad_layouts_read: Cell::new(0),
            violations: Vec::new(),
        }
    }

    pub fn pool(&self) -> &GroupedPool {
        &self.pool
    }

    pub fn max_step_tokens(&self) -> u32 {
        self.max_step_tokens
    }

    /// Pages each table of a `reserve_tokens` reservation takes, in table order (`None`: too
    /// large for any pool).
    pub fn table_pages(&self, reserve_tokens: u32) -> Option<Vec<u32>> {
        let cuts = cut_tables(&self.pool.shapes, reserve_tokens, self.max_step_tokens)?;
        Some(cuts.iter().map(|c| c.pages).collect())
    }

    /// The first page of `seq`'s reservation and its pages.
    pub fn reservation(&self, seq: SeqId) -> Option<(u32, u32)> {
        self.seqs.get(&seq).map(|r| (r.base_page, r.pages()))
    }

    /// Tokens `seq` has mapped (started and appended), written or not.
    pub fn mapped_tokens(&self, seq: SeqId) -> Option<u32> {
        self.seqs.get(&seq).map(|r| r.mapped_tokens)
    }

    pub(crate) fn page_slots(&self) -> u64 {
        u64::from(self.pool.page_slots)
    }

    /// Slots one recurrent state counts for, 0 without a recurrent group.
    pub(crate) fn state_slots(&self) -> u64 {
        self.pool.state.slots_per_sequence()
    }

    /// States neither held nor pending.
    pub(crate) fn states_free(&self) -> u64 {
        match self.pool.state.reserved_sequences() {
            Some(n) => u64::from(n).saturating_sub(self.states_held + self.pending_states),
            None => 0,
        }
    }

    pub(crate) fn needs_state(&self) -> bool {
        self.pool.state != GroupedState::None
    }

    /// Slots a reservation of `pages` pages (and a state, where the model has one) counts for.
    fn slots_of(&self, pages: u64) -> u64 {
        pages
            .saturating_mul(self.page_slots())
            .saturating_add(self.state_slots())
    }

    fn reserve_tokens(req: &StartRequest<'_>) -> Option<u32> {
        let started = u32::try_from(req.tokens.len()).ok()?;
        Some(req.reserve_tokens.max(started))
    }

    /// The tables of a `reserve_tokens` reservation, or why it can never be made.
    fn plan(&self, reserve_tokens: u32) -> Result<Vec<TableCut>, AllocError> {
        let too_large = |needed_slots| AllocError::TooLarge {
            needed_slots,
            total_slots: self.accounting().total_slots,
        };
        let cuts = cut_tables(&self.pool.shapes, reserve_tokens, self.max_step_tokens)
            .ok_or(too_large(u64::MAX))?;
        let pages = reservation_pages(&cuts);
        // The baseline reserves states up front, like a simple server; a pool whose states come
        // out of its pages (`GroupedState::Paged`) is the hybrid paged manager's, and holds no
        // state this baseline could take.
        let no_state = match self.pool.state {
            GroupedState::None => false,
            GroupedState::Reserved { sequences, .. } => sequences == 0,
            GroupedState::Paged { .. } => true,
        };
        if pages > self.pool.pages || no_state {
            return Err(too_large(self.slots_of(u64::from(pages))));
        }
        Ok(cuts)
    }

    /// Why a reservation of `pages` pages cannot be made now, if it cannot.
    fn no_space(&self, pages: u32) -> Option<AllocError> {
        let fits = pages == 0 || self.arena.find_first_fit(u64::from(pages)).is_some();
        let state_ok = !self.needs_state() || self.states_free() > 0;
        if fits && state_ok {
            return None;
        }
        let available_slots = if state_ok {
            self.largest_free_extent()
        } else {
            0
        };
        Some(AllocError::NoSpace {
            needed_slots: self.slots_of(u64::from(pages)),
            available_slots,
        })
    }

    /// Take a run of `pages` pages and a state (the caller checked both are there), noting
    /// (with the early-reuse fault armed) a run that overlaps storage whose fence has not
    /// retired.
    fn take(&mut self, pages: u32) -> u32 {
        // The arena holds `pool.pages` (a u32) pages, so its offsets fit a u32.
        let base = if pages == 0 {
            0
        } else {
            self.arena.allocate(u64::from(pages)).unwrap_or(0) as u32
        };
        if self.needs_state() {
            self.states_held += 1;
        }
        let (b, len) = (u64::from(base), u64::from(pages));
        let fence = &self.fence;
        self.early_freed.retain(|&(_, _, f)| !fence.is_retired(f));
        for &(s, l, f) in &self.early_freed {
            if s < b + len && b < s + l && self.violations.len() < 64 {
                self.violations.push(format!(
                    "pages {b}..{} handed out while pages {s}..{} were fenced on in-flight step {f}",
                    b + len,
                    s + l
                ));
            }
        }
        base
    }

    fn give_back(&mut self, freed: Freed) {
        self.arena
            .free(u64::from(freed.base_page), u64::from(freed.pages));
    }

    fn release_now_or_later(&mut self, freed: Freed) {
        if freed.state {
            self.states_held -= 1;
        }
        if let Some(step) = self.fence.newest_in_flight() {
            if self.faults.early_reuse {
                self.faults.fences_ignored += 1;
                self.early_freed
                    .push((u64::from(freed.base_page), u64::from(freed.pages), step));
            } else {
                let handed_back = self.fence.defer(freed);
                debug_assert!(handed_back.is_none());
                self.pending_pages += u64::from(freed.pages);
                self.pending_states += u64::from(freed.state);
                return;
            }
        }
        self.give_back(freed);
    }

    /// With the bad-block-table fault armed, give `seq` tables whose first held page is one
    /// outside its reservation.
    fn refresh_bad_layout(&mut self, seq: SeqId) {
        if !self.faults.bad_layout {
            return;
        }
        let total = self.pool.pages;
        let Some(r) = self.seqs.get_mut(&seq) else {
            return;
        };
        let pages = r.pages();
        r.bad_tables = None;
        if pages >= total {
            return;
        }
        let wrong = ((u64::from(r.base_page) + u64::from(pages)) % u64::from(total)) as u32;
        let mut bad = r.tables.clone();
        if let Some(table) = bad.iter_mut().find(|t| !t.pages.is_empty()) {
            table.pages.set(0, wrong);
            r.bad_tables = Some(bad);
        }
    }

    /// Note that the next step writes `seq` (call before the write).
    fn note_writer(&mut self, seq: SeqId) {
        let carrying = self.steps_begun + 1;
        let fence = &self.fence;
        if let Some(r) = self.seqs.get_mut(&seq) {
            r.note_writer(carrying, |s| fence.in_flight().any(|f| f == s));
        }
    }

    /// After a write: a ring that turned onto what a step not yet retired reads is a violation
    /// (its `max_step_tokens` was less than the steps in flight write).
    fn check_ring_reach(&mut self, seq: SeqId) {
        let Some(r) = self.seqs.get(&seq) else {
            return;
        };
        if let Some((t, step, from, first)) = r.ring_overreach(&self.pool.shapes) {
            let msg = format!(
                "seq {seq} table {t}: the ring holds blocks from {first} while step {step} \
                     reads from position {from}: its {} tokens beyond the window are fewer than \
                     the steps in flight write",
                self.max_step_tokens
            );
            if self.violations.len() < 64 && !self.violations.contains(&msg) {
                self.violations.push(msg);
            }
        }
    }

    fn refresh(&mut self, seq: SeqId) {
        if let Some(r) = self.seqs.get_mut(&seq) {
            r.refresh(&self.pool.shapes);
        }
        self.refresh_bad_layout(seq);
    }
}

impl KvCacheManager for GroupedContiguous {
    fn mode(&self) -> CacheMode {
        CacheMode::Contiguous
    }

    fn block_size(&self) -> u32 {
        self.pool.page_slots
    }

    fn probe_start(&self, req: &StartRequest<'_>) -> Probe {
        let plan = Self::reserve_tokens(req)
            .ok_or(AllocError::TooLarge {
                needed_slots: u64::MAX,
                total_slots: 0,
            })
            .and_then(|r| self.plan(r));
        let (new_slots, fits) = match plan {
            Ok(cuts) => {
                let pages = reservation_pages(&cuts);
                let fits = !self.seqs.contains_key(&req.seq) && self.no_space(pages).is_none();
                (self.slots_of(u64::from(pages)), fits)
            }
            Err(AllocError::TooLarge { needed_slots, .. }) => (needed_slots, false),
            Err(_) => (u64::MAX, false),
        };
        Probe {
            cached_tokens: 0,
            new_slots,
            fits,
            onload_tokens: 0,
        }
    }

    fn start(&mut self, req: &StartRequest<'_>) -> Result<Started, AllocError> {
        if self.seqs.contains_key(&req.seq) {
            return Err(AllocError::DuplicateSeq(req.seq));
        }
        let reserve_tokens = Self::reserve_tokens(req).ok_or(AllocError::TooLarge {
            needed_slots: u64::MAX,
            total_slots: self.accounting().total_slots,
        })?;
        let cuts = self.plan(reserve_tokens)?;
        let pages = reservation_pages(&cuts);
        if let Some(e) = self.no_space(pages) {
            return Err(e);
        }
        let base_page = self.take(pages);
        let tables = vec![GroupTable::default(); cuts.len()];
        let reservation = Reservation {
            base_page,
            reserve_tokens,
            cuts,
            mapped_tokens: req.tokens.len() as u32,
            written_tokens: 0,
            state: self.needs_state(),
            tables,
            bad_tables: None,
            readers: Vec::new(),
        };
        self.seqs.insert(req.seq, reservation);
        self.refresh(req.seq);
        Ok(Started::default())
    }

    fn fill(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        let max_step = self.max_step_tokens;
        let r = self.seqs.get_mut(&seq).ok_or(AllocError::UnknownSeq(seq))?;
        if n_tokens > max_step && r.has_turning_ring(&self.pool.shapes) {
            return Err(AllocError::InvalidOp {
                seq,
                reason: "fill of more tokens than the largest step its sliding rings hold",
            });
        }
        let written = r
            .written_tokens
            .checked_add(n_tokens)
            .filter(|&w| w <= r.mapped_tokens)
            .ok_or(AllocError::InvalidOp {
                seq,
                reason: "fill past the started tokens",
            })?;
        self.note_writer(seq);
        if let Some(r) = self.seqs.get_mut(&seq) {
            r.written_tokens = written;
        }
        self.refresh(seq);
        self.check_ring_reach(seq);
        Ok(())
    }

    /// A swap-in writes every started token at once, but the step after it reads only each
    /// ring's window of them, not the window before them as a prefill chunk's queries do: the
    /// ring keeps the last of what is written, and its reader is noted from the end of the
    /// restored tokens, so no `max_step_tokens` bound applies.
    fn restore(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        let r = self.seqs.get_mut(&seq).ok_or(AllocError::UnknownSeq(seq))?;
        if r.written_tokens != 0 || n_tokens != r.mapped_tokens {
            return Err(AllocError::InvalidOp {
                seq,
                reason: "restore of other than every started token of a fresh start",
            });
        }
        r.written_tokens = n_tokens;
        self.note_writer(seq);
        self.refresh(seq);
        self.check_ring_reach(seq);
        Ok(())
    }

    /// What its tables keep of `tokens` (a ring its window's blocks, not the ring) and the
    /// state: what a swap moves, not the reservation.
    fn swap_slots(&self, _seq: SeqId, tokens: u32) -> u64 {
        kvbench_cache_api::grouped::swap_pages(&self.pool.shapes, u64::from(tokens))
            .saturating_mul(self.page_slots())
            .saturating_add(self.state_slots())
    }

    fn append(&mut self, seq: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.seqs.get_mut(&seq).ok_or(AllocError::UnknownSeq(seq))?;
        if r.written_tokens != r.mapped_tokens {
            return Err(AllocError::InvalidOp {
                seq,
                reason: "append before the prompt is filled",
            });
        }
        if r.mapped_tokens >= r.reserve_tokens {
            return Err(AllocError::NoSpace {
                needed_slots: u64::from(self.pool.page_slots),
                available_slots: 0,
            });
        }
        self.note_writer(seq);
        let r = self.seqs.get_mut(&seq).ok_or(AllocError::UnknownSeq(seq))?;
        r.mapped_tokens += 1;
        r.written_tokens += 1;
        self.refresh(seq);
        self.check_ring_reach(seq);
        Ok(Vec::new())
    }

    fn append_cost(&self, seq: SeqId) -> u64 {
        match self.seqs.get(&seq) {
            Some(r) if r.mapped_tokens >= r.reserve_tokens => self.page_slots(),
            _ => 0,
        }
    }

    /// The reservation's pages and state: what a sequence holds from its start, whatever it
    /// writes (`tokens` past the reservation are refused by `append`, as in the plain baseline).
    fn sequence_slots(&self, _tokens: u64, reserve_tokens: u32) -> u64 {
        match cut_tables(&self.pool.shapes, reserve_tokens, self.max_step_tokens) {
            Some(cuts) => self.slots_of(u64::from(reservation_pages(&cuts))),
            None => u64::MAX,
        }
    }

    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        if self.seqs.contains_key(&child) {
            return Err(AllocError::DuplicateSeq(child));
        }
        let p = self
            .seqs
            .get(&parent)
            .ok_or(AllocError::UnknownSeq(parent))?;
        if p.written_tokens != p.mapped_tokens {
            return Err(AllocError::InvalidOp {
                seq: parent,
                reason: "fork before the prompt is filled",
            });
        }
        let pages = p.pages();
        if let Some(e) = self.no_space(pages) {
            return Err(e);
        }
        let base_page = self.take(pages);
        let p = &self.seqs[&parent];
        let ops = p.copy_ops(&self.pool.shapes, base_page, self.pool.page_slots);
        let mut c = p.clone();
        c.base_page = base_page;
        c.bad_tables = None;
        c.readers.clear();
        for t in &mut c.tables {
            *t = GroupTable::default();
        }
        self.seqs.insert(child, c);
        self.refresh(child);
        Ok(ops)
    }

    fn release(&mut self, seq: SeqId, _why: ReleaseReason) -> Result<(), AllocError> {
        let r = self.seqs.remove(&seq).ok_or(AllocError::UnknownSeq(seq))?;
        if self.faults.leak && !self.faults.leaked_once {
            // Pages and state stay taken with no sequence holding them.
            self.faults.leaked_once = true;
            return Ok(());
        }
        self.release_now_or_later(Freed {
            base_page: r.base_page,
            pages: r.pages(),
            state: r.state,
        });
        Ok(())
    }

    fn begin_step(&mut self) -> StepId {
        self.steps_begun += 1;
        self.fence.begin_step()
    }

    fn retire_step(&mut self, step: StepId) {
        let mut released = Vec::new();
        if !self.fence.try_retire(step, &mut released) {
            self.violations
                .push(format!("retire of step {step}, which is not in flight"));
        }
        for freed in released {
            self.pending_pages -= u64::from(freed.pages);
            self.pending_states -= u64::from(freed.state);
            self.give_back(freed);
        }
    }

    fn layout(&self, seq: SeqId) -> Option<SeqLayout<'_>> {
        let r = self.seqs.get(&seq)?;
        if r.bad_tables.is_some() {
            self.bad_layouts_read.set(self.bad_layouts_read.get() + 1);
        }
        Some(SeqLayout::Grouped {
            page_slots: self.pool.page_slots,
            shapes: &self.pool.shapes,
            tables: r.bad_tables.as_deref().unwrap_or(&r.tables),
        })
    }

    fn seq_tokens(&self, seq: SeqId) -> Option<u32> {
        self.seqs.get(&seq).map(|r| r.written_tokens)
    }

    fn accounting(&self) -> Accounting {
        let ps = self.page_slots();
        let state = self.state_slots();
        let (mut live, mut reserved) = (0u64, 0u64);
        for r in self.seqs.values() {
            live += r.live_slots(&self.pool.shapes, self.pool.page_slots);
            reserved += u64::from(r.pages()) * ps;
        }
        // A leaked reservation (the planted fault) is in no bucket: conservation catches it.
        let held_states = self.seqs.values().filter(|r| r.state).count() as u64;
        let states_total = self
            .pool
            .state
            .reserved_sequences()
            .map_or(0, |n| u64::from(n).saturating_mul(state));
        Accounting {
            total_slots: u64::from(self.pool.pages) * ps + states_total,
            live_slots: live + held_states.saturating_mul(state),
            allocated_unfilled_slots: reserved.saturating_sub(live),
            cached_free_slots: 0,
            pending_free_slots: self.pending_pages * ps + self.pending_states.saturating_mul(state),
            free_slots: self.arena.free_slots() * ps + self.states_free().saturating_mul(state),
        }
    }

    fn prefix_stats(&self) -> PrefixStats {
        PrefixStats::default()
    }

    fn largest_free_extent(&self) -> u64 {
        self.arena.largest_extent() * self.page_slots()
    }

    fn flush_prefix_cache(&mut self) {}

    fn check_invariants(&self) -> Result<(), String> {
        super::grouped_check::check(self)
    }

    fn assert_quiescent(&self) -> Result<(), String> {
        super::grouped_check::quiescent(self)
    }

    fn inject_fault(&mut self, fault: Fault) {
        match fault {
            // Nothing is ever shared, so there is no copy to skip.
            Fault::SkipCow => {}
            Fault::EarlyReuse => self.faults.early_reuse = true,
            Fault::Leak => self.faults.leak = true,
            Fault::BadBlockTable => {
                self.faults.bad_layout = true;
                let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
                for id in ids {
                    self.refresh_bad_layout(id);
                }
            }
            // The baseline has no lower tier: nothing is ever onloaded.
            Fault::StaleOnload | Fault::CheckpointOffByOne => {}
        }
    }

    fn fault_fired(&self) -> u64 {
        u64::from(self.faults.leaked_once)
            + self.faults.fences_ignored
            + self.bad_layouts_read.get()
    }
}
