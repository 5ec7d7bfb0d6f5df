//! Writing tags into the device's slots: a stream's own new tokens (a grain at a time, blind where
//! it alone reads the grain), a write another stream may be reading (through the reverse index,
//! invalidating what it must), block copies and swaps. The other half of a step, after
//! `observe.rs` has followed each stream's layout and queued its reads.

use super::*;

/// Store the tags of positions `pos..` (tokens `tokens`) from `slot` on, page run by page run;
/// returns how many fit before the end of the array.
#[inline]
fn store_run(tags: &mut LazyArray<Tag>, slot: u64, tokens: &[u32], pos: u32, writer: u32) -> u64 {
    if let [token] = *tokens {
        // A decode: one tag.
        let Some(t) = tags.get_mut(slot) else {
            return 0;
        };
        *t = Tag { pos, token, writer };
        return 1;
    }
    let mut done = 0usize;
    while done < tokens.len() {
        let Some(run) = tags.run_mut(slot + done as u64, (tokens.len() - done) as u64) else {
            break;
        };
        let n = run.len();
        let from = pos + done as u32;
        // Zipped, so the loop carries no bounds checks and stores a tag in a few instructions.
        for ((t, &token), p) in run.iter_mut().zip(&tokens[done..]).zip(from..) {
            *t = Tag {
                pos: p,
                token,
                writer,
            };
        }
        done += n;
    }
    done as u64
}

impl Shadow {
    /// Write `tag` into `slot` (`own`: the writing stream, when it writes its own position
    /// through its own table). A change that a stream whose checked context covers the slot does
    /// not expect invalidates that stream's chunk, and queues the slot on its in-flight step.
    pub(in crate::shadow) fn write(&mut self, slot: u64, tag: Tag, own: u32, step: u64) {
        let g = slot / u64::from(self.grain);
        let own_chunk = match self.mode {
            Some(CacheMode::Paged) => tag.pos / self.grain,
            _ => ANY_CHUNK,
        };
        // The writer reads its own position back: its expectation holds by construction.
        let foreign = !self.readers.only(g, own, own_chunk);
        let Some(t) = self.tags.get_mut(slot) else {
            let n = self.tags.len();
            let who = match self.writers.id(tag.writer) {
                Some(id) => format!("stream {id}"),
                None => "a copy of an unwritten slot".to_string(),
            };
            self.violation(format!(
                "step {step}: {who} wrote position {} to slot {slot}, outside the cache's {n} slots",
                tag.pos
            ));
            return;
        };
        self.report.written_slots += 1;
        // Nobody else's checked context covers the slot: a blind store (no load of the old tag).
        let changed = foreign && *t != tag;
        *t = tag;
        if !changed {
            return;
        }
        let mut holders = std::mem::take(&mut self.scratch);
        self.readers.collect(g, &mut holders);
        let is_own = |h: &Holder| h.seq == own && (h.chunk == own_chunk || own_chunk == ANY_CHUNK);
        for h in holders.iter().filter(|h| !is_own(h)) {
            let r = &mut self.seqs[h.seq as usize];
            let pos = match &r.table {
                Table::Paged(blocks) => {
                    let bs = u64::from(self.grain);
                    if blocks.get(h.chunk as usize).map(|&b| u64::from(b)) != Some(slot / bs) {
                        continue;
                    }
                    u64::from(h.chunk) * bs + slot % bs
                }
                Table::Contiguous { base, .. } => match slot.checked_sub(*base) {
                    Some(p) => p,
                    None => continue,
                },
                Table::None => continue,
            };
            if pos >= u64::from(r.extent)
                || expects(&r.history, r.scope, pos as u32, &tag, &self.writers)
            {
                continue;
            }
            if !r.recheck.contains(&h.chunk) {
                r.recheck.push(h.chunk);
            }
            if r.last_step != NEVER && r.last_step >= self.completed {
                if let Some(s) = self
                    .in_flight
                    .get_mut((r.last_step - self.completed) as usize)
                {
                    s.push(Check {
                        seq: h.seq,
                        pos: pos as u32,
                        slot,
                        len: 1,
                        clobbered: true,
                    });
                }
            }
        }
        self.scratch = holders;
    }

    /// Write stream `idx`'s own tags for positions `from..to` (all known and within its checked
    /// extent) through the table `observe` just made equal to the submitted layout. Per grain,
    /// one look at the reverse index decides: nobody else reads it, so the run is a blind store;
    /// otherwise tag by tag through [`Shadow::write`], which invalidates what it must.
    pub(in crate::shadow) fn write_own(&mut self, idx: u32, from: u32, to: u32, step: u64) {
        let grain = self.grain;
        let mut pos = from;
        while pos < to {
            let s = &self.seqs[idx as usize];
            let (slot, end, g, chunk) = match &s.table {
                Table::Paged(blocks) => {
                    let k = pos / grain;
                    let Some(&b) = blocks.get(k as usize) else {
                        return;
                    };
                    let end = ((u64::from(k) + 1) * u64::from(grain)).min(u64::from(to)) as u32;
                    let slot = u64::from(b) * u64::from(grain) + u64::from(pos % grain);
                    (slot, end, u64::from(b), k)
                }
                Table::Contiguous { base, .. } => {
                    let slot = base + u64::from(pos);
                    let g = slot / u64::from(grain);
                    let grain_end = (g + 1) * u64::from(grain) - base;
                    (slot, grain_end.min(u64::from(to)) as u32, g, ANY_CHUNK)
                }
                Table::None => return,
            };
            let (writer, known_sole) = (s.writer, s.sole == g);
            let alone = known_sole
                || if self.readers.sole(g, idx) {
                    self.seqs[idx as usize].sole = g;
                    true
                } else {
                    self.readers.only(g, idx, chunk)
                };
            let mut done = 0;
            if alone {
                let tokens = &self.seqs[idx as usize].history[pos as usize..end as usize];
                done = store_run(&mut self.tags, slot, tokens, pos, writer);
                self.report.written_slots += done;
            }
            if pos + (done as u32) < end {
                self.write_one_by_one(idx, slot, pos, pos + done as u32, end, step);
            }
            pos = end;
        }
    }

