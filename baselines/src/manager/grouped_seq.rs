//! One sequence's reservation in the grouped contiguous baseline: the run of pages it holds,
//! how that run is cut into its tables, and the block tables it hands to the backends.
//!
//! A full or latent table gets `⌈reserve / block_tokens⌉` pages, block `b` in page `b` of its
//! share. A sliding table gets a ring of `⌈(window + max_step_tokens) / block_tokens⌉ + 1` pages
//! (at most the full figure), block `b` in ring page `b mod ring_len`: a step writes at most
//! `max_step_tokens` new positions and reads at most `window` before them, and those positions
//! touch at most that many blocks whatever their alignment, so a write never lands on a page the
//! same step still reads.

use kvbench_cache_api::{CopyOp, GroupTable, StepId, TableShape};

/// Where one table's pages lie inside a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableCut {
    /// Pages before this table's share, from the reservation's first page.
    pub offset_pages: u32,
    /// Pages of this table's share (a sliding table's ring length).
    pub pages: u32,
}

/// The pages each table of a reservation of `reserve_tokens` takes, in table order, or `None`
/// when the figures do not fit a `u32` (no pool holds such a reservation).
pub(crate) fn cut_tables(
    shapes: &[TableShape],
    reserve_tokens: u32,
    max_step_tokens: u32,
) -> Option<Vec<TableCut>> {
    let mut cuts = Vec::with_capacity(shapes.len());
    let mut offset: u64 = 0;
    for shape in shapes {
        let pages = table_pages(shape, reserve_tokens, max_step_tokens)?;
        cuts.push(TableCut {
            offset_pages: u32::try_from(offset).ok()?,
            pages: u32::try_from(pages).ok()?,
        });
        offset = offset.checked_add(pages)?;
    }
    u32::try_from(offset).ok()?;
    Some(cuts)
}

/// Pages one table of a `reserve_tokens` reservation takes (see the module doc).
pub(crate) fn table_pages(
    shape: &TableShape,
    reserve_tokens: u32,
    max_step_tokens: u32,
) -> Option<u64> {
    let bt = u64::from(shape.block_tokens.max(1));
    let full = u64::from(reserve_tokens).div_ceil(bt);
    match shape.window {
        None => Some(full),
        Some(w) => {
            let span = u64::from(w).checked_add(u64::from(max_step_tokens.max(1)))?;
            Some(span.div_ceil(bt).checked_add(1)?.min(full))
        }
    }
}

/// Pages of a whole reservation: the sum of [`cut_tables`].
pub(crate) fn reservation_pages(cuts: &[TableCut]) -> u32 {
    cuts.last().map_or(0, |c| c.offset_pages + c.pages)
}

/// One live sequence's reservation.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    pub base_page: u32,
    /// Tokens reserved: the request's reservation, at least its started tokens.
    pub reserve_tokens: u32,
    pub cuts: Vec<TableCut>,
    /// Positions mapped (started tokens + appended).
    pub mapped_tokens: u32,
    /// Positions written (filled + appended).
    pub written_tokens: u32,
    /// Holds one recurrent state.
    pub state: bool,
    /// What `layout` hands out: full tables up to the mapped tokens, rings the last blocks of
    /// the written ones.
    pub tables: Vec<GroupTable>,
    /// With the bad-block-table fault armed: the corrupted tables handed out instead.
    pub bad_tables: Option<Vec<GroupTable>>,
    /// For each step not yet retired that writes this sequence (the next one to be submitted
    /// included): the step and the written tokens before its writes. Its reads start a window
    /// before those, so a ring may not turn past them (see [`Reservation::ring_overreach`]).
    pub readers: Vec<(StepId, u32)>,
}

impl Reservation {
    pub fn pages(&self) -> u32 {
        reservation_pages(&self.cuts)
    }

