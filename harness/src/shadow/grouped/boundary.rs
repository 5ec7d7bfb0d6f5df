//! The fused decode across a block boundary: a settled stream's decode whose token starts a new
//! block, or whose sliding window's first position left a block, in some table shape (Gemma 3's
//! sliding tables drop a block one decode before every table enters one). The general path
//! follows each table block by block (`observe_unmoved`: the kept blocks compared, the leaving
//! ones released, the entering one held) and then writes; here what each shape reads is worked
//! out once a shape, every table is checked before anything changes — so a decode the general
//! path must take leaves nothing behind — then followed in the general path's order, then
//! written. A child of `grouped`, for its records.

use kvbench_cache_api::{GroupTable, TableShape};

use super::write::{still_maps, token_tag, MAX_SHAPES};
use super::*;

/// Whether `table`'s pages `..j1` are, block for block, those of the list its record was last
/// found equal to (`checked`: that list's version and first block) because the list changed
/// once since, by one page pushed at its end or pages drained from its front with the first
/// block moved past them ([`Pages::parent`](kvbench_cache_api::pages::Pages::parent): only the
/// list's own methods say so). Its entering page is checked apart.
#[inline]
fn grew_once_from(checked: (u64, u64), table: &GroupTable, j1: usize) -> bool {
    table.pages.parent().is_some_and(|p| {
        p.version == checked.0
            && Some(table.first_block) == checked.1.checked_add(p.drained_front as u64)
            && j1 + p.pushed <= table.pages.len()
    })
}

/// What one table shape's records do at the decode: blocks `s0 .. s1` read last step, `b0 ..
/// b1` now (`b0 < s1`: some are kept; `b1 - s1` ≤ 1 enters), positions `lo .. end`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Move {
    pub bt: u64,
    pub lo: u64,
    pub s0: u64,
    pub s1: u64,
    pub b0: u64,
    pub b1: u64,
}

impl Move {
    fn moves(&self) -> bool {
        self.b0 != self.s0 || self.b1 != self.s1
    }
}

