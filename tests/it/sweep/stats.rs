//! The sweep's statistics against known distributions: the p99 interval's coverage (simulated,
//! seeded: `KVBENCH_SEED` replays), Wilson coverage, and MLPerf's sample floor as the probe's
//! verdict applies it.

use kvbench::metrics::hist::LatencyHist;
use kvbench::stats;
use kvbench::sweep::verdict::{check_attainment, check_p99, Verdict};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn seed() -> u64 {
    let s = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_201);
    println!("seed {s} (KVBENCH_SEED={s} replays)");
    s
}

/// Exponential latencies with mean 10 ms: the true p99 is 10·ln(100) ms. The 95% interval from
/// binomial order statistics, read through the LatencyHist the probes use, must cover it in at
/// least ~95% of trials (it is conservative: the binomial is discrete).
#[test]
fn p99_interval_covers_the_true_quantile() {
    let mut rng = ChaCha20Rng::seed_from_u64(seed());
    let true_p99_ms = 10.0 * 100f64.ln();
    let (trials, n) = (1500, 1000);
    let mut covered = 0;
    for _ in 0..trials {
        let ns: Vec<u64> = (0..n)
            .map(|_| {
                let u: f64 = rng.gen();
                (-10.0 * (1.0 - u).ln() * 1e6) as u64
            })
            .collect();
        let c = check_p99(&LatencyHist::of_ns(&ns), true_p99_ms);
        let (lo, hi) = (c.ci_ms[0].unwrap(), c.ci_ms[1].unwrap());
        if lo <= true_p99_ms && true_p99_ms <= hi {
            covered += 1;
        }
    }
    let coverage = covered as f64 / trials as f64;
    println!("coverage {coverage:.4} over {trials} trials of {n}");
    // Nominal ≥ 0.95; three binomial standard errors (0.017) of slack below it.
    assert!(coverage >= 0.933, "coverage {coverage}");
    assert!(coverage <= 0.995, "implausibly wide: {coverage}");
}

#[test]
fn wilson_interval_covers_the_true_share() {
    let mut rng = ChaCha20Rng::seed_from_u64(seed() ^ 1);
    let (trials, n, p) = (2000, 400u64, 0.9);
    let mut covered = 0;
    for _ in 0..trials {
        let k = (0..n).filter(|_| rng.gen::<f64>() < p).count() as u64;
        let (lo, hi) = stats::wilson_interval(k, n, 0.95);
        if lo <= p && p <= hi {
            covered += 1;
        }
    }
    let coverage = covered as f64 / trials as f64;
    println!("Wilson coverage {coverage:.4}");
    assert!(coverage >= 0.925, "coverage {coverage}");
}

/// A sample whose values are all within the target still cannot claim the p99 until it reaches
/// MLPerf's floor: 459 samples with no violation, 662 with one.
#[test]
fn p99_pass_needs_the_mlperf_floor() {
    let hist = |n: u64, violations: u64| {
        let mut h = LatencyHist::new();
        for i in 0..n {
            h.record_ns(if i < violations { 5_000_000 } else { 1_000_000 });
        }
        h
    };
    assert_eq!(check_p99(&hist(458, 0), 2.0).verdict, Verdict::Unresolved);
    assert_eq!(check_p99(&hist(459, 0), 2.0).verdict, Verdict::Pass);
    assert_eq!(check_p99(&hist(661, 1), 2.0).verdict, Verdict::Unresolved);
    let c = check_p99(&hist(662, 1), 2.0);
    assert_eq!((c.verdict, c.over_target, c.floor), (Verdict::Pass, 1, 662));
    // Far too many violations: a resolved failure.
    assert_eq!(check_p99(&hist(1000, 100), 2.0).verdict, Verdict::Fail);
    // Few samples, nothing bounds the p99 from above: unresolved, not pass.
    assert_eq!(check_p99(&hist(50, 0), 2.0).verdict, Verdict::Unresolved);
}

#[test]
fn attainment_verdict_is_resolved_only_off_the_target() {
    assert_eq!(check_attainment(990, 1000, 0.9).verdict, Verdict::Pass);
    assert_eq!(check_attainment(700, 1000, 0.9).verdict, Verdict::Fail);
    assert_eq!(check_attainment(9, 10, 0.9).verdict, Verdict::Unresolved);
}
