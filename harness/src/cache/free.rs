//! The paged pool's free blocks and the placement policy that picks the next one.
//!
//! `lifo` (the default) is a stack: the most recently freed block first, warm in the CPU cache,
//! whatever its address. After a while of churn a sequence's blocks lie scattered over the whole
//! pool, and a decode that streams them jumps across memory at every block boundary.
//!
//! `extents` keeps a sequence's blocks near each other. Free blocks are a bitmap in address
//! order; an extent is one 64-block word of it. A sequence grows into the lowest free block above
//! its last one in the same extent (so its blocks ascend), then into the next extent if that one
//! is wholly free, and otherwise starts a new extent: among the next unclaimed extents from a
//! rotating cursor, the one with the most free blocks, which it claims so that other growing
//! sequences start elsewhere. Claims only steer: any free block can be handed out when the
//! steered search finds none, so the policy never refuses an allocation `lifo` would grant, and
//! the number of blocks in use — every waste figure — is the same.

use serde::{Deserialize, Serialize};

/// Where the paged manager puts a sequence's next block (`cache.placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// The most recently freed block first.
    #[default]
    Lifo,
    /// Address-ordered extents of 64 blocks: a sequence's blocks ascend within an extent.
    Extents,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Lifo => "lifo",
            Placement::Extents => "extents",
        }
    }
}

/// Blocks per extent: one word of the bitmap.
const EXTENT: u32 = 64;
/// Unclaimed extents a new extent's search compares before settling for the best seen.
const SCAN_EXTENTS: usize = 64;

#[derive(Debug, Clone)]
pub(crate) enum FreeBlocks {
    Stack(Vec<u32>),
    Extents(ExtentMap),
}

/// [`FreeBlocks::view`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum FreeView<'a> {
    Stack(&'a [u32]),
    Bits(&'a [u64]),
}

#[derive(Debug, Clone)]
pub(crate) struct ExtentMap {
    /// Bit `i` of word `w`: block `w·64 + i` is free.
    words: Vec<u64>,
    /// Bit `w % 64` of word `w / 64`: extent `w` is claimed by a growing sequence.
    claimed: Vec<u64>,
    total: u32,
    count: u32,
    /// Where the next new extent's search begins (next fit).
    cursor: usize,
}

impl FreeBlocks {
    /// Every block of a pool of `total` free.
    pub fn new(total: u32, placement: Placement) -> Self {
        match placement {
            // Reversed so block 0 is handed out first: deterministic, readable traces.
            Placement::Lifo => FreeBlocks::Stack((0..total).rev().collect()),
            Placement::Extents => {
                let n_words = total.div_ceil(EXTENT) as usize;
                let mut words = vec![u64::MAX; n_words];
                if let Some(last) = words.last_mut() {
                    *last = full_mask(total, n_words - 1);
                }
                FreeBlocks::Extents(ExtentMap {
                    words,
                    claimed: vec![0; n_words.div_ceil(64)],
                    total,
                    count: total,
                    cursor: 0,
                })
            }
        }
    }

    pub fn len(&self) -> u32 {
        match self {
            FreeBlocks::Stack(v) => v.len() as u32,
            FreeBlocks::Extents(m) => m.count,
        }
    }

    /// The free blocks (stack order, or ascending), for the invariant checks.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            FreeBlocks::Stack(v) => v.clone(),
            FreeBlocks::Extents(m) => (0..m.total).filter(|&b| m.is_free(b)).collect(),
        }
    }

    /// The free set as stored: the stack in order, or the bitmap's words (bit `i` of word `w`:
    /// block `w·64 + i` is free). The incremental check compares it with its copy: a stack
    /// changes at its end, a bitmap in the words of the blocks that moved.
    pub fn view(&self) -> FreeView<'_> {
        match self {
            FreeBlocks::Stack(v) => FreeView::Stack(v),
            FreeBlocks::Extents(m) => FreeView::Bits(&m.words),
        }
    }

    /// `block` becomes free. The caller guarantees it was not (block states say so).
    #[inline]
    pub fn push(&mut self, block: u32) {
        match self {
            FreeBlocks::Stack(v) => v.push(block),
            FreeBlocks::Extents(m) => m.push(block),
        }
    }

    /// A free block for a sequence whose last block is `after` (`None`: a new sequence), taken
    /// off the free set; `None` when no block is free.
    #[inline]
    pub fn take(&mut self, after: Option<u32>) -> Option<u32> {
        match self {
            FreeBlocks::Stack(v) => v.pop(),
            FreeBlocks::Extents(m) => m.take(after),
        }
    }
}

/// The bits of word `w` that name blocks of a pool of `total`.
fn full_mask(total: u32, w: usize) -> u64 {
    let valid = total.saturating_sub(w as u32 * EXTENT).min(EXTENT);
    if valid == EXTENT {
        u64::MAX
    } else {
        (1u64 << valid) - 1
    }
}

impl ExtentMap {
    fn is_free(&self, block: u32) -> bool {
        self.words
            .get((block / EXTENT) as usize)
            .is_some_and(|w| w & (1 << (block % EXTENT)) != 0)
    }

