//! Trace rows → the request list: filters, the window, time and rate scaling, and token ids.
//!
//! Token ids carry the trace's content identity and nothing else: a Mooncake hash id's tokens
//! are a fixed function of (seed, id), a CSV `prefix_group` starts its prompts with that group's
//! tokens (the same ones a synthetic shared prefix uses), and a CSV `session_id` row starts with
//! its session's previous prompt. Every other token is fresh — a function of (seed, request id)
//! — so the cache manager can only find reuse the trace really has, by its own keys. A request's
//! prompt is a [`Recipe`] of those facts; no token id is made here.
//!
//! Rows stream in from the reader; only the rows a replay keeps are held, compactly, to be
//! sorted by time (traces are nearly sorted, but not always).
//!
//! A replay that keeps no row, or a scaled arrival past the clock's horizon, is refused here,
//! naming the file or the row; [`TraceInfo::left_out`] says why rows were not replayed (the
//! report's trace line).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::hash_block::{HashBlock, HashBlockFit};
use super::session_chain::SessionChain;
use super::{read_rows, TraceError, TraceRead};
use crate::scenario::ranges::MAX_HORIZON_S;
use crate::scenario::{FailedRows, TraceFormat, TraceSpec};
use crate::workload::types::{CancelPoint, Request, TraceInfo};
use crate::workload::{Head, Prompt, Recipe};

/// What a replay produced: the requests (dense ids, arrival order) and the facts about it.
pub struct Replayed {
    pub requests: Vec<Request>,
    pub info: TraceInfo,
    /// Rows identify content (Mooncake hash ids; CSV sessions or prefix groups).
    pub has_content_ids: bool,
    /// Mooncake: the tokens per hash id used, and what the rows allow (None: no ids).
    pub hash_block: Option<HashBlock>,
}

/// Where a replay's limits come from besides the trace spec.
pub struct ReplayLimits {
    /// `traffic.requests`: rows replayed at most.
    pub max_requests: Option<u32>,
    /// `traffic.duration_s`: replayed time after `start_s`, seconds.
    pub duration_s: Option<f64>,
}

/// A row the filters kept, as little as a request needs.
struct Kept {
    time_ns: u64,
    /// Its 1-based line in the file (to name it when its time cannot be replayed).
    line: u64,
    prompt_tokens: u32,
    output_tokens: u32,
    tenant: u32,
    prefix_group: Option<u32>,
    /// Index of its CSV session (u32::MAX: none).
    session: u32,
    failed: bool,
    hash_ids: Box<[u64]>,
}

const NO_SESSION: u32 = u32::MAX;

/// Read `path` (as `spec` says) and replay it: filters, the window, time and rate scaling, and
/// a prompt recipe per request.
pub fn replay(
    path: &Path,
    spec: &TraceSpec,
    limits: &ReplayLimits,
    seed: u64,
    vocab: u32,
) -> Result<Replayed, TraceError> {
    let (mut filtered, mut failed_skipped) = (0u64, 0u64);
    let mut session_ids: BTreeMap<String, u32> = BTreeMap::new();
    let mut kept: Vec<Kept> = Vec::new();
    let mut fit = HashBlockFit::new(spec.hash_block_tokens);
    let wanted = |want: &Option<String>, have: Option<&str>| match want {
        Some(w) => have.map(str::trim) == Some(w.trim()),
        None => true,
    };
    let read = read_rows(
        path,
        spec.format,
        spec.skip_bad_rows,
        |format, line, row| {
            fit.push(line, row.prompt_tokens, row.hash_ids.len());
            let burst = format == TraceFormat::Burstgpt;
            if burst && !(wanted(&spec.model, row.model) && wanted(&spec.log_type, row.log_type)) {
                filtered += 1;
                return;
            }
            let failed = burst && row.output_tokens == 0;
            if failed && spec.failed == FailedRows::Skip {
                failed_skipped += 1;
                return;
            }
            let session = match row.session {
                Some(s) => match session_ids.get(s) {
                    Some(&i) => i,
                    None => {
                        let i = session_ids.len() as u32;
                        session_ids.insert(s.to_string(), i);
                        i
                    }
                },
                None => NO_SESSION,
            };
            kept.push(Kept {
                time_ns: row.time_ns,
                line,
                prompt_tokens: row.prompt_tokens,
                output_tokens: row.output_tokens,
                tenant: row.tenant.unwrap_or(0),
                prefix_group: row.prefix_group,
                session,
                failed,
                hash_ids: row.hash_ids.into_boxed_slice(),
            });
        },
    )?;
    drop(session_ids);
    let hash_block = fit.resolve().map_err(|(line, message)| TraceError::Row {
        path: path_of(&read),
        line,
        col: 1,
        message,
    })?;
    replay_kept(
        kept,
        hash_block,
        &read,
        spec,
        limits,
        seed,
        vocab,
        filtered,
        failed_skipped,
    )
}

