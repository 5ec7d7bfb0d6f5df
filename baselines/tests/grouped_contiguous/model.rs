//! A plain reference model of the grouped contiguous baseline, written from the reservation
//! rule alone (no code shared with `kvbench_baselines`): pages owned page by page, first fit as
//! the lowest run of free pages, fences as a list, recurrent states as a count, and a page store
//! of tags so that copies and ring turns are checked by content.

use std::collections::{BTreeMap, BTreeSet};

use kvbench_cache_api::{Accounting, CopyOp, GroupedPool, TableShape};

/// Who holds a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Free,
    Seq(u64),
    Pending,
}

#[derive(Debug, Clone)]
pub struct MSeq {
    pub base: u32,
    pub pages: u32,
    /// (first page offset, pages) per table.
    pub cuts: Vec<(u32, u32)>,
    pub reserve: u32,
    pub mapped: u32,
    pub written: u32,
    /// The tag each written position must hold in every table.
    pub content: Vec<u64>,
    pub state: bool,
    /// Each step not yet retired that writes this sequence (the next one included), with the
    /// written tokens before its writes.
    pub writes: Vec<(u64, u32)>,
}

/// Why the model expects a start or fork to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    TooLarge,
    NoSpace,
}

pub struct Model {
    pub pool: GroupedPool,
    pub max_step: u32,
    pub owner: Vec<Owner>,
    pub seqs: BTreeMap<u64, MSeq>,
    /// (base, pages, state, fenced on step).
    pub pending: Vec<(u32, u32, bool, u64)>,
    pub in_flight: BTreeSet<u64>,
    pub next_step: u64,
    pub states_held: u64,
    /// One tag per cell; a page holds `max block_tokens` cells.
    pub store: Vec<Vec<u64>>,
}

/// Pages a table of a `reserve`-token reservation takes: the whole reservation for a full or
/// latent table; a sliding table's window plus the largest step, in whole blocks, plus one for
/// alignment, at most the whole reservation.
pub fn table_pages(shape: &TableShape, reserve: u32, max_step: u32) -> u32 {
    let bt = shape.block_tokens;
    let full = reserve.div_ceil(bt);
    match shape.window {
        None => full,
        Some(w) => ((w + max_step).div_ceil(bt) + 1).min(full),
    }
}

impl Model {
    pub fn new(pool: GroupedPool, max_step: u32) -> Model {
        let cells = pool
            .shapes
            .iter()
            .map(|s| s.block_tokens)
            .max()
            .unwrap_or(1) as usize;
        Model {
            owner: vec![Owner::Free; pool.pages as usize],
            store: vec![vec![0; cells]; pool.pages as usize],
            pool,
            max_step,
            seqs: BTreeMap::new(),
            pending: Vec::new(),
            in_flight: BTreeSet::new(),
            next_step: 1,
            states_held: 0,
        }
    }

    pub fn cuts(&self, reserve: u32) -> Vec<(u32, u32)> {
        let mut off = 0;
        self.pool
            .shapes
            .iter()
            .map(|s| {
                let n = table_pages(s, reserve, self.max_step);
                off += n;
                (off - n, n)
            })
            .collect()
    }

    fn pending_states(&self) -> u64 {
        self.pending.iter().filter(|p| p.2).count() as u64
    }

    fn free_states(&self) -> u64 {
        self.pool.state.reserved_sequences().map_or(0, |n| {
            u64::from(n) - self.states_held - self.pending_states()
        })
    }

    /// The lowest page starting a run of `pages` free pages.
    pub fn first_fit(&self, pages: u32) -> Option<u32> {
        if pages == 0 {
            return Some(0);
        }
        let mut run = 0;
        for (i, o) in self.owner.iter().enumerate() {
            run = if *o == Owner::Free { run + 1 } else { 0 };
            if run == pages {
                return Some(i as u32 + 1 - pages);
            }
        }
        None
    }

