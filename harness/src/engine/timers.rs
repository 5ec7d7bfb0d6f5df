//! Cancellation timers, owned in one place so that a request's end disarms its timer.
//!
//! A timer whose request already finished (or, for a queued-only cancellation, was admitted) is
//! dead: it must never advance the virtual clock, or an idle engine would wait for it and every
//! figure that divides by duration would come out low. Dead entries are dropped lazily: the heap
//! keeps them until they reach its top, where [`CancelTimers::next_due_ns`] discards them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub(super) struct CancelTimers {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    /// Per request: its timer is still live.
    armed: Vec<bool>,
}

impl CancelTimers {
    pub fn new(requests: usize) -> CancelTimers {
        CancelTimers {
            heap: BinaryHeap::new(),
            armed: vec![false; requests],
        }
    }

    /// Fire `request`'s timer at `at_ns` (a request has at most one timer).
    pub fn arm(&mut self, request: u32, at_ns: u64) {
        if let Some(a) = self.armed.get_mut(request as usize) {
            *a = true;
            self.heap.push(Reverse((at_ns, request)));
        }
    }

    /// The request no longer needs its timer (it ended, or can no longer be cancelled by it).
    pub fn disarm(&mut self, request: u32) {
        if let Some(a) = self.armed.get_mut(request as usize) {
            *a = false;
        }
    }

    /// When the next live timer fires; dead timers at the top are dropped.
    pub fn next_due_ns(&mut self) -> Option<u64> {
        while let Some(&Reverse((t, r))) = self.heap.peek() {
            if self.armed[r as usize] {
                return Some(t);
            }
            self.heap.pop();
        }
        None
    }

    /// The next live timer due at or before `now_ns`, disarmed as it is returned.
    pub fn pop_due(&mut self, now_ns: u64) -> Option<u32> {
        let t = self.next_due_ns()?;
        if t > now_ns {
            return None;
        }
        let Reverse((_, r)) = self.heap.pop()?;
        self.armed[r as usize] = false;
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disarmed_timer_is_never_due_and_never_sets_the_next_time() {
        let mut t = CancelTimers::new(3);
        t.arm(0, 100);
        t.arm(1, 50);
        t.arm(2, 200);
        t.disarm(1);
        assert_eq!(t.next_due_ns(), Some(100));
        assert_eq!(t.pop_due(99), None);
        assert_eq!(t.pop_due(1000), Some(0));
        t.disarm(2);
        assert_eq!(t.next_due_ns(), None);
        assert_eq!(t.pop_due(u64::MAX), None);
    }

    #[test]
    fn out_of_range_requests_are_ignored() {
        let mut t = CancelTimers::new(1);
        t.arm(5, 10);
        t.disarm(5);
        assert_eq!(t.next_due_ns(), None);
    }
}
