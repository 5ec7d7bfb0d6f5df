//! A stream's first step from nothing (no context: a prompt's first chunk with no cached
//! prefix), every table at once. The general path compares each table with a record that is
//! empty, enters its blocks one call at a time and then asks the reverse index, block by block,
//! whether the stream alone reads the page it writes; here the records are built and held in
//! one pass that remembers which blocks were held alone (and forgets a block the moment anyone
//! else holds its page), and the step's tokens go blind into those — so a prompt written into
//! many tables (Gemma 3 has 31) skips the general path's calls and index look-ups block by
//! block. A child of `grouped`.

use kvbench_cache_api::grouped::readable_from;
use kvbench_cache_api::{GroupTable, TableShape};

use super::*;

/// What a table reads at the step: its window's first position and blocks `b0..b1`.
fn reads(shape: &TableShape, end: u64) -> (u64, u64, u64, u64) {
    let bt = u64::from(shape.block_tokens.max(1));
    let lo = readable_from(shape, end);
    let (b0, b1) = if lo < end {
        (lo / bt, (end - 1) / bt + 1)
    } else {
        (0, 0)
    };
    (bt, lo, b0, b1)
}

impl Shadow {
    /// Stream `idx`'s first step when it starts from nothing: follow and write every table.
    /// Returns false, having changed nothing, when the general path must report something the
    /// step reads (a table that does not map it, a block past what the reverse index can name,
    /// a token the history lacks) or the records are not empty.
    pub(super) fn step_prompt(
        &mut self,
        idx: u32,
        shapes: &[TableShape],
        tables: &[GroupTable],
        w: &SeqWork,
        step: u64,
    ) -> bool {
        let i = idx as usize;
        let end = u64::from(w.new_tokens);
        let Kind::Grouped(cells) = &self.grouped.kind else {
            return false;
        };
        let n = cells.tables();
        let Some(st) = self.grouped.streams.get(i) else {
            return false;
        };
        if w.context_tokens != 0
            || (self.seqs[i].history.len() as u64) < end
            || st.tables.len() != tables.len()
            || shapes.len() != tables.len()
            || st.tables.iter().any(|s| !s.pages.is_empty())
        {
            return false;
        }
        let maps_all = shapes
            .iter()
            .zip(tables)
            .enumerate()
            .all(|(t, (shape, table))| {
                let (_, _, b0, b1) = reads(shape, end);
                b0 == b1
                    || (table.first_block <= b0
                        && b1 <= table.end_block()
                        && chunk(n, t as u32, b1 - 1).is_some())
            });
        if !maps_all {
            return false;
        }
        let mut alone = std::mem::take(&mut self.grouped.prompt_alone);
        let mut at = std::mem::take(&mut self.grouped.prompt_at);
        alone.clear();
        at.clear();
        for (t, (shape, table)) in shapes.iter().zip(tables).enumerate() {
            self.follow_prompt(idx, t, shape, table, end, step, (&mut alone, &mut at));
        }
        // Pages of other streams' pending tails the records joined: stored before any write.
        let mut joined = std::mem::take(&mut self.grouped.prompt_joined);
        for &s in &joined {
            self.flush_stream(s);
        }
        joined.clear();
        self.grouped.prompt_joined = joined;
        // The step's tags, built once for every table (the history has them: checked above).
        let mut tags = std::mem::take(&mut self.grouped.run_tags);
        tags.clear();
        let s = &self.seqs[i];
        tags.extend(
            (0u32..)
                .zip(&s.history[..end as usize])
                .map(|(pos, &token)| Tag {
                    pos,
                    token,
                    writer: s.writer,
                }),
        );
        for (t, (shape, table)) in shapes.iter().zip(tables).enumerate() {
            self.write_prompt(idx, t, shape, table, w, step, (&alone, at[t]), &tags);
        }
        self.grouped.run_tags = tags;
        self.grouped.prompt_alone = alone;
        self.grouped.prompt_at = at;
        true
    }

