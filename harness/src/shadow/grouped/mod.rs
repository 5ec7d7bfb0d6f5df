//! The shadow for grouped layouts (`SeqLayout::Grouped`): one tag per cell `(page, offset)` of the
//! grouped pool, written and read through every block table of a stream, so a table placed at the
//! wrong page, a ring overwritten inside its window, a page written before the step that reads it
//! retired, a missed page copy and a sliding table released too early all read back as a wrong tag
//! (or as a position its table no longer holds).
//!
//! **Incremental, as the flat shadow.** A stream keeps, per table, the pages it was last checked
//! against (logical blocks `first_block ..`) and the positions it read. A step compares each
//! table with that record — one slice comparison when nothing moved — and checks only what is
//! new to the stream: blocks that entered its reads or changed page, positions that entered its
//! context without being written by the step itself. What keeps the unchanged part valid is the
//! reverse index: every page lists the `(stream, table, block)` records that hold it, and a
//! write that changes a cell one of them reads to something it does not expect marks that block
//! for re-checking at the holder's next read — and, when a step of the holder's is still in
//! flight, checks that cell at the step's completion (a device reading it late would see it).
//! A record a step drops (a block leaving a sliding window, a block moved to another page) keeps
//! its page held until the steps that read it retire, so a page reused before its fence is seen.
//! So a decode costs a comparison of each table and one tag a table, not the whole context.
//!
//! **What a step reads.** In table `t`, positions `readable_from(shape, end) .. end` (the window
//! of the step's last token for a sliding table, everything otherwise), `end` = context + new
//! tokens: the context as it stands and the step's own writes. The earlier queries of a long
//! prefill chunk reach further back into a sliding table; the manager keeps those pages fenced
//! until the step retires, but the layout no longer names them, so they are not checked.
//! Recurrent state lives outside the pool and is not shadowed.
//!
//! **Map.** A child of the shadow (it reads the streams' histories and scopes and reports through
//! the same [`ShadowReport`]). This file holds the records (`Stream`, `Seen`, `Flight`) and the
//! general step; its children, for those records: `cells.rs` the cell store, `reverse_index.rs` a
//! record's holds on pages, `write.rs` a step's writes and the fused decode, `boundary.rs` the
//! fused decode across a block boundary, `pending.rs` the decodes the fused decode left unstored,
//! `prompt.rs` a stream's first step from nothing, `moves.rs` copies, swaps, foreign writes and the
//! checks at completion. The fused decodes, the first step and the general decode's blind store are
//! shortcuts of the general path; [`Shadow::set_grouped_shortcuts`] turns them off, so a test can
//! see that both report the same.

use std::collections::VecDeque;

use kvbench_cache_api::grouped::readable_from;
use kvbench_cache_api::{GroupTable, TableShape};

use super::*;

mod boundary;
mod cells;
mod moves;
mod pending;
mod prompt;
mod reverse_index;
mod write;

use cells::Cells;
use pending::NO_TAIL;
use write::MAX_SHAPES;

/// Whether the run's layouts are grouped: decided at the first step that schedules a stream
/// with a layout, since a manager hands out one kind of layout for a whole run.
#[derive(Debug, Default)]
pub(super) enum Kind {
    #[default]
    Unknown,
    Flat,
    Grouped(Box<Cells>),
}

