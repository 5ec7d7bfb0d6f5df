//! The shadow payload for grouped layouts (`SeqLayout::Grouped`): one tag per cell `(page,
//! offset)` of the grouped pool, written and read through every block table of a stream, so a
//! table placed at the wrong page, a ring overwritten inside its window, a page written before
//! the step that reads it retired, a missed page copy and a sliding table released too early all
//! read back as a wrong tag (or as a position its table no longer holds).
//!
//! **Incremental by page version.** Each page carries a version bumped by every write that
//! changes one of its tags. A stream remembers, per table and logical block, the page and
//! version its cells were checked at; a step re-checks a block only when its page changed, its
//! version moved or positions were added, and for every other block it reads asks at completion
//! whether the page's version moved while the step was in flight (a write by a later step, or
//! by another stream of the same step) — only then are its cells compared. So a decode costs one
//! page of checks per table and a look at one version per block read, not the whole context.
//!
//! **What a step reads.** In table `t`, positions `readable_from(shape, end) .. end` (the window
//! of the step's last token for a sliding table, everything otherwise), `end` = context + new
//! tokens: the context as it stands and the step's own writes, checked at completion. The
//! earlier queries of a long prefill chunk reach further back into a sliding table; the manager
//! keeps those pages fenced until the step retires, but the layout no longer names them, so they
//! are not checked. Recurrent state lives outside the pool and is not shadowed.
//!
//! This file is a child module of `shadow.rs` (it reads the streams' histories and scopes and
//! reports through the same [`ShadowReport`]); `shadow_grouped_cells.rs` holds the cell store.

use std::collections::VecDeque;

use kvbench_cache_api::grouped::{cell, readable_from};
use kvbench_cache_api::{CopyOp, GroupTable, TableShape};

use super::*;

#[path = "shadow_grouped_cells.rs"]
mod cells;

use cells::Cells;

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
    /// Per stream index (`Shadow::seqs`): what its tables were checked at.
    streams: Vec<Stream>,
    /// The checks of each in-flight step, by step number (steps without grouped reads have no
    /// entry).
    in_flight: VecDeque<(u64, Vec<GCheck>)>,
    /// Emptied check lists, reused.
    spare: Vec<Vec<GCheck>>,
}

impl GroupedState {
    pub(super) fn allocated_bytes(&self) -> u64 {
        match &self.kind {
            Kind::Grouped(c) => c.allocated_bytes(),
            _ => 0,
        }
    }
}

/// One stream's tables as last checked.
#[derive(Debug, Default)]
struct Stream {
    tables: Vec<Seen>,
    /// Tags copied out by a swap-out, per table: `(first position, tags)`.
    host: Option<Vec<(u64, Vec<Tag>)>>,
}

/// One table of a stream as last checked: logical blocks `first_block ..`.
#[derive(Debug, Default, Clone)]
struct Seen {
    first_block: u64,
    blocks: Vec<Block>,
}

/// A block whose cells up to position `checked_to` were checked when its page was `page` at
/// version `ver`.
#[derive(Debug, Clone, Copy)]
struct Block {
    page: u32,
    ver: u64,
    checked_to: u64,
}