    /// Build and hold table `t`'s record for a read of `readable_from(shape, end) .. end`; one
    /// flag a block in `alone` (from `at[t]` on): held with nobody else on its page. A block of
    /// this stream whose page another block of it then holds too loses its flag.
    #[allow(clippy::too_many_arguments)]
    fn follow_prompt(
        &mut self,
        idx: u32,
        t: usize,
        shape: &TableShape,
        table: &GroupTable,
        end: u64,
        step: u64,
        (alone, at): (&mut Vec<bool>, &mut Vec<usize>),
    ) {
        let (_, lo, b0, b1) = reads(shape, end);
        self.report.read_slots += end.saturating_sub(lo);
        at.push(alone.len());
        let i = idx as usize;
        let seen = &mut self.grouped.streams[i].tables[t];
        seen.checked = UNCHECKED_TABLE;
        let mut pages = std::mem::take(&mut seen.pages);
        pages.clear();
        let g = &mut self.grouped;
        let (Kind::Grouped(cells), Some(readers)) = (&g.kind, g.readers.as_mut()) else {
            return;
        };
        let n = cells.tables();
        // The table maps blocks `b0 .. b1` (`step_prompt` checked): the record names them all,
        // and a flag a block says which were held alone (none until found so).
        let j0 = (b0 - table.first_block) as usize;
        let mapped = &table.pages[j0..j0 + (b1 - b0) as usize];
        pages.extend_from_slice(mapped);
        let base = alone.len();
        alone.resize(base + mapped.len(), false);
        // Chunks grow with the block: when the last block's fits 32 bits, every block's does.
        let c0 =
            chunk(n, t as u32, b0).filter(|_| chunk(n, t as u32, b1.saturating_sub(1)).is_some());
        for (k, (b, &page)) in (b0..).zip(mapped).enumerate() {
            if !cells.has_page(page) {
                let id = self.seqs[i].id;
                let why = format!(
                    "step {step}: stream {id}'s table {t} names page {page}, outside the pool"
                );
                self.report.violation(why);
                continue;
            }
            let c = match c0 {
                Some(c0) => c0.wrapping_add((k as u32).wrapping_mul(n)),
                None => match chunk(n, t as u32, b) {
                    Some(c) => c,
                    None => continue,
                },
            };
            match readers.hold(u64::from(page), Holder { seq: idx, chunk: c }) {
                Held::Alone => alone[base + k] = true,
                Held::Shared => {}
                Held::Joined(was) => {
                    let (wt, wb) = ((was.chunk % n) as usize, u64::from(was.chunk / n));
                    if was.seq == idx {
                        // An earlier block of this step's records (a page named twice): not
                        // alone any more. Its write comes first and the later block's goes
                        // through the reverse index and would see it, but the flag stays
                        // exact: set only where the block is its page's one reader.
                        let first = if wt == t {
                            b0
                        } else {
                            g.streams[i].tables[wt].first_block
                        };
                        let k = at
                            .get(wt)
                            .and_then(|&a| Some(a + usize::try_from(wb.checked_sub(first)?).ok()?));
                        if let Some(flag) = k.and_then(|k| alone.get_mut(k)) {
                            *flag = false;
                        }
                    } else if let Some(st) = g.streams.get_mut(was.seq as usize) {
                        if st.tail != NO_TAIL {
                            g.prompt_joined.push(was.seq);
                        }
                        if let Some(seen) = st.tables.get_mut(wt).filter(|s| s.sole == page) {
                            seen.sole = NO_PAGE;
                        }
                    }
                }
            }
        }
        self.grouped.streams[i].tables[t] = Seen::new(b0, pages, lo, end);
    }

