//! Intervals from counts and samples (a probe's verdict, a comparison's change, a kernel
//! ratio's median): pure functions, no I/O.
//!
//! - A distribution-free interval for a quantile from binomial order statistics: the number of
//!   samples at or below the true q-quantile is Binomial(n, q) whatever the distribution, so the
//!   ranks that bracket it with probability ≥ 1 − α come from that binomial's CDF (statrs).
//! - MLPerf LoadGen's early-stopping floor for a p99 claim: with `t` samples over the limit, the
//!   run needs the smallest `n` with P(Binomial(n, 0.01) ≤ t) ≤ 0.01 (0 → 459, 1 → 662,
//!   10 → 2,010); derived here from the binomial rather than copied from a table.
//! - The Wilson score interval for a proportion (SLO attainment), as GuideLLM uses.
//! - Student-t intervals for a mean over seeds.

use statrs::distribution::{Binomial, ContinuousCDF, DiscreteCDF, Normal, StudentsT};

/// Two-sided confidence of every interval a sweep reports.
pub const CONFIDENCE: f64 = 0.95;
/// Quantile a latency target is stated at.
pub const P99: f64 = 0.99;

/// Above this many samples the binomial CDF is taken from the normal approximation (with
/// continuity correction): statrs' incomplete beta stops after 140 continued-fraction terms, which
/// is not enough for very large n; at these sizes the approximation's rank error is far below one
/// part in a thousand of the ranks involved. (`binomial_cdf_matches_direct_sum` checks both sides.)
pub const EXACT_BINOMIAL_MAX_N: u64 = 50_000;

/// P(Binomial(n, p) ≤ k).
pub fn binomial_cdf(n: u64, p: f64, k: u64) -> f64 {
    if k >= n {
        return 1.0;
    }
    if n <= EXACT_BINOMIAL_MAX_N {
        match Binomial::new(p, n) {
            Ok(b) => b.cdf(k),
            Err(_) => f64::NAN,
        }
    } else {
        let mean = n as f64 * p;
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        match Normal::new(mean, sd) {
            Ok(nd) => nd.cdf(k as f64 + 0.5),
            Err(_) => f64::NAN,
        }
    }
}

