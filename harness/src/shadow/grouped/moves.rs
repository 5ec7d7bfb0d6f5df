//! What moves cells in a grouped run besides a stream's own step — page copies, swaps, and a
//! write into a page someone else holds — and the checks at a step's completion. A child of
//! `grouped`, for its records and flights.

use kvbench_cache_api::grouped::{cell, readable_from};
use kvbench_cache_api::CopyOp;

use super::*;

impl Shadow {
    /// A write changed cell `(page, off)` to `tag`: every record holding the page (but `own`,
    /// the writer's) that reads that cell and does not expect `tag` there re-checks the block at
    /// its next read, and the in-flight step that read it checks the cell at its completion.
    pub(super) fn clobber(&mut self, page: u32, off: u32, tag: Tag, own: Option<Holder>) {
        let mut holders = std::mem::take(&mut self.grouped.scratch);
        match self.grouped.readers.as_ref() {
            Some(r) => r.collect(u64::from(page), &mut holders),
            None => holders.clear(),
        }
        for &h in &holders {
            if Some(h) != own {
                self.clobber_one(h, page, off, tag);
            }
        }
        self.grouped.scratch = holders;
    }

    fn clobber_one(&mut self, h: Holder, page: u32, off: u32, tag: Tag) {
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return;
        };
        let tables = cells.tables().max(1);
        let (t, b) = (h.chunk % tables, u64::from(h.chunk / tables));
        let Some(bt) = cells.block_tokens(t) else {
            return;
        };
        if off >= bt {
            return;
        }
        let pos = b * u64::from(bt) + u64::from(off);
        let r = &self.seqs[h.seq as usize];
        if u32::try_from(pos).is_ok_and(|p| expects(&r.history, r.scope, p, &tag, &self.writers)) {
            return;
        }
        let last = r.last_step;
        let check = GCheck {
            seq: h.seq,
            table: t,
            lo: pos,
            hi: pos + 1,
            page,
            clobbered: true,
        };
        // The record as it stands: re-checked at the next read, and by the step in flight.
        let shape = match &self.grouped.kind {
            Kind::Grouped(cells) => cells.shape(t),
            _ => None,
        };
        let held = self
            .grouped
            .streams
            .get(h.seq as usize)
            .zip(shape)
            .and_then(|(st, shape)| {
                Some((st.tables.get(t as usize)?, st.reads(t as usize, shape)?))
            })
            .is_some_and(|(seen, (lo, end))| {
                seen.page(b) == Some(page) && (lo..end).contains(&pos)
            });
        if held {
            self.grouped.streams[h.seq as usize].recheck.push((t, b));
            if let Some(f) = self.flight_at(last) {
                f.checks.push(check);
            }
        }
        // Holds dropped while a step that read the cell was in flight.
        let completed = self.completed;
        for f in self.grouped.in_flight.iter_mut() {
            if f.step < completed {
                continue;
            }
            let read = f
                .released
                .iter()
                .any(|d| d.holder == h && d.page == page && (d.lo..d.hi).contains(&pos));
            if read {
                f.checks.push(check);
            }
        }
    }

    /// A grouped run's copy: whole pages (`CopyOp` slots are `page × page_slots`), every cell.
    pub(in crate::shadow) fn copy_grouped(&mut self, c: &CopyOp, step: u64) {
        let Kind::Grouped(cells) = &mut self.grouped.kind else {
            return;
        };
        let ps = u64::from(cells.page_slots());
        let len = u64::from(c.len_tokens);
        if !c.src_slot.is_multiple_of(ps)
            || !c.dst_slot.is_multiple_of(ps)
            || !len.is_multiple_of(ps)
        {
            self.violation(format!(
                "step {step}: copy of {len} slots from slot {} to slot {} is not whole pages of \
                 {ps} slots",
                c.src_slot, c.dst_slot
            ));
            return;
        }
        let mut changed = std::mem::take(&mut self.grouped.changed);
        for k in 0..len / ps {
            let (src, dst) = (c.src_slot / ps + k, c.dst_slot / ps + k);
            if let (Ok(src), Ok(dst)) = (u32::try_from(src), u32::try_from(dst)) {
                self.flush_page(src);
                self.flush_page(dst);
            }
            let copied = match (u32::try_from(src), u32::try_from(dst)) {
                (Ok(src), Ok(dst)) => match &mut self.grouped.kind {
                    Kind::Grouped(cells) => {
                        cells.copy_page(src, dst, &mut changed).map(|n| (dst, n))
                    }
                    _ => None,
                },
                _ => None,
            };
            let Some((dst, n)) = copied else {
                self.violation(format!(
                    "step {step}: copy from page {src} to page {dst}, outside the pool"
                ));
                break;
            };
            self.report.written_slots += n;
            for &off in &changed {
                let tag = match &self.grouped.kind {
                    Kind::Grouped(cells) => cells.get(dst, off).unwrap_or(Tag::EMPTY),
                    _ => Tag::EMPTY,
                };
                self.clobber(dst, off, tag, None);
            }
        }
        changed.clear();
        self.grouped.changed = changed;
    }

    /// A swap-out keeps the tags of what every table still reads on the host and drops the
    /// stream's records (its pages go back to the pool); a swap-in writes them back through the
    /// layout handed out now, and the stream's next step checks them all.
    pub(in crate::shadow) fn swap_grouped(
        &mut self,
        seq: SeqId,
        direction: SwapDirection,
        tokens: u32,
        cache: &dyn KvCacheManager,
        step: u64,
    ) {
        let Some(idx) = self.idx_of(seq, step, "a swap") else {
            return;
        };
        let Some(SeqLayout::Grouped { shapes, tables, .. }) = cache.layout(seq) else {
            self.violation(format!(
                "step {step}: swap of stream {seq}, which has no grouped layout"
            ));
            return;
        };
        if !matches!(self.grouped.kind, Kind::Grouped(_)) {
            return;
        }
        let i = idx as usize;
        if self.grouped.streams.len() <= i {
            self.grouped.streams.resize_with(i + 1, Stream::default);
        }
        let end = u64::from(tokens);
        match direction {
            SwapDirection::Out => {
                self.flush_stream(idx);
                let Kind::Grouped(cells) = &self.grouped.kind else {
                    return;
                };
                let host = shapes
                    .iter()
                    .zip(tables)
                    .map(|(shape, table)| {
                        let lo = readable_from(shape, end);
                        let tags = (lo..end)
                            .map(|p| {
                                cell(shape, table, p)
                                    .and_then(|(page, off)| cells.get(page, off))
                                    .unwrap_or(Tag::EMPTY)
                            })
                            .collect();
                        (lo, tags)
                    })
                    .collect();
                self.grouped.streams[i].host = Some(host);
                let prev = self.seqs[i].last_step;
                self.drop_records(idx, prev);
                self.seqs[i].last_step = step;
            }
            SwapDirection::In => {
                let Some(host) = self.grouped.streams[i].host.take() else {
                    self.violation(format!(
                        "step {step}: swap-in of stream {seq}, which was never swapped out"
                    ));
                    return;
                };
                let mut unmapped = None;
                for ((shape, table), (lo, tags)) in shapes.iter().zip(tables).zip(host) {
                    for (p, tag) in (lo..).zip(tags).take_while(|(p, _)| *p < end) {
                        if let Some((page, _)) = cell(shape, table, p) {
                            self.flush_page(page);
                        }
                        let wrote = match (cell(shape, table, p), &mut self.grouped.kind) {
                            (Some((page, off)), Kind::Grouped(cells)) => {
                                cells.write(page, off, tag).map(|ch| (page, off, ch))
                            }
                            _ => None,
                        };
                        match wrote {
                            Some((page, off, changed)) => {
                                self.report.written_slots += 1;
                                if changed {
                                    self.clobber(page, off, tag, None);
                                }
                            }
                            None => {
                                unmapped.get_or_insert(p);
                            }
                        }
                    }
                }
                if let Some(p) = unmapped {
                    self.violation(format!(
                        "step {step}: swap-in of stream {seq}: position {p} is not mapped"
                    ));
                }
            }
        }
    }

    /// Step `step` completed: compare the cells it queued (what was new to its readers, and
    /// what a later write changed under them), then release the holds its readers dropped.
    pub(in crate::shadow) fn complete_grouped(&mut self, step: u64) {
        while self
            .grouped
            .in_flight
            .front()
            .is_some_and(|f| f.step <= step)
        {
            let Some(mut done) = self.grouped.in_flight.pop_front() else {
                return;
            };
            for c in &done.checks {
                self.check_block(c, step);
            }
            if let Some(r) = self.grouped.readers.as_mut() {
                for d in &done.released {
                    r.unhold(u64::from(d.page), d.holder);
                }
            }
            done.checks.clear();
            done.released.clear();
            self.grouped.spare.push(done);
        }
    }

    fn check_block(&mut self, c: &GCheck, step: u64) {
        self.flush_page(c.page);
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return;
        };
        let r = &self.seqs[c.seq as usize];
        let Some(bt) = cells.block_tokens(c.table) else {
            return;
        };
        let mut first_bad = None;
        let mut bad = 0u64;
        for pos in c.lo..c.hi {
            let tag = cells
                .get(c.page, (pos % u64::from(bt)) as u32)
                .unwrap_or(Tag::EMPTY);
            if !expects(&r.history, r.scope, pos as u32, &tag, &self.writers) {
                bad += 1;
                first_bad.get_or_insert((pos, tag));
            }
        }
        self.report.checked_slots += c.hi - c.lo;
        if let Some((pos, tag)) = first_bad {
            let why = mismatch(
                &r.history,
                r.scope,
                pos as u32,
                &tag,
                &self.writers,
                &self.scope_keys,
            )
            .unwrap_or_default();
            let more = if bad > 1 {
                format!(" ({} more in the block)", bad - 1)
            } else {
                String::new()
            };
            let late = if c.clobbered {
                " (overwritten while the step was in flight)"
            } else {
                ""
            };
            let msg = format!(
                "step {step}: stream {} read position {pos} of table {} at page {} offset {}, \
                 but {why}{more}{late}",
                r.id,
                c.table,
                c.page,
                pos % u64::from(bt)
            );
            self.violation(msg);
            // Every wrong cell counts, as in the flat shadow; one message a block.
            self.report.violations += bad - 1;
        }
    }
}
