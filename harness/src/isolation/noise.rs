//! The attacker's measurement noise: a seeded Gaussian jitter added to each probe's TTFT before
//! the AUC is taken. The engine's TTFT on `sim` is exact; a real prober measures it through a
//! network, a client and a clock, so how fast the AUC falls towards 0.5 as the jitter grows says
//! how much noise it takes to hide a hit.
//!
//! Common random numbers: one standard-normal draw per probe *ordinal* (the k-th probe of a run),
//! scaled by the noise level. Every scope, load and noise level therefore sees the same draws, so
//! a difference between grid cells is the cache's doing or the scale's, never a different draw.
//! The jitter rides on a network floor: the prober observes `ttft + σ·(FLOOR_SIGMAS + z)`, `z`
//! clamped to ±[`FLOOR_SIGMAS`] (a clamp that touches one draw in 500 million), so an observed
//! time is never below the engine's and never negative. The floor is the same for every probe,
//! so the AUC, which only compares observed times, is the Gaussian jitter's; clamping at zero
//! instead would turn large noise into ties, which the AUC counts half.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// Mixed into the probe seed so the noise stream is independent of the prompts' token stream.
const NOISE_STREAM: u64 = 0x6e6f_6973_655f_6d73; // "noise_ms"

/// `n` standard-normal draws for probe ordinals 0..n, fixed by `seed`.
pub fn unit_draws(seed: u64, n: usize) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ NOISE_STREAM);
    (0..n).map(|_| StandardNormal.sample(&mut rng)).collect()
}

/// Standard deviations of the network floor the jitter rides on.
pub const FLOOR_SIGMAS: f64 = 6.0;

/// The most jitter `--noise-ms` takes: a minute's standard deviation hides any TTFT gap already,
/// and a bound keeps every observed time a finite number.
pub const MAX_NOISE_MS: f64 = 60_000.0;

/// The TTFT the prober observes: `ttft_ms + noise_ms × (FLOOR_SIGMAS + draw)`, the draw clamped
/// to ±`FLOOR_SIGMAS` (`noise_ms` is the jitter's standard deviation): at least `ttft_ms`.
pub fn observed_ms(ttft_ms: f64, noise_ms: f64, draw: f64) -> f64 {
    ttft_ms + noise_ms * (FLOOR_SIGMAS + draw.clamp(-FLOOR_SIGMAS, FLOOR_SIGMAS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::auc;
    use statrs::distribution::{ContinuousCDF, Normal};

    /// Point masses `delta_ms` apart, each blurred by independent N(0, σ²) jitter, are two
    /// normals with d' = delta / σ, so the AUC must be Φ(delta / (σ√2)): the jitter really is
    /// Gaussian with the stated standard deviation.
    #[test]
    fn jitter_on_point_masses_gives_the_closed_form_auc() {
        let delta_ms = 10.0;
        for (seed, noise_ms) in [(21u64, 5.0), (22, 10.0), (23, 20.0), (24, 80.0)] {
            println!("seed {seed} noise {noise_ms} ms");
            let draws = unit_draws(seed, 1200);
            let hits: Vec<f64> = draws[..600]
                .iter()
                .map(|&z| observed_ms(100.0, noise_ms, z))
                .collect();
            let misses: Vec<f64> = draws[600..]
                .iter()
                .map(|&z| observed_ms(100.0 + delta_ms, noise_ms, z))
                .collect();
            let expected = Normal::standard().cdf(delta_ms / (noise_ms * std::f64::consts::SQRT_2));
            let e = auc::estimate(&hits, &misses, 0.95).expect("estimate");
            assert!(
                e.ci.0 <= expected && expected <= e.ci.1,
                "seed {seed}: expected {expected} outside {e:?}"
            );
        }
    }

    #[test]
    fn draws_replay_from_the_seed_and_differ_across_seeds() {
        assert_eq!(unit_draws(5, 50), unit_draws(5, 50));
        assert_ne!(unit_draws(5, 50), unit_draws(6, 50));
        // The first draws of a longer run are the shorter run's: a probe's draw is its ordinal's.
        assert_eq!(unit_draws(5, 80)[..50], unit_draws(5, 50)[..]);
        assert_eq!(observed_ms(12.0, 0.0, 3.0), 12.0);
    }

    /// Noise of 5 ms on TTFTs of a few ms made a third of the observed times negative.
    #[test]
    fn an_observed_time_is_never_below_the_engines() {
        let seed = 40;
        println!("seed {seed}");
        for z in unit_draws(seed, 10_000).into_iter().chain([-1e9, 1e9]) {
            let o = observed_ms(2.0, 5.0, z);
            assert!((2.0..=2.0 + 12.0 * 5.0).contains(&o), "draw {z}: {o}");
        }
    }
}
