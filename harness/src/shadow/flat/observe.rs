//! Following a stream's flat layout between steps: the block table (or contiguous region) the
//! cache manager hands out at submit time is compared with the one last checked, so only positions
//! that are new, or whose block changed, are queued for checking and moved in the reverse index —
//! the incremental half of a step (`write.rs` is the other half; [`Shadow::complete`] checks what
//! was queued).

use super::*;

impl Shadow {
    /// Bring stream `idx`'s checked layout up to `layout` for a read of positions `0..n_read`
    /// by the step being submitted: queue checks for positions that are new or whose chunk
    /// changed (or was invalidated), and move its reverse-index entries. Positions from
    /// `written_from` on are written by the step itself through this same layout, so they hold
    /// the reader's own tags by construction (a later write over them is caught by the reverse
    /// index) and are not queued.
    #[inline]
    pub(in crate::shadow) fn observe(
        &mut self,
        idx: u32,
        layout: &Flat<'_>,
        n_read: u32,
        written_from: u32,
        step: u64,
    ) {
        self.report.read_slots += u64::from(n_read);
        self.seqs[idx as usize].last_step = step;
        let unchanged = match *layout {
            Flat::Paged { block_size, blocks } => {
                self.observe_paged_grown(idx, block_size, blocks, n_read, written_from)
            }
            Flat::Contiguous {
                base_slot,
                capacity_tokens,
            } => {
                self.observe_contiguous_grown(idx, base_slot, capacity_tokens, n_read, written_from)
            }
        };
        if !unchanged {
            self.observe_changed(idx, layout, n_read, written_from, step);
        }
    }

    /// [`Shadow::observe`] when the table changed or a chunk was invalidated.
    #[inline(never)]
    pub(in crate::shadow) fn observe_changed(
        &mut self,
        idx: u32,
        layout: &Flat<'_>,
        n_read: u32,
        written_from: u32,
        step: u64,
    ) {
        let s = &mut self.seqs[idx as usize];
        let extent = s.extent;
        let mut changed = std::mem::take(&mut self.changed);
        changed.clear();
        changed.append(&mut s.recheck);
        let table = std::mem::replace(&mut s.table, Table::None);
        self.checked[idx as usize] = UNCHECKED;
        let new_table = match *layout {
            Flat::Paged { block_size, blocks } => Table::Paged(self.observe_paged(
                idx,
                table,
                block_size,
                blocks,
                n_read,
                written_from,
                extent,
                &mut changed,
                step,
            )),
            Flat::Contiguous {
                base_slot,
                capacity_tokens,
            } => self.observe_contiguous(
                idx,
                table,
                base_slot,
                capacity_tokens,
                n_read,
                written_from,
                extent,
                &mut changed,
                step,
            ),
        };
        self.seqs[idx as usize].table = new_table;
        changed.clear();
        self.changed = changed;
    }

    /// The common case of a step, in place: nothing was invalidated and the block table is the
    /// one checked last time, perhaps with more blocks at its end. Returns false, having changed
    /// nothing, otherwise.
    #[inline]
    pub(in crate::shadow) fn observe_paged_grown(
        &mut self,
        idx: u32,
        block_size: u32,
        blocks: &Pages,
        n_read: u32,
        written_from: u32,
    ) -> bool {
        let bs = block_size.max(1);
        let n_chunks = n_read.div_ceil(bs) as usize;
        let s = &mut self.seqs[idx as usize];
        let checked = &mut self.checked[idx as usize];
        let Table::Paged(old) = &mut s.table else {
            return false;
        };
        let have = old.len();
        if !s.recheck.is_empty() || blocks.len() < n_chunks || have > n_chunks {
            return false;
        }
        // Compared once per version of the manager's list; growing the record from the same
        // list keeps it a prefix of that version.
        if *checked != blocks.version() {
            if old[..] != blocks[..have] {
                return false;
            }
            *checked = blocks.version();
        }
        if have < n_chunks {
            old.extend_from_slice(&blocks[have..n_chunks]);
        }
        let extent = s.extent;
        let mapped = (n_chunks as u32).saturating_mul(bs).min(n_read);
        s.extent = mapped;
        for (k, &b) in blocks.iter().enumerate().take(n_chunks).skip(have) {
            self.hold(u64::from(b), idx, k as u32);
        }
        // New positions up to what the step writes itself, chunk by chunk.
        let n_read = mapped.min(written_from);
        let mut from = extent;
        while from < n_read {
            let lo = from / bs * bs;
            let hi = lo.saturating_add(bs).min(n_read);
            self.queue(Check {
                seq: idx,
                pos: from,
                slot: u64::from(blocks[(from / bs) as usize]) * u64::from(bs)
                    + u64::from(from - lo),
                len: hi - from,
                clobbered: false,
            });
            from = hi;
        }
        true
    }

