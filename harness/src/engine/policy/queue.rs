//! The wait queue. Preempted sequences go to the front (they already paid for admission once);
//! new arrivals join the back. With tenant fairness, new arrivals are served round-robin across
//! tenants instead of in arrival order, so one tenant's burst cannot starve the others.
//!
//! Entries are removed lazily: the engine skips entries whose stream is no longer waiting
//! (cancelled while queued), so cancellation is O(1).

use std::collections::{BTreeMap, VecDeque};

/// The wait queue. Lanes exist only for tenants with someone waiting, so a step's cost follows
/// the tenants in the queue, never the tenant count (a hundred million tenants cost nothing
/// until they send).
#[derive(Debug, Clone, Default)]
pub struct WaitQueue {
    front: VecDeque<u32>,
    /// One FIFO per tenant with entries (a single lane, tenant 0, without fairness).
    lanes: BTreeMap<u32, VecDeque<u32>>,
    fair: bool,
    /// Round-robin position: the next tenant to serve is the first lane at or after it.
    cursor: u64,
}

impl WaitQueue {
    /// `_tenants` is the tenant count; lanes are made on demand, so it sizes nothing.
    pub fn new(fair: bool, _tenants: u32) -> WaitQueue {
        WaitQueue {
            front: VecDeque::new(),
            lanes: BTreeMap::new(),
            fair,
            cursor: 0,
        }
    }

    pub fn push_back(&mut self, stream: u32, tenant: u32) {
        let lane = if self.fair { tenant } else { 0 };
        self.lanes.entry(lane).or_default().push_back(stream);
    }

    pub fn push_front(&mut self, stream: u32) {
        self.front.push_front(stream);
    }

    /// The next candidate, dropping entries `live` rejects (and lanes they empty). Does not
    /// remove it.
    pub fn peek(&mut self, live: impl Fn(u32) -> bool) -> Option<u32> {
        while let Some(&s) = self.front.front() {
            if live(s) {
                return Some(s);
            }
            self.front.pop_front();
        }
        // Lanes at or after the cursor, then those before it: round-robin over waiting tenants.
        loop {
            let lane = u32::try_from(self.cursor)
                .ok()
                .and_then(|c| self.lanes.range(c..).next())
                .or_else(|| self.lanes.iter().next())
                .map(|(&k, _)| k)?;
            let queue = self.lanes.get_mut(&lane)?;
            while let Some(&s) = queue.front() {
                if live(s) {
                    self.cursor = lane as u64;
                    return Some(s);
                }
                queue.pop_front();
            }
            self.lanes.remove(&lane);
        }
    }

    /// Remove the candidate `peek` returned; round-robin moves on to the next tenant.
    pub fn pop(&mut self, stream: u32) {
        if self.front.front() == Some(&stream) {
            self.front.pop_front();
            return;
        }
        let Ok(lane) = u32::try_from(self.cursor) else {
            return;
        };
        if let Some(queue) = self.lanes.get_mut(&lane) {
            if queue.front() == Some(&stream) {
                queue.pop_front();
                if queue.is_empty() {
                    self.lanes.remove(&lane);
                }
                self.cursor = lane as u64 + 1;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.front.is_empty() && self.lanes.values().all(VecDeque::is_empty)
    }

    /// Tenants with a lane (someone queued, or entries not yet dropped): what a step may visit.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
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
    fn fairness_wraps_around_and_cost_follows_waiting_tenants() {
        let mut q = WaitQueue::new(true, u32::MAX);
        for (s, t) in [(1, u32::MAX), (2, 100_000_000), (3, 5), (4, u32::MAX)] {
            q.push_back(s, t);
        }
        assert_eq!(q.lanes(), 3);
        assert_eq!(drain(&mut q), [3, 2, 1, 4]);
        assert_eq!(q.lanes(), 0);
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