    /// Write the step's tokens `0..end` (their tags `tags`) into table `t`: positions before its
    /// record's first block (left of a sliding window) and everything from the first block not
    /// held alone on through [`Shadow::write_span`]; the blocks held alone blind — one copy for
    /// a run of them on consecutive pages where a block is as long as a page's cells, else a
    /// copy a block.
    #[allow(clippy::too_many_arguments)]
    fn write_prompt(
        &mut self,
        idx: u32,
        t: usize,
        shape: &TableShape,
        table: &GroupTable,
        w: &SeqWork,
        step: u64,
        (alone, at): (&[bool], usize),
        tags: &[Tag],
    ) {
        let end = u64::from(w.new_tokens);
        let (bt, lo, b0, b1) = reads(shape, end);
        let mut bad: Option<(u64, &'static str)> = None;
        let split = (b0 * bt).min(end);
        if split > 0 {
            let from = self.store_before_window(idx, t, table, bt, split, tags);
            if from < split {
                self.write_span(idx, t, table, (bt, lo), (from, split), &mut bad);
            }
        }
        let i = idx as usize;
        let mut pos = split;
        let mut last = NO_PAGE;
        if let Kind::Grouped(cells) = &mut self.grouped.kind {
            let merge = bt == u64::from(cells.stride());
            let (_, cell_tags) = cells.classes_and_tags();
            let seen = &self.grouped.streams[i].tables[t];
            let flags = alone.get(at..).unwrap_or(&[]);
            let pages = &seen.pages[..];
            // Blocks `k..` of the record (block `b0 + k` starts at `split` + k × bt).
            let mut k = 0usize;
            let n = pages.len().min(flags.len()).min((b1 - b0) as usize);
            while pos < end && k < n && flags[k] {
                // Blocks held alone on consecutive pages, as one run of cells.
                let mut j = k + 1;
                while merge && j < n && flags[j] && pages[j] == pages[j - 1].wrapping_add(1) {
                    j += 1;
                }
                let run_end = (pos + (j - k) as u64 * bt).min(end);
                let run = &tags[pos as usize..run_end as usize];
                let stored = if merge {
                    cell_tags.store_tags_on(pages[k], 0, run)
                } else {
                    cell_tags.store_tags(pages[k], 0, run)
                };
                if stored.is_none() {
                    break;
                }
                last = pages[j - 1];
                pos = run_end;
                k = j;
            }
        }
        self.report.written_slots += pos - split;
        if pos < end {
            self.write_span(idx, t, table, (bt, lo), (pos, end), &mut bad);
        } else if last != NO_PAGE {
            // Held alone and written last: the stream's next decode there is stored blind.
            self.grouped.streams[i].tables[t].sole = last;
        }
        if let Some((pos, why)) = bad {
            self.violation(format!(
                "step {step}: stream {} writes position {pos} of table {t}, {why}",
                w.seq
            ));
        }
    }

    /// Store table `t`'s positions `0..split`, the blocks left of its window (which the record
    /// does not hold), blind while nobody reads their pages — blocks the table no longer maps
    /// skipped, as the general path skips them — one copy for a run of consecutive pages where
    /// a block is as long as a page's cells. Returns where the rest starts: the first block
    /// someone reads or that lies outside the pool, for [`Shadow::write_span`] to store cell by
    /// cell and report.
    fn store_before_window(
        &mut self,
        idx: u32,
        t: usize,
        table: &GroupTable,
        bt: u64,
        split: u64,
        tags: &[Tag],
    ) -> u64 {
        let g = &mut self.grouped;
        let (Kind::Grouped(cells), Some(readers)) = (&mut g.kind, g.readers.as_ref()) else {
            return 0;
        };
        let n = cells.tables();
        let merge = bt == u64::from(cells.stride());
        let (_, cell_tags) = cells.classes_and_tags();
        let blocks = split / bt;
        // Nobody reads the block's page: its stores surprise no one (`alone` in the general
        // path, which for a block outside the record comes to the same).
        let unread = |b: u64| -> Option<u32> {
            let page = *table
                .pages
                .get(usize::try_from(b - table.first_block).ok()?)?;
            let c = chunk(n, t as u32, b)?;
            readers.only(u64::from(page), idx, c).then_some(page)
        };
        let mut b = table.first_block.min(blocks);
        while b < blocks {
            let Some(page) = unread(b) else {
                break;
            };
            let mut j = b + 1;
            while merge
                && j < blocks
                && unread(j).is_some_and(|p| u64::from(p) == u64::from(page) + (j - b))
            {
                j += 1;
            }
            let run = &tags[(b * bt) as usize..(j * bt) as usize];
            let stored = if merge {
                cell_tags.store_tags_on(page, 0, run)
            } else {
                cell_tags.store_tags(page, 0, run)
            };
            if stored.is_none() {
                break;
            }
            self.report.written_slots += (j - b) * bt;
            b = j;
        }
        b * bt
    }
}
