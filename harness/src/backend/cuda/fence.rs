//! Event fences for the cuda backend: an event is recorded after each step on the stream, and a
//! step is retired with the cache manager (which then hands its fenced blocks out again) only
//! once that event has completed. Steps on one stream complete in order, so retirement walks
//! the queue from the oldest step and stops at the first event still pending: a newer event
//! reporting done never retires an older step, and a block released while step `s` was the
//! newest in flight is reused only after `s`'s event completed.
//!
//! Pure bookkeeping over a [`Completion`] (a CUDA event on the GPU, a flag in tests).

use std::collections::VecDeque;

use kvbench_cache_api::StepId;

/// Something that can say whether the device has passed it (`cuEventQuery`).
pub trait Completion {
    fn done(&self) -> bool;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    #[error("step {step} recorded after step {newest}: steps are recorded in submission order")]
    OutOfOrder { step: StepId, newest: StepId },
    /// `complete` was asked for a step whose event (or an older one's) has not completed.
    #[error("step {step} completed before the fence queue retired it (next retired: {next:?})")]
    NotRetired { step: StepId, next: Option<StepId> },
}

/// Steps submitted and not yet retired, each with the event recorded after it.
#[derive(Debug)]
pub struct StepEvents<E> {
    queue: VecDeque<(StepId, E)>,
}

impl<E> Default for StepEvents<E> {
    fn default() -> Self {
        StepEvents {
            queue: VecDeque::new(),
        }
    }
}

impl<E: Completion> StepEvents<E> {
    /// `event` was recorded on the stream right after `step`'s work.
    pub fn record(&mut self, step: StepId, event: E) -> Result<(), FenceError> {
        if let Some(&(newest, _)) = self.queue.back() {
            if step <= newest {
                return Err(FenceError::OutOfOrder { step, newest });
            }
        }
        self.queue.push_back((step, event));
        Ok(())
    }

    /// Steps whose events completed, oldest first, removed from the queue: the caller retires
    /// each with the cache manager. Stops at the first pending event.
    pub fn retire_ready(&mut self) -> Vec<StepId> {
        let mut out = Vec::new();
        while self.queue.front().is_some_and(|(_, e)| e.done()) {
            if let Some((s, _)) = self.queue.pop_front() {
                out.push(s);
            }
        }
        out
    }

    /// The oldest step still pending (what `complete` waits on).
    pub fn oldest(&self) -> Option<StepId> {
        self.queue.front().map(|&(s, _)| s)
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// What the backend's `complete` uses: steps are handed back to the engine (which then retires
/// their fences with the cache manager) strictly in submission order, each only once its event
/// — and every older one — completed. A poll may find several events done; the extra steps
/// wait here for their own `complete`.
#[derive(Debug)]
pub struct InOrder<E> {
    events: StepEvents<E>,
    retired: VecDeque<StepId>,
}

impl<E> Default for InOrder<E> {
    fn default() -> Self {
        InOrder {
            events: StepEvents::default(),
            retired: VecDeque::new(),
        }
    }
}

impl<E: Completion> InOrder<E> {
    pub fn record(&mut self, step: StepId, event: E) -> Result<(), FenceError> {
        self.events.record(step, event)
    }

    /// `step` is the oldest step not yet completed and the caller waited for its event: it
    /// must be the next one retired.
    pub fn complete(&mut self, step: StepId) -> Result<(), FenceError> {
        self.retired.extend(self.events.retire_ready());
        match self.retired.front() {
            Some(&s) if s == step => {
                self.retired.pop_front();
                Ok(())
            }
            next => Err(FenceError::NotRetired {
                step,
                next: next.copied(),
            }),
        }
    }

    /// Steps recorded and not yet completed.
    pub fn len(&self) -> usize {
        self.events.len() + self.retired.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use kvbench_cache_api::fence::FenceQueue;

    use super::*;

    #[derive(Clone)]
    struct Flag(Rc<Cell<bool>>);

    impl Completion for Flag {
        fn done(&self) -> bool {
            self.0.get()
        }
    }

    fn flag() -> (Flag, Rc<Cell<bool>>) {
        let c = Rc::new(Cell::new(false));
        (Flag(c.clone()), c)
    }

    #[test]
    fn a_block_released_during_step_2_is_reused_only_after_step_2s_event() {
        let mut fences: FenceQueue<u32> = FenceQueue::new();
        let mut events = StepEvents::default();
        let s1 = fences.begin_step();
        let (e1, d1) = flag();
        events.record(s1, e1).expect("in order");
        let s2 = fences.begin_step();
        let (e2, d2) = flag();
        events.record(s2, e2).expect("in order");
        // Block 7 is released while steps 1 and 2 are in flight: fenced on step 2.
        assert_eq!(fences.defer(7), None);

        // Step 2's event reporting done first retires nothing: step 1 is still pending.
        d2.set(true);
        assert!(events.retire_ready().is_empty());
        d1.set(true);
        let mut freed = Vec::new();
        for s in events.retire_ready() {
            freed.extend(fences.retire(s));
        }
        assert_eq!(freed, vec![7]);
        assert!(events.is_empty());
    }

    #[test]
    fn step_1_completing_does_not_free_what_step_2_may_touch() {
        let mut fences: FenceQueue<u32> = FenceQueue::new();
        let mut events = StepEvents::default();
        let (e1, d1) = flag();
        let (e2, _d2) = flag();
        let s1 = fences.begin_step();
        events.record(s1, e1).expect("in order");
        let s2 = fences.begin_step();
        events.record(s2, e2).expect("in order");
        assert_eq!(fences.defer(3), None);
        d1.set(true);
        let mut freed = Vec::new();
        for s in events.retire_ready() {
            freed.extend(fences.retire(s));
        }
        assert!(
            freed.is_empty(),
            "block 3 handed out while step 2 may still read it"
        );
        assert_eq!(events.oldest(), Some(s2));
        // The planted early-reuse fault retires at submit time; the same bookkeeping shows it.
        let early = fences.retire(s2);
        assert_eq!(
            early,
            vec![3],
            "retiring without the event frees the block: the fault"
        );
    }

    #[test]
    fn steps_must_be_recorded_in_order() {
        let mut events = StepEvents::default();
        events.record(5, flag().0).expect("first");
        assert_eq!(
            events.record(5, flag().0),
            Err(FenceError::OutOfOrder { step: 5, newest: 5 })
        );
    }

    #[test]
    fn completion_is_in_order_and_only_after_the_event() {
        let mut q = InOrder::default();
        let (e1, d1) = flag();
        let (e2, d2) = flag();
        q.record(1, e1).expect("in order");
        q.record(2, e2).expect("in order");
        // Step 2's event first: completing step 1 is refused while its event is pending.
        d2.set(true);
        assert_eq!(
            q.complete(1),
            Err(FenceError::NotRetired {
                step: 1,
                next: None
            })
        );
        d1.set(true);
        // One poll retires both; step 2 waits for its own complete.
        q.complete(1).expect("step 1 done");
        assert_eq!(q.len(), 1);
        assert!(q.complete(3).is_err(), "step 3 was never recorded");
        q.complete(2).expect("step 2 done");
        assert!(q.is_empty());
    }
}
