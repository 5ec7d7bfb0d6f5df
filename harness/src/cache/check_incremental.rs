//! The paged manager's invariant check made incremental: what changed since the last check, and
//! a full walk (`check.rs`' `check_full`) every [`walk_period`] checks.
//!
//! The full walk visits every block of the pool, the whole free list and the whole eviction
//! order at every check, and at the default `--check-every 1` that was most of a long run: the
//! Azure replay's 10,240-block pool walked at each of 1.5 M steps, 25 times the run unchecked.
//! Most of the pool is unchanged from one step to the next. This keeps, from the last check,
//! what the full walk recomputes — each block's references from the block tables, its places on
//! the free list, the state, written slots and key the per-state counts were taken from, and a
//! copy of every sequence's table — and brings it up to date from:
//!
//! - the blocks the pool says changed (`block.rs` touches a block at every transition it makes,
//!   and the manager where it publishes a key);
//! - the sequences, every one compared with its copy (a slice comparison a table), so a table
//!   changed by any path — a planted fault included — is seen; what differs is diffed entry by
//!   entry and its blocks are re-examined;
//! - the free set compared with its copy (a stack changes at its end, a bitmap in the words of
//!   the blocks that moved).
//!
//! Each re-examined block gets the full walk's per-block checks; the counters (per state, live
//! slots, keyed blocks against the index, the fence queue, the accounting) are compared every
//! time. The lower tiers give their recorded problems (a slot reused under a pending onload)
//! and their counters every time, and a walk of every slot with the full walk only (a 64 GiB
//! host tier is 32,768 slots: walked at every step it was 98% of a checked tiered run). Whatever this finds, the check then runs the full walk and reports what
//! it reports, so a problem reads the same as before; anything the copies cannot follow (a block
//! out of range, a count that would go negative) falls back to a full walk at once, and any
//! problem makes the next check a full walk too.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use kvbench_cache_api::SeqId;

use super::block::{BlockPool, BlockState};
use super::free::FreeView;
use super::table::{Seq, SeqIdHasher};
use super::touched::walk_period;

/// The manager's tables, as `PagedCache` keeps them.
type Seqs = HashMap<SeqId, Seq, BuildHasherDefault<SeqIdHasher>>;

/// What a block's per-state count, live slots and keyed count were taken from.
#[derive(Debug, Clone, Copy)]
struct Seen {
    state: BlockState,
    written_slots: u32,
    keyed: bool,
}

const UNSEEN: Seen = Seen {
    state: BlockState::Free,
    written_slots: 0,
    keyed: false,
};

/// A sequence's table as last checked.
#[derive(Debug, Default)]
struct SeqCopy {
    blocks: Vec<u32>,
    len_tokens: u32,
    filled_tokens: u32,
}

#[derive(Debug, Default)]
enum FreeCopy {
    #[default]
    Empty,
    Stack(Vec<u32>),
    Bits(Vec<u64>),
}

/// A change the copies cannot follow: walk everything.
pub(crate) struct Fallback;

/// Which per-block count [`Blocks::bump`] moves.
#[derive(Debug, Clone, Copy)]
enum Count {
    Refs,
    OnFree,
}

/// Per block: references from the tables, places on the free list, and whether it is to be
/// re-examined.
#[derive(Debug, Default)]
struct Blocks {
    refs: Vec<u32>,
    on_free: Vec<u32>,
    dirty: Vec<u32>,
    dirty_mark: Vec<bool>,
}

impl Blocks {
    fn dirty(&mut self, block: u32) {
        if let Some(m) = self.dirty_mark.get_mut(block as usize) {
            if !*m {
                *m = true;
                self.dirty.push(block);
            }
        }
    }

    /// One more (or one fewer) of `block` in `counts`, and the block re-examined.
    fn bump(&mut self, which: Count, block: u32, add: bool) -> Result<(), Fallback> {
        let counts = match which {
            Count::Refs => &mut self.refs,
            Count::OnFree => &mut self.on_free,
        };
        let c = counts.get_mut(block as usize).ok_or(Fallback)?;
        *c = if add {
            c.checked_add(1)
        } else {
            c.checked_sub(1)
        }
        .ok_or(Fallback)?;
        self.dirty(block);
        Ok(())
    }

