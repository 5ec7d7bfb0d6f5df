//! The AUC of a threshold classifier that calls a probe a hit when its TTFT is below a threshold,
//! with a Hanley–McNeil interval.
//!
//! Direction: we report the *directed* AUC, P(miss TTFT > hit TTFT) with ties counted half, not
//! max(AUC, 1 − AUC). The direction is known before looking at the data — a prefix hit skips
//! prefill, so it can only make TTFT shorter — and an attacker needs no data to pick it. Taking the
//! max would bias the estimate above 0.5 when nothing leaks (identical samples would read as a
//! small leak, and the interval could not contain 0.5 from below). A value below 0.5 therefore
//! means hits were *slower*, which is itself worth seeing rather than folding away.
//!
//! Interval: the hull of Hanley & McNeil's (1982) A ± z·SE and a Wilson score interval for A as
//! a proportion of the smaller class's count, clipped to [0, 1]. Both are closed-form and
//! deterministic, so the same probes always give the same interval and no seed is involved.
//! Hanley–McNeil alone collapses to a point where every pair is ordered (AUC 0 or 1): three
//! hits and three misses all ordered would read as [1, 1], although one such ordering in twenty
//! arises by chance. The Wilson interval is the score interval of a proportion whose variance is
//! at most a(1 − a) over the smaller count (the Birnbaum–Klose bound on an AUC's variance); it
//! never collapses, and shrinks with the sample as an honest interval must.

use statrs::distribution::{ContinuousCDF, Normal};

/// What a probe sample says about the channel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AucEstimate {
    /// P(miss TTFT > hit TTFT) + ½·P(tie).
    pub auc: f64,
    /// Two-sided interval at `confidence`, clipped to [0, 1].
    pub ci: (f64, f64),
    /// Hanley–McNeil standard error of `auc`.
    pub std_error: f64,
}

/// Why an AUC could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AucError {
    #[error("AUC needs at least one hit and one miss probe (got {hits} hits, {misses} misses)")]
    EmptyClass { hits: usize, misses: usize },
    #[error("TTFT sample contains a non-finite value ({0})")]
    NonFinite(f64),
    #[error("confidence must lie strictly between 0 and 1 (got {0})")]
    BadConfidence(f64),
}

/// The directed Mann–Whitney AUC: the share of (hit, miss) pairs in which the hit was faster,
/// ties counted half. O((h + m) log m).
pub fn directed_auc(hit_ttft_ms: &[f64], miss_ttft_ms: &[f64]) -> Result<f64, AucError> {
    if hit_ttft_ms.is_empty() || miss_ttft_ms.is_empty() {
        return Err(AucError::EmptyClass {
            hits: hit_ttft_ms.len(),
            misses: miss_ttft_ms.len(),
        });
    }
    if let Some(&bad) = hit_ttft_ms
        .iter()
        .chain(miss_ttft_ms)
        .find(|v| !v.is_finite())
    {
        return Err(AucError::NonFinite(bad));
    }
    let mut misses = miss_ttft_ms.to_vec();
    misses.sort_by(f64::total_cmp);
    let m = misses.len();
    // Twice the Mann–Whitney U, so ties add 1 instead of 0.5 and the sum stays integral.
    let mut twice_u: u128 = 0;
    for &h in hit_ttft_ms {
        let at_or_below = misses.partition_point(|&x| x <= h);
        let below = misses.partition_point(|&x| x < h);
        let greater = m - at_or_below;
        let ties = at_or_below - below;
        twice_u = twice_u.saturating_add(2 * greater as u128 + ties as u128);
    }
    let pairs = hit_ttft_ms.len() as f64 * m as f64;
    Ok(twice_u as f64 / 2.0 / pairs)
}

/// Hanley–McNeil standard error of an AUC `a` from `n_hits` and `n_misses` samples.
pub fn hanley_mcneil_se(a: f64, n_hits: usize, n_misses: usize) -> f64 {
    let q1 = a / (2.0 - a);
    let q2 = 2.0 * a * a / (1.0 + a);
    let n1 = n_hits as f64;
    let n2 = n_misses as f64;
    let var = (a * (1.0 - a) + (n1 - 1.0) * (q1 - a * a) + (n2 - 1.0) * (q2 - a * a)) / (n1 * n2);
    var.max(0.0).sqrt()
}

/// The directed AUC with its Hanley–McNeil interval at `confidence` (e.g. 0.95).
pub fn estimate(
    hit_ttft_ms: &[f64],
    miss_ttft_ms: &[f64],
    confidence: f64,
) -> Result<AucEstimate, AucError> {
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(AucError::BadConfidence(confidence));
    }
    let auc = directed_auc(hit_ttft_ms, miss_ttft_ms)?;
    let se = hanley_mcneil_se(auc, hit_ttft_ms.len(), miss_ttft_ms.len());
    let z = Normal::standard().inverse_cdf(0.5 + confidence / 2.0);
    let n = hit_ttft_ms.len().min(miss_ttft_ms.len());
    let (w_lo, w_hi) = wilson(auc, n, z);
    Ok(AucEstimate {
        auc,
        ci: (
            (auc - z * se).min(w_lo).max(0.0),
            (auc + z * se).max(w_hi).min(1.0),
        ),
        std_error: se,
    })
}

