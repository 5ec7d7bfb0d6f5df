//! Trace rows → the request list: filters, the window, time and rate scaling, and token ids.
//!
//! Token ids carry the trace's content identity and nothing else: a Mooncake hash id's tokens
//! are a fixed function of (seed, id), a CSV `prefix_group` starts its prompts with that group's
//! tokens (the same ones a synthetic shared prefix uses), and a CSV `session_id` row starts with
//! its session's previous prompt. Every other token is fresh, so the cache manager can only find
//! reuse the trace really has, by its own keys.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::{ParsedTrace, TraceRow};
use crate::scenario::{FailedRows, TraceFormat, TraceSpec};
use crate::workload::generate::prefix_tokens;
use crate::workload::types::{CancelPoint, Request, TraceInfo};

/// Stream of the fresh (unshared) prompt tokens of a replay.
const FRESH_TOKENS_STREAM: u64 = 16;

/// The tokens of Mooncake hash id `id`: `len` ids drawn from `vocab`, a fixed function of
/// (seed, id, vocab); a shorter block is a prefix of a longer one.
pub fn hash_block_tokens(seed: u64, id: u64, len: u32, vocab: u32) -> Vec<u32> {
    let mut key = blake3::Hasher::new();
    key.update(b"kvbench-trace-hash-id-v1");
    key.update(&seed.to_le_bytes());
    let mut r = ChaCha20Rng::from_seed(*key.finalize().as_bytes());
    r.set_stream(id);
    (0..len).map(|_| r.gen_range(0..vocab)).collect()
}

/// What a replay produced: the requests (dense ids, arrival order) and the facts about it.
pub struct Replayed {
    pub requests: Vec<Request>,
    pub info: TraceInfo,
}

/// Where a replay's limits come from besides the trace spec.
pub struct ReplayLimits {
    /// `traffic.requests`: rows replayed at most.
    pub max_requests: Option<u32>,
    /// `traffic.duration_s`: replayed time after `start_s`, seconds.
    pub duration_s: Option<f64>,
}

pub fn replay(
    trace: &ParsedTrace,
    spec: &TraceSpec,
    limits: &ReplayLimits,
    seed: u64,
    vocab: u32,
) -> Replayed {
    let mut info = TraceInfo {
        path: spec.path.clone(),
        format: trace.format.name().into(),
        rows: trace.data_rows,
        blake3: trace.blake3.clone(),
        replayed: 0,
        skipped_bad_rows: trace.skipped_bad_rows,
        filtered_rows: 0,
        failed_skipped: 0,
        failed_cancelled: 0,
        outside_window: 0,
        ideal_prefix_hit_rate: None,
    };
    let burst = trace.format == TraceFormat::Burstgpt;
    let wanted = |want: &Option<String>, have: &Option<String>| match want {
        Some(w) => have.as_deref().map(str::trim) == Some(w.trim()),
        None => true,
    };
    // Kept rows with whether each replays as a failed (cancelled) request.
    let mut kept: Vec<(&TraceRow, bool)> = Vec::with_capacity(trace.rows.len());
    for row in &trace.rows {
        if burst && !(wanted(&spec.model, &row.model) && wanted(&spec.log_type, &row.log_type)) {
            info.filtered_rows += 1;
            continue;
        }
        let failed = burst && row.output_tokens == 0;
        if failed && spec.failed == FailedRows::Skip {
            info.failed_skipped += 1;
            continue;
        }
        kept.push((row, failed));
    }
    // Traces are nearly sorted; a stable sort keeps file order among equal times.
    kept.sort_by_key(|(r, _)| r.time_ns);
    let origin = kept.first().map_or(0, |(r, _)| r.time_ns);
    let start = origin.saturating_add((spec.start_s * 1e9).round() as u64);
    let factor = spec.time_scale / spec.rate_scale;
    let end_ns = limits.duration_s.map(|d| (d * 1e9).round() as u64);
    let cap = limits.max_requests.map_or(usize::MAX, |n| n as usize);

    let mut fresh = ChaCha20Rng::seed_from_u64(seed);
    fresh.set_stream(FRESH_TOKENS_STREAM);
    let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut sessions: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let block = spec.hash_block_tokens.max(1);
    let mut requests = Vec::new();
    for &(row, failed) in &kept {
        let rel = match row.time_ns.checked_sub(start) {
            Some(d) => d,
            None => {
                info.outside_window += 1;
                continue;
            }
        };
        let at_ns = if factor == 1.0 {
            rel
        } else {
            (rel as f64 * factor).round() as u64
        };
        if requests.len() >= cap || end_ns.is_some_and(|e| at_ns >= e) {
            info.outside_window += 1;
            continue;
        }
        let len = row.prompt_tokens as usize;
        let mut prompt: Vec<u32> = Vec::with_capacity(len);
        for &id in &row.hash_ids {
            if prompt.len() >= len {
                break;
            }
            let take = (len - prompt.len()).min(block as usize) as u32;
            prompt.extend(hash_block_tokens(seed, id, take, vocab));
        }
        let earlier = row.session.as_deref().and_then(|s| sessions.get(s));
        match (earlier, row.prefix_group) {
            (Some(prev), _) => prompt.extend_from_slice(&prev[..prev.len().min(len)]),
            (None, Some(g)) => {
                let want = spec.prefix_tokens.min(row.prompt_tokens);
                let have = groups.entry(g).or_default();
                if have.len() < want as usize {
                    *have = prefix_tokens(seed, g, want, vocab);
                }
                prompt.extend_from_slice(&have[..want as usize]);
            }
            _ => {}
        }
        while prompt.len() < len {
            prompt.push(fresh.gen_range(0..vocab));
        }
        if let Some(s) = row.session.as_deref() {
            sessions.insert(s, prompt.clone());
        }
        // A prefill always emits one token; a failed request is cancelled at that token.
        let (output_tokens, cancel) = if failed {
            info.failed_cancelled += 1;
            (2, Some(CancelPoint::AfterTokens { tokens: 1 }))
        } else {
            (row.output_tokens.max(1), None)
        };
        requests.push(Request {
            id: requests.len() as u64,
            tenant: row.tenant.unwrap_or(0),
            arrival_ms: at_ns as f64 / 1e6,
            prompt,
            prefix_group: row.prefix_group,
            output_tokens,
            samples: 1,
            cancel,
            session: None,
        });
    }
    info.replayed = requests.len() as u64;
    Replayed { requests, info }
}
