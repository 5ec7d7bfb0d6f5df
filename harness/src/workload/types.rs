//! The request list: the one input both cache modes are driven with.

use serde::{Deserialize, Serialize};

/// Where a request is cancelled by its client, if at all.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CancelPoint {
    /// Cancelled `after_ms` after arrival only if still waiting in the queue then.
    Queued { after_ms: f64 },
    /// Cancelled `after_ms` after arrival wherever it is (queued, prefilling, decoding, preempted).
    AfterDelay { after_ms: f64 },
    /// Cancelled once it has emitted `tokens` output tokens (counted per continuation).
    AfterTokens { tokens: u32 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Dense, 0-based, in arrival order.
    pub id: u64,
    pub tenant: u32,
    /// Intended arrival time (open loop). For closed-loop workloads this is 0 and the engine
    /// issues requests in id order as clients free up.
    pub arrival_ms: f64,
    /// Prompt token ids; requests in one shared-prefix group start with the same ids.
    pub prompt: Vec<u32>,
    /// Index of the shared-prefix group this prompt starts with, if any.
    pub prefix_group: Option<u32>,
    /// Output tokens to generate per continuation (no stop token: both cache modes do equal work).
    pub output_tokens: u32,
    /// Parallel continuations of this prompt (1 = none). Continuations fork after prefill.
    pub samples: u32,
    pub cancel: Option<CancelPoint>,
}

/// A generated workload: the request list and how it is issued.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub requests: Vec<Request>,
    /// `Some(n)`: closed loop with `n` clients, each issuing its next request `think_ms` after its
    /// previous one finished.
    pub closed_loop: Option<ClosedLoop>,
    /// Hex digest of the request list; written into every result.
    pub workload_hash: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClosedLoop {
    pub clients: u32,
    pub think_ms: f64,
}