    /// Positions `from..end` of stream `idx` (position `pos` at `slot`) through
    /// [`Shadow::write`]: another stream reads the grain, or the slots lie past the cache's end.
    #[inline(never)]
    pub(in crate::shadow) fn write_one_by_one(
        &mut self,
        idx: u32,
        slot: u64,
        pos: u32,
        from: u32,
        end: u32,
        step: u64,
    ) {
        let writer = self.seqs[idx as usize].writer;
        for p in from..end {
            let tag = Tag {
                pos: p,
                token: self.seqs[idx as usize].history[p as usize],
                writer,
            };
            self.write(slot + u64::from(p - pos), tag, idx, step);
        }
    }

    /// The step's new tokens of stream `idx`, through the layout as handed out now (`observe`
    /// just made the stream's table equal to it over every position the step touches).
    #[inline]
    pub(in crate::shadow) fn write_step(&mut self, idx: u32, w: &SeqWork, step: u64) {
        let (from, to) = (
            w.context_tokens,
            w.context_tokens.saturating_add(w.new_tokens),
        );
        let s = &self.seqs[idx as usize];
        let known = s.history.len().min(u32::MAX as usize) as u32;
        let end = to.min(known).min(s.extent);
        if from < end {
            self.write_own(idx, from, end, step);
        }
        let bad = from.max(end);
        if bad < to {
            self.violation(if bad >= known {
                format!(
                    "step {step}: stream {} writes position {bad}, whose token is unknown",
                    w.seq
                )
            } else {
                format!(
                    "step {step}: stream {} writes position {bad}, which its layout does not map",
                    w.seq
                )
            });
        }
    }

    /// A block copy (copy-on-write, or a contiguous fork's prefix): tags move as the data would.
    /// Per grain of the destination, one look at the reverse index: nobody's checked context
    /// covers it (a block just handed out, almost always), so a blind copy — exactly what
    /// [`Shadow::write`] would do tag by tag there; otherwise tag by tag through it.
    pub(in crate::shadow) fn copy(&mut self, src: u64, dst: u64, len_tokens: u32, step: u64) {
        let gs = u64::from(self.grain);
        let len = u64::from(len_tokens);
        let mut k = 0u64;
        while k < len {
            let g = (dst + k) / gs;
            let end = ((g + 1) * gs - dst).min(len);
            if self.readers.unread(g) && dst + end <= self.tags.len() {
                for j in k..end {
                    let tag = self.tags.get(src + j).copied().unwrap_or(Tag::EMPTY);
                    if let Some(t) = self.tags.get_mut(dst + j) {
                        *t = tag;
                    }
                }
                self.report.written_slots += end - k;
            } else {
                for j in k..end {
                    let tag = self.tags.get(src + j).copied().unwrap_or(Tag::EMPTY);
                    self.write(dst + j, tag, u32::MAX, step);
                }
            }
            k = end;
        }
    }

    /// A swap-out reads the stream's context and keeps its tags on the host; a swap-in writes
    /// them back through the layout handed out now.
    pub(in crate::shadow) fn swap(
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
        let Some(layout) = cache.layout(seq) else {
            self.violation(format!(
                "step {step}: swap of stream {seq}, which has no cache layout"
            ));
            return;
        };
        let Some(layout) = Flat::of(layout) else {
            self.violation(format!(
                "step {step}: swap of stream {seq}, whose layout is grouped in a run whose \
                 layouts are not"
            ));
            return;
        };
        match direction {
            SwapDirection::Out => {
                self.observe(idx, &layout, tokens, tokens, step);
                let host = (0..tokens)
                    .map(|p| {
                        layout
                            .slot_of(p)
                            .and_then(|x| self.tags.get(x).copied())
                            .unwrap_or(Tag::EMPTY)
                    })
                    .collect();
                self.seqs[idx as usize].host = Some(Box::new(host));
            }
            SwapDirection::In => {
                let Some(host) = self.seqs[idx as usize].host.take() else {
                    self.violation(format!(
                        "step {step}: swap-in of stream {seq}, which was never swapped out"
                    ));
                    return;
                };
                if host.len() < tokens as usize {
                    self.violation(format!(
                        "step {step}: swap-in of {tokens} tokens of stream {seq}, {} were swapped \
                         out",
                        host.len()
                    ));
                }
                for (p, tag) in (*host).into_iter().enumerate().take(tokens as usize) {
                    match layout.slot_of(p as u32) {
                        Some(x) => self.write(x, tag, u32::MAX, step),
                        None => self.violation(format!(
                            "step {step}: swap-in of stream {seq}: position {p} is not mapped"
                        )),
                    }
                }
            }
        }
    }
}
