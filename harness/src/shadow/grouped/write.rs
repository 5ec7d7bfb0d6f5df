//! A grouped step's writes: the fused decode (one new token through tables that did not move,
//! the common stream-step) and the general write of a step's new tokens, a block's run at a
//! time. A child of `grouped`, for its records.

use kvbench_cache_api::grouped::readable_from;
use kvbench_cache_api::{GroupTable, TableShape};

use super::boundary::Move;
use super::*;

impl Shadow {
    /// A decode through tables that all read the same blocks as last step, through the same
    /// pages: move the read ranges and store the token's tag in every table — blind where the
    /// record alone holds its last page. The records were left settled at this decode's
    /// context ([`Stream::settled`]), so whether a table's read range still covers the same
    /// blocks is a shape's question, asked once a shape (`Cells::classes`: Gemma 3's 31 tables
    /// have two); a table's own work is its version (its pages compared only when it changed),
    /// its read range and one store (none while the stream's decodes are pending:
    /// `pending.rs`). A block entering or leaving some shape's reads takes the
    /// decode across (`boundary.rs`). Returns false when any table needs the
    /// general path (a page moved, a re-check is due, the stream is new), having changed
    /// nothing that path does not redo the same way (the pass below).
    pub(super) fn decode_grouped(
        &mut self,
        idx: u32,
        shapes: &[TableShape],
        tables: &[GroupTable],
        w: &SeqWork,
        (step, prev): (u64, u64),
    ) -> bool {
        if w.new_tokens != 1 {
            return false;
        }
        let i = idx as usize;
        let context = u64::from(w.context_tokens);
        let end = context + 1;
        let g = &mut self.grouped;
        let (Some(st), Kind::Grouped(cells)) = (g.streams.get_mut(i), &mut g.kind) else {
            return false;
        };
        let (distinct, class) = cells.classes();
        // The caller checked the layout against the run's shapes (`Cells::refuses`).
        if st.settled != context
            || !st.recheck.is_empty()
            || st.tables.len() != tables.len()
            || class.len() != tables.len()
            || shapes.len() != tables.len()
            || distinct.len() > MAX_SHAPES
        {
            return false;
        }
        let Some(tag) = token_tag(&self.seqs[i], context) else {
            return false;
        };
        // What each shape reads now against what it read at `context` (where every record of
        // the shape was left): the same blocks when the token does not start a block and the
        // window's first position stayed in its block — else the decode goes across
        // (`boundary.rs`), if some block read last step is still read. And the
        // token's offset in its block.
        let mut spans = [Span::default(); MAX_SHAPES];
        let mut moving = false;
        for (span, shape) in spans.iter_mut().zip(distinct) {
            let bt = u64::from(shape.block_tokens.max(1));
            let off = context % bt;
            let (lo, was) = (readable_from(shape, end), readable_from(shape, context));
            if lo >= end || lo < was {
                return false;
            }
            moving |= off == 0 || (lo != was && lo / bt != was / bt);
            *span = Span {
                lo,
                off: off as u32,
            };
        }
        if moving {
            let mut moves = [Move::default(); MAX_SHAPES];
            for ((m, span), shape) in moves.iter_mut().zip(&spans).zip(distinct) {
                let bt = u64::from(shape.block_tokens.max(1));
                *m = Move {
                    bt,
                    lo: span.lo,
                    s0: readable_from(shape, context) / bt,
                    s1: context.saturating_sub(1) / bt + 1,
                    b0: span.lo / bt,
                    b1: context / bt + 1,
                };
                // Nothing read last step is still read: the general path.
                if m.b0 >= m.s1 {
                    return false;
                }
            }
            return self.decode_at_boundary(idx, shapes, tables, w, step, prev, &moves);
        }
        // One pass: a table that changed since its record last matched it must still name the
        // record's pages (a page moved under an unmoved read range takes the general path);
        // then its read range moves and the token's tag is stored — or, for a stream with a
        // pending tail (every record alone on its last page), left pending with the others
        // (`pending.rs`). A pass that stops early has moved the earlier tables'
        // ranges and stored their tags — what the general path then does for them anyway (its
        // follow of a record already at `end` checks nothing new, its stores rewrite the same
        // tags) — and counted nothing.
        let slow = &mut g.slow;
        slow.clear();
        let (mut written, mut outside) = (0u64, None);
        let (class, tags) = cells.classes_and_tags();
        let tailing = st.tail != NO_TAIL;
        let mut ok = true;
        if tailing {
            // The decode waits with the tail, and the records' read ranges stay where the tail
            // began: what they read follows from `settled` ([`Stream::reads`]) until the tail
            // is stored, which sets them. Only the tables are compared.
            for (seen, table) in st.tables.iter_mut().zip(tables) {
                if !still_maps(seen, table) {
                    ok = false;
                    break;
                }
            }
        } else {
            let records = st.tables.iter_mut().zip(class).zip(tables).enumerate();
            for (t, ((seen, &c), table)) in records {
                // `% MAX_SHAPES` keeps the index in the array without a check (`c` < the
                // distinct shapes ≤ MAX_SHAPES already).
                let Span { lo, off } = spans[c as usize % MAX_SHAPES];
                if !still_maps(seen, table) {
                    ok = false;
                    break;
                }
                seen.lo = lo;
                seen.end = end;
                // The token's block is the record's last, through the same page.
                let page = seen.pages.last().copied().unwrap_or(NO_PAGE);
                if seen.sole != page {
                    slow.push(t as u32);
                } else if tags.store(page, off, tag) {
                    written += 1;
                } else {
                    outside.get_or_insert((t, page));
                }
            }
        }
        if !ok {
            return false;
        }
        // Every table of a shape reads the same positions.
        let read: u64 = (cells.class_counts().iter().zip(&spans))
            .map(|(&n, s)| n * (end - s.lo))
            .sum();
        if tailing {
            // Every table's store would have been blind and inside the pool.
            written = st.tables.len() as u64;
        } else if slow.is_empty() && outside.is_none() && cells.tails() {
            // Every record alone on its last page, just stored into: the next decodes there can
            // wait (the tail's invariant holds from here).
            st.tail = end;
        }
        st.settled = end;
        // Tables whose page someone else may read: the general write (the table is unchanged,
        // so it names the record's page), through the reverse index.
        self.finish_decode(idx, shapes, tables, w, step, (read, written, outside));
        true
    }

