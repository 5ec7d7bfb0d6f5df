//! The trace-replay part of `[traffic]`: a trace file's format, columns and the sessions a
//! conversation trace is read as.

use serde::{Deserialize, Serialize};

use super::types::{DelayDist, LengthDist};

/// A trace's format; `auto` reads it from the header line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    #[default]
    Auto,
    /// Azure LLM inference traces: `TIMESTAMP,ContextTokens,GeneratedTokens`.
    Azure,
    /// BurstGPT: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.
    Burstgpt,
    /// Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
    Mooncake,
    /// `arrival_ms,prompt_tokens,output_tokens[,session_id][,tenant][,prefix_group]`.
    Csv,
}

impl TraceFormat {
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Auto => "auto",
            TraceFormat::Azure => "azure",
            TraceFormat::Burstgpt => "burstgpt",
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::Csv => "csv",
        }
    }
}

/// What replay does with a BurstGPT row whose response has 0 tokens (a failed request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FailedRows {
    /// Left out of the replay and counted.
    #[default]
    Skip,
    /// Replayed: prefilled, then cancelled by its client at its first output token.
    Cancel,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSpec {
    pub path: String,
    #[serde(default)]
    pub format: TraceFormat,
    /// Multiplies the trace's times (2 = the same pattern at half the rate).
    #[serde(default = "one_f64")]
    pub time_scale: f64,
    /// Multiplies the trace's rate (divides its times); composes with `time_scale`.
    #[serde(default = "one_f64")]
    pub rate_scale: f64,
    /// Rows before this many seconds of trace time (from its first row) are left out.
    #[serde(default)]
    pub start_s: f64,
    /// Skip and count malformed rows instead of refusing the trace.
    #[serde(default)]
    pub skip_bad_rows: bool,
    /// BurstGPT: replay only rows of this model (e.g. "ChatGPT").
    #[serde(default)]
    pub model: Option<String>,
    /// BurstGPT: replay only rows of this log type (e.g. "Conversation log").
    #[serde(default)]
    pub log_type: Option<String>,
    /// BurstGPT: failed requests (0 response tokens).
    #[serde(default)]
    pub failed: FailedRows,
    /// Mooncake: prompt tokens per hash id (512 in the FAST'25 release, 16 in others). None:
    /// inferred from the rows' `input_length` and id counts; a stated one they contradict is
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_block_tokens: Option<u32>,
    /// Plain CSV: tokens of a `prefix_group`'s shared prefix (capped below each prompt).
    #[serde(default = "default_group_prefix_tokens")]
    pub prefix_tokens: u32,
}

fn one_f64() -> f64 {
    1.0
}

fn default_group_prefix_tokens() -> u32 {
    256
}

impl TraceSpec {
    /// A spec with every option at its default.
    pub fn new(path: impl Into<String>) -> TraceSpec {
        TraceSpec {
            path: path.into(),
            format: TraceFormat::Auto,
            time_scale: 1.0,
            rate_scale: 1.0,
            start_s: 0.0,
            skip_bad_rows: false,
            model: None,
            log_type: None,
            failed: FailedRows::Skip,
            hash_block_tokens: None,
            prefix_tokens: default_group_prefix_tokens(),
        }
    }
}

/// What a session does when its conversation would exceed `cache.max_seq_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SessionOverflow {
    /// The overlong turn is rejected (counted as any too-long request) and the session ends.
    #[default]
    End,
    /// The oldest tokens are dropped so the turn fits; it no longer shares the old prefix.
    Truncate,
}

/// Multi-turn conversations: the arrival process starts sessions; each later turn arrives
/// `think` after the previous turn's last token, with the whole conversation as its prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsSpec {
    /// Turns per session (first turn included).
    pub turns: LengthDist,
    /// User think time between a turn's last token and the next turn's arrival.
    pub think: DelayDist,
    /// New user tokens each later turn adds to the conversation.
    pub new_tokens: LengthDist,
    #[serde(default)]
    pub overflow: SessionOverflow,
}