/// The grouped half of the shadow's state.
#[derive(Debug, Default)]
pub(super) struct GroupedState {
    pub(super) kind: Kind,
    /// Per page, the records that hold it (`Holder::chunk` = [`chunk`] of table and block).
    readers: Option<Readers>,
    /// Per stream index (`Shadow::seqs`): what its tables were checked at.
    streams: Vec<Stream>,
    /// The steps in flight that ran grouped streams, oldest first.
    in_flight: VecDeque<Flight>,
    /// Emptied flights, reused.
    spare: Vec<Flight>,
    /// Readers of a page, copied out while a write looks at them.
    scratch: Vec<Holder>,
    /// Offsets a page copy changed.
    changed: Vec<u32>,
    /// Tables of a fused decode whose write goes through the reverse index.
    slow: Vec<u32>,
    /// The shapes slice (address, length) and page size already found to be the run's during
    /// the current `submit`: the manager is borrowed shared for the whole call, so a slice it
    /// lends again at the same address and length holds the same shapes, and the comparison
    /// (a few hundred instructions for Gemma 3's 31 tables) is done once a step, not once a
    /// stream. Cleared at every `submit`.
    shapes_ok: Option<(usize, usize, u32)>,
    /// A fresh stream's first step (`prompt.rs`): per block of its records,
    /// whether it was held alone, and where each table's blocks start in that list.
    prompt_alone: Vec<bool>,
    prompt_at: Vec<usize>,
    /// Streams with a pending tail whose page a fresh step's records joined: their tails are
    /// stored before the step writes.
    prompt_joined: Vec<u32>,
    /// One stream's tags for a run of positions (a pending tail, a fresh step's prompt), built
    /// once for every table they are stored into.
    run_tags: Vec<Tag>,
    /// Records a decode across block boundaries found on a page it entered, with the page:
    /// settled after the pass ([`Shadow::no_longer_alone`]).
    joined: Vec<(Holder, u32)>,
    /// Every step through the general path: the fused decode, the fresh step and the general
    /// decode's blind store are shortcuts of it, and a differential test runs both ways
    /// (`Shadow::set_grouped_shortcuts`).
    general_only: bool,
}

impl GroupedState {
    pub(super) fn set_shortcuts(&mut self, on: bool) {
        self.general_only = !on;
    }

    /// A new `submit`: the manager may have changed since the shapes were last compared.
    pub(super) fn forget_shapes(&mut self) {
        self.shapes_ok = None;
    }

    pub(super) fn allocated_bytes(&self) -> u64 {
        let readers = self.readers.as_ref().map_or(0, Readers::allocated_bytes);
        match &self.kind {
            Kind::Grouped(c) => c.allocated_bytes() + readers,
            _ => 0,
        }
    }
}

/// One stream's tables as last checked.
#[derive(Debug)]
struct Stream {
    tables: Vec<Seen>,
    /// `(table, block)`s a foreign write changed under the record: re-checked at the next read.
    recheck: Vec<(u32, u64)>,
    /// Tags copied out by a swap-out, per table: `(first position, tags)`.
    host: Option<Vec<(u64, Vec<Tag>)>>,
    /// The end `e` of the stream's last step when every record was left as its shape reads at
    /// `e` ([`Stream::settle`]): blocks `lo / bt .. (e − 1) / bt + 1`, positions `lo .. e`, `lo =
    /// readable_from(shape, e) < e`. Then the fused decode compares the read range once a
    /// shape, not once a table. [`UNSETTLED`] otherwise; any step but a fused decode starts by
    /// setting it so, as does dropping the records.
    settled: u64,
    /// The first of the decodes the fused decode left pending, `tail .. settled` of every
    /// table ([`NO_TAIL`] if none): `pending.rs` says when they are stored.
    tail: u64,
}

/// No end the records are known to be settled at.
const UNSETTLED: u64 = u64::MAX;

impl Default for Stream {
    fn default() -> Stream {
        Stream {
            tables: Vec::new(),
            recheck: Vec::new(),
            host: None,
            settled: UNSETTLED,
            tail: NO_TAIL,
        }
    }
}

impl Stream {
    /// After a step through the general path (or a fresh one) that ended at `end`: whether
    /// every record is as its shape reads at `end`, remembered for the next fused decode. The
    /// run's distinct shapes and each table's index into them (`Cells::classes`): what a shape
    /// reads is worked out once a shape. More shapes than the fused decode takes: unsettled.
    fn settle(&mut self, (distinct, class): (&[TableShape], &[u32]), end: u64) {
        self.settled = UNSETTLED;
        if end == 0 || distinct.len() > MAX_SHAPES || class.len() != self.tables.len() {
            return;
        }
        // Per shape: the first position read and the blocks `first .. end` read.
        let mut reads = [(0u64, 0u64, 0u64); MAX_SHAPES];
        for (r, shape) in reads.iter_mut().zip(distinct) {
            let bt = u64::from(shape.block_tokens.max(1));
            let lo = readable_from(shape, end);
            if lo >= end {
                return;
            }
            *r = (lo, lo / bt, (end - 1) / bt + 1);
        }
        let settled = self.tables.iter().zip(class).all(|(seen, &c)| {
            let (lo, first, last) = reads[c as usize % MAX_SHAPES];
            seen.lo == lo
                && seen.end == end
                && seen.first_block == first
                && seen.end_block() == last
        });
        if settled {
            self.settled = end;
        }
    }
}