#[allow(clippy::too_many_arguments)]
fn replay_kept(
    mut kept: Vec<Kept>,
    hash_block: Option<HashBlock>,
    read: &TraceRead,
    spec: &TraceSpec,
    limits: &ReplayLimits,
    seed: u64,
    vocab: u32,
    filtered_rows: u64,
    failed_skipped: u64,
) -> Result<Replayed, TraceError> {
    let mut info = TraceInfo {
        path: spec.path.clone(),
        format: read.format.name().into(),
        rows: read.data_rows,
        blake3: read.blake3.clone(),
        replayed: 0,
        skipped_bad_rows: read.skipped_bad_rows,
        filtered_rows,
        failed_skipped,
        failed_cancelled: 0,
        outside_window: 0,
        before_start: 0,
        past_requests: 0,
        past_duration: 0,
        ideal_prefix_hit_rate: None,
        hash_block_tokens: hash_block.as_ref().map(|b| b.tokens),
    };
    // Traces are nearly sorted; a stable sort keeps file order among equal times.
    kept.sort_by_key(|r| r.time_ns);
    let origin = kept.first().map_or(0, |r| r.time_ns);
    let start = origin.saturating_add((spec.start_s * 1e9).round() as u64);
    let factor = spec.time_scale / spec.rate_scale;
    let end_ns = limits.duration_s.map(|d| (d * 1e9).round() as u64);
    let cap = limits.max_requests.map_or(usize::MAX, |n| n as usize);

    // Each CSV session's link chain from its latest row down to its first, as a stack of
    // (position where the row's own ids start, row), starts strictly increasing: the rows a
    // next row's prefix can still come from. A row continuing with prefix `upto` pops the rows
    // whose own ids all lie at or past `upto` (no later row reads them through the chain) and
    // links to the top, so each row is pushed and popped once: linear in the session.
    let mut sessions: BTreeMap<u32, SessionChain> = BTreeMap::new();
    let block = hash_block.as_ref().map_or(1, |b| b.tokens.max(1));
    let mut requests = Vec::with_capacity(kept.len().min(cap));
    for row in kept {
        let rel = match row.time_ns.checked_sub(start) {
            Some(d) => d,
            None => {
                info.before_start += 1;
                continue;
            }
        };
        let at_ns = if factor == 1.0 {
            rel
        } else {
            (rel as f64 * factor).round() as u64
        };
        if requests.len() >= cap {
            info.past_requests += 1;
            continue;
        }
        if end_ns.is_some_and(|e| at_ns >= e) {
            info.past_duration += 1;
            continue;
        }
        // The engine's clock is integer ns; a scaled time past the horizon would overflow it
        // mid-run (or saturate silently above): refused here, naming the row.
        let at_s = rel as f64 * factor / 1e9;
        if !at_s.is_finite() || at_s > MAX_HORIZON_S {
            return Err(TraceError::Row {
                path: path_of(read),
                line: row.line,
                col: 1,
                message: format!(
                    "this row arrives {:.3} s after the first replayed row, times time_scale {} / \
                     rate_scale {} = {at_s:e} s of virtual time; the most is {MAX_HORIZON_S:e} s \
                     (lower time_scale or raise rate_scale)",
                    rel as f64 / 1e9,
                    spec.time_scale,
                    spec.rate_scale
                ),
            });
        }
        let id = requests.len() as u64;
        let in_session = row.session != NO_SESSION;
        let earlier = if in_session {
            sessions.get_mut(&row.session)
        } else {
            None
        };
        // Where this row's own ids start (what a later row's chain needs to know).
        let mut own_from = 0;
        let head = match (earlier, row.prefix_group) {
            _ if !row.hash_ids.is_empty() => Head::HashIds {
                block_tokens: block,
                ids: row.hash_ids,
            },
            (Some(chain), _) => {
                own_from = row.prompt_tokens.min(chain.prev_len_tokens);
                let link = chain.link(own_from, id).ok_or_else(|| TraceError::Row {
                    path: path_of(read),
                    line: row.line,
                    col: 1,
                    message: format!(
                        "this session row is more than {} requests after its previous row",
                        u32::MAX
                    ),
                })?;
                Head::Continues(link)
            }
            (None, Some(g)) => Head::PrefixGroup {
                group: g,
                tokens: spec.prefix_tokens.min(row.prompt_tokens),
                opens_session: in_session,
            },
            (None, None) => Head::Fresh {
                opens_session: in_session,
            },
        };
        let recipe = Recipe {
            seed,
            key: id,
            len_tokens: row.prompt_tokens,
            vocab,
            head,
        };
        if in_session {
            let latest = Arc::new(recipe.clone());
            match sessions.get_mut(&row.session) {
                Some(chain) if matches!(recipe.head, Head::Continues(_)) => {
                    chain.push(own_from, latest)
                }
                _ => {
                    sessions.insert(row.session, SessionChain::new(latest));
                }
            }
        }
        // A prefill always emits one token; a failed request is cancelled at that token.
        let (output_tokens, cancel) = if row.failed {
            info.failed_cancelled += 1;
            (2, Some(CancelPoint::AfterTokens { tokens: 1 }))
        } else {
            (row.output_tokens.max(1), None)
        };
        requests.push(Request {
            id,
            tenant: row.tenant,
            arrival_ms: at_ns as f64 / 1e6,
            prompt: Prompt::Recipe(recipe),
            prefix_group: row.prefix_group,
            output_tokens,
            samples: 1,
            cancel,
            session: None,
        });
    }
    info.replayed = requests.len() as u64;
    info.outside_window = info.before_start + info.past_requests + info.past_duration;
    if requests.is_empty() {
        let message = if info.rows == 0 {
            "no data rows (empty or header only): nothing to replay".to_string()
        } else {
            format!(
                "none of its {} rows is replayed: {}",
                info.rows,
                info.left_out(limits, spec.start_s).join(", ")
            )
        };
        return Err(TraceError::Nothing {
            path: path_of(read),
            message,
        });
    }
    Ok(Replayed {
        requests,
        info,
        has_content_ids: read.has_content_ids,
        hash_block,
    })
}

fn path_of(read: &TraceRead) -> std::path::PathBuf {
    read.path.clone()
}

impl TraceInfo {
    /// Why rows were not replayed, one phrase per nonzero reason (empty when every row was).
    pub fn left_out(&self, limits: &ReplayLimits, start_s: f64) -> Vec<String> {
        let cap = limits
            .max_requests
            .map_or("traffic.requests".to_string(), |n| {
                format!("traffic.requests = {n}")
            });
        let dur = limits
            .duration_s
            .map_or("traffic.duration_s".to_string(), |d| {
                format!("traffic.duration_s = {d} s")
            });
        [
            (self.skipped_bad_rows, "malformed (skipped)".to_string()),
            (
                self.filtered_rows,
                "left out by the model / log-type filters".into(),
            ),
            (
                self.failed_skipped,
                "failed (0 response tokens; failed = \"skip\")".into(),
            ),
            (self.before_start, format!("before start_s = {start_s} s")),
            (self.past_requests, format!("past the cap {cap}")),
            (self.past_duration, format!("past {dur} of replayed time")),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect()
    }
}
