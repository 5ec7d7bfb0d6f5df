//! A stream's pending tail: the decodes the fused decode did not store yet, and when they are
//! stored. A settled stream whose records all hold their last page alone ([`Seen::sole`]) writes
//! each decode's token into cells nobody else reads, so nothing can tell when it is stored: the
//! fused decode keeps positions `Stream::tail .. Stream::settled` pending instead of storing a tag
//! a table every decode, and this module stores them — one run a table, a block's worth of decodes
//! at once — the moment anything could look at those cells.
//!
//! **Invariant.** While a stream has a tail (`tail != NO_TAIL`): the stream is settled, every
//! record's last page is its sole page, positions `tail .. settled` lie in every record's last
//! block (the fused decode never crosses a block), and their cells lie in a page of the lazy
//! store already allocated (the decode that started the tail stored into the same block, or —
//! a decode that entered new blocks, whose token starts the tail unstored — found each page's
//! cells allocated; a block's cells do not straddle a store page: `Cells::tails`) — so storing
//! them later changes no count, no message and no allocated byte. The records' read ranges
//! (`Seen::lo .. Seen::end`) stay where the tail began: a pending decode compares each table
//! and moves nothing else, and what a record reads is its shape's range at `settled`
//! ([`Stream::reads`], for a write into a page the stream shares) until the tail is stored,
//! which moves them there ([`Stream::set_reads`]; the decode across a boundary moves them
//! itself, after setting them so where its releases are queued on a step in flight).
//!
//! **When a tail is stored.** Before anything but the owner's fused decode touches those cells
//! or the records that name them: the owner's next step through any other path, its records
//! dropped (finished, swapped out, a new stream at its index), another record joining one of its
//! pages (the only way a page stops being sole: `hold_page`, a first step's holds), and any read
//! or write of a page's cells by someone else — a shared write, a copy, a swap-in, a completion
//! check ([`Shadow::flush_page`]: a page with a pending tail has exactly one reader, the
//! owner). A child of `grouped`, for its records.

use kvbench_cache_api::grouped::readable_from;
use kvbench_cache_api::TableShape;

use super::write::MAX_SHAPES;
use super::*;

/// No pending tail.
pub(super) const NO_TAIL: u64 = u64::MAX;

impl Stream {
    /// The positions record `t` (of shape `shape`) reads: its own `lo .. end` — or, while the
    /// stream's decodes are pending, what its shape reads at `settled`: a pending decode
    /// leaves the records' read ranges where the tail began ([`Stream::set_reads`] moves them
    /// when the tail is stored).
    pub(super) fn reads(&self, t: usize, shape: &TableShape) -> Option<(u64, u64)> {
        let seen = self.tables.get(t)?;
        if self.tail == NO_TAIL {
            return Some((seen.lo, seen.end));
        }
        Some((readable_from(shape, self.settled), self.settled))
    }

    /// Every record's read range as its shape reads at `settled`, where the pending decodes
    /// left them behind (the records are settled there).
    pub(super) fn set_reads(&mut self, (distinct, class): (&[TableShape], &[u32])) {
        let end = self.settled;
        // The first position read, once a shape (a stream with more shapes is never settled,
        // so never has a tail; a table apart all the same).
        let mut los = [0u64; MAX_SHAPES];
        for (lo, shape) in los.iter_mut().zip(distinct) {
            *lo = readable_from(shape, end);
        }
        let few = distinct.len() <= MAX_SHAPES;
        for (seen, &c) in self.tables.iter_mut().zip(class) {
            seen.lo = match distinct.get(c as usize) {
                Some(_) if few => los[c as usize % MAX_SHAPES],
                Some(shape) => readable_from(shape, end),
                None => seen.lo,
            };
            seen.end = end;
        }
    }
}

impl Shadow {
    /// Store stream `idx`'s pending tail, if it has one, into every record's last page: its tags
    /// built once, copied once a table.
    pub(super) fn flush_tail(&mut self, idx: u32) {
        let i = idx as usize;
        let g = &mut self.grouped;
        let (Some(st), Kind::Grouped(cells)) = (g.streams.get_mut(i), &mut g.kind) else {
            return;
        };
        if st.tail == NO_TAIL {
            return;
        }
        // The records' read ranges first: the pending decodes left them where the tail began.
        st.set_reads(cells.classes());
        let from = std::mem::replace(&mut st.tail, NO_TAIL);
        let to = st.settled;
        if from >= to {
            return;
        }
        let s = &self.seqs[i];
        // The fused decode found every token of the tail in the history, which only grows past
        // `settled` until the stream's next step (which stores the tail first).
        let tags = &mut g.run_tags;
        tags.clear();
        if let Some(tokens) = usize::try_from(from)
            .ok()
            .zip(usize::try_from(to).ok())
            .and_then(|(a, b)| s.history.get(a..b))
        {
            tags.extend((from..).zip(tokens).map(|(pos, &token)| Tag {
                pos: pos as u32,
                token,
                writer: s.writer,
            }));
        }
        // The tail's offset in its block, once a shape.
        let mut offs = [0u32; MAX_SHAPES];
        for (o, shape) in offs.iter_mut().zip(cells.classes().0) {
            *o = (from % u64::from(shape.block_tokens.max(1))) as u32;
        }
        let (class, cell_tags) = cells.classes_and_tags();
        let mut lost = None;
        let whole = tags.len() as u64 == to - from;
        for (t, (seen, &c)) in st.tables.iter().zip(class).enumerate() {
            let page = seen.pages.last().copied().unwrap_or(NO_PAGE);
            let off = offs[c as usize % MAX_SHAPES];
            if !whole || cell_tags.store_tags(page, off, tags).is_none() {
                lost.get_or_insert((t, page));
            }
        }
        if let Some((t, page)) = lost {
            // Unreachable while the invariant holds; said rather than dropped if it breaks.
            let id = s.id;
            self.violation(format!(
                "stream {id}'s decodes {from}..{to} of table {t} could not be stored into page \
                 {page}"
            ));
        }
    }

    /// Before page `page`'s cells are read or written by anyone but the fused decode: store the
    /// tail of the stream whose record alone holds it, if that stream has one.
    pub(super) fn flush_page(&mut self, page: u32) {
        let owner = self
            .grouped
            .readers
            .as_ref()
            .and_then(|r| r.single(u64::from(page)));
        if let Some(h) = owner {
            self.flush_stream(h.seq);
        }
    }

    /// Store stream `idx`'s tail if it has one (a cheap test first: most streams have none).
    #[inline]
    pub(super) fn flush_stream(&mut self, idx: u32) {
        if self
            .grouped
            .streams
            .get(idx as usize)
            .is_some_and(|st| st.tail != NO_TAIL)
        {
            self.flush_tail(idx);
        }
    }
}
