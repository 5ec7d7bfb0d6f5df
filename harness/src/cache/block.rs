//! The physical block pool: every block state transition of the paged cache lives here.
//!
//! States (a block is in exactly one):
//! - `Free`: no holder, no cached content; on the free stack.
//! - `Mapped`: `ref_count >= 1` block-table references. May carry a prefix key.
//! - `Pending`: no holder, but released while a device step that may touch it was in flight;
//!   withheld in the fence queue until that step (and every older one) retires.
//! - `Cached`: no holder, carries a prefix key, kept for reuse; in the eviction policy's set
//!   (`evict/`: the policy holds only the order, this file tells it every change).
//!
//! Transitions: `Free|Cached(evicted) → Mapped` ([`BlockPool::take_fresh`], the content is new so
//! the key is dropped), `Cached|Pending → Mapped` ([`BlockPool::revive`], a prefix hit reusing the
//! same content), `Mapped → Mapped` ([`BlockPool::add_ref`], [`BlockPool::drop_ref`] while other
//! holders remain), `Mapped → Pending|Cached|Free` (the last [`BlockPool::drop_ref`]),
//! `Pending → Cached|Free` ([`BlockPool::retire_step`]), `Cached → Free`
//! ([`BlockPool::flush_cached`]).

use std::cell::RefCell;

use kvbench_cache_api::fence::FenceQueue;
use kvbench_cache_api::StepId;

use super::evict::{AnyEvictor, Evictable, EvictionPolicy, Evictor};
use super::free::{FreeBlocks, FreeView, Placement};
use super::prefix::PrefixKey;
use super::touched::Touched;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockState {
    Free,
    Mapped,
    Pending,
    Cached,
}

#[derive(Debug, Clone)]
pub(crate) struct BlockMeta {
    pub state: BlockState,
    pub ref_count: u32,
    /// Bumped whenever the block leaves `Pending` early (revived), so a stale fence entry for it
    /// is recognised and skipped.
    pub generation: u32,
    /// The step this block was fenced on at its last release (0: released with nothing in
    /// flight). Checked when the block is handed out for new content.
    pub release_fence: StepId,
    /// Token slots holding data (the most any holder has written).
    pub written_slots: u32,
    /// Set while the block is published in the prefix index.
    pub key: Option<PrefixKey>,
    /// Position of the block in its prefix chain, set when it is published (what `priority`
    /// weighs).
    pub depth: u32,
    /// Prefix hits on this content since it was written (what `lfu` weighs).
    pub hits: u32,
}

/// The identity of a cached block evicted for new content (what a lower tier keeps of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EvictedKey {
    pub key: PrefixKey,
    pub depth: u32,
    pub hits: u32,
}

/// What happened to a block whose last reference was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    StillShared,
    Pending,
    Cached,
    Freed,
}

/// The pool of physical blocks. Knows nothing of sequences or token ids; the paged manager owns
/// block tables and the prefix index and calls these transitions.
#[derive(Debug)]
pub(crate) struct BlockPool {
    pub block_size: u32,
    pub meta: Vec<BlockMeta>,
    /// Free blocks without cached content, in the order the placement policy hands them out.
    free: FreeBlocks,
    /// The order evictable cached blocks go in; holds every `Cached` block and nothing else.
    evict: AnyEvictor,
    pub cached_blocks: u32,
    pub pending_blocks: u32,
    pub mapped_blocks: u32,
    /// Σ written_slots over mapped blocks.
    pub live_slots: u64,
    pub fence: FenceQueue<(u32, u32)>,
    /// Blocks handed out for new content while their release fence was still in flight.
    pub early_reuse: Vec<(u32, StepId)>,
    /// Test fault: release ignores the fence.
    pub ignore_fence: bool,
    /// Releases whose fence `ignore_fence` skipped (a step was in flight): early-reuse fired.
    pub fences_ignored: u64,
    /// Blocks changed since the incremental check last looked (it takes them through `&self`).
    pub touched: RefCell<Touched>,
}

