//! `LatencyHist`: the one latency accumulator every consumer of metrics reads (the run's summary,
//! the sweep's order-statistic intervals, a streaming run's running figures).
//!
//! An auto-resizing hdrhistogram of integer nanoseconds at [`HDR_SIGFIGS`] significant digits:
//! it never clips (a 36-hour TTFT is recorded as 36 hours, not as the histogram's ceiling); the
//! rare value beyond what hdrhistogram can resize to (> 2^62 ns, centuries) is kept exactly on
//! the side. `count`, `mean_ns` and `max_ns` are exact; ranked values are the histogram's
//! highest equivalent value, within 0.1% of the exact one.

use hdrhistogram::Histogram;

use super::Dist;

/// Significant digits of every latency histogram.
pub const HDR_SIGFIGS: u8 = 3;

#[derive(Debug, Clone, PartialEq)]
pub struct LatencyHist {
    h: Histogram<u64>,
    /// Values the histogram could not take, kept exactly (sorted on read).
    overflow_ns: Vec<u64>,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist::new()
    }
}

impl LatencyHist {
    pub fn new() -> LatencyHist {
        LatencyHist {
            h: Histogram::new(HDR_SIGFIGS).expect("3 significant digits is a valid histogram"),
            overflow_ns: Vec::new(),
            sum_ns: 0,
            max_ns: 0,
        }
    }

    pub fn of_ns(values_ns: &[u64]) -> LatencyHist {
        let mut h = LatencyHist::new();
        for &v in values_ns {
            h.record_ns(v);
        }
        h
    }

    pub fn record_ns(&mut self, v: u64) {
        if self.h.record(v).is_err() {
            self.overflow_ns.push(v);
        }
        self.sum_ns += v as u128;
        self.max_ns = self.max_ns.max(v);
    }

    /// Fold `other` in (probes over several seeds, shards of one run).
    pub fn add(&mut self, other: &LatencyHist) {
        if self.h.add(&other.h).is_err() {
            // Only possible at the resize limit: fall back to the other's values one by one.
            for v in other.h.iter_recorded() {
                for _ in 0..v.count_at_value() {
                    self.overflow_ns.push(v.value_iterated_to());
                }
            }
        }
        self.overflow_ns.extend_from_slice(&other.overflow_ns);
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    pub fn count(&self) -> u64 {
        self.h.len() + self.overflow_ns.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// Exact mean (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum_ns as f64 / n as f64,
        }
    }

    /// The `k`-th smallest value, 1-based (`k` is clamped to `[1, count]`; 0 when empty). This is
    /// what an order-statistic confidence interval for a percentile reads.
    pub fn value_at_rank_ns(&self, k: u64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let k = k.clamp(1, n);
        let in_hist = self.h.len();
        if k > in_hist {
            let mut over = self.overflow_ns.clone();
            over.sort_unstable();
            return over[(k - in_hist - 1) as usize];
        }
        let mut seen = 0u64;
        for v in self.h.iter_recorded() {
            seen += v.count_at_value();
            if seen >= k {
                return v.value_iterated_to().min(self.max_ns);
            }
        }
        self.max_ns
    }

