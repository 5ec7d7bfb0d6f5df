//! The fused pass for the commonest stream-step, a decode through an unchanged table: one pass
//! that does what [`Shadow::observe`] and [`Shadow::write_own`] would, or declines (changing
//! nothing) so the general path runs. It checks exactly what they check.

use super::*;

impl Shadow {
    /// A decode of stream `idx` through the block table it was checked against (almost every
    /// stream-step of a paged run): the
    /// same comparison of the whole table as [`Shadow::observe`], the same reverse-index look as
    /// [`Shadow::write_own`], in one pass over the stream's state. Returns false, having changed
    /// nothing, when the general path must run (a changed or invalidated table, a position not
    /// yet checked, a shared grain).
    #[inline]
    pub(in crate::shadow) fn decode_paged(
        &mut self,
        idx: u32,
        block_size: u32,
        blocks: &Pages,
        w: &SeqWork,
        step: u64,
    ) -> bool {
        let bs = block_size.max(1);
        let pos = w.context_tokens;
        // A block size is a power of two in every shipped scenario: a shift and a mask then, not
        // a division, which costs tens of cycles a stream-step.
        let (k, at) = if bs.is_power_of_two() {
            ((pos >> bs.trailing_zeros()) as usize, pos & (bs - 1))
        } else {
            ((pos / bs) as usize, pos % bs)
        };
        let s = &mut self.seqs[idx as usize];
        let checked = &mut self.checked[idx as usize];
        let Table::Paged(old) = &mut s.table else {
            return false;
        };
        let have = old.len();
        let Some(&b) = blocks.get(k) else {
            return false;
        };
        // Everything before `pos` checked, the token at `pos` known, the block holding `pos`
        // already registered (a new block goes through `observe`), the table unchanged: compared
        // once per version of the manager's list (`Pages` renumbers every change).
        if s.extent != pos
            || pos as usize >= s.history.len()
            || !s.recheck.is_empty()
            || have != k + 1
        {
            return false;
        }
        if *checked != blocks.version() {
            if old[..] != blocks[..have] {
                return false;
            }
            *checked = blocks.version();
        }
        let g = u64::from(b);
        if s.sole != g && !self.readers.sole(g, idx) {
            return false;
        }
        self.decode_store(idx, g * u64::from(bs) + u64::from(at), g, pos, step)
    }

    /// As [`Shadow::decode_paged`] for a contiguous region: the same base, the grain holding the
    /// new position already registered, nobody else reading it.
    #[inline]
    pub(in crate::shadow) fn decode_contiguous(
        &mut self,
        idx: u32,
        base_slot: u64,
        capacity_tokens: u32,
        w: &SeqWork,
        step: u64,
    ) -> bool {
        let pos = w.context_tokens;
        // A contiguous cache's grain is the constant, so the divisions below are shifts (a
        // contiguous layout from a manager of another mode takes the general path).
        if self.grain != CONTIGUOUS_GRAIN {
            return false;
        }
        let gs = u64::from(CONTIGUOUS_GRAIN);
        let s = &mut self.seqs[idx as usize];
        let Table::Contiguous { base, grains } = s.table else {
            return false;
        };
        let slot = base_slot + u64::from(pos);
        let g = slot / gs;
        if base != base_slot
            || pos >= capacity_tokens
            || s.extent != pos
            || pos as usize >= s.history.len()
            || !s.recheck.is_empty()
            || g - base_slot / gs + 1 != u64::from(grains)
        {
            return false;
        }
        if s.sole != g && !self.readers.sole(g, idx) {
            return false;
        }
        self.decode_store(idx, slot, g, pos, step)
    }

    /// The tag of stream `idx`'s token at `pos`, stored at `slot` (in grain `g`, which the
    /// stream alone reads), and the bookkeeping of one position read and written. Always
    /// inlined: called from two places, it was otherwise a call with a prologue costing as much
    /// as the store.
    #[inline(always)]
    fn decode_store(&mut self, idx: u32, slot: u64, g: u64, pos: u32, step: u64) -> bool {
        let s = &mut self.seqs[idx as usize];
        let tag = Tag {
            pos,
            token: s.history[pos as usize],
            writer: s.writer,
        };
        let Some(t) = self.tags.get_mut(slot) else {
            return false;
        };
        *t = tag;
        s.sole = g;
        s.extent = pos + 1;
        s.last_step = step;
        self.report.read_slots += u64::from(pos) + 1;
        self.report.written_slots += 1;
        true
    }
}
