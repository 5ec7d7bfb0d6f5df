//! `summary.json` of an endpoint run: the run fields `compare` and `gate` read (scenario, seed,
//! workload hash, checks, `runs[]` with the same figure names), with `backend` = `endpoint`
//! and `cache` = `endpoint`, then what only an endpoint run has (`endpoint`), the prefix view
//! (`prefix_cache`: the server's hit share beside the request list's bounds) and `sim`'s
//! prediction (`predict`). Figures a client cannot measure (memory, steps, preemptions) are
//! absent, not zero.

use std::collections::BTreeMap;

use serde::Serialize;

use super::prom::Scrape;
use crate::metrics::prefix_bounds::PrefixBounds;
use crate::metrics::{Counts, Dist, RunMetrics};
use crate::results::summary::{Checks, SessionsSummary};

#[derive(Debug, Serialize)]
pub struct EndpointSummary {
    pub scenario: String,
    pub backend: &'static str,
    pub seed: u64,
    pub workload_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::workload::TraceInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionsSummary>,
    pub slo: crate::scenario::SloSpec,
    /// Failed when the run is partial, a request was flagged or the offered rate was not
    /// achieved: the gate refuses such a folder.
    pub checks: Checks,
    pub runs: Vec<EndpointRunSummary>,
    pub endpoint: EndpointInfo,
    pub prefix_cache: PrefixView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predict: Option<Prediction>,
}

#[derive(Debug, Serialize)]
pub struct EndpointRunSummary {
    pub cache: &'static str,
    pub requests: Counts,
    pub streams: Counts,
    pub output_tokens: u64,
    pub duration_s: f64,
    pub throughput_tokens_per_s: f64,
    pub requests_per_s: f64,
    pub goodput_requests_per_s: f64,
    pub ttft_ms: Dist,
    /// Gaps between arrivals (a multi-token chunk is one arrival).
    pub itl_ms: Dist,
    pub e2e_ms: Dist,
    pub tpot_ms: Dist,
    /// Prompt tokens the server reported as cached (`usage.prompt_tokens_details`), where it
    /// reports them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_prompt_tokens: Option<u64>,
}

impl EndpointRunSummary {
    pub fn new(m: &RunMetrics, cached: Option<u64>) -> EndpointRunSummary {
        EndpointRunSummary {
            cache: super::record::CACHE,
            requests: m.counts,
            streams: m.streams,
            output_tokens: m.output_tokens,
            duration_s: m.duration_s,
            throughput_tokens_per_s: m.throughput_tokens_per_s,
            requests_per_s: m.requests_per_s,
            goodput_requests_per_s: m.goodput_requests_per_s,
            ttft_ms: m.ttft,
            itl_ms: m.itl,
            e2e_ms: m.e2e,
            tpot_ms: m.tpot,
            cached_prompt_tokens: cached,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct LagMs {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// Requests with a scheduled arrival (open loop, first turns).
    pub count: u64,
}

#[derive(Debug, Serialize)]
pub struct EndpointInfo {
    pub url: String,
    /// The model name sent with every request.
    pub model: String,
    /// The server's `/v1/models` answer as it came (null where it has none).
    pub models: serde_json::Value,
    pub client_version: String,
    /// The run stopped early (the server failed): the figures cover what completed.
    pub partial: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_at_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_because: Option<String>,
    pub requests_planned: u64,
    pub requests_sent: u64,
    pub requests_not_sent: u64,
    /// Requests with at least one flag, and the flags by kind (`endpoint.csv` has each).
    pub flagged_requests: u64,
    pub flags: BTreeMap<&'static str, u64>,
    /// Scheduled requests over the span of their schedule, and over the span they were sent in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offered_rate_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub achieved_rate_per_s: Option<f64>,
    /// Sent − scheduled.
    pub lag_ms: LagMs,
    /// The achieved rate fell below 90% of the offered one (the client, or the connection
    /// set-up, could not keep the schedule).
    pub rate_not_achieved: bool,
    pub request_timeout_s: f64,
    pub idle_timeout_s: f64,
    /// Later session turns sent without the previous outputs' token ids (the server sent none).
    pub session_turns_without_token_ids: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_metrics: Option<ServerMetrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_metrics_unavailable: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ServerMetrics {
    /// Scrapes of `/metrics` that answered (before, during and after the run).
    pub scrapes: u64,
    pub before: Scrape,
    pub after: Scrape,
    /// The run's deltas of the prefix-cache counters, in tokens, and their ratio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_hit_tokens: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_query_tokens: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_hit_share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_requests_running: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_requests_waiting: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_kv_cache_usage: Option<f64>,
}

/// The server's prefix hit share beside what the request list allows.
#[derive(Debug, Serialize)]
pub struct PrefixView {
    /// From `/metrics` deltas over the run (`endpoint.server_metrics`). A server's counters
    /// count every lookup, a preempted request's again when it restarts, so this share may
    /// exceed the request list's ceiling; `admission_hit_share` is the one read against it.
    pub server_hit_share: Option<f64>,
    /// The server's own per-request hits (`usage.prompt_tokens_details.cached_tokens`, the
    /// hit at first admission on `kvbench serve`) over `bounds.lookup_tokens`, where the server
    /// reports them and the list gives bounds: comparable with the bounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission_hit_share: Option<f64>,
    /// `bounds.replayed_lru_hit_rate`, `optimum_hit_rate`, `ceiling_hit_rate`: the same request
    /// list at the scenario's pool capacity (as `kvbench run` sizes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bounds: Option<PrefixBounds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bounds_unavailable: Option<String>,
}

/// `sim`'s figures for the same scenario on a device profile (its paged run), and measured ÷
/// predicted.
#[derive(Debug, Serialize)]
pub struct Prediction {
    pub device: String,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    pub tpot_p50_ms: f64,
    pub e2e_p99_ms: f64,
    pub throughput_tokens_per_s: f64,
    /// The paged run's request prefix hit share (`achieved_hit_rate` of a run's summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_hit_rate: Option<f64>,
    /// Measured ÷ predicted, per figure (absent where the prediction is 0).
    pub ratio: BTreeMap<&'static str, f64>,
}