impl Shadow {
    /// Stream `idx`'s decode (token at `context`, step `step`, its previous step `prev`)
    /// through tables whose blocks move as `moves` says, per shape. False, having changed
    /// nothing, when a table does not map what its shape reads now through the record's kept
    /// pages, names an entering page outside the pool, or a block past the reverse index.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decode_at_boundary(
        &mut self,
        idx: u32,
        shapes: &[TableShape],
        tables: &[GroupTable],
        w: &SeqWork,
        step: u64,
        prev: u64,
        moves: &[Move; MAX_SHAPES],
    ) -> bool {
        let i = idx as usize;
        let context = u64::from(w.context_tokens);
        let end = context + 1;
        if !self.tables_map_at_boundary(i, tables, moves) {
            return false;
        }
        let Some(tag) = token_tag(&self.seqs[i], context) else {
            return false;
        };
        let enters = moves.iter().any(|m| m.b1 != m.s1);
        if enters {
            // The tail's block is left: stored before any record changes.
            self.flush_stream(idx);
        }
        // Follow every table, in order: release what left, hold what entered — block by block
        // while the step before is in flight (its releases wait for it), else in one pass.
        let n = tables.len();
        if self.flight_at(prev).is_some() || !self.follow_boundary_now(idx, tables, moves, end) {
            // The releases queued on the step in flight name what each record read there.
            if let (Some(st), Kind::Grouped(cells)) =
                (self.grouped.streams.get_mut(i), &self.grouped.kind)
            {
                if st.tail != NO_TAIL {
                    st.set_reads(cells.classes());
                }
            }
            for (t, table) in tables.iter().enumerate() {
                let c = match &self.grouped.kind {
                    Kind::Grouped(cells) => cells.classes().1[t],
                    _ => 0,
                };
                let m = moves[c as usize % MAX_SHAPES];
                if m.moves() {
                    self.follow_boundary(idx, t, table, &m, step, prev);
                }
                let seen = &mut self.grouped.streams[i].tables[t];
                seen.lo = m.lo;
                seen.end = end;
            }
        }
        // Then write: blind where the record alone holds its last page, else the general write.
        let g = &mut self.grouped;
        let (Some(st), Kind::Grouped(cells)) = (g.streams.get_mut(i), &mut g.kind) else {
            return false;
        };
        let tailing = st.tail != NO_TAIL;
        let tails = cells.tails();
        let (class, tags) = cells.classes_and_tags();
        let slow = &mut g.slow;
        slow.clear();
        let (mut written, mut outside) = (0u64, None);
        let waits = |seen: &Seen| {
            let page = seen.pages.last().copied().unwrap_or(NO_PAGE);
            seen.sole == page && tags.allocated(page)
        };
        if tailing {
            // No block entered: the token waits with the tail in every record's last page.
            written = n as u64;
        } else if tails && st.tables.iter().all(waits) {
            // Blocks entered, every record alone on its last page, its cells allocated: the
            // token starts the next tail there instead of being stored 31 times (Gemma 3).
            st.tail = context;
            written = n as u64;
        } else {
            for (t, (seen, &c)) in st.tables.iter().zip(class).enumerate() {
                let m = moves[c as usize % MAX_SHAPES];
                let page = seen.pages.last().copied().unwrap_or(NO_PAGE);
                if seen.sole != page {
                    slow.push(t as u32);
                } else if tags.store(page, (context % m.bt) as u32, tag) {
                    written += 1;
                } else {
                    outside.get_or_insert((t, page));
                }
            }
            if slow.is_empty() && outside.is_none() && tails {
                st.tail = end;
            }
        }
        let read: u64 = (cells.class_counts().iter().zip(moves))
            .map(|(&k, m)| k * (end - m.lo))
            .sum();
        st.settled = end;
        self.finish_decode(idx, shapes, tables, w, step, (read, written, outside));
        true
    }

    /// Whether every table of stream `i` maps what its shape reads now through its record's
    /// pages: an unmoved table by its version (compared when it moved, then remembered), a
    /// moving one by its kept pages, its entering page inside the pool and its block inside
    /// what the reverse index names. Changes nothing but the remembered versions.
    fn tables_map_at_boundary(&mut self, i: usize, tables: &[GroupTable], moves: &[Move]) -> bool {
        let g = &mut self.grouped;
        let (Some(st), Kind::Grouped(cells)) = (g.streams.get_mut(i), &g.kind) else {
            return false;
        };
        let (_, class) = cells.classes();
        let n = cells.tables();
        for (t, ((seen, &c), table)) in st.tables.iter_mut().zip(class).zip(tables).enumerate() {
            let m = moves[c as usize % MAX_SHAPES];
            if !m.moves() {
                if !still_maps(seen, table) {
                    return false;
                }
                continue;
            }
            let (m0, m1) = (table.first_block, table.end_block());
            if m.b0 < m0 || m.b1 > m1 || seen.first_block != m.s0 || seen.end_block() != m.s1 {
                return false;
            }
            let keep = (m.b0 - m.s0) as usize;
            let (j0, j1) = ((m.b0 - m0) as usize, (m.s1 - m0) as usize);
            let version = (table.pages.version(), table.first_block);
            if seen.checked != version
                && !grew_once_from(seen.checked, table, j1)
                && seen.pages[keep..] != table.pages[j0..j1]
            {
                return false;
            }
            if m.b1 != m.s1 {
                let page = table.pages[j1];
                if !cells.has_page(page) || chunk(n, t as u32, m.s1).is_none() {
                    return false;
                }
            }
        }
        true
    }

    /// [`Shadow::follow_boundary`] for every table when nothing is in flight, the records, the
    /// reverse index and the cell classes borrowed once: a leaving block unheld at once, an
    /// entering one held, and a record whose page another record held first (`Held::Joined`)
    /// settled after the pass — its owner's tail stored, its sole page forgotten — before
    /// anything is written. False, having changed nothing, without a reverse index.
    fn follow_boundary_now(
        &mut self,
        idx: u32,
        tables: &[GroupTable],
        moves: &[Move; MAX_SHAPES],
        end: u64,
    ) -> bool {
        let g = &mut self.grouped;
        let (Kind::Grouped(cells), Some(readers), Some(st)) =
            (&g.kind, g.readers.as_mut(), g.streams.get_mut(idx as usize))
        else {
            return false;
        };
        let n = cells.tables();
        let joined = &mut g.joined;
        joined.clear();
        let records = st.tables.iter_mut().zip(cells.classes().1).zip(tables);
        for (t, ((seen, &c), table)) in records.enumerate() {
            let m = moves[c as usize % MAX_SHAPES];
            seen.lo = m.lo;
            seen.end = end;
            if !m.moves() {
                continue;
            }
            let gone = (m.b0 - m.s0) as usize;
            for (b, &page) in (m.s0..).zip(&seen.pages[..gone]) {
                if let Some(c) = chunk(n, t as u32, b) {
                    if seen.sole == page {
                        seen.sole = NO_PAGE;
                    }
                    readers.unhold(u64::from(page), Holder { seq: idx, chunk: c });
                }
            }
            if gone > 0 {
                seen.pages.drain(..gone);
            }
            seen.first_block = m.b0;
            if m.b1 != m.s1 {
                // Inside the pool and the reverse index: `tables_map_at_boundary` checked.
                let page = table.pages[(m.s1 - table.first_block) as usize];
                if let Some(c) = chunk(n, t as u32, m.s1) {
                    match readers.hold(u64::from(page), Holder { seq: idx, chunk: c }) {
                        Held::Alone => seen.sole = page,
                        Held::Joined(was) => joined.push((was, page)),
                        Held::Shared => {}
                    }
                }
                seen.pages.push(page);
            }
            seen.checked = (table.pages.version(), table.first_block);
        }
        let joined = std::mem::take(&mut self.grouped.joined);
        for &(was, page) in &joined {
            self.no_longer_alone(was, page, n);
        }
        self.grouped.joined = joined;
        true
    }

    /// Table `t`'s record moves as `m` says: its leaving blocks released (held until step
    /// `prev` retires if it is in flight), its entering block held; then it is the table's
    /// blocks `b0 .. b1`, the part kept compared and the rest copied from it.
    fn follow_boundary(
        &mut self,
        idx: u32,
        t: usize,
        table: &GroupTable,
        m: &Move,
        step: u64,
        prev: u64,
    ) {
        let i = idx as usize;
        let seen = &self.grouped.streams[i].tables[t];
        let (old_lo, old_end) = (seen.lo, seen.end);
        for b in m.s0..m.b0 {
            let page = self.grouped.streams[i].tables[t].pages[(b - m.s0) as usize];
            let (plo, phi) = in_block(b, m.bt, old_lo, old_end);
            self.release_page(idx, t, b, page, plo, phi, prev);
        }
        let seen = &mut self.grouped.streams[i].tables[t];
        seen.pages.drain(..(m.b0 - m.s0) as usize);
        seen.first_block = m.b0;
        if m.b1 != m.s1 {
            let page = table.pages[(m.s1 - table.first_block) as usize];
            self.hold_page(idx, t, m.s1, page, step);
            self.grouped.streams[i].tables[t].pages.push(page);
        }
        self.grouped.streams[i].tables[t].checked = (table.pages.version(), table.first_block);
    }
}

