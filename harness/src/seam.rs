//! What one engine step asks of a backend and what comes back: plain data, built by the engine,
//! executed by a backend (`crate::backend`, which re-exports it), and followed by the shadow
//! checker (`crate::shadow`), which runs inside the sim backend. It lives below both so that the
//! backend and the checker it carries do not import each other.

use kvbench_cache_api::{CopyOp, SeqId, TierOp};
use serde::{Deserialize, Serialize};

/// One scheduled sequence in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqWork {
    pub seq: SeqId,
    /// Tokens whose K/V are already in the cache before this step (the attention context).
    pub context_tokens: u32,
    /// Tokens this step writes K/V for: a prefill chunk, or 1 for a decode.
    pub new_tokens: u32,
    /// Sample a token after the last new token (final prefill chunk, or a decode).
    pub sample: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwapDirection {
    /// Copy the sequence's K/V to the host tier (its layout is still mapped at submit time; the
    /// engine releases it after submitting, so the release is fenced on this step).
    Out,
    /// Copy the sequence's K/V back from the host into its freshly allocated layout.
    In,
}

/// A swap transfer performed before the step's compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwapOp {
    pub seq: SeqId,
    pub direction: SwapDirection,
    /// Tokens of K/V moved.
    pub tokens: u32,
    /// Bytes moved where the cache manager priced them (a grouped run: what its tables keep of
    /// the tokens, and the recurrent state); `None`: the backend turns `tokens` into bytes with
    /// its model shape's summed bytes a token.
    pub bytes: Option<u64>,
}

/// Everything one step does, in order: tier transfers (offloads and onloads, in the order the
/// cache manager gave them), copies (copy-on-write, contiguous forks), swaps, then the compute
/// over `seqs`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    pub tier_ops: Vec<TierOp>,
    pub copies: Vec<CopyOp>,
    pub swaps: Vec<SwapOp>,
    pub seqs: Vec<SeqWork>,
}

impl StepPlan {
    pub fn is_empty(&self) -> bool {
        self.tier_ops.is_empty()
            && self.copies.is_empty()
            && self.swaps.is_empty()
            && self.seqs.is_empty()
    }

    pub fn clear(&mut self) {
        self.tier_ops.clear();
        self.copies.clear();
        self.swaps.clear();
        self.seqs.clear();
    }
}

/// The token a sequence sampled at the end of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampled {
    pub seq: SeqId,
    pub token: u32,
}

/// The result of one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// Seconds the step took: modelled on `sim`, measured compute wall time on `cpu` (oracle
    /// checks excluded). The engine advances its virtual clock by this.
    pub duration_s: f64,
    /// One entry per `SeqWork` with `sample == true`, in plan order.
    pub sampled: Vec<Sampled>,
    /// Seconds of `duration_s` the step's compute waited for its onloads (blocking: the whole
    /// transfer; overlap: what the transfer took beyond the compute). The engine shares it among
    /// the sequences whose onloads the step carried, by tokens onloaded.
    pub onload_wait_s: f64,
}
