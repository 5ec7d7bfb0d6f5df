//! The ideal prefix reuse of a request list: the share of prompt tokens an infinite prefix
//! cache would serve, matching whole blocks the way the paged manager does (a chain of block
//! keys per reuse scope, at most `(prompt - 1) / block` blocks, so one token is always
//! computed). The ceiling a run's prefix hit rate is read against.

use std::collections::HashSet;

use serde::Serialize;

use crate::workload::types::Request;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IdealReuse {
    pub block_tokens: u32,
    /// Prompt tokens of the requests that fit `max_seq_len` (the ones a run looks up).
    pub lookup_tokens: u64,
    pub hit_tokens: u64,
    pub hit_rate: f64,
}

/// `per_tenant`: each tenant is its own scope (the default `prefix_scope = "tenant"`).
/// Requests longer than `max_seq_len` are left out: a run rejects them unseen.
pub fn ideal_prefix_reuse(
    requests: &[Request],
    block_tokens: u32,
    max_seq_len: u32,
    per_tenant: bool,
) -> IdealReuse {
    let bs = block_tokens.max(1) as usize;
    let mut seen: HashSet<[u8; 16]> = HashSet::new();
    let (mut lookup, mut hit) = (0u64, 0u64);
    let mut order: Vec<&Request> = requests.iter().collect();
    order.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms).then(a.id.cmp(&b.id)));
    for r in order {
        let len = r.prompt.len();
        if len == 0 || len as u64 + r.output_tokens as u64 > max_seq_len as u64 {
            continue;
        }
        lookup += len as u64;
        let scope = if per_tenant { r.tenant } else { 0 };
        let mut key = blake3::hash(&scope.to_le_bytes());
        let max_hits = (len - 1) / bs;
        let mut hits = 0;
        let mut matching = true;
        for (i, chunk) in r.prompt.chunks_exact(bs).enumerate() {
            let mut h = blake3::Hasher::new();
            h.update(key.as_bytes());
            for t in chunk {
                h.update(&t.to_le_bytes());
            }
            key = h.finalize();
            let mut k = [0u8; 16];
            k.copy_from_slice(&key.as_bytes()[..16]);
            if matching && i < max_hits && seen.contains(&k) {
                hits += 1;
            } else {
                matching = false;
            }
            seen.insert(k);
        }
        hit += (hits * bs) as u64;
    }
    IdealReuse {
        block_tokens: bs as u32,
        lookup_tokens: lookup,
        hit_tokens: hit,
        hit_rate: if lookup > 0 {
            hit as f64 / lookup as f64
        } else {
            0.0
        },
    }
}