    /// The end of a decode's writes: what was read and written counted, a store outside the
    /// pool reported, then the tables whose page someone else may read (`GroupedState::slow`)
    /// written through the reverse index.
    pub(super) fn finish_decode(
        &mut self,
        idx: u32,
        shapes: &[TableShape],
        tables: &[GroupTable],
        w: &SeqWork,
        step: u64,
        (read, written, outside): (u64, u64, Option<(usize, u32)>),
    ) {
        self.report.read_slots += read;
        self.report.written_slots += written;
        if let Some((t, page)) = outside {
            self.violation(format!(
                "step {step}: stream {} writes position {} of table {t}, into page {page} \
                 outside the pool",
                w.seq, w.context_tokens
            ));
        }
        if self.grouped.slow.is_empty() {
            return;
        }
        let slow = std::mem::take(&mut self.grouped.slow);
        for &t in &slow {
            let t = t as usize;
            self.write_table(idx, t, &shapes[t], &tables[t], w, step);
        }
        self.grouped.slow = slow;
    }

    /// A decode's token (position `context`) written into every table after the general path
    /// followed them: blind where the record alone holds the token's page (a block entered at
    /// this step is held alone from the moment it is entered), through [`Shadow::write_table`]
    /// otherwise — a page someone else reads, a record that does not reach the token's block
    /// (the table did not map it), a token the stream's history does not have. Returns whether
    /// every table's store went blind into its record's last page (a tail may start there).
    pub(super) fn write_decode(
        &mut self,
        idx: u32,
        shapes: &[TableShape],
        tables: &[GroupTable],
        w: &SeqWork,
        step: u64,
    ) -> bool {
        let context = u64::from(w.context_tokens);
        let tag = token_tag(&self.seqs[idx as usize], context);
        let g = &mut self.grouped;
        let mut slow = std::mem::take(&mut g.slow);
        slow.clear();
        let (mut written, mut outside) = (0u64, None);
        match (tag, g.streams.get(idx as usize), &mut g.kind) {
            (Some(tag), Some(st), Kind::Grouped(cells)) if st.tables.len() == shapes.len() => {
                let (_, tags) = cells.classes_and_tags();
                for (t, (seen, shape)) in st.tables.iter().zip(shapes).enumerate() {
                    let bt = u64::from(shape.block_tokens.max(1));
                    let page = seen.pages.last().copied().unwrap_or(NO_PAGE);
                    if page == NO_PAGE || seen.sole != page || seen.end_block() != context / bt + 1
                    {
                        slow.push(t as u32);
                    } else if tags.store(page, (context % bt) as u32, tag) {
                        written += 1;
                    } else {
                        outside.get_or_insert((t, page));
                    }
                }
            }
            _ => slow.extend(0..shapes.len() as u32),
        }
        let blind = slow.is_empty() && outside.is_none();
        self.grouped.slow = slow;
        self.finish_decode(idx, shapes, tables, w, step, (0, written, outside));
        blind
    }

