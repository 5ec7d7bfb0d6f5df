//! The blocks (or pages) whose state changed since an incremental invariant check last looked,
//! each once: the check re-examines only these, and the blocks of sequences whose tables changed.
//! Shared by the paged pool (`block.rs`) and the grouped one (`hybrid/pool.rs`); each pool
//! touches a block at every transition it makes.
//!
//! Nothing is recorded until the check first takes the list: its first look is a full walk that
//! examines every block anyway, and a run with checks off (`--check-every 0`) then pays nothing
//! for them (a mark and a push on every page write was 2.5% of `gemma3-27b-h100` on `sim`).

/// An incremental check walks everything at least every this many checks (the first check and,
/// through `assert_quiescent`, the run's end are full walks too)...
pub(crate) const FULL_EVERY: u64 = 64;
/// ...or, on a larger pool, every `blocks / WALK_SHARE` checks: the walks' cost spread over the
/// checks between them stays at about `WALK_SHARE` blocks a check (a 10,240-block pool walked
/// every 64th step was most of a checked Azure replay; the hybrid pool of Gemma 3 on shared
/// prompts has 81,920 pages).
const WALK_SHARE: u64 = 8;

/// Checks from one full walk to the next on a pool of `blocks` blocks (or pages).
pub(crate) fn walk_period(blocks: u32) -> u64 {
    FULL_EVERY.max(u64::from(blocks) / WALK_SHARE)
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Touched {
    pub(crate) pages: Vec<u32>,
    mark: Vec<bool>,
    tracking: bool,
}

impl Touched {
    pub(crate) fn new(blocks: u32) -> Touched {
        Touched {
            pages: Vec::new(),
            mark: vec![false; blocks as usize],
            tracking: false,
        }
    }

    #[inline]
    pub(crate) fn touch(&mut self, block: u32) {
        if !self.tracking {
            return;
        }
        if let Some(m) = self.mark.get_mut(block as usize) {
            if !*m {
                *m = true;
                self.pages.push(block);
            }
        }
    }

    /// The blocks touched since the last call, forgotten; from the first call on, touches are
    /// recorded.
    pub(crate) fn take(&mut self) -> Vec<u32> {
        self.tracking = true;
        for &p in &self.pages {
            self.mark[p as usize] = false;
        }
        std::mem::take(&mut self.pages)
    }
}
