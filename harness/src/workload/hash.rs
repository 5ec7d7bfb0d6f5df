//! `workload_hash`: blake3 over a canonical byte encoding of the request list.
//!
//! Floats are encoded by their bits and every variable-length field by its length first, so the
//! hash does not depend on how a formatter prints numbers or on the platform's endianness.

use super::prompt::Prompt;
use super::types::{CancelPoint, ClosedLoop, Request, TraceInfo};

/// Bump when the encoding (not the generator) changes.
const ENCODING: &[u8] = b"kvbench-workload-v1";

pub fn workload_hash(requests: &[Request], closed_loop: Option<&ClosedLoop>) -> String {
    hasher(requests, closed_loop)
        .finalize()
        .to_hex()
        .to_string()
}

/// A replay's hash covers the trace's identity too (format, rows, the blake3 of its bytes), so
/// two replays that happen to yield the same requests from different files still differ. The
/// path is not part of it: one file named from another folder, or by another spelling, is the
/// same workload.
pub fn workload_hash_with_trace(
    requests: &[Request],
    closed_loop: Option<&ClosedLoop>,
    trace: &TraceInfo,
) -> String {
    let mut h = hasher(requests, closed_loop);
    h.update(b"trace");
    for s in [&trace.format, &trace.blake3] {
        h.update(&(s.len() as u64).to_le_bytes())
            .update(s.as_bytes());
    }
    h.update(&trace.rows.to_le_bytes());
    h.finalize().to_hex().to_string()
}

fn hasher(requests: &[Request], closed_loop: Option<&ClosedLoop>) -> blake3::Hasher {
    let mut h = blake3::Hasher::new();
    h.update(ENCODING);
    match closed_loop {
        None => {
            h.update(&[0]);
        }
        Some(c) => {
            h.update(&[1]);
            h.update(&c.clients.to_le_bytes());
            h.update(&c.think_ms.to_bits().to_le_bytes());
        }
    }
    h.update(&(requests.len() as u64).to_le_bytes());
    for r in requests {
        h.update(&r.id.to_le_bytes());
        h.update(&r.tenant.to_le_bytes());
        h.update(&r.arrival_ms.to_bits().to_le_bytes());
        match &r.prompt {
            Prompt::Explicit(ids) => {
                h.update(&(ids.len() as u64).to_le_bytes());
                for t in ids {
                    h.update(&t.to_le_bytes());
                }
            }
            // No length is u64::MAX: a recipe's bytes cannot read as an explicit list.
            Prompt::Recipe(recipe) => {
                h.update(&u64::MAX.to_le_bytes());
                recipe.hash_into(&mut h);
            }
        }
        match r.prefix_group {
            None => h.update(&[0]),
            Some(g) => h.update(&[1]).update(&g.to_le_bytes()),
        };
        h.update(&r.output_tokens.to_le_bytes());
        h.update(&r.samples.to_le_bytes());
        match r.cancel {
            None => h.update(&[0]),
            Some(CancelPoint::Queued { after_ms }) => {
                h.update(&[1]).update(&after_ms.to_bits().to_le_bytes())
            }
            Some(CancelPoint::AfterDelay { after_ms }) => {
                h.update(&[2]).update(&after_ms.to_bits().to_le_bytes())
            }
            Some(CancelPoint::AfterTokens { tokens }) => {
                h.update(&[3]).update(&tokens.to_le_bytes())
            }
        };
        // Only session turns add bytes, so lone-request workloads hash as before.
        if let Some(s) = &r.session {
            h.update(b"S")
                .update(&s.session.to_le_bytes())
                .update(&s.turn.to_le_bytes())
                .update(&s.next.map_or(u64::MAX, |n| n).to_le_bytes())
                .update(&s.think_ms.to_bits().to_le_bytes())
                .update(&[s.truncate_front as u8]);
        }
    }
    h
}