/// At completion, positions `lo..hi` of table `table` of stream `seq` must hold its tokens in
/// page `page` — compared when `forced`, or when the page's version is no longer `ver`.
#[derive(Debug, Clone, Copy)]
struct GCheck {
    seq: u32,
    table: u32,
    lo: u64,
    hi: u64,
    page: u32,
    ver: u64,
    forced: bool,
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
        match Cells::new(page_slots, shapes, slots) {
            Ok(c) => self.grouped.kind = Kind::Grouped(Box::new(c)),
            Err(why) => {
                // Nothing can be checked; say so once and treat every layout as unshadowed.
                self.violation(why);
                self.grouped.kind = Kind::Flat;
                return false;
            }
        }
        true
    }

    /// Stream `idx`'s step through its grouped layout: queue the reads of every table, write the
    /// step's new tokens into every table, check at completion.
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
        if let Some(why) = cells.refuses(page_slots, shapes, tables) {
            self.violation(format!("step {step}: stream {}: {why}", w.seq));
            return;
        }
        let s = &mut self.seqs[idx as usize];
        let first_step = s.last_step == NEVER;
        s.last_step = step;
        let i = idx as usize;
        if self.grouped.streams.len() <= i {
            self.grouped.streams.resize_with(i + 1, Stream::default);
        }
        let st = &mut self.grouped.streams[i];
        if first_step {
            // A new stream in a reused index: nothing it holds was checked yet.
            st.tables.clear();
            st.host = None;
        }
        st.tables.resize_with(tables.len(), Seen::default);
        let end = u64::from(w.context_tokens) + u64::from(w.new_tokens);
        let mut checks = self.take_checks(step);
        for (t, (shape, table)) in shapes.iter().zip(tables).enumerate() {
            self.observe_table(idx, t, shape, table, end, step, &mut checks);
        }
        self.put_checks(step, checks);
        for (t, (shape, table)) in shapes.iter().zip(tables).enumerate() {
            self.write_table(idx, t, shape, table, w, step);
        }
    }

    /// The check list of the step being submitted (its entry is the newest, if any).
    fn take_checks(&mut self, step: u64) -> Vec<GCheck> {
        match self.grouped.in_flight.back_mut() {
            Some((s, v)) if *s == step => std::mem::take(v),
            _ => self.grouped.spare.pop().unwrap_or_default(),
        }
    }

    fn put_checks(&mut self, step: u64, checks: Vec<GCheck>) {
        match self.grouped.in_flight.back_mut() {
            Some((s, v)) if *s == step => *v = checks,
            _ => self.grouped.in_flight.push_back((step, checks)),
        }
    }

    /// Queue the reads of table `t` (positions `readable_from(shape, end) .. end`) and bring the
    /// stream's record of it up to `table`.
    #[allow(clippy::too_many_arguments)]
    fn observe_table(
        &mut self,
        idx: u32,
        t: usize,
        shape: &TableShape,
        table: &GroupTable,
        end: u64,
        step: u64,
        checks: &mut Vec<GCheck>,
    ) {
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return;
        };
        let bt = u64::from(shape.block_tokens.max(1));
        let lo = readable_from(shape, end);
        self.report.read_slots += end - lo;
        if lo >= end {
            return;
        }
        let (b0, b1) = (lo / bt, (end - 1) / bt + 1);
        let old = std::mem::take(&mut self.grouped.streams[idx as usize].tables[t]);
        let mut seen = Seen {
            first_block: b0,
            blocks: Vec::with_capacity((b1 - b0) as usize),
        };
        let mut missing: Option<u64> = None;
        let mut outside: Option<u32> = None;
        for b in b0..b1 {
            let (plo, phi) = ((b * bt).max(lo), ((b + 1) * bt).min(end));
            // The page of block `b` (`plo / bt == b`), as `cell` finds it, without the division.
            let mapped = b
                .checked_sub(table.first_block)
                .and_then(|i| table.pages.get(usize::try_from(i).ok()?));
            let Some(&page) = mapped else {
                missing.get_or_insert(plo);
                // Keep the record aligned: an unmapped block is re-checked once mapped.
                seen.blocks.push(Block {
                    page: u32::MAX,
                    ver: 0,
                    checked_to: 0,
                });
                continue;
            };
            let Some(ver) = cells.ver(page) else {
                outside.get_or_insert(page);
                seen.blocks.push(Block {
                    page: u32::MAX,
                    ver: 0,
                    checked_to: 0,
                });
                continue;
            };
            let known = b
                .checked_sub(old.first_block)
                .and_then(|k| old.blocks.get(usize::try_from(k).ok()?));
            let forced =
                !matches!(known, Some(k) if k.page == page && k.ver == ver && k.checked_to >= phi);
            checks.push(GCheck {
                seq: idx,
                table: t as u32,
                lo: plo,
                hi: phi,
                page,
                ver,
                forced,
            });
            seen.blocks.push(Block {
                page,
                ver,
                checked_to: phi,
            });
        }
        self.grouped.streams[idx as usize].tables[t] = seen;
        let id = self.seqs[idx as usize].id;
        if let Some(pos) = missing {
            let why = if (pos / bt) < table.first_block {
                "which the table no longer holds (released)"
            } else {
                "which the table does not map"
            };
            self.violation(format!(
                "step {step}: stream {id} reads position {pos} of table {t}, {why}"
            ));
        }
        if let Some(page) = outside {
            self.violation(format!(
                "step {step}: stream {id}'s table {t} names page {page}, outside the pool"
            ));
        }
    }

    /// Write the step's new tokens (`context .. end`) into table `t`. A position before the
    /// window of the step's last token that the table no longer maps is not written (its layers
    /// never read it again); any other unmapped position is a violation.
    fn write_table(
        &mut self,
        idx: u32,
        t: usize,
        shape: &TableShape,
        table: &GroupTable,
        w: &SeqWork,
        step: u64,
    ) {
        let Kind::Grouped(cells) = &mut self.grouped.kind else {
            return;
        };
        let s = &self.seqs[idx as usize];
        let (from, to) = (
            u64::from(w.context_tokens),
            u64::from(w.context_tokens) + u64::from(w.new_tokens),
        );
        let lo = readable_from(shape, to);
        let mut bad: Option<(u64, &str)> = None;
        for pos in from..to {
            let Some(&token) = s.history.get(pos as usize) else {
                bad.get_or_insert((pos, "whose token is unknown"));
                break;
            };
            match cell(shape, table, pos) {
                Some((page, off)) => {
                    let tag = Tag {
                        pos: pos as u32,
                        token,
                        writer: s.writer,
                    };
                    if cells.write(page, off, tag) {
                        self.report.written_slots += 1;
                    } else {
                        bad.get_or_insert((pos, "into a page outside the pool"));
                    }
                }
                None if pos < lo => {}
                None => {
                    bad.get_or_insert((pos, "which the table does not map"));
                }
            }
        }
        if let Some((pos, why)) = bad {
            self.violation(format!(
                "step {step}: stream {} writes position {pos} of table {t}, {why}",
                w.seq
            ));
        }
    }

    /// A grouped run's copy: whole pages (`CopyOp` slots are `page × page_slots`), every cell.
    pub(super) fn copy_grouped(&mut self, c: &CopyOp, step: u64) {
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
        for k in 0..len / ps {
            let (src, dst) = (c.src_slot / ps + k, c.dst_slot / ps + k);
            let (Ok(src), Ok(dst)) = (u32::try_from(src), u32::try_from(dst)) else {
                self.violation(format!(
                    "step {step}: copy from page {src} to page {dst}, outside the pool"
                ));
                return;
            };
            match cells.copy_page(src, dst) {
                Some(n) => self.report.written_slots += n,
                None => {
                    self.violation(format!(
                        "step {step}: copy from page {src} to page {dst}, outside the pool"
                    ));
                    return;
                }
            }
        }
    }

    /// A swap-out keeps the tags of what every table still reads on the host; a swap-in writes
    /// them back through the layout handed out now.
    pub(super) fn swap_grouped(
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
        let Kind::Grouped(cells) = &mut self.grouped.kind else {
            return;
        };
        let i = idx as usize;
        if self.grouped.streams.len() <= i {
            self.grouped.streams.resize_with(i + 1, Stream::default);
        }
        let end = u64::from(tokens);
        match direction {
            SwapDirection::Out => {
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
                        match cell(shape, table, p) {
                            Some((page, off)) if cells.write(page, off, tag) => {
                                self.report.written_slots += 1;
                            }
                            _ => {
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

    /// Step `step` completed: compare the cells of every block it read that was new, moved or
    /// rewritten since it was last checked.
    pub(super) fn complete_grouped(&mut self, step: u64) {
        while let Some((s, _)) = self.grouped.in_flight.front() {
            if *s > step {
                return;
            }
            let Some((_, mut done)) = self.grouped.in_flight.pop_front() else {
                return;
            };
            for c in &done {
                // The common case, a block read unchanged, costs one version look-up here.
                if !c.forced {
                    if let Kind::Grouped(cells) = &self.grouped.kind {
                        if cells.ver(c.page) == Some(c.ver) {
                            continue;
                        }
                    }
                }
                self.check_block(c, step);
            }
            done.clear();
            self.grouped.spare.push(done);
        }
    }

    fn check_block(&mut self, c: &GCheck, step: u64) {
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return;
        };
        if !c.forced && cells.ver(c.page) == Some(c.ver) {
            return;
        }
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
            let msg = format!(
                "step {step}: stream {} read position {pos} of table {} at page {} offset {}, \
                 but {why}{more}",
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