    fn table_ref(&mut self, block: u32, add: bool) -> Result<(), Fallback> {
        self.bump(Count::Refs, block, add)
    }

    /// Table `old` became `new`: the entries that differ move their references.
    fn diff_table(&mut self, old: &[u32], new: &[u32]) -> Result<(), Fallback> {
        let common = old.len().min(new.len());
        for (&o, &n) in old[..common].iter().zip(&new[..common]) {
            if o != n {
                self.table_ref(o, false)?;
                self.table_ref(n, true)?;
            }
        }
        for &o in &old[common..] {
            self.table_ref(o, false)?;
        }
        for &n in &new[common..] {
            self.table_ref(n, true)?;
        }
        Ok(())
    }

    fn free_place(&mut self, block: u32, add: bool) -> Result<(), Fallback> {
        self.bump(Count::OnFree, block, add)
    }
}

/// What the last check saw, kept to check only what changed since.
#[derive(Debug, Default)]
pub(crate) struct Incremental {
    /// Whether the state below describes the manager as of the last check (`false`: the next
    /// check walks everything and rebuilds it).
    ready: bool,
    checks: u64,
    /// Full walks run (tests read it).
    pub(crate) full_walks: u64,
    seqs: HashMap<SeqId, SeqCopy, BuildHasherDefault<SeqIdHasher>>,
    blocks: Blocks,
    seen: Vec<Seen>,
    /// Blocks per state (`BlockState as usize`), live slots and keyed blocks, from `seen`.
    pub(crate) counts: [u32; 4],
    pub(crate) live_slots: u64,
    pub(crate) keyed: usize,
    free_copy: FreeCopy,
    /// The sequences whose table or lengths changed at the last update.
    changed: Vec<SeqId>,
}

impl Incremental {
    /// Counts a check on a pool of `blocks`; whether it must be a full walk.
    pub(crate) fn full_due(&mut self, blocks: u32) -> bool {
        self.checks += 1;
        !self.ready || self.checks.is_multiple_of(walk_period(blocks))
    }

    /// After a full walk that found `clean`: take the manager as it is now.
    pub(crate) fn rebuild(&mut self, pool: &BlockPool, seqs: &Seqs) {
        let total = pool.total_blocks() as usize;
        *self = Incremental {
            checks: self.checks,
            full_walks: self.full_walks,
            blocks: Blocks {
                refs: vec![0; total],
                on_free: vec![0; total],
                dirty: Vec::with_capacity(total),
                dirty_mark: vec![false; total],
            },
            seen: vec![UNSEEN; total],
            counts: [total as u32, 0, 0, 0],
            free_copy: match pool.free_view() {
                FreeView::Stack(_) => FreeCopy::Stack(Vec::new()),
                FreeView::Bits(words) => FreeCopy::Bits(vec![0; words.len()]),
            },
            ..Incremental::default()
        };
        for b in 0..total as u32 {
            self.blocks.dirty(b);
        }
        let rebuilt = self.update(pool, seqs).is_ok();
        self.clear_dirty();
        self.ready = rebuilt;
    }

    /// The next check is a full walk (a problem was found).
    pub(crate) fn invalidate(&mut self) {
        self.ready = false;
    }

    /// The blocks to re-examine and the sequences that changed, as of the last update.
    pub(crate) fn dirty(&self) -> &[u32] {
        &self.blocks.dirty
    }

    pub(crate) fn changed(&self) -> &[SeqId] {
        &self.changed
    }

    pub(crate) fn refs(&self, block: u32) -> u32 {
        self.blocks.refs[block as usize]
    }

    pub(crate) fn on_free(&self, block: u32) -> u32 {
        self.blocks.on_free[block as usize]
    }

    pub(crate) fn clear_dirty(&mut self) {
        for &b in &self.blocks.dirty {
            self.blocks.dirty_mark[b as usize] = false;
        }
        self.blocks.dirty.clear();
    }