impl BlockPool {
    pub fn new(
        total_blocks: u32,
        block_size: u32,
        placement: Placement,
        eviction: EvictionPolicy,
    ) -> Self {
        let meta = vec![
            BlockMeta {
                state: BlockState::Free,
                ref_count: 0,
                generation: 0,
                release_fence: 0,
                written_slots: 0,
                key: None,
                depth: 0,
                hits: 0,
            };
            total_blocks as usize
        ];
        let free = FreeBlocks::new(total_blocks, placement);
        BlockPool {
            block_size,
            meta,
            free,
            evict: eviction.build(total_blocks),
            cached_blocks: 0,
            pending_blocks: 0,
            mapped_blocks: 0,
            live_slots: 0,
            fence: FenceQueue::new(),
            early_reuse: Vec::new(),
            ignore_fence: false,
            fences_ignored: 0,
            touched: RefCell::new(Touched::new(total_blocks)),
        }
    }

    /// `block`'s metadata changed: the incremental check looks at it next time. Every
    /// transition below calls it; so must anything else that writes `meta` (publishing a key).
    #[inline]
    pub fn touch(&mut self, block: u32) {
        self.touched.get_mut().touch(block);
    }

    pub fn total_blocks(&self) -> u32 {
        self.meta.len() as u32
    }

    pub fn free_blocks(&self) -> u32 {
        self.free.len()
    }

    /// Blocks `take_fresh` can hand out now: free plus evictable cached ones.
    pub fn allocatable_blocks(&self) -> u32 {
        self.free_blocks() + self.cached_blocks
    }

    /// The free blocks, for the invariant checks.
    pub fn free_list(&self) -> Vec<u32> {
        self.free.to_vec()
    }

    /// The free set as it is stored, for the incremental check to compare with its copy.
    pub fn free_view(&self) -> FreeView<'_> {
        self.free.view()
    }

    /// The evictable blocks in eviction order (head first).
    pub fn eviction_order(&self) -> Vec<u32> {
        self.evict.order()
    }

    /// Whether the eviction policy holds `block`, and how many it holds (the incremental check).
    pub fn is_evictable(&self, block: u32) -> bool {
        self.evict.contains(block)
    }

    pub fn evictable_len(&self) -> usize {
        self.evict.len()
    }

    /// Hand out a block for new content to a sequence whose last block is `after`: a free one
    /// (where the placement policy puts it), else the eviction policy's victim among the cached
    /// ones (whose key the caller must unpublish — and may offload to a lower tier — returned
    /// as the second value with the block's depth and hits).
    pub fn take_fresh(&mut self, after: Option<u32>) -> Option<(u32, Option<EvictedKey>)> {
        let (block, evicted_key) = if let Some(b) = self.free.take(after) {
            (b, None)
        } else if let Some(b) = self.evict.pop_victim() {
            self.cached_blocks -= 1;
            let m = &mut self.meta[b as usize];
            let evicted = m.key.take().map(|key| EvictedKey {
                key,
                depth: m.depth,
                hits: m.hits,
            });
            (b, evicted)
        } else {
            return None;
        };
        let fence = self.meta[block as usize].release_fence;
        if fence != 0 && !self.fence.is_retired(fence) {
            self.early_reuse.push((block, fence));
        }
        self.touch(block);
        let m = &mut self.meta[block as usize];
        m.state = BlockState::Mapped;
        m.ref_count = 1;
        m.written_slots = 0;
        m.key = None;
        m.depth = 0;
        m.hits = 0;
        self.mapped_blocks += 1;
        Some((block, evicted_key))
    }

    /// A prefix hit maps a cached or pending block again with its content intact.
    pub fn revive(&mut self, block: u32) {
        self.touch(block);
        let m = &mut self.meta[block as usize];
        m.hits = m.hits.saturating_add(1);
        let state = m.state;
        match state {
            BlockState::Cached => {
                self.evict.remove(block);
                self.cached_blocks -= 1;
            }
            BlockState::Pending => {
                self.pending_blocks -= 1;
                // The fence entry is now stale.
                self.meta[block as usize].generation =
                    self.meta[block as usize].generation.wrapping_add(1);
            }
            BlockState::Mapped => {
                self.add_ref(block);
                return;
            }
            BlockState::Free => unreachable!("a free block has no prefix key to hit"),
        }
        let m = &mut self.meta[block as usize];
        m.state = BlockState::Mapped;
        m.ref_count = 1;
        self.mapped_blocks += 1;
        self.live_slots += u64::from(m.written_slots);
    }

    pub fn add_ref(&mut self, block: u32) {
        self.touch(block);
        let m = &mut self.meta[block as usize];
        debug_assert_eq!(m.state, BlockState::Mapped);
        m.ref_count += 1;
    }

    /// Record that a holder wrote slot `offset` of `block`.
    pub fn note_written(&mut self, block: u32, written_slots: u32) {
        let m = &mut self.meta[block as usize];
        if written_slots > m.written_slots {
            self.touched.get_mut().touch(block);
            self.live_slots += u64::from(written_slots - m.written_slots);
            m.written_slots = written_slots;
        }
    }

    /// Drop one reference. The last one fences the block on the newest in-flight step (or, with
    /// nothing in flight, makes it cached or free at once).
    pub fn drop_ref(&mut self, block: u32) -> Dropped {
        let fence = self.fence.newest_in_flight().unwrap_or(0);
        self.touch(block);
        let m = &mut self.meta[block as usize];
        debug_assert_eq!(m.state, BlockState::Mapped);
        m.ref_count -= 1;
        if m.ref_count > 0 {
            return Dropped::StillShared;
        }
        m.release_fence = fence;
        self.mapped_blocks -= 1;
        self.live_slots -= u64::from(m.written_slots);
        if self.ignore_fence || fence == 0 {
            if fence != 0 {
                self.fences_ignored += 1;
            }
            return self.settle(block);
        }
        let m = &mut self.meta[block as usize];
        m.state = BlockState::Pending;
        let generation = m.generation;
        let handed_back = self.fence.defer((block, generation));
        debug_assert!(handed_back.is_none());
        self.pending_blocks += 1;
        Dropped::Pending
    }

    pub fn begin_step(&mut self) -> StepId {
        self.fence.begin_step()
    }

    /// Retire a step; blocks whose fence is now behind the watermark become cached or free.
    /// Returns `false` if the step was not in flight.
    pub fn retire_step(&mut self, step: StepId) -> bool {
        let mut released = Vec::new();
        if !self.fence.try_retire(step, &mut released) {
            return false;
        }
        for (block, generation) in released {
            let m = &self.meta[block as usize];
            if m.state == BlockState::Pending && m.generation == generation {
                self.pending_blocks -= 1;
                self.settle(block);
            }
        }
        true
    }

    /// A block with no holder and no fence: cached if it carries a key, else free.
    fn settle(&mut self, block: u32) -> Dropped {
        self.touch(block);
        let m = &mut self.meta[block as usize];
        if m.key.is_some() {
            m.state = BlockState::Cached;
            let info = Evictable {
                depth: m.depth,
                hits: m.hits,
                shared: m.hits > 0,
            };
            self.evict.insert(block, info);
            self.cached_blocks += 1;
            Dropped::Cached
        } else {
            let m = &mut self.meta[block as usize];
            m.state = BlockState::Free;
            m.written_slots = 0;
            self.free.push(block);
            Dropped::Freed
        }
    }

    /// Every cached block back to free; returns their keys for the index to drop.
    pub fn flush_cached(&mut self) -> Vec<PrefixKey> {
        let mut keys = Vec::new();
        for block in self.evict.order() {
            self.touch(block);
            self.evict.remove(block);
            self.cached_blocks -= 1;
            let m = &mut self.meta[block as usize];
            if let Some(k) = m.key.take() {
                keys.push(k);
            }
            m.state = BlockState::Free;
            m.written_slots = 0;
            self.free.push(block);
        }
        keys
    }
}

