//! The blocks (or pages) whose state changed since an incremental invariant check last looked,
//! each once: the check re-examines only these, and the blocks of sequences whose tables changed.
//! Shared by the paged pool (`block.rs`) and the grouped one (`hybrid/pool.rs`); each pool
//! touches a block at every transition it makes.
//!
//! Nothing is recorded until the check first takes the list: its first look is a full walk that
//! examines every block anyway, and a run with checks off (`--check-every 0`) then pays nothing
//! for them (a mark and a push on every page write was 2.5% of `gemma3-27b-h100` on `sim`).

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