#[cfg(test)]
mod tests {
    use kvbench_cache_api::{GroupTable, Pages};

    use super::grew_once_from;

    /// Blocks 2.. on pages 10, 11, 12, found equal to a record that read blocks 2..5.
    fn table() -> (GroupTable, (u64, u64)) {
        let t = GroupTable {
            first_block: 2,
            pages: Pages::from(vec![10, 11, 12]),
        };
        let checked = (t.pages.version(), t.first_block);
        (t, checked)
    }

    #[test]
    fn a_table_grown_once_from_what_the_record_matched_is_known_without_comparing() {
        let (mut t, checked) = table();
        t.pages.push(13);
        assert!(
            grew_once_from(checked, &t, 3),
            "one page entered at the end"
        );
        assert!(
            !grew_once_from(checked, &t, 4),
            "the record cannot read the entered page"
        );
        let (mut t, checked) = table();
        t.pages.drain_front(1).for_each(drop);
        t.first_block += 1;
        assert!(grew_once_from(checked, &t, 2), "a window left a block");
        let (mut t, checked) = table();
        t.pages.drain_front(1).for_each(drop);
        assert!(
            !grew_once_from(checked, &t, 2),
            "drained without moving the first block: every block is on another page"
        );
        let (mut t, checked) = table();
        t.pages.rotate_left(1);
        t.first_block += 1;
        assert!(grew_once_from(checked, &t, 2), "a ring turned one block");
    }

    #[test]
    fn a_table_changed_otherwise_or_twice_is_compared() {
        let (mut t, checked) = table();
        t.pages.set(1, 20);
        assert!(!grew_once_from(checked, &t, 3), "a kept page replaced");
        t.pages.push(13);
        assert!(
            !grew_once_from(checked, &t, 3),
            "replaced, then grown: the parent is not what the record matched"
        );
        let (mut t, checked) = table();
        t.pages.push(13);
        t.pages.push(14);
        assert!(!grew_once_from(checked, &t, 3), "two changes");
        let (mut t, checked) = table();
        t.pages.pop();
        t.pages.push(20);
        assert!(
            !grew_once_from(checked, &t, 2),
            "the last page swapped for another"
        );
    }
}