    pub fn largest_free_run(&self) -> u64 {
        let (mut best, mut run) = (0, 0);
        for o in &self.owner {
            run = if *o == Owner::Free { run + 1 } else { 0 };
            best = best.max(run);
        }
        best
    }

    /// Where a reservation of `reserve` tokens would go now.
    pub fn place(&self, reserve: u32) -> Result<u32, Refusal> {
        let pages: u32 = self.cuts(reserve).iter().map(|c| c.1).sum();
        if pages > self.pool.pages || self.pool.state.reserved_sequences() == Some(0) {
            return Err(Refusal::TooLarge);
        }
        if self.pool.state.reserved_sequences().is_some() && self.free_states() == 0 {
            return Err(Refusal::NoSpace);
        }
        self.first_fit(pages).ok_or(Refusal::NoSpace)
    }

    /// Slots a reservation of `reserve` tokens counts for.
    pub fn reservation_slots(&self, reserve: u32) -> u64 {
        let pages: u32 = self.cuts(reserve).iter().map(|c| c.1).sum();
        u64::from(pages) * u64::from(self.pool.page_slots) + self.state_slots()
    }

    fn state_slots(&self) -> u64 {
        if self.pool.state.reserved_sequences().is_some() {
            self.pool.state.slots_per_sequence()
        } else {
            0
        }
    }

    pub fn start(&mut self, id: u64, prompt: u32, reserve: u32) -> Result<u32, Refusal> {
        let reserve = reserve.max(prompt);
        let base = self.place(reserve)?;
        let cuts = self.cuts(reserve);
        let pages = cuts.iter().map(|c| c.1).sum();
        self.take(id, base, pages);
        self.seqs.insert(
            id,
            MSeq {
                base,
                pages,
                cuts,
                reserve,
                mapped: prompt,
                written: 0,
                content: Vec::new(),
                state: self.pool.state.reserved_sequences().is_some(),
                writes: Vec::new(),
            },
        );
        Ok(base)
    }

    fn take(&mut self, id: u64, base: u32, pages: u32) {
        for p in base..base + pages {
            self.owner[p as usize] = Owner::Seq(id);
        }
        if self.pool.state.reserved_sequences().is_some() {
            self.states_held += 1;
        }
    }

    pub fn fork(&mut self, parent: u64, child: u64) -> Result<u32, Refusal> {
        let p = self.seqs[&parent].clone();
        if self.pool.state.reserved_sequences().is_some() && self.free_states() == 0 {
            return Err(Refusal::NoSpace);
        }
        let base = self.first_fit(p.pages).ok_or(Refusal::NoSpace)?;
        self.take(child, base, p.pages);
        self.seqs.insert(
            child,
            MSeq {
                base,
                writes: Vec::new(),
                ..p
            },
        );
        Ok(base)
    }

    pub fn release(&mut self, id: u64) {
        let s = self
            .seqs
            .remove(&id)
            .expect("model: release of a live sequence");
        if s.state {
            self.states_held -= 1;
        }
        match self.in_flight.last() {
            Some(&step) => {
                for p in s.base..s.base + s.pages {
                    self.owner[p as usize] = Owner::Pending;
                }
                self.pending.push((s.base, s.pages, s.state, step));
            }
            None => {
                for p in s.base..s.base + s.pages {
                    self.owner[p as usize] = Owner::Free;
                }
            }
        }
    }

    pub fn begin(&mut self) -> u64 {
        let s = self.next_step;
        self.next_step += 1;
        self.in_flight.insert(s);
        s
    }

    pub fn retire(&mut self, step: u64) {
        self.in_flight.remove(&step);
        let watermark = self.in_flight.first().copied().unwrap_or(self.next_step);
        let (done, keep): (Vec<_>, Vec<_>) = self.pending.iter().partition(|p| p.3 < watermark);
        self.pending = keep;
        for (base, pages, _, _) in done {
            for p in base..base + pages {
                self.owner[p as usize] = Owner::Free;
            }
        }
    }

