//! Scheduling policies: what one step runs, given the operations the engine offers. Each policy
//! is a separate piece with its own tests (against a recording fake of [`StepOps`]).
//!
//! Policies decide order and shape; they never touch the cache. Memory feasibility is the
//! admission controller's job, reached through [`StepOps::admit`]; preemption when a running
//! sequence cannot grow happens inside [`StepOps::schedule_decodes`]: the victim is the
//! newest-admitted running sequence (as in vLLM), recomputed or swapped per the scenario; the
//! grower retries once and otherwise waits a step (a release may be fenced on an in-flight step).
//!
//! [`max_step_tokens`] is the one bound on the tokens a step can hold, and the only step bound a
//! backend's `RunSetup` carries: no backend sizes anything per step by the chunk budget alone,
//! since `prefill_first` runs a prompt whole.

mod decode_first;
mod prefill_first;
pub mod queue;

pub use decode_first::DecodeFirst;
pub use prefill_first::PrefillFirst;

use crate::scenario::PolicyName;

/// The operations a step is built from. Each returns what it scheduled.
pub trait StepOps {
    /// Schedule one decode for every running sequence, in admission order, while the token and
    /// sequence budgets last. Returns sequences scheduled.
    fn schedule_decodes(&mut self) -> u32;
    /// Continue prefills already admitted. `chunked`: cut to the remaining token budget;
    /// otherwise a prompt runs whole or not at all (alone, if it exceeds the budget).
    /// Returns prompt tokens scheduled.
    fn schedule_prefills(&mut self, chunked: bool) -> u32;
    /// Bring swapped sequences back while admission allows. Returns sequences swapped in.
    fn swap_in(&mut self) -> u32;
    /// Admit the next waiting sequence if admission allows and budget remains, scheduling its
    /// first prefill chunk. False when nothing was admitted.
    fn admit(&mut self, chunked: bool) -> bool;
    /// Sequences waiting or prefilling (prefill-first serves these before decodes).
    fn has_prefill_work(&self) -> bool;
    /// A preemption happened while building this step (then no new admissions, as in vLLM).
    fn preempted(&self) -> bool;
}

pub trait Policy: Send {
    fn name(&self) -> &'static str;
    fn build(&mut self, ops: &mut dyn StepOps);
}

pub fn create(name: PolicyName) -> Box<dyn Policy> {
    match name {
        PolicyName::DecodeFirst => Box::new(DecodeFirst),
        PolicyName::PrefillFirst => Box::new(PrefillFirst),
    }
}

/// The most tokens one step of policy `name` can hold, which every backend's per-step workspace
/// is sized for (`cuda` allocates it, `cpu` and `sim` count it in the ledger): the chunk budget, except that `prefill_first` runs a
/// prompt whole — alone when it exceeds the budget — so its steps reach `max_seq_len` (a
/// recompute re-prefills prompt and generated tokens, at most that).
pub fn max_step_tokens(name: PolicyName, budget_tokens: u32, max_seq_len: u32) -> u32 {
    match name {
        PolicyName::DecodeFirst => budget_tokens,
        PolicyName::PrefillFirst => budget_tokens.max(max_seq_len),
    }
}

/// A recording fake shared by the policy tests.
#[cfg(test)]
pub(crate) mod fake {
    use super::StepOps;

    #[derive(Default)]
    pub struct Fake {
        pub calls: Vec<String>,
        pub decodes: u32,
        pub prefill_tokens: u32,
        pub admissible: u32,
        pub prefill_work: bool,
        pub preempts: bool,
    }

    impl StepOps for Fake {
        fn schedule_decodes(&mut self) -> u32 {
            self.calls.push("decodes".into());
            self.decodes
        }
        fn schedule_prefills(&mut self, chunked: bool) -> u32 {
            self.calls.push(format!("prefills(chunked={chunked})"));
            self.prefill_tokens
        }
        fn swap_in(&mut self) -> u32 {
            self.calls.push("swap_in".into());
            0
        }
        fn admit(&mut self, chunked: bool) -> bool {
            self.calls.push(format!("admit(chunked={chunked})"));
            if self.admissible > 0 {
                self.admissible -= 1;
                true
            } else {
                false
            }
        }
        fn has_prefill_work(&self) -> bool {
            self.prefill_work
        }
        fn preempted(&self) -> bool {
            self.preempts
        }
    }
}
