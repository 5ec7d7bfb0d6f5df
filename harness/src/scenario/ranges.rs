//! The physical ranges a scenario's numbers must lie in. A value outside is refused at load
//! (`FILE:LINE:COL: KEY`), never turned into a plausible-looking figure: the virtual clock is
//! integer nanoseconds in a `u64` (about 584 years), so a 1e14 ms delay or a 1e-9/s rate would
//! wrap or saturate it, and a 2^31-layer model would overflow the bytes per token.
//!
//! `docs/scenarios.md` lists these; keep the two in step.

/// Longest stretch of virtual time a workload may span (arrivals, think times): about 3.2 years,
/// 1e17 ns, leaving the `u64` clock a 180x margin for service time and timers on top.
pub const MAX_HORIZON_S: f64 = 1e8;
/// Longest single delay (think time, cancellation delay, SLO target): about 11.6 days.
pub const MAX_DELAY_MS: f64 = 1e9;
/// Open-loop rates: one request per ~11.6 days up to one per nanosecond.
pub const RATE_PER_S: (f64, f64) = (1e-6, 1e9);
/// Gamma shape: coefficient of variation 1/sqrt(shape) from 10 down to 0.1.
pub const GAMMA_SHAPE: (f64, f64) = (0.01, 100.0);
/// Trace time scale.
pub const TIME_SCALE: (f64, f64) = (1e-6, 1e6);
/// Swap bandwidth in GB/s: a slow disk to far beyond any host link.
pub const SWAP_GBYTES_PER_S: (f64, f64) = (1e-3, 1e5);
/// A disk tier's read and write bandwidth in bytes per second: a slow disk (1 MB/s) to far
/// beyond any (100 TB/s), as the device profile's links.
pub const DISK_BYTES_PER_S: (f64, f64) = (1e6, 1e14);
/// A disk tier's latency per step with disk traffic, in microseconds: at most a second.
pub const DISK_LATENCY_US: (f64, f64) = (0.0, 1e6);
/// Requests in one workload (given or expected from rate x duration).
pub const MAX_REQUESTS: u64 = 5_000_000;
/// Tokens in one sequence (prompt + output): above every published context window.
pub const MAX_SEQ_LEN: u32 = 1 << 24;
/// Tokens per block.
pub const MAX_BLOCK_SIZE: u32 = 1 << 16;
/// Continuations of one prompt.
pub const MAX_SAMPLES: u32 = 4096;
/// Streams (requests x continuations) in one run: stream ids are 32-bit.
pub const MAX_STREAMS: u64 = 1 << 31;
/// Log-space spread of a lognormal length; beyond it every draw is a clamp.
pub const MAX_SIGMA: f64 = 100.0;
/// Zipf exponent.
pub const MAX_ZIPF_S: f64 = 100.0;
/// Model dimensions, each `(key, most)`: well above any published dense decoder.
pub const MODEL_MAX: &[(&str, u32)] = &[
    ("layers", 4096),
    ("q_heads", 4096),
    ("kv_heads", 4096),
    ("head_dim", 4096),
    ("d_model", 1 << 20),
    ("ffn_dim", 1 << 22),
    ("vocab", 1 << 24),
    ("tp", 4096),
];
/// Mixture-of-experts dimensions, each `(key, least, most)`: routed experts per layer (1 is a
/// dense MLP written the long way; DeepSeek-V3 has 256, the most published is in the low
/// thousands), experts per token, each expert's MLP width, always-on shared experts.
/// `active_experts` must also be at most `experts` (checked beside these).
pub const MOE_RANGE: &[(&str, u32, u32)] = &[
    ("experts", 1, 1 << 16),
    ("active_experts", 1, 1 << 16),
    ("expert_ffn_dim", 1, 1 << 22),
    ("shared_experts", 0, 1 << 16),
];

/// Whether `v` is a finite number in `[lo, hi]`.
pub fn within(v: f64, (lo, hi): (f64, f64)) -> bool {
    v.is_finite() && v >= lo && v <= hi
}

/// "must be in [1e-6, 1e9] (got 1e-320)".
pub fn range_message((lo, hi): (f64, f64), v: f64) -> String {
    format!("must be in [{lo:e}, {hi:e}] (got {v:e})")
}

/// A scenario name is used as a folder name: letters, digits, `-`, `_`, `.`; not `.` or `..`.
pub fn safe_slug(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        for ok in ["quick-basic", "a.b_c-1", "x..y"] {
            assert!(safe_slug(ok), "{ok}");
        }
        for bad in ["", ".", "..", "../x", "/abs", "a b", "a/b", "é"] {
            assert!(!safe_slug(bad), "{bad}");
        }
    }

    #[test]
    fn ranges_refuse_subnormals_and_nan() {
        assert!(!within(1e-320, RATE_PER_S));
        assert!(!within(f64::NAN, RATE_PER_S));
        assert!(within(1.0, RATE_PER_S));
    }
}
