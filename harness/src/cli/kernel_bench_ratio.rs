//! The side-by-side ratios `kvbench kernel-bench` (cpu) reports: each repeat times the three
//! layouts of a grid point close together in time, so a ratio within one repeat cancels most of
//! what other load on a shared machine does to both of its times; the median of those paired
//! ratios over the repeats, with a distribution-free interval, says whether a ratio target is met
//! however much the single figures scatter.

use crate::stats::{binomial_cdf, quantile_rank_interval};

/// Two-sided confidence the interval aims at (a sweep's, too).
pub(super) const CONFIDENCE: f64 = crate::stats::CONFIDENCE;

/// The median of a sample and an interval for the population median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct MedianInterval {
    pub median: f64,
    pub low: f64,
    pub high: f64,
    /// P(low ≤ population median ≤ high) for independent draws of a continuous distribution:
    /// at least [`CONFIDENCE`] from 6 samples on, less below (0 for one sample).
    pub confidence: f64,
}

/// `num[r] / den[r]` for every repeat `r`; `None` unless both have the same length and every
/// time is positive and finite.
pub(super) fn paired_ratios(num: &[f64], den: &[f64]) -> Option<Vec<f64>> {
    let ok = |t: &f64| t.is_finite() && *t > 0.0;
    if num.len() != den.len() || !num.iter().all(ok) || !den.iter().all(ok) {
        return None;
    }
    Some(num.iter().zip(den).map(|(n, d)| n / d).collect())
}

/// The sample median of `xs` and the order statistics `[x_(l), x_(u)]` around it that bracket
/// the population median with probability ≥ [`CONFIDENCE`], whatever the distribution: the number
/// of draws at or below the median is Binomial(n, ½), so P(x_(l) ≤ m ≤ x_(u)) =
/// P(l ≤ B ≤ u − 1), and `quantile_rank_interval` picks the narrowest symmetric ranks reaching
/// the target (n = 10: ranks 2 and 9; n = 20: 6 and 15). Below 6 draws no ranks reach it, and
/// `[min, max]` is given with the confidence it has (n = 5: 15/16). `None` for an empty sample
/// or a value that is not finite.
pub(super) fn median_interval(xs: &[f64]) -> Option<MedianInterval> {
    if xs.is_empty() || !xs.iter().all(|x| x.is_finite()) {
        return None;
    }
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let ranks = quantile_rank_interval(n as u64, 0.5, CONFIDENCE);
    // 1-based ranks; a side the sample is too small to bound falls back to the extreme.
    let l = ranks.lo_rank.unwrap_or(1).clamp(1, n as u64);
    let u = ranks.hi_rank.unwrap_or(n as u64).clamp(l, n as u64);
    let n64 = n as u64;
    let confidence = (binomial_cdf(n64, 0.5, u - 1) - binomial_cdf(n64, 0.5, l - 1)).max(0.0);
    Some(MedianInterval {
        median,
        low: s[(l - 1) as usize],
        high: s[(u - 1) as usize],
        confidence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// 1..=n in a scrambled order, so the ranks are the values.
    fn ranks_scrambled(n: usize) -> Vec<f64> {
        (0..n).map(|i| ((i * 7) % n + 1) as f64).collect()
    }

    #[test]
    fn known_ranks_from_the_binomial() {
        // n, expected (l, u), coverage 1 − 2·P(B ≤ l − 1) computed by hand.
        let cases: [(usize, (f64, f64), f64); 4] = [
            (6, (1.0, 6.0), 1.0 - 2.0 / 64.0),
            (10, (2.0, 9.0), 1.0 - 2.0 * 11.0 / 1024.0),
            (11, (2.0, 10.0), 1.0 - 2.0 * 12.0 / 2048.0),
            (20, (6.0, 15.0), 1.0 - 2.0 * 21_700.0 / 1_048_576.0),
        ];
        for (n, (l, u), cover) in cases {
            let m = median_interval(&ranks_scrambled(n)).expect("interval");
            assert_eq!((m.low, m.high), (l, u), "n = {n}");
            assert!((m.confidence - cover).abs() < 1e-9, "n = {n}: {m:?}");
            assert!(m.confidence >= CONFIDENCE, "n = {n}");
            assert_eq!(m.median, (n as f64 + 1.0) / 2.0, "n = {n}");
        }
    }

    #[test]
    fn small_samples_give_the_range_with_the_confidence_it_has() {
        let m = median_interval(&[3.0, 1.0, 2.0, 5.0, 4.0]).expect("interval");
        assert_eq!((m.median, m.low, m.high), (3.0, 1.0, 5.0));
        assert!((m.confidence - 15.0 / 16.0).abs() < 1e-12, "{m:?}");
        let one = median_interval(&[1.25]).expect("interval");
        assert_eq!((one.median, one.low, one.high), (1.25, 1.25, 1.25));
        assert_eq!(one.confidence, 0.0);
        assert_eq!(median_interval(&[]), None);
        assert_eq!(median_interval(&[1.0, f64::NAN]), None);
    }

    /// The stated confidence is the real coverage: intervals from skewed samples with a known
    /// median cover it as often as they say (an off-by-one rank moves coverage by 4 points at
    /// n = 11, 30 standard errors here).
    #[test]
    fn coverage_matches_the_stated_confidence() {
        let seed = std::env::var("KVBENCH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(18_07);
        println!("seed {seed} (KVBENCH_SEED replays)");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // exp(U · 3) for U uniform on [0, 1): median exp(1.5), long right tail.
        let true_median = 1.5f64.exp();
        let trials = 8000;
        for n in [7usize, 11, 24] {
            let mut covered = 0;
            let mut stated = 0.0;
            for _ in 0..trials {
                let xs: Vec<f64> = (0..n).map(|_| (rng.gen::<f64>() * 3.0).exp()).collect();
                let m = median_interval(&xs).expect("interval");
                stated = m.confidence;
                covered += usize::from(m.low <= true_median && true_median <= m.high);
            }
            let p = covered as f64 / trials as f64;
            let se = (stated * (1.0 - stated) / trials as f64).sqrt();
            assert!(
                (p - stated).abs() <= 4.0 * se + 1e-3,
                "n = {n}: covered {p}, stated {stated} (seed {seed})"
            );
        }
    }

    #[test]
    fn ratios_pair_repeats_and_refuse_bad_times() {
        assert_eq!(
            paired_ratios(&[2.0, 3.0], &[1.0, 2.0]),
            Some(vec![2.0, 1.5])
        );
        assert_eq!(paired_ratios(&[2.0], &[1.0, 2.0]), None);
        assert_eq!(paired_ratios(&[2.0, 0.0], &[1.0, 2.0]), None);
        assert_eq!(paired_ratios(&[2.0, 1.0], &[f64::INFINITY, 2.0]), None);
    }
}