/// The bare block allocator (free list, eviction order, fences) without block tables or a prefix index:
/// what "block allocate + free" costs on its own. Public for the criterion benchmark.
#[derive(Debug)]
pub struct BlockAllocator(BlockPool);

impl BlockAllocator {
    pub fn new(total_blocks: u32, block_size: u32) -> Self {
        Self::with_placement(total_blocks, block_size, Placement::Lifo)
    }

    pub fn with_placement(total_blocks: u32, block_size: u32, placement: Placement) -> Self {
        BlockAllocator(BlockPool::new(
            total_blocks,
            block_size.max(1),
            placement,
            EvictionPolicy::Lru,
        ))
    }

    /// A block for new content (ref count 1), or `None` when none is free or evictable.
    pub fn allocate(&mut self) -> Option<u32> {
        self.allocate_after(None)
    }

    /// As [`BlockAllocator::allocate`] for a sequence whose last block is `after`.
    pub fn allocate_after(&mut self, after: Option<u32>) -> Option<u32> {
        self.0.take_fresh(after).map(|(b, _)| b)
    }

    /// Drop the only reference to `block` (fenced if a step is in flight).
    pub fn free(&mut self, block: u32) {
        self.0.drop_ref(block);
    }

    pub fn free_blocks(&self) -> u32 {
        self.0.free_blocks()
    }
}