/// The Wilson score interval of a proportion `p` observed over `n` trials, at normal quantile
/// `z`: never a point, even at `p` = 0 or 1.
pub fn wilson(p: f64, n: usize, z: f64) -> (f64, f64) {
    let n = n.max(1) as f64;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).max(0.0).sqrt();
    (centre - half, centre + half)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use rand_distr::{Distribution, Normal as RNormal};

    fn normals(seed: u64, mean: f64, n: usize) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let d = RNormal::new(mean, 1.0).expect("unit normal");
        (0..n).map(|_| d.sample(&mut rng)).collect()
    }

    /// A 95% interval misses 0.5 on about one seed in twenty even with nothing to find, so this
    /// checks coverage over many seeds rather than demanding it of each.
    #[test]
    fn identical_distributions_read_as_no_leak() {
        let seeds = 1u64..=40;
        let mut covered = 0usize;
        for seed in seeds.clone() {
            let hits = normals(seed, 10.0, 400);
            let misses = normals(seed + 1000, 10.0, 400);
            let e = estimate(&hits, &misses, 0.95).expect("estimate");
            println!("seed {seed}: auc {:.4} ci {:?}", e.auc, e.ci);
            assert!((e.auc - 0.5).abs() < 0.08, "seed {seed}: auc {}", e.auc);
            if e.ci.0 <= 0.5 && 0.5 <= e.ci.1 {
                covered += 1;
            }
        }
        // Expected 38 of 40; 34 or fewer happens about 1.4% of the time for a correct 95% interval.
        assert!(covered >= 35, "0.5 inside only {covered} of 40 intervals");
    }

    #[test]
    fn fully_separated_is_one_and_reversed_is_zero() {
        let hits: Vec<f64> = (0..50).map(|i| i as f64).collect();
        let misses: Vec<f64> = (0..60).map(|i| 100.0 + i as f64).collect();
        let e = estimate(&hits, &misses, 0.95).expect("estimate");
        assert_eq!(e.auc, 1.0);
        // 50 hits all faster than 60 misses: the Wilson bound at the smaller count, 50.
        let z2 = 1.959_963_984_540_054f64.powi(2);
        assert!((e.ci.0 - 50.0 / (50.0 + z2)).abs() < 1e-9, "{e:?}");
        assert_eq!(e.ci.1, 1.0);
        assert_eq!(directed_auc(&misses, &hits).expect("auc"), 0.0);
    }

    /// Three hits and three misses all ordered: one labelling in twenty orders them so by chance,
    /// so the interval must reach well below 1 (it read [1, 1]); it narrows as probes grow.
    #[test]
    fn a_perfect_separation_of_few_probes_is_not_a_certainty() {
        let e = estimate(&[1.0, 2.0, 3.0], &[10.0, 11.0, 12.0], 0.95).expect("estimate");
        assert_eq!(e.auc, 1.0);
        assert!(e.ci.0 < 0.5 && e.ci.1 == 1.0, "{e:?}");
        let hits: Vec<f64> = (0..100).map(f64::from).collect();
        let misses: Vec<f64> = (0..100).map(|i| 1000.0 + f64::from(i)).collect();
        let big = estimate(&hits, &misses, 0.95).expect("estimate");
        assert!(big.ci.0 > 0.95 && big.ci.0 < 1.0, "{big:?}");
    }

    #[test]
    fn ties_count_half() {
        assert_eq!(directed_auc(&[5.0, 5.0], &[5.0]).expect("auc"), 0.5);
        // Pairs (1,1) tie, (1,2) ordered, (3,1) reversed, (3,2) reversed: (0.5 + 1) / 4.
        assert_eq!(directed_auc(&[1.0, 3.0], &[1.0, 2.0]).expect("auc"), 0.375);
    }

    #[test]
    fn known_d_prime_matches_closed_form() {
        let std_normal = Normal::standard();
        for (seed, d_prime) in [(11u64, 0.5), (12, 1.0), (13, 2.0)] {
            println!("seed {seed} d' {d_prime}");
            let hits = normals(seed, 0.0, 600);
            let misses = normals(seed + 1000, d_prime, 600);
            let expected = std_normal.cdf(d_prime / std::f64::consts::SQRT_2);
            let e = estimate(&hits, &misses, 0.95).expect("estimate");
            assert!(
                e.ci.0 <= expected && expected <= e.ci.1,
                "seed {seed}: expected {expected} outside {e:?}"
            );
            assert!(e.ci.1 - e.ci.0 < 0.1, "interval too wide: {e:?}");
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(
            estimate(&[], &[1.0], 0.95),
            Err(AucError::EmptyClass { hits: 0, misses: 1 })
        ));
        assert!(matches!(
            estimate(&[f64::NAN], &[1.0], 0.95),
            Err(AucError::NonFinite(_))
        ));
        assert!(matches!(
            estimate(&[1.0], &[1.0], 1.0),
            Err(AucError::BadConfidence(_))
        ));
    }
}