/// One table of a stream as last checked: the pages of logical blocks `first_block ..`, each
/// held in the reverse index, and the positions `lo .. end` the step read.
#[derive(Debug, Clone)]
struct Seen {
    first_block: u64,
    pages: Vec<u32>,
    lo: u64,
    end: u64,
    /// A page this record is known to be the only reader of ([`NO_PAGE`] if none): the
    /// stream's writes there need no look at the reverse index. Cleared when anyone else
    /// starts reading the page or the record lets it go.
    sole: u32,
    /// The manager's table this record was last found equal to, as `(pages' version, first
    /// block)` ([`UNCHECKED_TABLE`] if none): while the table hands out the same two, its pages are
    /// the ones compared (`Pages` renumbers every change), and the fused decode skips the
    /// comparison. Any change to the record's blocks resets it.
    checked: (u64, u64),
}

/// No table's version: a record not yet compared since its blocks last changed.
const UNCHECKED_TABLE: (u64, u64) = (u64::MAX, u64::MAX);

impl Default for Seen {
    fn default() -> Seen {
        Seen {
            first_block: 0,
            pages: Vec::new(),
            lo: 0,
            end: 0,
            sole: NO_PAGE,
            checked: UNCHECKED_TABLE,
        }
    }
}

const NO_PAGE: u32 = u32::MAX;

impl Seen {
    /// A record of blocks `first_block ..` through `pages`, read at `lo..end`, not yet known
    /// alone on any page nor compared with any version of the table.
    fn new(first_block: u64, pages: Vec<u32>, lo: u64, end: u64) -> Seen {
        Seen {
            first_block,
            pages,
            lo,
            end,
            ..Seen::default()
        }
    }

    fn end_block(&self) -> u64 {
        self.first_block + self.pages.len() as u64
    }

    /// The page this record holds for block `b`.
    fn page(&self, b: u64) -> Option<u32> {
        let k = usize::try_from(b.checked_sub(self.first_block)?).ok()?;
        self.pages.get(k).copied()
    }
}

/// A step in flight: the cells to compare when it completes, and the holds its readers dropped
/// since (released then).
#[derive(Debug, Default)]
struct Flight {
    step: u64,
    checks: Vec<GCheck>,
    released: Vec<Released>,
}

/// At completion, positions `lo..hi` of table `table` of stream `seq` must hold its tokens in
/// page `page`.
#[derive(Debug, Clone, Copy)]
struct GCheck {
    seq: u32,
    table: u32,
    lo: u64,
    hi: u64,
    page: u32,
    /// Queued by a write made while the step was in flight.
    clobbered: bool,
}

/// A hold a record dropped while a step that read positions `lo..hi` through it was in flight.
#[derive(Debug, Clone, Copy)]
struct Released {
    holder: Holder,
    page: u32,
    lo: u64,
    hi: u64,
}

/// The reverse index's chunk for block `b` of table `t` among `tables`, if it fits 32 bits
/// (positions are 32-bit, so it does unless blocks are a token and tables many).
#[inline]
fn chunk(tables: u32, t: u32, b: u64) -> Option<u32> {
    let c = b
        .checked_mul(u64::from(tables))?
        .checked_add(u64::from(t))?;
    u32::try_from(c).ok()
}

/// Positions `lo..hi` clipped to block `b` of `bt` tokens.
#[inline]
fn in_block(b: u64, bt: u64, lo: u64, hi: u64) -> (u64, u64) {
    ((b * bt).max(lo), ((b + 1) * bt).min(hi))
}

