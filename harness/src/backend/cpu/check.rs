//! The oracle check: each checked sequence's logits at every sampled step against the f64
//! oracle's over the same token history, recomputed from scratch with no cache.
//!
//! Histories are checked when the sequence is forgotten (its history is final then), outside
//! the timed compute. A sequence still live at the end is checked by [`Checker::report`].

use kvbench_cache_api::SeqId;
use kvbench_oracle::rel_err;

use crate::backend::NumericsReport;

/// f32 KV: ‖out − ref‖/‖ref‖ ≤ 1e-4. Observed errors are ~1e-6 (f32 accumulation over a few
/// hundred terms); a wrong block, a missed copy-on-write or a stale slot moves logits by O(1).
pub const F32_TOLERANCE: f64 = 1e-4;
/// bf16 KV: every stored K/V element is rounded to 8 significant bits (≤ 2^-9 relative); the
/// logits observed move by ~1e-3, so 1e-2 keeps a margin while still catching any real fault.
pub const BF16_TOLERANCE: f64 = 1e-2;

/// Every sequence among the first this many registered is checked; later ones are sampled.
pub const CHECK_ALL_FIRST: u64 = 256;
/// Beyond that, one sequence in this many (by a hash of its id) is checked, plus every fork of a
/// checked sequence.
pub const SAMPLE_ONE_IN: u64 = 8;

/// Whether `seq`, the `nth` registered, is checked.
pub fn sampled(seq: SeqId, nth: u64) -> bool {
    if nth < CHECK_ALL_FIRST {
        return true;
    }
    // splitmix64 finaliser: a fixed, well-mixed choice independent of arrival order.
    let mut z = seq.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).is_multiple_of(SAMPLE_ONE_IN)
}

pub use crate::backend::seq_history::Record;

pub struct Checker {
    oracle: kvbench_oracle::Model,
    tolerance: f64,
    checked_steps: u64,
    max_rel_err: f64,
    ok: bool,
    /// The first failure, for the error message.
    first_failure: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct Outcome {
    steps: u64,
    /// Largest error seen (∞ for a NaN output).
    max_err: f64,
    failure: Option<String>,
}

impl Checker {
    pub fn new(oracle: kvbench_oracle::Model, tolerance: f64) -> Checker {
        Checker {
            oracle,
            tolerance,
            checked_steps: 0,
            max_rel_err: 0.0,
            ok: true,
            first_failure: None,
        }
    }

    fn evaluate(&self, history: &[u32], records: &[Record]) -> Outcome {
        let mut out = Outcome::default();
        if records.is_empty() {
            return out;
        }
        let positions: Vec<usize> = records.iter().map(|r| r.pos).collect();
        let reference = match self.oracle.logits_at(history, &positions) {
            Ok(r) => r,
            Err(e) => {
                out.max_err = f64::INFINITY;
                out.failure = Some(format!("oracle refused the history: {e}"));
                return out;
            }
        };
        for (r, reference) in records.iter().zip(&reference) {
            let err = rel_err(&r.logits, reference);
            out.steps += 1;
            out.max_err = out
                .max_err
                .max(if err.is_nan() { f64::INFINITY } else { err });
            // A NaN error (poisoned output) is not within tolerance.
            let within = err.is_finite() && err <= self.tolerance;
            if !within && out.failure.is_none() {
                out.failure = Some(format!(
                    "position {}: rel err {err:.3e} > {:.0e}",
                    r.pos, self.tolerance
                ));
            }
        }
        out
    }

    /// Checks one finished history.
    pub fn check(&mut self, seq: SeqId, history: &[u32], records: &[Record]) {
        let o = self.evaluate(history, records);
        self.checked_steps += o.steps;
        self.max_rel_err = self.max_rel_err.max(o.max_err);
        if let Some(msg) = o.failure {
            self.ok = false;
            self.first_failure
                .get_or_insert(format!("sequence {seq}: {msg}"));
        }
    }

    /// The running totals plus sequences still live (checked now, without changing state).
    pub fn report<'a>(
        &self,
        live: impl Iterator<Item = (&'a [u32], &'a [Record])>,
    ) -> NumericsReport {
        let mut rep = NumericsReport {
            checked_steps: self.checked_steps,
            max_rel_err: self.max_rel_err,
            tolerance: self.tolerance,
            ok: self.ok,
        };
        for (h, r) in live {
            let o = self.evaluate(h, r);
            rep.checked_steps += o.steps;
            rep.max_rel_err = rep.max_rel_err.max(o.max_err);
            rep.ok &= o.failure.is_none();
        }
        rep
    }

    /// The first failure seen by [`check`](Self::check), for error messages.
    pub fn first_failure(&self) -> Option<&str> {
        self.first_failure.as_deref()
    }
}