    /// Bring table `t`'s block table to the sequence's current tokens, touching only what
    /// changed: a full table grows at its end; a ring that moves past its length turns (the
    /// page of block `b` is the page of `b − ring_len`, so the dropped front is the new back).
    pub fn refresh_table(&mut self, t: usize, shape: &TableShape) {
        let cut = self.cuts[t];
        let (first, end) = expected_blocks(shape, cut, self.mapped_tokens, self.written_tokens);
        let base = self.base_page + cut.offset_pages;
        let table = &mut self.tables[t];
        let (old_first, old_end) = (table.first_block, table.end_block());
        if old_first == first && old_end == end {
            return;
        }
        let ring = u64::from(cut.pages.max(1));
        let page_of = |b: u64| base + (b % ring) as u32;
        let old_len = old_end - old_first;
        let new_len = end - first;
        let continues = first >= old_first && first <= old_end && end >= old_end;
        let turned = first.saturating_sub(old_first);
        if continues && old_len == new_len && turned < old_len && shape.window.is_some() {
            table.pages.rotate_left(turned as usize);
        } else if continues {
            table.pages.drain_front(turned as usize);
            table.pages.extend((old_end.max(first)..end).map(page_of));
        } else {
            table.pages.clear();
            table.pages.extend((first..end).map(page_of));
        }
        table.first_block = first;
        debug_assert_eq!(table.pages.len() as u64, new_len);
    }

    /// Whether a sliding table's ring is shorter than the reservation, so that it turns and a
    /// step larger than the one it was sized for would overwrite what that step reads.
    pub fn has_turning_ring(&self, shapes: &[TableShape]) -> bool {
        shapes.iter().zip(&self.cuts).any(|(shape, cut)| {
            let full =
                u64::from(self.reserve_tokens).div_ceil(u64::from(shape.block_tokens.max(1)));
            shape.window.is_some() && u64::from(cut.pages) < full
        })
    }

    /// Before a write carried by step `carrying`: forget the readers that retired (`live` says
    /// whether a begun step is still in flight) and note this one.
    pub fn note_writer(&mut self, carrying: StepId, live: impl Fn(StepId) -> bool) {
        self.readers
            .retain(|&(step, _)| step >= carrying || live(step));
        if self.readers.last().map(|r| r.0) != Some(carrying) {
            self.readers.push((carrying, self.written_tokens));
        }
    }

    /// A ring whose dropped blocks reach a position a step not yet retired still reads — a
    /// ring sized for fewer tokens than the steps in flight write — as (table, the step, the
    /// first position it reads, the first block still held).
    pub fn ring_overreach(&self, shapes: &[TableShape]) -> Option<(usize, StepId, u64, u64)> {
        let &(step, before) = self.readers.iter().min_by_key(|r| r.1)?;
        for (t, (shape, table)) in shapes.iter().zip(&self.tables).enumerate() {
            let Some(w) = shape.window else { continue };
            let reads_from = u64::from(before).saturating_sub(u64::from(w));
            let bt = u64::from(shape.block_tokens.max(1));
            if table.first_block * bt > reads_from {
                return Some((t, step, reads_from, table.first_block));
            }
        }
        None
    }

    /// Refresh every table.
    pub fn refresh(&mut self, shapes: &[TableShape]) {
        for (t, shape) in shapes.iter().enumerate() {
            self.refresh_table(t, shape);
        }
    }