    /// Write the step's new tokens (`context .. end`) into table `t`, a block's run at a time.
    /// A position before the window of the step's last token that the table no longer maps is
    /// not written (its layers never read it again); any other unmapped position is a
    /// violation. A write that changes a cell someone else holds is shown to them
    /// (`moves.rs`); where the writer alone holds the page, the run is stored
    /// blind.
    pub(super) fn write_table(
        &mut self,
        idx: u32,
        t: usize,
        shape: &TableShape,
        table: &GroupTable,
        w: &SeqWork,
        step: u64,
    ) {
        let (from, to) = (
            u64::from(w.context_tokens),
            u64::from(w.context_tokens) + u64::from(w.new_tokens),
        );
        let lo = readable_from(shape, to);
        let bt = u64::from(shape.block_tokens.max(1));
        let mut bad: Option<(u64, &str)> = None;
        self.write_span(idx, t, table, (bt, lo), (from, to), &mut bad);
        if let Some((pos, why)) = bad {
            self.violation(format!(
                "step {step}: stream {} writes position {pos} of table {t}, {why}",
                w.seq
            ));
        }
    }

    /// Store positions `from..to` of table `t` (`table`, blocks of `bt` tokens, the step's
    /// window from `lo`): blind through the blocks the stream alone reads, a shared one cell by
    /// cell. What goes wrong first is left in `bad` (the caller reports it).
    pub(super) fn write_span(
        &mut self,
        idx: u32,
        t: usize,
        table: &GroupTable,
        (bt, lo): (u64, u64),
        (from, to): (u64, u64),
        bad: &mut Option<(u64, &'static str)>,
    ) {
        let known = (self.seqs[idx as usize].history.len() as u64).min(to);
        if known < to {
            bad.get_or_insert((known.max(from), "whose token is unknown"));
        }
        let mut pos = from;
        while pos < known {
            let Some((b, page, run_end)) =
                self.write_blocks_alone(idx, t, table, (bt, lo), (&mut pos, known), bad)
            else {
                break;
            };
            let own = self.holder(idx, t, b);
            if !self.write_block_shared(idx, page, (pos, run_end), bt, own) {
                bad.get_or_insert((pos, "into a page outside the pool"));
            }
            pos = run_end;
        }
    }

    /// Store positions `*pos..known` of table `t` (`table`, blocks of `bt` tokens, window from
    /// `lo`) a block's run at a time, blind, while no one but this record reads the block's
    /// page; `*pos` advances past what was stored or skipped (an unmapped block: `bad` names it
    /// unless it lies before the window). Stops at a block someone else may read and returns
    /// it (block, page, end of its run) for the cell-by-cell path; `None` once at `known`. One
    /// call for a prefill chunk's blocks, its borrows taken once.
    #[allow(clippy::too_many_arguments)]
    fn write_blocks_alone(
        &mut self,
        idx: u32,
        t: usize,
        table: &GroupTable,
        (bt, lo): (u64, u64),
        (pos, known): (&mut u64, u64),
        bad: &mut Option<(u64, &'static str)>,
    ) -> Option<(u64, u32, u64)> {
        let s = &self.seqs[idx as usize];
        let g = &mut self.grouped;
        let Kind::Grouped(cells) = &mut g.kind else {
            *pos = known;
            return None;
        };
        let tables = cells.tables();
        let mut seen = g
            .streams
            .get_mut(idx as usize)
            .and_then(|st| st.tables.get_mut(t));
        let readers = g.readers.as_ref();
        let (mut written, mut shared) = (0u64, None);
        while *pos < known {
            let b = *pos / bt;
            let run_end = ((b + 1) * bt).min(known);
            let Some(page) = b
                .checked_sub(table.first_block)
                .and_then(|k| table.pages.get(usize::try_from(k).ok()?).copied())
            else {
                if run_end > lo {
                    bad.get_or_insert(((*pos).max(lo), "which the table does not map"));
                }
                *pos = run_end;
                continue;
            };
            if !alone(seen.as_deref_mut(), readers, (idx, tables, t), b, page) {
                shared = Some((b, page, run_end));
                break;
            }
            let from = *pos;
            let tokens = &s.history[from as usize..run_end as usize];
            match cells.store_run(page, (from % bt) as u32, tokens, from as u32, s.writer) {
                Some(()) => written += run_end - from,
                None => {
                    bad.get_or_insert((from, "into a page outside the pool"));
                }
            }
            *pos = run_end;
        }
        self.report.written_slots += written;
        shared
    }

    /// Stream `idx`'s record of block `b` of table `t` as the reverse index names it.
    fn holder(&self, idx: u32, t: usize, b: u64) -> Option<Holder> {
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return None;
        };
        chunk(cells.tables(), t as u32, b).map(|c| Holder { seq: idx, chunk: c })
    }

    /// Store stream `idx`'s positions `from..to` of a page someone else may read (`own`: the
    /// writer's record of it): cell by cell, each change shown to the page's readers. False
    /// when the page is outside the pool.
    #[inline(never)]
    fn write_block_shared(
        &mut self,
        idx: u32,
        page: u32,
        (from, to): (u64, u64),
        bt: u64,
        own: Option<Holder>,
    ) -> bool {
        self.flush_page(page);
        let writer = self.seqs[idx as usize].writer;
        for pos in from..to {
            let tag = Tag {
                pos: pos as u32,
                token: self.seqs[idx as usize].history[pos as usize],
                writer,
            };
            let off = (pos % bt) as u32;
            let changed = match &mut self.grouped.kind {
                Kind::Grouped(cells) => cells.write(page, off, tag),
                _ => None,
            };
            let Some(changed) = changed else {
                return false;
            };
            self.report.written_slots += 1;
            if changed {
                self.clobber(page, off, tag, own);
            }
        }
        true
    }
}

/// Whether stream `idx`'s record `seen` of table `t` (of `tables`) is all that reads `page`,
/// its block `b`: then the block's writes are stored blind. Remembers the page as the record's
/// own ([`Seen::sole`]) when the record is its one reader, so the next write there needs no
/// look at the reverse index.
#[inline(always)]
fn alone(
    seen: Option<&mut Seen>,
    readers: Option<&Readers>,
    (idx, tables, t): (u32, u32, usize),
    b: u64,
    page: u32,
) -> bool {
    if seen
        .as_ref()
        .is_some_and(|s| s.sole == page && s.page(b) == Some(page))
    {
        return true;
    }
    let (alone, sole) = match (chunk(tables, t as u32, b), readers) {
        (Some(c), Some(r)) => r.only_and_sole(u64::from(page), idx, c),
        _ => (false, false),
    };
    if let Some(s) = seen.filter(|_| alone && sole) {
        s.sole = page;
    }
    alone
}

/// Whether a settled record still names the pages `table` maps its blocks to: its version
/// compared, and the pages only when the version moved (then remembered).
#[inline(always)]
pub(super) fn still_maps(seen: &mut Seen, table: &GroupTable) -> bool {
    let version = (table.pages.version(), table.first_block);
    if seen.checked != version {
        // The record is settled: its first block is the one the shape reads from.
        let n = seen.pages.len();
        let mapped = (seen.first_block)
            .checked_sub(table.first_block)
            .and_then(|j0| table.pages.get(j0 as usize..).and_then(|p| p.get(..n)));
        if mapped != Some(&seen.pages[..]) {
            return false;
        }
        seen.checked = version;
    }
    true
}

/// The tag stream `s` writes at position `pos`, if its history has the token (and the position
/// fits a tag).
#[inline(always)]
pub(super) fn token_tag(s: &SeqShadow, pos: u64) -> Option<Tag> {
    Some(Tag {
        pos: u32::try_from(pos).ok()?,
        token: *s.history.get(usize::try_from(pos).ok()?)?,
        writer: s.writer,
    })
}

/// Distinct table shapes a fused decode handles (Gemma 3 and gpt-oss have two, Qwen3-Next one).
/// A power of two: an index `% MAX_SHAPES` needs no bounds check.
pub(super) const MAX_SHAPES: usize = 4;
const _: () = assert!(MAX_SHAPES.is_power_of_two());

/// What one table shape reads at a decode: the first readable position and the new token's
/// offset in its block — the same for every table of the shape.
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    lo: u64,
    off: u32,
}
