//! The step timeline behind `memory.csv` and Perfetto's step track and KV counters, at a stated
//! time resolution, so long runs write a bounded number of rows while their peaks stay exact.
//!
//! A row is a bucket of consecutive steps: every step its own row (resolution "every step"),
//! or every step whose end falls in one `[k·r, (k+1)·r)` interval of the resolution `r`. Each
//! column of a bucket is the **maximum** over its steps (the step and time columns: its last
//! step's), so the peak of any column over the file is the peak over every step. The exact
//! figures (peaks, the time-weighted waste fraction) come from every step through
//! [`super::accum::LedgerAccum`], never from these rows.
//!
//! `Auto` keeps every step until there are more than `max_rows` rows, then switches to 1 ms and
//! doubles the resolution until the rows fit in half the bound (intervals nest, so regrouping is
//! exact); the resolution it settled on is stated in `summary.json`.

use crate::engine::{RunStart, StepSample};

/// Rows per cache mode that `Auto` stays within.
pub const DEFAULT_MAX_ROWS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Every step until more than `max_rows` rows, then the coarsest power-of-two multiple of
    /// 1 ms that is needed.
    Auto { max_rows: usize },
    /// A row per step, however many.
    EveryStep,
    /// A row per interval of this many nanoseconds that holds a step.
    Fixed { ns: u64 },
}

impl Default for Resolution {
    fn default() -> Self {
        Resolution::Auto {
            max_rows: DEFAULT_MAX_ROWS,
        }
    }
}

impl Resolution {
    /// `--memory-resolution-ms`: 0 is every step, a positive value a fixed interval.
    pub fn from_ms(ms: f64) -> Option<Resolution> {
        if ms == 0.0 {
            Some(Resolution::EveryStep)
        } else if ms.is_finite() && ms > 0.0 && ms * 1e6 < u64::MAX as f64 {
            Some(Resolution::Fixed {
                ns: ((ms * 1e6).round() as u64).max(1),
            })
        } else {
            None
        }
    }
}

/// One row: the maxima over a run of consecutive steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub first_step: u64,
    pub last_step: u64,
    pub steps: u64,
    /// First step's start and last step's end.
    pub start_ns: u64,
    pub end_ns: u64,
    pub batch_seqs: u32,
    pub batch_tokens: u32,
    pub running: u32,
    pub live_slots: u64,
    pub allocated_unfilled_slots: u64,
    pub cached_free_slots: u64,
    pub pending_free_slots: u64,
    pub free_slots: u64,
    /// The engine's part of "other" (block tables, per-sequence metadata), bytes.
    pub metadata_bytes: u64,
    /// Blocks held by the host and the disk tier.
    pub tier_used_blocks: [u64; 2],
}

impl Bucket {
    fn of(s: &StepSample, metadata_bytes: u64) -> Bucket {
        let a = &s.accounting;
        Bucket {
            first_step: s.step,
            last_step: s.step,
            steps: 1,
            start_ns: s.start_ns,
            end_ns: s.end_ns,
            batch_seqs: s.batch_seqs,
            batch_tokens: s.batch_tokens,
            running: s.running,
            live_slots: a.live_slots,
            allocated_unfilled_slots: a.allocated_unfilled_slots,
            cached_free_slots: a.cached_free_slots,
            pending_free_slots: a.pending_free_slots,
            free_slots: a.free_slots,
            metadata_bytes,
            tier_used_blocks: s.tier_used_blocks,
        }
    }

    fn merge(&mut self, o: &Bucket) {
        self.last_step = o.last_step;
        self.steps += o.steps;
        self.end_ns = o.end_ns;
        self.batch_seqs = self.batch_seqs.max(o.batch_seqs);
        self.batch_tokens = self.batch_tokens.max(o.batch_tokens);
        self.running = self.running.max(o.running);
        self.live_slots = self.live_slots.max(o.live_slots);
        self.allocated_unfilled_slots = self
            .allocated_unfilled_slots
            .max(o.allocated_unfilled_slots);
        self.cached_free_slots = self.cached_free_slots.max(o.cached_free_slots);
        self.pending_free_slots = self.pending_free_slots.max(o.pending_free_slots);
        self.free_slots = self.free_slots.max(o.free_slots);
        self.metadata_bytes = self.metadata_bytes.max(o.metadata_bytes);
        for (a, b) in self.tier_used_blocks.iter_mut().zip(o.tier_used_blocks) {
            *a = (*a).max(b);
        }
    }
}

pub struct Timeline {
    resolution: Resolution,
    /// Interval in ns; 0 while every step is its own row.
    res_ns: u64,
    rows: Vec<Bucket>,
    block_size: u32,
    paged: bool,
}

impl Timeline {
    pub fn new(resolution: Resolution, start: &RunStart) -> Timeline {
        Timeline {
            resolution,
            res_ns: match resolution {
                Resolution::Fixed { ns } => ns,
                _ => 0,
            },
            rows: Vec::new(),
            block_size: start.block_size,
            paged: start.mode == kvbench_cache_api::CacheMode::Paged,
        }
    }

