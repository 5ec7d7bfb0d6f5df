//! The virtual clock and what is due on it: requests waiting to arrive and cancellation timers.
//!
//! Time is integer nanoseconds and never goes back. It moves in two ways only: a completed step
//! ends at `max(device free, planned) + duration` ([`VirtualClock::place_step`]), and an idle
//! engine jumps to the next live arrival or timer ([`VirtualClock::jump_to_next_event`]). Dead
//! timers are dropped on the way (`timers.rs`), so the clock never advances past the last real
//! event.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::timers::CancelTimers;
use super::EngineError;

pub(super) struct VirtualClock {
    now_ns: u64,
    /// When the device is done with the last step placed on it.
    device_free_ns: u64,
    /// End of the last completed step.
    last_step_end_ns: Option<u64>,
    /// (time, request) of requests not arrived yet: the open loop's list, closed-loop clients'
    /// next requests, later session turns.
    arrivals: BinaryHeap<Reverse<(u64, u32)>>,
    timers: CancelTimers,
}

impl VirtualClock {
    pub fn new(requests: usize) -> VirtualClock {
        VirtualClock {
            now_ns: 0,
            device_free_ns: 0,
            last_step_end_ns: None,
            arrivals: BinaryHeap::new(),
            timers: CancelTimers::new(requests),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// A live run's wall time reached `ns`: the clock follows it, never going back.
    pub fn advance_to(&mut self, ns: u64) {
        self.now_ns = self.now_ns.max(ns);
    }

    /// Request `request` arrives at `at_ns`.
    pub fn schedule_arrival(&mut self, at_ns: u64, request: u32) {
        self.arrivals.push(Reverse((at_ns, request)));
    }

    /// The next arrival due by now, as (time, request), removed.
    pub fn pop_arrival_due(&mut self) -> Option<(u64, u32)> {
        let &Reverse((t, r)) = self.arrivals.peek()?;
        if t > self.now_ns {
            return None;
        }
        self.arrivals.pop();
        Some((t, r))
    }

    /// Cancel `request` at `at_ns` unless it is disarmed first (a request has at most one).
    pub fn arm_cancel(&mut self, request: u32, at_ns: u64) {
        self.timers.arm(request, at_ns);
    }

    /// `request` can no longer be cancelled by its timer (it resolved, or was admitted before a
    /// queued-only cancellation fired).
    pub fn disarm_cancel(&mut self, request: u32) {
        self.timers.disarm(request);
    }

    /// The next live cancellation due by now, disarmed as it is returned.
    pub fn pop_cancel_due(&mut self) -> Option<u32> {
        self.timers.pop_due(self.now_ns)
    }

    /// Nothing to run: jump to the next arrival or live timer. False when there is none.
    pub fn jump_to_next_event(&mut self) -> bool {
        let next_arrival = self.arrivals.peek().map(|Reverse((t, _))| *t);
        let next = [next_arrival, self.timers.next_due_ns()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) => {
                self.now_ns = self.now_ns.max(t);
                true
            }
            None => false,
        }
    }

    /// Place completed step `index`, planned at `planned_ns` and `duration_ns` long, on the
    /// device after the previous one; the clock moves to its end. Returns (start, end).
    pub fn place_step(
        &mut self,
        planned_ns: u64,
        duration_ns: u64,
        index: u64,
    ) -> Result<(u64, u64), EngineError> {
        let start = self.device_free_ns.max(planned_ns);
        let end = start
            .checked_add(duration_ns)
            .ok_or_else(|| EngineError::Stalled {
                t_ms: start as f64 / 1e6,
                detail: format!("step {index} of {duration_ns} ns overflows the virtual clock"),
            })?;
        self.device_free_ns = end;
        self.now_ns = self.now_ns.max(end);
        self.last_step_end_ns = Some(end);
        Ok((start, end))
    }

    /// The run's duration: the end of its last step, or now if later.
    pub fn end_ns(&self) -> u64 {
        self.last_step_end_ns
            .unwrap_or(self.now_ns)
            .max(self.now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_queue_on_the_device_and_the_clock_never_goes_back() {
        let mut c = VirtualClock::new(2);
        assert_eq!(c.place_step(0, 10, 0).expect("fits"), (0, 10));
        // Planned at 5 while the device was busy until 10: starts at 10.
        assert_eq!(c.place_step(5, 10, 1).expect("fits"), (10, 20));
        assert_eq!(c.now_ns(), 20);
        c.schedule_arrival(15, 0);
        assert_eq!(
            c.pop_arrival_due(),
            Some((15, 0)),
            "an arrival in the past is due now"
        );
        assert!(!c.jump_to_next_event(), "nothing left to wait for");
        assert_eq!(c.end_ns(), 20);
        assert!(
            c.place_step(u64::MAX, 1, 2).is_err(),
            "overflow is an error"
        );
    }

    #[test]
    fn an_idle_clock_jumps_to_the_next_live_event_only() {
        let mut c = VirtualClock::new(2);
        c.arm_cancel(0, 50);
        c.schedule_arrival(100, 1);
        c.disarm_cancel(0);
        assert!(c.jump_to_next_event());
        assert_eq!(c.now_ns(), 100, "a disarmed timer never sets the time");
        assert_eq!(c.pop_cancel_due(), None);
        assert_eq!(c.pop_arrival_due(), Some((100, 1)));
        assert_eq!(c.end_ns(), 100, "no step ran: the run ends now");
    }
}
