//! The wait queue. Preempted sequences go to the front (they already paid for admission once);
//! new arrivals join the back. With tenant fairness, new arrivals are served round-robin across
//! tenants instead of in arrival order, so one tenant's burst cannot starve the others.
//!
//! Entries are removed lazily: the engine skips entries whose stream is no longer waiting
//! (cancelled while queued), so cancellation is O(1).

use std::collections::VecDeque;

#[derive(Debug, Clone, Default)]
pub struct WaitQueue {
    front: VecDeque<u32>,
    /// One FIFO per tenant (a single one without fairness).
    tenants: Vec<VecDeque<u32>>,
    fair: bool,
    /// Next tenant to serve (round-robin).
    cursor: usize,
}

impl WaitQueue {
    pub fn new(fair: bool, tenants: u32) -> WaitQueue {
        let lanes = if fair { tenants.max(1) as usize } else { 1 };
        WaitQueue {
            front: VecDeque::new(),
            tenants: vec![VecDeque::new(); lanes],
            fair,
            cursor: 0,
        }
    }

    pub fn push_back(&mut self, stream: u32, tenant: u32) {
        let lane = if self.fair {
            tenant as usize % self.tenants.len()
        } else {
            0
        };
        self.tenants[lane].push_back(stream);
    }

    pub fn push_front(&mut self, stream: u32) {
        self.front.push_front(stream);
    }

    /// The next candidate, dropping entries `live` rejects. Does not remove it.
    pub fn peek(&mut self, live: impl Fn(u32) -> bool) -> Option<u32> {
        while let Some(&s) = self.front.front() {
            if live(s) {
                return Some(s);
            }
            self.front.pop_front();
        }
        let n = self.tenants.len();
        for i in 0..n {
            let lane = (self.cursor + i) % n;
            while let Some(&s) = self.tenants[lane].front() {
                if live(s) {
                    self.cursor = lane;
                    return Some(s);
                }
                self.tenants[lane].pop_front();
            }
        }
        None
    }

    /// Remove the candidate `peek` returned; round-robin moves on to the next tenant.
    pub fn pop(&mut self, stream: u32) {
        if self.front.front() == Some(&stream) {
            self.front.pop_front();
            return;
        }
        let lane = self.cursor;
        if self.tenants[lane].front() == Some(&stream) {
            self.tenants[lane].pop_front();
            self.cursor = (lane + 1) % self.tenants.len();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.front.is_empty() && self.tenants.iter().all(VecDeque::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut WaitQueue) -> Vec<u32> {
        let mut out = vec![];
        while let Some(s) = q.peek(|_| true) {
            q.pop(s);
            out.push(s);
        }
        out
    }

    #[test]
    fn fifo_without_fairness_and_preempted_first() {
        let mut q = WaitQueue::new(false, 3);
        for (s, t) in [(1, 0), (2, 0), (3, 1), (4, 2)] {
            q.push_back(s, t);
        }
        q.push_front(9);
        assert_eq!(drain(&mut q), [9, 1, 2, 3, 4]);
    }

    #[test]
    fn fairness_serves_tenants_round_robin() {
        let mut q = WaitQueue::new(true, 2);
        for s in [1, 2, 3] {
            q.push_back(s, 0);
        }
        q.push_back(10, 1);
        q.push_back(11, 1);
        assert_eq!(drain(&mut q), [1, 10, 2, 11, 3]);
    }

    #[test]
    fn dead_entries_are_skipped() {
        let mut q = WaitQueue::new(false, 1);
        for s in [1, 2, 3] {
            q.push_back(s, 0);
        }
        assert_eq!(q.peek(|s| s != 1 && s != 2), Some(3));
        q.pop(3);
        assert!(q.peek(|_| true).is_none());
        assert!(q.is_empty());
    }
}