    pub fn push(&mut self, s: &StepSample) {
        let b = Bucket::of(
            s,
            super::ledger::other_bytes(s, self.block_size, self.paged),
        );
        match self.rows.last_mut() {
            Some(last)
                if self.res_ns > 0 && last.end_ns / self.res_ns == b.end_ns / self.res_ns =>
            {
                last.merge(&b)
            }
            _ => self.rows.push(b),
        }
        if let Resolution::Auto { max_rows } = self.resolution {
            if self.rows.len() > max_rows {
                self.coarsen((max_rows / 2).max(1));
            }
        }
    }

    fn coarsen(&mut self, fit: usize) {
        while self.rows.len() > fit {
            self.res_ns = if self.res_ns == 0 {
                1_000_000
            } else {
                self.res_ns.saturating_mul(2)
            };
            let res = self.res_ns;
            let mut out: Vec<Bucket> = Vec::with_capacity(self.rows.len() / 2 + 1);
            for b in &self.rows {
                match out.last_mut() {
                    Some(last) if last.end_ns / res == b.end_ns / res => last.merge(b),
                    _ => out.push(*b),
                }
            }
            self.rows = out;
            if res == u64::MAX {
                break;
            }
        }
    }

    /// The interval of a row in nanoseconds; `None` when every step is its own row.
    pub fn resolution_ns(&self) -> Option<u64> {
        (self.res_ns > 0).then_some(self.res_ns)
    }

    pub fn rows(&self) -> &[Bucket] {
        &self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvbench_cache_api::{Accounting, CacheMode};

    fn start() -> RunStart {
        RunStart {
            mode: CacheMode::Paged,
            block_size: 16,
            total_slots: 1 << 20,
            slot_bytes: 1,
            memory: Default::default(),
            computes: false,
            tier_capacity_blocks: [0; 2],
        }
    }

    fn step(i: u64, live: u64) -> StepSample {
        StepSample {
            step: i,
            start_ns: i * 700_000,
            end_ns: (i + 1) * 700_000,
            batch_seqs: (i % 7) as u32,
            batch_tokens: 1,
            running: 1,
            accounting: Accounting {
                total_slots: 1 << 20,
                live_slots: live,
                allocated_unfilled_slots: 0,
                cached_free_slots: 0,
                pending_free_slots: 0,
                free_slots: (1 << 20) - live,
            },
            tier_used_blocks: [0; 2],
        }
    }

    #[test]
    fn auto_stays_within_its_bound_and_keeps_every_peak() {
        let seed = crate::metrics::timeline::tests::seed();
        let mut t = Timeline::new(Resolution::Auto { max_rows: 100 }, &start());
        let mut peak = 0;
        let mut x = seed;
        for i in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let live = (x >> 40) % 100_000;
            peak = peak.max(live);
            t.push(&step(i, live));
        }
        let rows = t.rows();
        assert!(rows.len() <= 100, "{} rows (seed {seed})", rows.len());
        assert_eq!(
            rows.iter().map(|b| b.live_slots).max(),
            Some(peak),
            "seed {seed}"
        );
        assert_eq!(rows.iter().map(|b| b.steps).sum::<u64>(), 5000);
        assert_eq!(rows.last().map(|b| b.last_step), Some(4999));
        let res = t.resolution_ns().expect("coarsened");
        assert_eq!(res % 1_000_000, 0);
        assert!((res / 1_000_000).is_power_of_two());
        // Rows are whole intervals: no two rows share one.
        for w in rows.windows(2) {
            assert!(w[0].end_ns / res < w[1].end_ns / res);
        }
    }

    #[test]
    fn short_runs_keep_every_step() {
        let mut t = Timeline::new(Resolution::default(), &start());
        for i in 0..50 {
            t.push(&step(i, i));
        }
        assert_eq!(t.rows().len(), 50);
        assert_eq!(t.resolution_ns(), None);
        assert_eq!(t.rows()[7].live_slots, 7);
    }

    #[test]
    fn fixed_resolution_groups_by_interval() {
        // 0.7 ms steps in 2 ms intervals: ends at 0.7, 1.4 | 2.1, 2.8, 3.5 | 4.2 ...
        let mut t = Timeline::new(Resolution::Fixed { ns: 2_000_000 }, &start());
        for i in 0..6 {
            t.push(&step(i, 10 - i));
        }
        let steps: Vec<u64> = t.rows().iter().map(|b| b.steps).collect();
        assert_eq!(steps, [2, 3, 1]);
        assert_eq!(t.rows()[1].live_slots, 8);
        assert_eq!(Resolution::from_ms(0.0), Some(Resolution::EveryStep));
        assert_eq!(Resolution::from_ms(-1.0), None);
    }

    pub(super) fn seed() -> u64 {
        let seed = std::env::var("KVBENCH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_7141);
        println!("seed {seed} (KVBENCH_SEED replays)");
        seed
    }
}