impl Shadow {
    /// Decide, at the first step that schedules a stream with a layout, whether the run is
    /// grouped; size the cell store from that layout and the manager's slot count. True for a
    /// grouped run.
    pub(super) fn ensure_grouped(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> bool {
        match self.grouped.kind {
            Kind::Flat => return false,
            Kind::Grouped(_) => return true,
            Kind::Unknown => {}
        }
        let Some(layout) = plan.seqs.iter().find_map(|w| cache.layout(w.seq)) else {
            return false;
        };
        let SeqLayout::Grouped {
            page_slots, shapes, ..
        } = layout
        else {
            self.grouped.kind = Kind::Flat;
            return false;
        };
        let slots = cache.accounting().total_slots.max(self.tags.len());
        let made = Cells::new(page_slots, shapes, slots).and_then(|c| {
            let r = Readers::new(c.pages()).ok_or("the page index is too large")?;
            Ok((c, r))
        });
        match made {
            Ok((c, r)) => {
                self.grouped.kind = Kind::Grouped(Box::new(c));
                self.grouped.readers = Some(r);
            }
            Err(why) => {
                // Nothing can be checked; say so once and treat every layout as unshadowed.
                self.violation(why);
                self.grouped.kind = Kind::Flat;
                return false;
            }
        }
        true
    }

    /// Stream `idx`'s step through its grouped layout: follow every table (queueing checks of
    /// what is new), then write the step's new tokens into every table.
    pub(super) fn step_grouped(
        &mut self,
        idx: u32,
        page_slots: u32,
        shapes: &[TableShape],
        tables: &[GroupTable],
        w: &SeqWork,
        step: u64,
    ) {
        let Kind::Grouped(cells) = &self.grouped.kind else {
            self.violation(format!(
                "step {step}: stream {} has a grouped layout in a run whose layouts are not \
                 grouped",
                w.seq
            ));
            return;
        };
        let key = (shapes.as_ptr() as usize, shapes.len(), page_slots);
        let why = if self.grouped.shapes_ok == Some(key) {
            Cells::refuses_tables(shapes, tables)
        } else {
            cells.refuses(page_slots, shapes, tables)
        };
        if let Some(why) = why {
            self.violation(format!("step {step}: stream {}: {why}", w.seq));
            return;
        }
        self.grouped.shapes_ok = Some(key);
        let s = &mut self.seqs[idx as usize];
        let prev = s.last_step;
        s.last_step = step;
        let i = idx as usize;
        if self.grouped.streams.len() <= i {
            self.grouped.streams.resize_with(i + 1, Stream::default);
        }
        if prev == NEVER {
            // A new stream in a reused index: nothing it holds was checked yet.
            self.drop_records(idx, NEVER);
            self.grouped.streams[i].host = None;
        }
        if self.grouped.streams[i].tables.len() != tables.len() {
            self.flush_stream(idx);
            let st = &mut self.grouped.streams[i];
            st.tables.resize_with(tables.len(), Seen::default);
            st.settled = UNSETTLED;
        }
        self.flight_of(step);
        let shortcuts = !self.grouped.general_only;
        if shortcuts && self.decode_grouped(idx, shapes, tables, w, (step, prev)) {
            return;
        }
        let context = u64::from(w.context_tokens);
        let end = context + u64::from(w.new_tokens);
        // Any other path reads and writes the records and cells directly.
        self.flush_stream(idx);
        self.grouped.streams[i].settled = UNSETTLED;
        if shortcuts && prev == NEVER && self.step_prompt(idx, shapes, tables, w, step) {
            self.settle(idx, end, false);
            return;
        }
        let mut recheck = std::mem::take(&mut self.grouped.streams[i].recheck);
        // Every table followed before any is written: a write through one table then meets
        // every record of the stream as this step reads it (a record not yet followed would
        // still name pages the manager let go since, and read as clobbered).
        for (t, (shape, table)) in shapes.iter().zip(tables).enumerate() {
            let forced = !recheck.is_empty() && recheck.iter().any(|&(rt, _)| rt == t as u32);
            let span = (context, end);
            if forced || !self.observe_unmoved(idx, t, shape, table, span, prev, step) {
                self.observe_table(idx, t, shape, table, span, prev, step, &recheck);
            }
        }
        let blind = if shortcuts && w.new_tokens == 1 {
            self.write_decode(idx, shapes, tables, w, step)
        } else {
            for (t, (shape, table)) in shapes.iter().zip(tables).enumerate() {
                self.write_table(idx, t, shape, table, w, step);
            }
            false
        };
        recheck.clear();
        let st = &mut self.grouped.streams[i];
        if st.recheck.is_empty() {
            st.recheck = recheck;
        }
        self.settle(idx, end, blind);
    }

    /// Stream `idx`'s step through the general or fresh path ended at `end`: remember whether
    /// its records are settled there ([`Stream::settle`]) and, when the step's one token went
    /// blind into every record's last page (`blind`) and they are, start a tail there
    /// (`pending.rs`: the next decodes in the block can wait).
    fn settle(&mut self, idx: u32, end: u64, blind: bool) {
        let g = &mut self.grouped;
        let (Some(st), Kind::Grouped(cells)) = (g.streams.get_mut(idx as usize), &g.kind) else {
            return;
        };
        st.settle(cells.classes(), end);
        if blind && st.settled == end && cells.tails() {
            st.tail = end;
        }
    }

    /// The flight of step `step`, opened if it is not yet.
    fn flight_of(&mut self, step: u64) -> &mut Flight {
        let g = &mut self.grouped;
        if g.in_flight.back().is_none_or(|f| f.step != step) {
            let mut f = g.spare.pop().unwrap_or_default();
            f.step = step;
            g.in_flight.push_back(f);
        }
        g.in_flight.back_mut().expect("just opened")
    }

    /// The flight of in-flight step `step`, if it ran grouped streams and has not completed.
    fn flight_at(&mut self, step: u64) -> Option<&mut Flight> {
        if step == NEVER || step < self.completed {
            return None;
        }
        self.grouped
            .in_flight
            .iter_mut()
            .rev()
            .find(|f| f.step == step)
    }

    /// Queue positions `lo..hi` of table `t` (in `page`) for checking when `step` completes.
    fn queue_grouped(&mut self, seq: u32, t: usize, page: u32, lo: u64, hi: u64, step: u64) {
        if lo >= hi {
            return;
        }
        if let Some(f) = self.flight_at(step) {
            f.checks.push(GCheck {
                seq,
                table: t as u32,
                lo,
                hi,
                page,
                clobbered: false,
            });
        }
    }

    /// The common case of a table, in place: nothing was invalidated, the window did not move
    /// back, the positions read before are still read and the pages they lie in are the ones
    /// checked last time. Blocks that left the read range are released, blocks that entered it
    /// are held and checked. Returns false, having changed nothing, otherwise.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn observe_unmoved(
        &mut self,
        idx: u32,
        t: usize,
        shape: &TableShape,
        table: &GroupTable,
        (context, end): (u64, u64),
        prev: u64,
        step: u64,
    ) -> bool {
        let bt = u64::from(shape.block_tokens.max(1));
        let lo = readable_from(shape, end);
        let seen = &self.grouped.streams[idx as usize].tables[t];
        if lo >= end || seen.pages.is_empty() || lo < seen.lo || context < seen.end || seen.end < lo
        {
            return false;
        }
        let (b0, b1) = (lo / bt, (end - 1) / bt + 1);
        let (s0, s1) = (seen.first_block, seen.end_block());
        let (m0, m1) = (table.first_block, table.end_block());
        let version = (table.pages.version(), table.first_block);
        // A decode inside the blocks read last time: compare (unless this version of the table
        // was), move the read range, done.
        if b0 == s0 && b1 == s1 && m0 <= b0 && b1 <= m1 && context == seen.end {
            let j0 = (b0 - m0) as usize;
            if seen.checked != version && seen.pages[..] != table.pages[j0..j0 + seen.pages.len()] {
                return false;
            }
            self.report.read_slots += end - lo;
            let seen = &mut self.grouped.streams[idx as usize].tables[t];
            seen.lo = lo;
            seen.end = end;
            seen.checked = version;
            return true;
        }
        // The table maps everything read; the record starts at or before the read range and
        // ends inside it (a decode adds at most a block at the end).
        if b0 < s0 || b0 < m0 || b1 > m1 || s1 > b1 || s1 <= b0 {
            return false;
        }
        let (k0, k1) = ((b0 - s0) as usize, (s1 - s0) as usize);
        let (j0, j1) = ((b0 - m0) as usize, (s1 - m0) as usize);
        if seen.pages[k0..k1] != table.pages[j0..j1] {
            return false;
        }
        // Unmoved. Positions `seen.end .. context` entered without this step writing them.
        let (old_lo, old_end) = (seen.lo, seen.end);
        self.report.read_slots += end - lo;
        for b in s0..b0 {
            let page = self.grouped.streams[idx as usize].tables[t].pages[(b - s0) as usize];
            let (plo, phi) = in_block(b, bt, old_lo, old_end);
            self.release_page(idx, t, b, page, plo, phi, prev);
        }
        let seen = &mut self.grouped.streams[idx as usize].tables[t];
        seen.pages.drain(..k0);
        seen.first_block = b0;
        seen.checked = UNCHECKED_TABLE;
        seen.lo = lo;
        seen.end = end;
        if old_end < context {
            for b in (old_end / bt)..s1 {
                let page = self.grouped.streams[idx as usize].tables[t].pages[(b - b0) as usize];
                let (plo, phi) = in_block(b, bt, old_end, context);
                self.queue_grouped(idx, t, page, plo, phi, step);
            }
        }
        for b in s1..b1 {
            let page = table.pages[(b - m0) as usize];
            self.enter_block(idx, t, b, page, bt, (lo, context), step);
            self.grouped.streams[idx as usize].tables[t]
                .pages
                .push(page);
        }
        // The record is now the table's blocks `b0..b1`: the part kept was compared, the rest
        // copied from it.
        self.grouped.streams[idx as usize].tables[t].checked = version;
        true
    }