    /// As [`Shadow::observe_paged_grown`] for a contiguous region: same base, nothing
    /// invalidated, at least as many positions read as last time.
    #[inline]
    pub(in crate::shadow) fn observe_contiguous_grown(
        &mut self,
        idx: u32,
        base_slot: u64,
        capacity_tokens: u32,
        n_read: u32,
        written_from: u32,
    ) -> bool {
        let g = u64::from(self.grain);
        let s = &mut self.seqs[idx as usize];
        let Table::Contiguous {
            base,
            grains: old_grains,
        } = s.table
        else {
            return false;
        };
        if base != base_slot || n_read > capacity_tokens || !s.recheck.is_empty() {
            return false;
        }
        let g0 = base_slot / g;
        let grains = if n_read == 0 {
            0
        } else {
            ((base_slot + u64::from(n_read) - 1) / g - g0 + 1) as u32
        };
        if grains < old_grains {
            return false;
        }
        s.table = Table::Contiguous { base, grains };
        let extent = s.extent;
        s.extent = n_read;
        for k in old_grains..grains {
            self.hold(g0 + u64::from(k), idx, k);
        }
        let n_read = n_read.min(written_from);
        let from = extent.min(n_read);
        self.queue(Check {
            seq: idx,
            pos: from,
            slot: base_slot + u64::from(from),
            len: n_read - from,
            clobbered: false,
        });
        true
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::shadow) fn observe_paged(
        &mut self,
        idx: u32,
        table: Table,
        block_size: u32,
        blocks: &[u32],
        n_read: u32,
        written_from: u32,
        extent: u32,
        changed: &mut Vec<u32>,
        step: u64,
    ) -> Vec<u32> {
        let bs = block_size.max(1);
        let mut n_chunks = n_read.div_ceil(bs) as usize;
        if blocks.len() < n_chunks {
            let id = self.seqs[idx as usize].id;
            self.violation(format!(
                "step {step}: stream {id} reads {n_read} positions but its layout maps only \
                 {} blocks of {bs}",
                blocks.len()
            ));
            n_chunks = blocks.len();
        }
        let new = &blocks[..n_chunks];
        let mut old = match table {
            Table::Paged(v) => v,
            other => {
                self.unhold_from(idx, &other, 0);
                // A finished stream's table buffer: no allocation, no regrowth block by block.
                let mut v = self.spare_tables.pop().unwrap_or_default();
                v.clear();
                v
            }
        };
        // The common case of a decode: the table is the one checked last step, perhaps with one
        // more block; one comparison of the entries says so.
        let common = old.len().min(n_chunks);
        if old[..common] != new[..common] {
            for k in 0..common {
                if old[k] != new[k] {
                    self.unhold(u64::from(old[k]), idx, k as u32);
                    self.hold(u64::from(new[k]), idx, k as u32);
                    changed.push(k as u32);
                    old[k] = new[k];
                }
            }
        }
        for (k, &b) in old.iter().enumerate().skip(common) {
            self.unhold(u64::from(b), idx, k as u32);
        }
        for (k, &b) in new.iter().enumerate().skip(common) {
            self.hold(u64::from(b), idx, k as u32);
        }
        old.truncate(common);
        old.extend_from_slice(&new[common..]);
        let mapped = (n_chunks as u32 * bs).min(n_read);
        let n_read = mapped.min(written_from);
        if changed.len() > 1 {
            changed.sort_unstable();
            changed.dedup();
        }
        let first_new = (extent.min(n_read) / bs) as usize;
        for &k in changed.iter().filter(|&&k| (k as usize) < first_new) {
            let lo = k * bs;
            self.queue(Check {
                seq: idx,
                pos: lo,
                slot: u64::from(new[k as usize]) * u64::from(bs),
                len: (lo + bs).min(n_read) - lo,
                clobbered: false,
            });
        }
        for (k, &b) in new.iter().enumerate().skip(first_new) {
            let lo = k as u32 * bs;
            if lo >= n_read {
                break;
            }
            let from = if changed.binary_search(&(k as u32)).is_ok() {
                lo
            } else {
                lo.max(extent)
            };
            let hi = (lo + bs).min(n_read);
            if from < hi {
                self.queue(Check {
                    seq: idx,
                    pos: from,
                    slot: u64::from(b) * u64::from(bs) + u64::from(from - lo),
                    len: hi - from,
                    clobbered: false,
                });
            }
        }
        self.seqs[idx as usize].extent = mapped;
        old
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::shadow) fn observe_contiguous(
        &mut self,
        idx: u32,
        table: Table,
        base_slot: u64,
        capacity_tokens: u32,
        n_read: u32,
        written_from: u32,
        extent: u32,
        changed: &mut Vec<u32>,
        step: u64,
    ) -> Table {
        let mut n_read = n_read;
        if n_read > capacity_tokens {
            let id = self.seqs[idx as usize].id;
            self.violation(format!(
                "step {step}: stream {id} reads {n_read} positions but its region holds \
                 {capacity_tokens}"
            ));
            n_read = capacity_tokens;
        }
        let g = u64::from(self.grain);
        let g0 = base_slot / g;
        let grains = if n_read == 0 {
            0
        } else {
            ((base_slot + u64::from(n_read) - 1) / g - g0 + 1) as u32
        };
        let (from, old_grains) = match table {
            Table::Contiguous { base, grains } if base == base_slot => (extent, grains),
            other => {
                self.unhold_from(idx, &other, 0);
                (0, 0)
            }
        };
        if old_grains > grains {
            let t = Table::Contiguous {
                base: base_slot,
                grains: old_grains,
            };
            self.unhold_from(idx, &t, grains);
        }
        for k in old_grains..grains {
            self.hold(g0 + u64::from(k), idx, k);
        }
        let mapped = n_read;
        let n_read = n_read.min(written_from);
        let from = from.min(n_read);
        // Invalidated grains before the new positions, clipped to the read range.
        if changed.len() > 1 {
            changed.sort_unstable();
            changed.dedup();
        }
        for &k in changed.iter() {
            let lo_slot = (g0 + u64::from(k)) * g;
            let lo = lo_slot.saturating_sub(base_slot) as u32;
            let hi = ((lo_slot + g - base_slot) as u32).min(from);
            if lo < hi {
                self.queue(Check {
                    seq: idx,
                    pos: lo,
                    slot: base_slot + u64::from(lo),
                    len: hi - lo,
                    clobbered: false,
                });
            }
        }
        self.queue(Check {
            seq: idx,
            pos: from,
            slot: base_slot + u64::from(from),
            len: n_read - from,
            clobbered: false,
        });
        self.seqs[idx as usize].extent = mapped;
        Table::Contiguous {
            base: base_slot,
            grains,
        }
    }
}
