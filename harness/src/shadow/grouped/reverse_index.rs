//! A record's holds in the grouped reverse index (page → the `(stream, table, block)` records
//! that read it), which keeps a record's unchanged blocks valid between checks: a block entering a
//! record holds its page (the page's first reader is its sole one), a block leaving lets it go — at
//! once, or when the step that read through it retires — and a stream's records are dropped
//! whole. A child of `grouped`, for its records.

use super::*;

impl Shadow {
    /// Register stream `idx`'s block `b` of table `t` as a reader of `page`.
    pub(super) fn hold_page(&mut self, idx: u32, t: usize, b: u64, page: u32, step: u64) {
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return;
        };
        let Some(c) = chunk(cells.tables(), t as u32, b) else {
            self.violation(format!(
                "step {step}: block {b} of table {t} is past what the shadow can index"
            ));
            return;
        };
        let tables = cells.tables();
        let held = self.grouped.readers.as_mut().map_or(Held::Shared, |r| {
            r.hold(u64::from(page), Holder { seq: idx, chunk: c })
        });
        match held {
            // The page's first reader is its sole one: the stream's writes there (a decode's
            // token in the block it just entered) are stored blind until someone else reads it.
            Held::Alone => {
                let seen = self
                    .grouped
                    .streams
                    .get_mut(idx as usize)
                    .and_then(|st| st.tables.get_mut(t));
                if let Some(seen) = seen {
                    seen.sole = page;
                }
            }
            Held::Joined(was) => self.no_longer_alone(was, page, tables),
            Held::Shared => {}
        }
    }

    /// Record `was` (of `tables` tables a stream) is not alone on `page` any more: its stream's
    /// pending decodes are stored, then the page stops being its sole one.
    pub(super) fn no_longer_alone(&mut self, was: Holder, page: u32, tables: u32) {
        self.flush_stream(was.seq);
        let t = (was.chunk % tables.max(1)) as usize;
        let seen = self
            .grouped
            .streams
            .get_mut(was.seq as usize)
            .and_then(|st| st.tables.get_mut(t));
        if let Some(seen) = seen.filter(|s| s.sole == page) {
            seen.sole = NO_PAGE;
        }
    }

    /// Stream `idx`'s record drops block `b` of table `t` (page `page`; the step before read
    /// positions `lo..hi` of it): unheld now, or when step `prev` retires if it is in flight.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn release_page(
        &mut self,
        idx: u32,
        t: usize,
        b: u64,
        page: u32,
        lo: u64,
        hi: u64,
        prev: u64,
    ) {
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return;
        };
        let Some(c) = chunk(cells.tables(), t as u32, b) else {
            return;
        };
        let holder = Holder { seq: idx, chunk: c };
        let seen = self
            .grouped
            .streams
            .get_mut(idx as usize)
            .and_then(|st| st.tables.get_mut(t));
        if let Some(seen) = seen.filter(|s| s.sole == page) {
            seen.sole = NO_PAGE;
        }
        if let Some(f) = self.flight_at(prev) {
            f.released.push(Released {
                holder,
                page,
                lo,
                hi,
            });
            return;
        }
        if let Some(r) = self.grouped.readers.as_mut() {
            r.unhold(u64::from(page), holder);
        }
    }

    /// Drop every record of stream `idx` (a swap-out, a stream gone), keeping the pages held
    /// until step `prev` retires if it is in flight.
    pub(in crate::shadow) fn drop_records(&mut self, idx: u32, prev: u64) {
        self.flush_stream(idx);
        let Some(st) = self.grouped.streams.get_mut(idx as usize) else {
            return;
        };
        let mut tables = std::mem::take(&mut st.tables);
        st.recheck.clear();
        st.settled = UNSETTLED;
        if self.flight_at(prev).is_none() {
            // Nothing the records read is in flight: unheld now, in one pass.
            if let (Kind::Grouped(cells), Some(r)) =
                (&self.grouped.kind, self.grouped.readers.as_mut())
            {
                let n = cells.tables();
                for (t, seen) in tables.iter().enumerate() {
                    // Chunks grow with the block: when the last block's fits 32 bits, every
                    // block's does, a table apart.
                    let last = seen.end_block().saturating_sub(1);
                    match chunk(n, t as u32, seen.first_block).zip(chunk(n, t as u32, last)) {
                        Some((mut c, _)) => {
                            for &page in &seen.pages {
                                r.unhold(u64::from(page), Holder { seq: idx, chunk: c });
                                c = c.wrapping_add(n);
                            }
                        }
                        None => {
                            for (b, &page) in (seen.first_block..).zip(&seen.pages) {
                                if let Some(c) = chunk(n, t as u32, b) {
                                    r.unhold(u64::from(page), Holder { seq: idx, chunk: c });
                                }
                            }
                        }
                    }
                }
            }
        } else {
            for (t, seen) in tables.iter().enumerate() {
                let Kind::Grouped(cells) = &self.grouped.kind else {
                    return;
                };
                let Some(bt) = cells.block_tokens(t as u32).map(u64::from) else {
                    continue;
                };
                for (b, &page) in (seen.first_block..).zip(&seen.pages) {
                    let (lo, hi) = in_block(b, bt, seen.lo, seen.end);
                    self.release_page(idx, t, b, page, lo, hi, prev);
                }
            }
        }
        // Emptied records keep their pages' capacity for the next stream at this index: an
        // empty record reads as no record everywhere (no page, no positions, no sole page).
        for seen in &mut tables {
            let mut pages = std::mem::take(&mut seen.pages);
            pages.clear();
            *seen = Seen {
                pages,
                ..Seen::default()
            };
        }
        if let Some(st) = self.grouped.streams.get_mut(idx as usize) {
            st.tables = tables;
        }
    }
}
