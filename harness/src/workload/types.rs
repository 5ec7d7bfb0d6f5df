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
    /// Prompt token ids (held, or a trace row's recipe made on demand); requests in one
    /// shared-prefix group start with the same ids.
    pub prompt: super::Prompt,
    /// Index of the shared-prefix group this prompt starts with, if any.
    pub prefix_group: Option<u32>,
    /// Output tokens to generate per continuation (no stop token: both cache modes do equal work).
    pub output_tokens: u32,
    /// Parallel continuations of this prompt (1 = none). Continuations fork after prefill.
    pub samples: u32,
    pub cancel: Option<CancelPoint>,
    /// A turn of a multi-turn session (`workload/sessions.rs`); `None` for a lone request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionTurn>,
}

/// One turn of a conversation. A later turn's `prompt` holds only the user's new tokens: the
/// engine prepends the conversation so far (every earlier prompt and output, token for token)
/// when the turn arrives, `think_ms` after the previous turn's last token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SessionTurn {
    pub session: u32,
    /// 0 for the first turn (which arrives by the arrival process at `arrival_ms`).
    pub turn: u32,
    /// Request id of the next turn, if the session has one.
    pub next: Option<u64>,
    /// Think time before this turn (0 for the first).
    pub think_ms: f64,
    /// When the conversation would exceed `max_seq_len`: drop its oldest tokens (true) or let the
    /// turn be rejected as too long, which ends the session (false).
    pub truncate_front: bool,
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
    /// The trace the requests were replayed from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceInfo>,
}

/// Where a replayed workload came from: written to `summary.json` and hashed into the workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceInfo {
    pub path: String,
    pub format: String,
    /// Data rows in the file (header excluded), parsed or not.
    pub rows: u64,
    /// blake3 of the file's bytes.
    pub blake3: String,
    /// Rows replayed as requests.
    pub replayed: u64,
    /// Malformed rows skipped under `skip_bad_rows`.
    pub skipped_bad_rows: u64,
    /// Rows left out by the model / log-type filters.
    pub filtered_rows: u64,
    /// BurstGPT rows with 0 response tokens: left out (`failed = "skip"`) ...
    pub failed_skipped: u64,
    /// ... or replayed as cancellations (`failed = "cancel"`).
    pub failed_cancelled: u64,
    /// Rows outside the window (`start_s`, `traffic.requests`, `traffic.duration_s`): the sum
    /// of the three counts below.
    pub outside_window: u64,
    /// Rows before `start_s`.
    #[serde(default)]
    pub before_start: u64,
    /// Rows past the `traffic.requests` cap.
    #[serde(default)]
    pub past_requests: u64,
    /// Rows past `traffic.duration_s` of replayed time.
    #[serde(default)]
    pub past_duration: u64,
    /// Share of prompt tokens an infinite prefix cache could serve, at the cache's block size,
    /// in the tenant's scope (None for traces without content ids).
    pub ideal_prefix_hit_rate: Option<f64>,
    /// Mooncake: tokens per hash id the replay used, stated or inferred from the rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_block_tokens: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClosedLoop {
    pub clients: u32,
    pub think_ms: f64,
}