/// Smallest k in `0..=n` with `binomial_cdf(n, p, k) >= target` (n when none is smaller).
fn binomial_quantile(n: u64, p: f64, target: f64) -> u64 {
    let (mut lo, mut hi) = (0u64, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if binomial_cdf(n, p, mid) >= target {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// A confidence interval for a quantile as 1-based ranks into the sorted sample; `None` on a side
/// means the sample is too small to bound that side (the bound is −∞ or +∞).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankInterval {
    pub lo_rank: Option<u64>,
    pub hi_rank: Option<u64>,
}

/// Ranks (l, u) with P(x_(l) ≤ ξ_q ≤ x_(u)) ≥ `confidence` for n samples of any continuous
/// distribution: with B ~ Binomial(n, q) the count of samples at or below ξ_q,
/// P(x_(l) > ξ_q) = P(B ≤ l − 1) and P(x_(u) < ξ_q) = P(B ≥ u), so l is the largest rank with
/// P(B ≤ l − 1) ≤ α/2 and u the smallest with P(B ≤ u − 1) ≥ 1 − α/2.
pub fn quantile_rank_interval(n: u64, q: f64, confidence: f64) -> RankInterval {
    let tail = (1.0 - confidence) / 2.0;
    if n == 0 {
        return RankInterval {
            lo_rank: None,
            hi_rank: None,
        };
    }
    // k* = smallest k with F(k) > tail; then F(k* − 1) ≤ tail, so l = k* is the largest valid rank.
    let k_lo = binomial_quantile_strict(n, q, tail);
    let lo_rank = (k_lo >= 1).then_some(k_lo);
    // u − 1 = smallest k with F(k) ≥ 1 − tail.
    let k_hi = binomial_quantile(n, q, 1.0 - tail);
    let hi_rank = (k_hi < n && binomial_cdf(n, q, k_hi) >= 1.0 - tail).then_some(k_hi + 1);
    RankInterval { lo_rank, hi_rank }
}

/// Smallest k with `binomial_cdf(n, p, k) > target`.
fn binomial_quantile_strict(n: u64, p: f64, target: f64) -> u64 {
    let (mut lo, mut hi) = (0u64, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if binomial_cdf(n, p, mid) > target {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// MLPerf LoadGen's early-stopping floor: the fewest samples for which `violations` samples over
/// the limit still support "the p-quantile is within the limit" at `confidence` (one-sided): the
/// smallest n with P(Binomial(n, 1 − p) ≤ violations) ≤ 1 − confidence.
pub fn quantile_claim_floor(violations: u64, p: f64, confidence: f64) -> u64 {
    let over = 1.0 - p;
    let alpha = 1.0 - confidence;
    let ok = |n: u64| binomial_cdf(n, over, violations) <= alpha;
    let mut hi = (violations + 1).max(2);
    while !ok(hi) {
        match hi.checked_mul(2) {
            Some(h) => hi = h,
            None => return u64::MAX,
        }
    }
    let mut lo = violations + 1;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// MLPerf's floor for a p99 claim at 99% confidence.
pub fn p99_claim_floor(violations: u64) -> u64 {
    quantile_claim_floor(violations, P99, 0.99)
}

fn z(confidence: f64) -> f64 {
    Normal::new(0.0, 1.0).map_or(1.959_963_984_540_054, |n| {
        n.inverse_cdf(1.0 - (1.0 - confidence) / 2.0)
    })
}

/// The Wilson score interval for `successes` out of `n` (`[0, 1]` when n = 0).
pub fn wilson_interval(successes: u64, n: u64, confidence: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let z = z(confidence);
    let nf = n as f64;
    let p = successes as f64 / nf;
    let denom = 1.0 + z * z / nf;
    let center = (p + z * z / (2.0 * nf)) / denom;
    let half = z / denom * (p * (1.0 - p) / nf + z * z / (4.0 * nf * nf)).sqrt();
    ((center - half).max(0.0), (center + half).min(1.0))
}

/// Two-sided Student-t critical value with `df` degrees of freedom.
pub fn t_critical(df: f64, confidence: f64) -> f64 {
    if df.is_nan() || df <= 0.0 {
        return f64::INFINITY;
    }
    StudentsT::new(0.0, 1.0, df).map_or(f64::INFINITY, |t| {
        t.inverse_cdf(1.0 - (1.0 - confidence) / 2.0)
    })
}

/// Mean and sample standard deviation.
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// The t-interval for the mean of `xs`; `None` with fewer than two values.
pub fn mean_interval(xs: &[f64], confidence: f64) -> Option<(f64, f64)> {
    if xs.len() < 2 {
        return None;
    }
    let (m, sd) = mean_sd(xs);
    let half = t_critical(xs.len() as f64 - 1.0, confidence) * sd / (xs.len() as f64).sqrt();
    Some((m - half, m + half))
}

/// Least-squares slope of `ys` on `xs` with its `confidence` interval (t with n − 2 degrees of
/// freedom); `None` with fewer than three points or no spread in `xs`.
pub fn slope_interval(xs: &[f64], ys: &[f64], confidence: f64) -> Option<(f64, f64, f64)> {
    let n = xs.len().min(ys.len());
    if n < 3 {
        return None;
    }
    let (mx, _) = mean_sd(&xs[..n]);
    let (my, _) = mean_sd(&ys[..n]);
    let sxx: f64 = xs[..n].iter().map(|x| (x - mx).powi(2)).sum();
    if sxx.is_nan() || sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = (0..n).map(|i| (xs[i] - mx) * (ys[i] - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let sse: f64 = (0..n)
        .map(|i| (ys[i] - intercept - slope * xs[i]).powi(2))
        .sum();
    let se = (sse / (n as f64 - 2.0) / sxx).sqrt();
    let half = t_critical(n as f64 - 2.0, confidence) * se;
    Some((slope, slope - half, slope + half))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_floor_reproduces_mlperf_figures() {
        assert_eq!(p99_claim_floor(0), 459);
        assert_eq!(p99_claim_floor(1), 662);
        assert_eq!(p99_claim_floor(10), 2010);
    }

    /// P(B ≤ k) by direct summation in log space, for checking statrs and the normal branch.
    fn direct_cdf(n: u64, p: f64, k: u64) -> f64 {
        use statrs::function::gamma::ln_gamma;
        let ln_c = |j: u64| {
            ln_gamma(n as f64 + 1.0) - ln_gamma(j as f64 + 1.0) - ln_gamma((n - j) as f64 + 1.0)
        };
        (0..=k)
            .map(|j| (ln_c(j) + j as f64 * p.ln() + (n - j) as f64 * (1.0 - p).ln()).exp())
            .sum()
    }

    #[test]
    fn binomial_cdf_matches_direct_sum() {
        for &(n, k) in &[
            (500u64, 495u64),
            (5_000, 4_960),
            (49_000, 48_550),
            (60_000, 59_420),
            (200_000, 198_050),
        ] {
            let (a, b) = (binomial_cdf(n, 0.99, k), direct_cdf(n, 0.99, k));
            assert!((a - b).abs() < 0.01, "n={n} k={k}: {a} vs direct {b}");
        }
    }

    #[test]
    fn rank_interval_brackets_the_quantile_rank() {
        let r = quantile_rank_interval(1000, 0.99, 0.95);
        let (l, u) = (r.lo_rank.unwrap(), r.hi_rank.unwrap());
        assert!(l < 990 && u > 990 && u <= 1000, "{r:?}");
        let cover = binomial_cdf(1000, 0.99, u - 1) - binomial_cdf(1000, 0.99, l - 1);
        assert!(cover >= 0.95, "coverage {cover}");
        // Too few samples to bound the p99 from above.
        assert_eq!(quantile_rank_interval(50, 0.99, 0.95).hi_rank, None);
        assert_eq!(quantile_rank_interval(0, 0.99, 0.95).lo_rank, None);
    }

    #[test]
    fn wilson_interval_known_values() {
        // 90 of 100: Wilson 95% is [0.8256, 0.9448].
        let (lo, hi) = wilson_interval(90, 100, 0.95);
        assert!(
            (lo - 0.8256).abs() < 1e-3 && (hi - 0.9448).abs() < 1e-3,
            "{lo} {hi}"
        );
        assert_eq!(wilson_interval(0, 0, 0.95), (0.0, 1.0));
        let (lo, hi) = wilson_interval(100, 100, 0.95);
        assert!(lo > 0.96 && hi == 1.0);
    }

    #[test]
    fn t_interval_and_slope() {
        assert!((t_critical(4.0, 0.95) - 2.776).abs() < 1e-3);
        let (lo, hi) = mean_interval(&[1.0, 2.0, 3.0], 0.95).unwrap();
        assert!(
            (lo - (2.0 - 4.303 / 3f64.sqrt())).abs() < 1e-3
                && (hi - (2.0 + 4.303 / 3f64.sqrt())).abs() < 1e-3
        );
        let xs: Vec<f64> = (0..10).map(f64::from).collect();
        let ys: Vec<f64> = xs.iter().map(|x| 3.0 * x + 1.0).collect();
        let (s, lo, hi) = slope_interval(&xs, &ys, 0.95).unwrap();
        assert!((s - 3.0).abs() < 1e-9 && (hi - lo) < 1e-6);
    }
}
