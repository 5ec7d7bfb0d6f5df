//! Deferred reclamation: no slot is handed out again while a device step that may touch it is in
//! flight.
//!
//! The engine calls `begin_step` when it submits a step to the device and `retire_step` when that
//! step has completed. A step may read or write anything that was mapped when it began, so storage
//! released while steps are in flight is *fenced* on the newest of them: it returns to the pool
//! only when every step up to and including that one has retired.
//!
//! **Out-of-order retirement is allowed.** The release rule is a watermark, not "the fence step
//! retired": an item fenced on step `s` is released once no step `<= s` is still in flight. So a
//! newer step retiring early never frees storage an older, still running step may touch, and an
//! older step retiring never frees storage fenced on a newer one. Retiring a step that is not in
//! flight (never begun, or retired twice) changes nothing and is reported as `false` by
//! [`FenceQueue::try_retire`], so managers can surface the engine's protocol error.
//!
//! [`FenceQueue`] is the single-threaded piece both managers embed; [`SharedFence`] wraps it in the
//! [`crate::sync`] shim so the protocol between a device-completion thread, an allocating thread
//! and a cancelling thread can be model-checked with loom (`tests/loom_fence.rs`).

use std::collections::{BTreeMap, BTreeSet};

use crate::sync::{Arc, Mutex};
use crate::StepId;

/// Items (blocks, slot ranges) withheld until the steps that may touch them have retired.
#[derive(Debug, Clone)]
pub struct FenceQueue<T> {
    /// The id the next `begin_step` hands out; ids start at 1 so 0 can mean "no fence".
    next_step: StepId,
    in_flight: BTreeSet<StepId>,
    /// Items keyed by the step they are fenced on; insertion order is kept within a step.
    pending: BTreeMap<StepId, Vec<T>>,
    pending_len: usize,
}

impl<T> Default for FenceQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> FenceQueue<T> {
    pub fn new() -> Self {
        FenceQueue {
            next_step: 1,
            in_flight: BTreeSet::new(),
            pending: BTreeMap::new(),
            pending_len: 0,
        }
    }

    /// A step was submitted; it may touch everything mapped now.
    pub fn begin_step(&mut self) -> StepId {
        let step = self.next_step;
        self.next_step += 1;
        self.in_flight.insert(step);
        step
    }

    /// The newest step still in flight: what a release made now is fenced on.
    pub fn newest_in_flight(&self) -> Option<StepId> {
        self.in_flight.last().copied()
    }

    /// Every step with an id below this has retired.
    pub fn watermark(&self) -> StepId {
        self.in_flight.first().copied().unwrap_or(self.next_step)
    }

    /// Whether storage released while `fence` was the newest in-flight step may be reused now.
    /// Fence 0 means "released with nothing in flight".
    pub fn is_retired(&self, fence: StepId) -> bool {
        fence < self.watermark()
    }

    pub fn in_flight(&self) -> impl Iterator<Item = StepId> + '_ {
        self.in_flight.iter().copied()
    }

    pub fn in_flight_len(&self) -> usize {
        self.in_flight.len()
    }

    /// Withhold `item` until the newest in-flight step retires. With nothing in flight the item
    /// is handed straight back: the caller may reuse it at once.
    #[must_use = "an item handed back must be returned to the pool by the caller"]
    pub fn defer(&mut self, item: T) -> Option<T> {
        match self.newest_in_flight() {
            None => Some(item),
            Some(step) => {
                self.pending.entry(step).or_default().push(item);
                self.pending_len += 1;
                None
            }
        }
    }

    /// Retire `step`; returns the items that became reusable, oldest fence first and in release
    /// order within a fence. An unknown step releases nothing.
    pub fn retire(&mut self, step: StepId) -> Vec<T> {
        let mut released = Vec::new();
        self.try_retire(step, &mut released);
        released
    }

    /// Like [`retire`](Self::retire), appending into `out`; returns `false` (and changes
    /// nothing) when `step` was not in flight.
    pub fn try_retire(&mut self, step: StepId, out: &mut Vec<T>) -> bool {
        if !self.in_flight.remove(&step) {
            return false;
        }
        let watermark = self.watermark();
        // Everything fenced on a step below the watermark is free; keep the rest.
        let keep = self.pending.split_off(&watermark);
        let ready = std::mem::replace(&mut self.pending, keep);
        for (_, items) in ready {
            self.pending_len -= items.len();
            out.extend(items);
        }
        true
    }

    /// Items currently withheld.
    pub fn pending_len(&self) -> usize {
        self.pending_len
    }

    /// Withheld items with the step each is fenced on, oldest fence first.
    pub fn pending(&self) -> impl Iterator<Item = (StepId, &T)> + '_ {
        self.pending
            .iter()
            .flat_map(|(step, items)| items.iter().map(move |item| (*step, item)))
    }
}