    /// The `q`-quantile (`q` in [0, 1]): the value at rank ⌈q·n⌉, as hdrhistogram defines it,
    /// never above the exact maximum: the histogram answers with its bucket's highest value,
    /// which can exceed every value recorded, and a p99 above the max is a figure no run made.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.overflow_ns.is_empty() {
            return self.h.value_at_quantile(q).min(self.max_ns);
        }
        let n = self.count();
        let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as u64;
        self.value_at_rank_ns(rank)
    }

    /// How many recorded values exceed `t_ns` (at histogram resolution: a value within 0.1% of
    /// `t_ns` may be counted on either side).
    pub fn count_above_ns(&self, t_ns: u64) -> u64 {
        let in_hist_le = if t_ns >= self.h.max() {
            self.h.len()
        } else {
            self.h.count_between(0, t_ns)
        };
        let over = self.overflow_ns.iter().filter(|&&v| v > t_ns).count() as u64;
        self.h.len() - in_hist_le + over
    }

    /// The summary in milliseconds (all zeros when empty).
    pub fn dist(&self) -> Dist {
        if self.is_empty() {
            return Dist::default();
        }
        let ms = |v: u64| v as f64 / 1e6;
        Dist {
            p50: ms(self.quantile_ns(0.50)),
            p90: ms(self.quantile_ns(0.90)),
            p99: ms(self.quantile_ns(0.99)),
            max: ms(self.max_ns),
            mean: self.mean_ns() / 1e6,
            count: self.count(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_old_ceiling_are_recorded_not_clipped() {
        // 131,131,050 ms (36 h) where the old fixed histogram reported its 19.5 h ceiling.
        let v = [131_131_050_000_000u64, 131_131_050_000_000, 1_000_000];
        let d = LatencyHist::of_ns(&v).dist();
        assert!(
            (d.p50 - 131_131_050.0).abs() / 131_131_050.0 < 1e-3,
            "{d:?}"
        );
        assert_eq!(d.max, 131_131_050.0);
    }

    #[test]
    fn extreme_values_are_recorded_within_the_stated_precision() {
        let big = [1u64 << 46, 1 << 50, 1 << 60, 1 << 63, u64::MAX];
        let mut h = LatencyHist::new();
        h.record_ns(5);
        for &v in &big {
            h.record_ns(v);
        }
        assert_eq!(h.count(), 6);
        assert_eq!(h.value_at_rank_ns(1), 5);
        for (i, &v) in big.iter().enumerate() {
            let got = h.value_at_rank_ns(i as u64 + 2);
            assert!(got.abs_diff(v) as f64 <= v as f64 * 1e-3, "{got} vs {v}");
        }
        assert_eq!(h.max_ns(), u64::MAX);
        assert_eq!(h.count_above_ns(10), 5);
        assert!(h.quantile_ns(1.0) >= u64::MAX - u64::MAX / 1000);
    }

    #[test]
    fn ranks_quantiles_and_counts_agree_with_a_sorted_list() {
        let v: Vec<u64> = (1..=2000u64).map(|i| i * 7_919 % 2003 * 1000 + 1).collect();
        let h = LatencyHist::of_ns(&v);
        let mut sorted = v.clone();
        sorted.sort_unstable();
        for k in [1u64, 2, 500, 1980, 1999, 2000] {
            let exact = sorted[(k - 1) as usize] as f64;
            let got = h.value_at_rank_ns(k) as f64;
            assert!(
                (got - exact).abs() / exact <= 1e-3,
                "rank {k}: {got} vs {exact}"
            );
        }
        let t = sorted[1500];
        let above = sorted.iter().filter(|&&x| x > t).count() as u64;
        assert!(
            h.count_above_ns(t).abs_diff(above) <= 2,
            "{} vs {above}",
            h.count_above_ns(t)
        );
        assert_eq!(h.quantile_ns(0.5), h.value_at_rank_ns(1000));
    }

    #[test]
    fn add_is_the_histogram_of_the_union() {
        let a = LatencyHist::of_ns(&[1, 2, 3]);
        let b = LatencyHist::of_ns(&[u64::MAX, 10]);
        let mut u = a.clone();
        u.add(&b);
        assert_eq!(u, {
            let mut x = LatencyHist::of_ns(&[1, 2, 3, 10]);
            x.record_ns(u64::MAX);
            x
        });
        assert_eq!(u.count(), 5);
        assert_eq!(u.max_ns(), u64::MAX);
    }

    /// A quantile is a value the run could have recorded: never above the exact maximum, even
    /// where the histogram's bucket for the top values reaches past it.
    #[test]
    fn no_quantile_exceeds_the_max() {
        for top in [1_000_001u64, 131_131_050, 7_777_777_777, 123_456_789_013] {
            let mut h = LatencyHist::new();
            for v in [top / 3, top / 2, top] {
                h.record_ns(v);
            }
            let d = h.dist();
            for (name, q) in [("p50", d.p50), ("p90", d.p90), ("p99", d.p99)] {
                assert!(q <= d.max, "{name} {q} above max {} (top {top})", d.max);
            }
            assert_eq!(h.quantile_ns(1.0), top, "the top rank is the max itself");
        }
    }
}
