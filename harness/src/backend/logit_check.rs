//! The comparison both computing backends' oracle checks share: a checked sequence's kept
//! logits against a reference's over the same token history, and the running totals that
//! become the run's [`NumericsReport`]. What the reference is differs per backend (`cpu`: the
//! f64 oracle; `cuda`: the oracle or the CPU f32 model), so it comes in through [`Reference`];
//! the oracle crate itself shares nothing with the backends beyond plain data.

use kvbench_cache_api::SeqId;
use kvbench_oracle::rel_err;

use super::seq_history::{Record, SeqState};
use super::NumericsReport;

/// Whatever recomputes a history's logits from scratch for the check.
pub trait Reference {
    /// How a refusal is named in the failure message ("oracle refused the history: …").
    const NAME: &'static str;

    /// Logits after each of `positions` (ascending) of `history`.
    fn logits_at(&self, history: &[u32], positions: &[usize]) -> Result<Vec<Vec<f64>>, String>;
}

impl Reference for kvbench_oracle::Model {
    const NAME: &'static str = "oracle";

    fn logits_at(&self, history: &[u32], positions: &[usize]) -> Result<Vec<Vec<f64>>, String> {
        kvbench_oracle::Model::logits_at(self, history, positions).map_err(|e| e.to_string())
    }
}

pub struct Checker<R> {
    reference: R,
    tolerance: f64,
    checked_steps: u64,
    max_rel_err: f64,
    ok: bool,
    /// The first failure, for the error message.
    first_failure: Option<String>,
    /// The first failure has been said on stderr.
    reported: bool,
}

#[derive(Debug, Clone, Default)]
struct Outcome {
    steps: u64,
    /// Largest error seen (∞ for a NaN output).
    max_err: f64,
    failure: Option<String>,
}

impl<R: Reference> Checker<R> {
    pub fn new(reference: R, tolerance: f64) -> Checker<R> {
        Checker {
            reference,
            tolerance,
            checked_steps: 0,
            max_rel_err: 0.0,
            ok: true,
            first_failure: None,
            reported: false,
        }
    }

    fn evaluate(&self, history: &[u32], records: &[Record]) -> Outcome {
        let mut out = Outcome::default();
        if records.is_empty() {
            return out;
        }
        let mut recs: Vec<&Record> = records.iter().collect();
        recs.sort_by_key(|r| r.pos);
        let positions: Vec<usize> = recs.iter().map(|r| r.pos).collect();
        let reference = match self.reference.logits_at(history, &positions) {
            Ok(r) => r,
            Err(e) => {
                out.max_err = f64::INFINITY;
                out.failure = Some(format!("{} refused the history: {e}", R::NAME));
                return out;
            }
        };
        for (r, want) in recs.iter().zip(&reference) {
            let err = rel_err(&r.logits, want);
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

    /// Checks a forgotten sequence if it is checked and, the first time the run has a failure,
    /// says so on stderr (`{backend} backend: oracle mismatch: …`).
    pub fn check_forgotten(&mut self, backend: &str, seq: SeqId, st: &SeqState) {
        if !st.checked {
            return;
        }
        self.check(seq, &st.history, &st.records);
        if let (Some(msg), false) = (self.first_failure.as_deref(), self.reported) {
            eprintln!("{backend} backend: oracle mismatch: {msg}");
            self.reported = true;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits `[p, 1]` after position `p`; refuses a history longer than `max_len`.
    struct Fake {
        max_len: usize,
    }

    impl Reference for Fake {
        const NAME: &'static str = "fake";

        fn logits_at(&self, history: &[u32], positions: &[usize]) -> Result<Vec<Vec<f64>>, String> {
            if history.len() > self.max_len {
                return Err("too long".into());
            }
            Ok(positions.iter().map(|&p| vec![p as f64, 1.0]).collect())
        }
    }

    fn rec(pos: usize, first: f32) -> Record {
        Record {
            pos,
            logits: vec![first, 1.0],
        }
    }

    #[test]
    fn records_are_compared_in_position_order_and_failures_name_the_reference() {
        let mut c = Checker::new(Fake { max_len: 4 }, 1e-4);
        // Out of order: each record must still meet its own position's reference.
        c.check(1, &[0; 4], &[rec(3, 3.0), rec(1, 1.0)]);
        assert!(c.first_failure().is_none());
        c.check(2, &[0; 4], &[rec(2, 9.0)]);
        c.check(3, &[0; 5], &[rec(1, 1.0)]);
        let msg = c.first_failure().expect("failure");
        assert!(msg.starts_with("sequence 2: position 2: rel err"), "{msg}");
        let rep = c.report([(&[0u32; 5][..], &[rec(1, 1.0)][..])].into_iter());
        assert_eq!(rep.checked_steps, 3, "a refused history counts no steps");
        assert!(rep.max_rel_err.is_infinite() && !rep.ok);
        let mut d = Checker::new(Fake { max_len: 0 }, 1e-4);
        d.check(7, &[0], &[rec(0, 0.0)]);
        assert_eq!(
            d.first_failure(),
            Some("sequence 7: fake refused the history: too long")
        );
    }
}