    fn is_claimed(&self, w: usize) -> bool {
        self.claimed[w / 64] & (1 << (w % 64)) != 0
    }

    fn set_claim(&mut self, w: usize, on: bool) {
        if on {
            self.claimed[w / 64] |= 1 << (w % 64);
        } else {
            self.claimed[w / 64] &= !(1 << (w % 64));
        }
    }

    fn push(&mut self, block: u32) {
        let w = (block / EXTENT) as usize;
        debug_assert!(self.words[w] & (1 << (block % EXTENT)) == 0);
        self.words[w] |= 1 << (block % EXTENT);
        self.count += 1;
        // Space opened up: whoever starts an extent next may use it.
        self.set_claim(w, false);
    }

    /// Take the lowest free block of word `w` (which has one).
    fn take_in(&mut self, w: usize) -> u32 {
        let bit = self.words[w].trailing_zeros();
        self.words[w] &= !(1 << bit);
        self.count -= 1;
        if self.words[w] == 0 {
            self.set_claim(w, false);
        }
        w as u32 * EXTENT + bit
    }

    fn take(&mut self, after: Option<u32>) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        if let Some(a) = after.filter(|&a| a < self.total) {
            let w = (a / EXTENT) as usize;
            let bit = a % EXTENT;
            let above = if bit == EXTENT - 1 {
                0
            } else {
                u64::MAX << (bit + 1)
            };
            if self.words[w] & above != 0 {
                let b = (self.words[w] & above).trailing_zeros();
                self.words[w] &= !(1 << b);
                self.count -= 1;
                if self.words[w] == 0 {
                    self.set_claim(w, false);
                }
                return Some(w as u32 * EXTENT + b);
            }
            // Straight on into the next extent when nobody holds or claims any of it.
            let next = w + 1;
            if next < self.words.len()
                && !self.is_claimed(next)
                && self.words[next] == full_mask(self.total, next)
            {
                self.set_claim(next, true);
                return Some(self.take_in(next));
            }
        }
        let w = self.new_extent();
        Some(self.take_in(w))
    }

    /// The extent a sequence starts in: a wholly free unclaimed one if the scan meets one, else
    /// the unclaimed one with the most free blocks among those scanned, else any with a free
    /// block. Claimed, and the cursor moved there. Needs `count > 0`.
    fn new_extent(&mut self) -> usize {
        let n = self.words.len();
        let mut best: Option<(u32, usize)> = None;
        let mut seen = 0;
        let mut w = self.cursor % n;
        for _ in 0..n {
            if !self.is_claimed(w) && self.words[w] != 0 {
                let free = self.words[w].count_ones();
                if self.words[w] == full_mask(self.total, w) {
                    best = Some((free, w));
                    break;
                }
                if best.is_none_or(|(f, _)| free > f) {
                    best = Some((free, w));
                }
                seen += 1;
                if seen >= SCAN_EXTENTS {
                    break;
                }
            }
            w = (w + 1) % n;
        }
        let w = match best {
            Some((_, w)) => {
                self.set_claim(w, true);
                w
            }
            // Every extent with a free block is claimed: share one (first fit from the cursor).
            None => (0..n)
                .map(|k| (self.cursor + k) % n)
                .find(|&w| self.words[w] != 0)
                .unwrap_or(0),
        };
        self.cursor = w;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifo_hands_out_block_zero_first_and_reuses_the_last_freed() {
        let mut f = FreeBlocks::new(4, Placement::Lifo);
        assert_eq!(f.take(None), Some(0));
        assert_eq!(f.take(Some(0)), Some(1));
        f.push(0);
        assert_eq!(
            f.take(Some(1)),
            Some(0),
            "most recently freed, hint ignored"
        );
    }

    #[test]
    fn interleaved_growth_stays_ascending_within_each_sequences_extent() {
        // Room for each sequence's second extent.
        let total = 6 * EXTENT;
        let mut f = FreeBlocks::new(total, Placement::Extents);
        let mut last = [None; 3];
        let mut tables = vec![Vec::new(); 3];
        for _ in 0..EXTENT + 5 {
            for s in 0..3 {
                let b = f.take(last[s]).expect("room");
                tables[s].push(b);
                last[s] = Some(b);
            }
        }
        for t in &tables {
            let far = t.windows(2).filter(|w| w[1] != w[0] + 1).count();
            assert!(far <= 1, "one jump at most per extent change: {t:?}");
        }
        assert_eq!(f.len(), total - 3 * (EXTENT + 5));
    }

    #[test]
    fn every_block_is_handed_out_once_whatever_the_hints() {
        let total = 3 * EXTENT + 7;
        let mut f = FreeBlocks::new(total, Placement::Extents);
        let mut seen = vec![false; total as usize];
        let mut hint = None;
        for i in 0..total {
            let b = f.take(hint).expect("a free block remains");
            assert!(!std::mem::replace(&mut seen[b as usize], true), "{b} twice");
            hint = if i % 5 == 0 {
                None
            } else {
                Some((b * 7) % total)
            };
        }
        assert_eq!(f.take(Some(0)), None);
        f.push(total - 1);
        assert_eq!(f.take(None), Some(total - 1));
    }
}