    /// Bring the copies up to date with the pool and the tables.
    pub(crate) fn update(&mut self, pool: &BlockPool, seqs: &Seqs) -> Result<(), Fallback> {
        let total = pool.total_blocks() as usize;
        if self.seen.len() != total {
            return Err(Fallback);
        }
        let touched = pool.touched.borrow_mut().take();
        for b in touched {
            self.blocks.dirty(b);
        }
        self.changed.clear();
        // Sequences: new and changed ones diffed, then released ones give back what they held.
        let (mut matched, mut added) = (0usize, 0usize);
        for (&id, s) in seqs {
            let copy = match self.seqs.entry(id) {
                Entry::Occupied(e) => {
                    matched += 1;
                    let c = e.into_mut();
                    if c.blocks[..] == s.blocks[..]
                        && c.len_tokens == s.len_tokens
                        && c.filled_tokens == s.filled_tokens
                    {
                        continue;
                    }
                    c
                }
                Entry::Vacant(v) => {
                    added += 1;
                    v.insert(SeqCopy::default())
                }
            };
            self.blocks.diff_table(&copy.blocks, &s.blocks)?;
            copy.blocks.clear();
            copy.blocks.extend_from_slice(&s.blocks);
            copy.len_tokens = s.len_tokens;
            copy.filled_tokens = s.filled_tokens;
            self.changed.push(id);
        }
        if self.seqs.len() != matched + added {
            let blocks = &mut self.blocks;
            let mut fell = false;
            self.seqs.retain(|id, copy| {
                let live = seqs.contains_key(id);
                if !live {
                    fell |= blocks.diff_table(&copy.blocks, &[]).is_err();
                }
                live
            });
            if fell {
                return Err(Fallback);
            }
        }
        self.update_free(pool.free_view(), total)?;
        // The re-examined blocks' contributions to the counts.
        for i in 0..self.blocks.dirty.len() {
            let b = self.blocks.dirty[i] as usize;
            let m = pool.meta.get(b).ok_or(Fallback)?;
            let old = self.seen[b];
            let new = Seen {
                state: m.state,
                written_slots: m.written_slots,
                keyed: m.key.is_some(),
            };
            let c = &mut self.counts[old.state as usize];
            *c = c.checked_sub(1).ok_or(Fallback)?;
            self.counts[new.state as usize] += 1;
            if old.state == BlockState::Mapped {
                self.live_slots = self
                    .live_slots
                    .checked_sub(u64::from(old.written_slots))
                    .ok_or(Fallback)?;
            }
            if new.state == BlockState::Mapped {
                self.live_slots += u64::from(new.written_slots);
            }
            self.keyed = self.keyed - usize::from(old.keyed) + usize::from(new.keyed);
            self.seen[b] = new;
        }
        Ok(())
    }

    /// The free set against its copy: the blocks that joined or left it are re-examined.
    fn update_free(&mut self, view: FreeView<'_>, total: usize) -> Result<(), Fallback> {
        match (view, &mut self.free_copy) {
            (FreeView::Stack(now), FreeCopy::Stack(copy)) => {
                let n = now.len().min(copy.len());
                let mut same = 0;
                while same + 256 <= n && now[same..same + 256] == copy[same..same + 256] {
                    same += 256;
                }
                while same < n && now[same] == copy[same] {
                    same += 1;
                }
                for &b in &copy[same..] {
                    self.blocks.free_place(b, false)?;
                }
                copy.truncate(same);
                for &b in &now[same..] {
                    self.blocks.free_place(b, true)?;
                    copy.push(b);
                }
            }
            (FreeView::Bits(now), FreeCopy::Bits(copy)) if now.len() == copy.len() => {
                for (w, (&word, old)) in now.iter().zip(copy.iter_mut()).enumerate() {
                    let mut moved = word ^ *old;
                    while moved != 0 {
                        let bit = moved.trailing_zeros();
                        moved &= moved - 1;
                        let b = w * 64 + bit as usize;
                        if b >= total {
                            return Err(Fallback);
                        }
                        self.blocks.free_place(b as u32, word & (1 << bit) != 0)?;
                    }
                    *old = word;
                }
            }
            _ => return Err(Fallback),
        }
        Ok(())
    }
}