    /// The page copies that give a reservation at `dst_base` this one's written content: each
    /// table's pages that hold written blocks, at the same place in the child's run, adjacent
    /// runs merged into one op.
    pub fn copy_ops(&self, shapes: &[TableShape], dst_base: u32, page_slots: u32) -> Vec<CopyOp> {
        let mut ops: Vec<CopyOp> = Vec::new();
        let ps = u64::from(page_slots);
        for (shape, cut) in shapes.iter().zip(&self.cuts) {
            let bt = u64::from(shape.block_tokens.max(1));
            let held = u64::from(self.written_tokens)
                .div_ceil(bt)
                .min(u64::from(cut.pages));
            if held == 0 {
                continue;
            }
            let src = u64::from(self.base_page + cut.offset_pages) * ps;
            let dst = u64::from(dst_base + cut.offset_pages) * ps;
            let len = held * ps;
            if let Some(last) = ops.last_mut() {
                let last_len = u64::from(last.len_tokens);
                let merged = last_len + len;
                if last.src_slot + last_len == src
                    && last.dst_slot + last_len == dst
                    && merged <= u64::from(u32::MAX)
                {
                    last.len_tokens = merged as u32;
                    continue;
                }
            }
            // A table's share is at most u32::MAX pages of page_slots each; a longer copy is
            // split so that every op's length fits its field.
            let mut done = 0;
            while done < len {
                let chunk = (len - done).min(u64::from(u32::MAX) / ps * ps);
                ops.push(CopyOp {
                    src_slot: src + done,
                    dst_slot: dst + done,
                    len_tokens: chunk as u32,
                });
                done += chunk;
            }
        }
        ops
    }

    /// Slots of this reservation holding written tokens: each held block's written tokens by
    /// their share of its page (rounded down).
    pub fn live_slots(&self, shapes: &[TableShape], page_slots: u32) -> u64 {
        shapes
            .iter()
            .zip(&self.tables)
            .map(|(shape, table)| {
                live_slots(shape, table.first_block, self.written_tokens, page_slots)
            })
            .sum()
    }
}

/// Logical blocks `[first, end)` a table holds: a full table every block up to the mapped
/// tokens; a ring the last `ring_len` blocks of the written tokens.
pub(crate) fn expected_blocks(
    shape: &TableShape,
    cut: TableCut,
    mapped_tokens: u32,
    written_tokens: u32,
) -> (u64, u64) {
    let bt = u64::from(shape.block_tokens.max(1));
    match shape.window {
        None => (0, u64::from(mapped_tokens).div_ceil(bt)),
        Some(_) => {
            let end = u64::from(written_tokens).div_ceil(bt);
            (end.saturating_sub(u64::from(cut.pages)), end)
        }
    }
}

/// Live slots of one table holding blocks `first_block..` of `written_tokens` written tokens.
pub(crate) fn live_slots(
    shape: &TableShape,
    first_block: u64,
    written_tokens: u32,
    page_slots: u32,
) -> u64 {
    let bt = u64::from(shape.block_tokens.max(1));
    let ps = u64::from(page_slots);
    let written = u64::from(written_tokens);
    let whole = (written / bt).saturating_sub(first_block);
    let partial = written % bt;
    whole * ps + partial * ps / bt
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(block_tokens: u32, window: Option<u32>) -> TableShape {
        TableShape {
            block_tokens,
            window,
        }
    }

    #[test]
    fn a_ring_turns_by_rotation_and_keeps_each_block_on_its_page() {
        let shapes = [shape(4, Some(6))];
        // Ring: ceil((6 + 2) / 4) + 1 = 3 pages, well under the full 25.
        let cuts = cut_tables(&shapes, 100, 2).unwrap();
        assert_eq!(cuts[0].pages, 3);
        let mut r = Reservation {
            base_page: 10,
            reserve_tokens: 100,
            cuts,
            mapped_tokens: 0,
            written_tokens: 0,
            state: false,
            tables: vec![GroupTable::default()],
            bad_tables: None,
            readers: Vec::new(),
        };
        for written in 1..=40u32 {
            r.mapped_tokens = written;
            r.written_tokens = written;
            r.refresh(&shapes);
            let t = &r.tables[0];
            let end = u64::from(written).div_ceil(4);
            assert_eq!(t.end_block(), end);
            assert_eq!(t.first_block, end.saturating_sub(3));
            for (i, &p) in t.pages.iter().enumerate() {
                let b = t.first_block + i as u64;
                assert_eq!(p, 10 + (b % 3) as u32, "block {b} at {written} tokens");
            }
        }
    }
}