    /// Block `b` (page `page`) enters stream `idx`'s record of table `t`: held, and its
    /// positions in `lo..context` (the rest the step writes itself) checked at completion.
    #[allow(clippy::too_many_arguments)]
    fn enter_block(
        &mut self,
        idx: u32,
        t: usize,
        b: u64,
        page: u32,
        bt: u64,
        (lo, context): (u64, u64),
        step: u64,
    ) {
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return;
        };
        if !cells.has_page(page) {
            let id = self.seqs[idx as usize].id;
            self.violation(format!(
                "step {step}: stream {id}'s table {t} names page {page}, outside the pool"
            ));
            return;
        }
        self.hold_page(idx, t, b, page, step);
        let (plo, phi) = in_block(b, bt, lo, context);
        self.queue_grouped(idx, t, page, plo, phi, step);
    }

    /// Bring stream `idx`'s record of table `t` up to `table` for a read of positions
    /// `readable_from(shape, end) .. end`, block by block: release what left, hold and check
    /// what entered or moved, re-check what a foreign write invalidated.
    #[allow(clippy::too_many_arguments)]
    fn observe_table(
        &mut self,
        idx: u32,
        t: usize,
        shape: &TableShape,
        table: &GroupTable,
        (context, end): (u64, u64),
        prev: u64,
        step: u64,
        recheck: &[(u32, u64)],
    ) {
        let bt = u64::from(shape.block_tokens.max(1));
        let lo = readable_from(shape, end);
        self.report.read_slots += end.saturating_sub(lo);
        let (m0, m1) = (table.first_block, table.end_block());
        let (mut b0, mut b1) = if lo < end {
            (lo / bt, (end - 1) / bt + 1)
        } else {
            (0, 0)
        };
        if b0 < b1 && (b0 < m0 || b1 > m1) {
            let (pos, why) = if b0 < m0 {
                (lo, "which the table no longer holds (released)")
            } else {
                ((m1 * bt).max(lo), "which the table does not map")
            };
            let id = self.seqs[idx as usize].id;
            self.violation(format!(
                "step {step}: stream {id} reads position {pos} of table {t}, {why}"
            ));
            // Record only what is mapped: the rest is looked at again next step.
            b0 = b0.max(m0);
            b1 = b1.min(m1).max(b0);
        }
        let old = std::mem::take(&mut self.grouped.streams[idx as usize].tables[t]);
        for (b, &page) in (old.first_block..).zip(&old.pages) {
            if b < b0 || b >= b1 || table.pages[(b - m0) as usize] != page {
                let (plo, phi) = in_block(b, bt, old.lo, old.end);
                self.release_page(idx, t, b, page, plo, phi, prev);
            }
        }
        let mut pages = Vec::with_capacity((b1 - b0) as usize);
        for b in b0..b1 {
            let page = table.pages[(b - m0) as usize];
            pages.push(page);
            if old.page(b) != Some(page) {
                self.enter_block(idx, t, b, page, bt, (lo, context), step);
                continue;
            }
            let (plo, phi) = in_block(b, bt, lo, context);
            if recheck.contains(&(t as u32, b)) {
                self.queue_grouped(idx, t, page, plo, phi, step);
                continue;
            }
            // Positions of the block read now but not read (or not written) last time.
            if plo < old.lo.min(phi) {
                self.queue_grouped(idx, t, page, plo, old.lo.min(phi), step);
            }
            let from = old.end.max(plo);
            if from < phi {
                self.queue_grouped(idx, t, page, from, phi, step);
            }
        }
        self.grouped.streams[idx as usize].tables[t] = Seen::new(b0, pages, lo, end);
    }
}