    /// Tokens `id` may still write: `max_step` beyond the written tokens before the oldest
    /// step not yet retired that writes it (that step reads a window before them, and steps
    /// may retire out of order).
    pub fn write_budget(&mut self, id: u64) -> u32 {
        let next = self.next_step;
        let in_flight = &self.in_flight;
        let s = self.seqs.get_mut(&id).expect("model: a live sequence");
        s.writes
            .retain(|&(step, _)| step >= next || in_flight.contains(&step));
        let from = s.writes.iter().map(|w| w.1).min().unwrap_or(s.written);
        self.max_step - (s.written - from)
    }

    /// `id` writes in the next step (call before the write).
    pub fn note_write(&mut self, id: u64) {
        let next = self.next_step;
        let s = self.seqs.get_mut(&id).expect("model: a live sequence");
        if s.writes.last().map(|w| w.0) != Some(next) {
            s.writes.push((next, s.written));
        }
    }

    /// A write of `pos` of `id` in table `t`, through the cell the manager's layout names.
    pub fn write(&mut self, id: u64, pos: u32, cell: (u32, u32)) {
        let tag = self.seqs[&id].content[pos as usize];
        self.store[cell.0 as usize][cell.1 as usize] = tag;
    }

    /// Perform a fork's page copies; `Err` names an op that is not whole pages.
    pub fn copy(&mut self, op: &CopyOp) -> Result<(), String> {
        let ps = u64::from(self.pool.page_slots);
        let len = u64::from(op.len_tokens);
        if !op.src_slot.is_multiple_of(ps)
            || !op.dst_slot.is_multiple_of(ps)
            || !len.is_multiple_of(ps)
            || len == 0
        {
            return Err(format!("copy {op:?} is not whole pages of {ps} slots"));
        }
        for i in 0..len / ps {
            let (src, dst) = (op.src_slot / ps + i, op.dst_slot / ps + i);
            let page = self
                .store
                .get(src as usize)
                .ok_or(format!("copy {op:?} reads past the pool"))?
                .clone();
            *self
                .store
                .get_mut(dst as usize)
                .ok_or(format!("copy {op:?} writes past the pool"))? = page;
        }
        Ok(())
    }

    /// Positions of a sequence of `written` tokens that table `shape` must still hold: every
    /// one for a full table; a sliding table the window plus the largest step before the end.
    pub fn must_hold(&self, shape: &TableShape, written: u32) -> std::ops::Range<u32> {
        match shape.window {
            None => 0..written,
            Some(w) => written.saturating_sub(w + self.max_step)..written,
        }
    }

    /// The accounting, recomputed from the model's pages, tokens and states.
    pub fn accounting(&self) -> Accounting {
        let ps = u64::from(self.pool.page_slots);
        let state = self.state_slots();
        let mut live = 0u64;
        let mut reserved = 0u64;
        for s in self.seqs.values() {
            reserved += u64::from(s.pages) * ps;
            for (shape, &(_, pages)) in self.pool.shapes.iter().zip(&s.cuts) {
                let bt = u64::from(shape.block_tokens);
                let end = u64::from(s.written).div_ceil(bt);
                let first = match shape.window {
                    None => 0,
                    Some(_) => end.saturating_sub(u64::from(pages)),
                };
                for b in first..end {
                    let in_block = (u64::from(s.written) - b * bt).min(bt);
                    live += in_block * ps / bt;
                }
            }
        }
        let held = self.seqs.values().filter(|s| s.state).count() as u64;
        let count = |o: Owner| self.owner.iter().filter(|&&x| x == o).count() as u64;
        Accounting {
            total_slots: u64::from(self.pool.pages) * ps
                + self
                    .pool
                    .state
                    .reserved_sequences()
                    .map_or(0, |n| u64::from(n) * state),
            live_slots: live + held * state,
            allocated_unfilled_slots: reserved - live,
            cached_free_slots: 0,
            pending_free_slots: count(Owner::Pending) * ps + self.pending_states() * state,
            free_slots: count(Owner::Free) * ps + self.free_states() * state,
        }
    }
}
