//! The admission controller: may this sequence start now without violating memory reserves?
//!
//! It knows nothing of latency or order (that is the policy's job). A start is admitted when the
//! cache says it fits and, after taking its slots, the pool still holds
//! - the watermark: a share of the whole pool kept free for bursts of growth, and
//! - the decode reserve: slots for one further decode step of every running sequence
//!   (Σ `append_cost` over running sequences, computed by the engine once per step).
//!
//! With nothing running and nothing in flight, reserves are waived: a lone request that fits must
//! start, or a large prompt could wait forever on a reserve that no one else needs.

use kvbench_cache_api::{Accounting, Probe};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionConfig {
    /// Share of the pool kept free (scheduler.watermark).
    pub watermark: f64,
}

/// Pool state the decision reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// Slots allocatable now, including evictable cached-free prefix blocks.
    pub available_slots: u64,
    pub total_slots: u64,
    /// Slots one more decode step of every running sequence would take.
    pub decode_reserve_slots: u64,
    /// Nothing running and no step in flight.
    pub idle: bool,
}

impl Capacity {
    pub fn from_accounting(a: &Accounting, decode_reserve_slots: u64, idle: bool) -> Capacity {
        Capacity {
            available_slots: a.free_slots + a.cached_free_slots,
            total_slots: a.total_slots,
            decode_reserve_slots,
            idle,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// Not now: the cache is full or a reserve would be violated.
    Wait,
}

impl AdmissionConfig {
    pub fn watermark_slots(&self, total_slots: u64) -> u64 {
        (self.watermark.clamp(0.0, 1.0) * total_slots as f64).ceil() as u64
    }

    pub fn decide(&self, probe: &Probe, cap: &Capacity) -> Verdict {
        if !probe.fits {
            return Verdict::Wait;
        }
        if cap.idle {
            return Verdict::Admit;
        }
        let after = cap.available_slots.saturating_sub(probe.new_slots);
        if probe.new_slots > cap.available_slots {
            return Verdict::Wait;
        }
        let reserve = self.watermark_slots(cap.total_slots) + cap.decode_reserve_slots;
        if after >= reserve {
            Verdict::Admit
        } else {
            Verdict::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(new_slots: u64, fits: bool) -> Probe {
        Probe {
            cached_tokens: 0,
            new_slots,
            fits,
            onload_tokens: 0,
        }
    }

    fn cap(available: u64, reserve: u64, idle: bool) -> Capacity {
        Capacity {
            available_slots: available,
            total_slots: 1000,
            decode_reserve_slots: reserve,
            idle,
        }
    }

    #[test]
    fn admits_when_the_reserves_remain_after_the_start() {
        let a = AdmissionConfig { watermark: 0.01 };
        // 10 watermark + 20 decode reserve: 100 - 70 = 30 left → admit; 71 → wait.
        assert_eq!(
            a.decide(&probe(70, true), &cap(100, 20, false)),
            Verdict::Admit
        );
        assert_eq!(
            a.decide(&probe(71, true), &cap(100, 20, false)),
            Verdict::Wait
        );
    }

    #[test]
    fn never_admits_what_the_cache_says_does_not_fit() {
        let a = AdmissionConfig { watermark: 0.0 };
        assert_eq!(
            a.decide(&probe(1, false), &cap(1000, 0, true)),
            Verdict::Wait
        );
    }

    #[test]
    fn an_idle_engine_waives_reserves() {
        let a = AdmissionConfig { watermark: 0.5 };
        assert_eq!(
            a.decide(&probe(900, true), &cap(1000, 0, true)),
            Verdict::Admit
        );
        assert_eq!(
            a.decide(&probe(900, true), &cap(1000, 0, false)),
            Verdict::Wait
        );
    }

    #[test]
    fn watermark_is_a_share_of_the_whole_pool_rounded_up() {
        let a = AdmissionConfig { watermark: 0.015 };
        assert_eq!(a.watermark_slots(1000), 15);
        assert_eq!(a.watermark_slots(1001), 16);
        assert_eq!(AdmissionConfig { watermark: 2.0 }.watermark_slots(10), 10);
    }

    #[test]
    fn a_start_larger_than_what_is_available_waits_even_if_reserves_are_zero() {
        let a = AdmissionConfig { watermark: 0.0 };
        assert_eq!(
            a.decide(&probe(101, true), &cap(100, 0, false)),
            Verdict::Wait
        );
    }
}
