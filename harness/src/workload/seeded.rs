//! What every generator of the workload shares, below them all: a seeded ChaCha20 stream per
//! aspect of a request, and the latest time any draw may produce. `generate.rs` (the request
//! list), `sample.rs` (the distributions) and `sessions.rs` (multi-turn sessions) all read it,
//! and it reads none of them.

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// Latest arrival the generator produces, in ms: ten times the load-time horizon (whose check
/// uses the mean gap), 1e18 ns, so the engine's `u64` nanosecond clock keeps an 18x margin.
/// Every generated time (arrival, delay) is at most this; an arrival past it is refused.
pub const MAX_TIME_MS: f64 = crate::scenario::ranges::MAX_HORIZON_S * 1000.0 * 10.0;

/// The ChaCha20 stream `stream` of `seed`: each aspect draws from its own, so changing one knob
/// leaves the others' draws as they were.
pub(super) fn rng(seed: u64, stream: u64) -> ChaCha20Rng {
    let mut r = ChaCha20Rng::seed_from_u64(seed);
    r.set_stream(stream);
    r
}