/// A [`FenceQueue`] shared between threads (device completion, allocation, cancellation).
///
/// Locking is deliberately coarse: one mutex guards the in-flight set and the pending items so a
/// release and a retirement can never interleave half-way. The loom test checks that no item is
/// ever handed out while a step that was in flight at its release is still running.
#[derive(Debug)]
pub struct SharedFence<T> {
    inner: Arc<Mutex<FenceQueue<T>>>,
}

impl<T> Clone for SharedFence<T> {
    fn clone(&self) -> Self {
        SharedFence {
            inner: self.inner.clone(),
        }
    }
}

impl<T> Default for SharedFence<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> SharedFence<T> {
    pub fn new() -> Self {
        SharedFence {
            inner: Arc::new(Mutex::new(FenceQueue::new())),
        }
    }

    /// Run `f` with the queue locked (a poisoned lock is recovered: the queue has no invariant a
    /// panicking holder can break half-way through a single method).
    pub fn with<R>(&self, f: impl FnOnce(&mut FenceQueue<T>) -> R) -> R {
        let mut guard = match self.inner.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    pub fn begin_step(&self) -> StepId {
        self.with(|q| q.begin_step())
    }

    #[must_use = "an item handed back must be returned to the pool by the caller"]
    pub fn defer(&self, item: T) -> Option<T> {
        self.with(|q| q.defer(item))
    }

    pub fn retire(&self, step: StepId) -> Vec<T> {
        self.with(|q| q.retire(step))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn nothing_in_flight_releases_at_once() {
        let mut q = FenceQueue::new();
        assert_eq!(q.defer(7u32), Some(7));
        assert_eq!(q.pending_len(), 0);
    }

    #[test]
    fn release_waits_for_newest_in_flight_step() {
        let mut q = FenceQueue::new();
        let s1 = q.begin_step();
        let s2 = q.begin_step();
        assert_eq!(q.defer(1u32), None); // fenced on s2
        assert_eq!(
            q.retire(s1),
            Vec::<u32>::new(),
            "an older step must not release it"
        );
        assert_eq!(q.pending_len(), 1);
        assert_eq!(q.retire(s2), vec![1]);
        assert_eq!(q.pending_len(), 0);
    }

    #[test]
    fn out_of_order_retirement_waits_for_older_steps() {
        let mut q = FenceQueue::new();
        let s1 = q.begin_step();
        assert_eq!(q.defer(1u32), None); // fenced on s1
        let s2 = q.begin_step();
        assert_eq!(q.defer(2u32), None); // fenced on s2
        assert_eq!(
            q.retire(s2),
            Vec::<u32>::new(),
            "s1 still in flight holds both"
        );
        assert!(!q.is_retired(s1));
        assert_eq!(q.retire(s1), vec![1, 2]);
        assert!(q.is_retired(s2));
    }

    #[test]
    fn unknown_or_double_retire_changes_nothing() {
        let mut q = FenceQueue::new();
        let s1 = q.begin_step();
        assert_eq!(q.defer(1u32), None);
        let mut out = Vec::new();
        assert!(!q.try_retire(s1 + 5, &mut out));
        assert!(out.is_empty());
        assert!(q.try_retire(s1, &mut out));
        assert!(!q.try_retire(s1, &mut out));
        assert_eq!(out, vec![1]);
    }

    #[test]
    fn shared_fence_round_trip() {
        let f = SharedFence::new();
        let s = f.begin_step();
        assert_eq!(f.defer(3u8), None);
        assert_eq!(f.clone().retire(s), vec![3]);
    }
}
