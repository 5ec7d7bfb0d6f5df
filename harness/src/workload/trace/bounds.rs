//! Eviction bounds of a request list: its access string (the content blocks each request reads,
//! in arrival order, with the same block keys and the same hit rule as the infinite-cache pass
//! of `reuse.rs`) replayed through `lru`, `lfu` and the offline optimum `belady` at a capacity
//! in blocks, beside the infinite-cache ceiling. How much of the gap to the ceiling is capacity
//! (Belady's shortfall) and how much is policy (the rest).
//!
//! A request's hit is its leading run of blocks resident when read, at most `(prompt - 1) /
//! block` of them (one token is always computed); every content block it reads is then
//! resident (inserted on a miss; `belady` may keep a block out). Belady maximises hits over
//! block accesses; since a parent block is read before its child in every request (so its next
//! use is nearer, and a tie goes against the child, first seen later), its resident set stays
//! prefix-closed and its block hits are leading runs. That its leading-run count bounds the
//! others' is what the tests and the shipped sample show, not a theorem: the `(prompt - 1) /
//! block` cap leaves a request's last block uncounted for every policy alike.
//!
//! Memory: one `u32` per block access (the string), a next-use index (one `usize` per access),
//! one descriptor per request and per-key state; no prompt or token is kept.

use std::collections::HashMap;

use serde::Serialize;

use super::evict::{next_uses, replay, PolicyKind};
use super::reuse::{id_chain_keys, short};
use crate::workload::types::Request;
use crate::workload::{Head, Prompt, Recipe};

/// The block keys a request list reads, as dense ids, in arrival order.
#[derive(Debug, Clone, Default)]
pub struct AccessString {
    pub block_tokens: u32,
    pub keys: Vec<u32>,
    /// Per request that is looked up: (content blocks read, at most this many may hit).
    pub requests: Vec<(u32, u32)>,
    pub distinct_blocks: u32,
    /// Prompt tokens of the requests that fit `max_seq_len`.
    pub lookup_tokens: u64,
}

/// Hits of one policy at one capacity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PolicyHits {
    pub policy: PolicyKind,
    pub hit_tokens: u64,
    pub hit_blocks: u64,
    /// `hit_tokens / lookup_tokens`.
    pub hit_rate: f64,
    /// `hit_blocks / lookup_blocks` (blocks that could hit).
    pub block_hit_rate: f64,
}

/// Every policy at one capacity, and the infinite-cache ceiling on the same string.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvictionBounds {
    pub capacity_blocks: u64,
    pub block_tokens: u32,
    pub lookup_tokens: u64,
    /// Blocks that could hit (each request's leading `(prompt - 1) / block` content blocks).
    pub lookup_blocks: u64,
    pub distinct_blocks: u32,
    pub ceiling: PolicyHits,
    pub policies: Vec<PolicyHits>,
}

/// Same arguments and same request filter as [`super::ideal_prefix_reuse`].
pub fn access_string(
    requests: &[Request],
    block_tokens: u32,
    max_seq_len: u32,
    per_tenant: bool,
) -> AccessString {
    let bs = block_tokens.max(1) as usize;
    let mut ids: HashMap<[u8; 16], u32> = HashMap::new();
    let mut out = AccessString {
        block_tokens: bs as u32,
        ..AccessString::default()
    };
    let mut order: Vec<&Request> = requests.iter().collect();
    order.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms).then(a.id.cmp(&b.id)));
    let mut push = |k: [u8; 16], keys: &mut Vec<u32>| {
        let next = ids.len() as u32;
        keys.push(*ids.entry(k).or_insert(next));
    };
    for r in order {
        let len = r.prompt.len_tokens() as usize;
        if len == 0 || len as u64 + r.output_tokens as u64 > max_seq_len as u64 {
            continue;
        }
        out.lookup_tokens += len as u64;
        let content = (r.prompt.content_tokens() as usize).min(len);
        let scope = if per_tenant { r.tenant } else { 0 };
        let max_hits = ((len - 1) / bs) as u32;
        let before = out.keys.len();
        if content >= bs {
            match &r.prompt {
                Prompt::Recipe(Recipe {
                    head: Head::HashIds { block_tokens, ids },
                    ..
                }) => {
                    // Cache block i (tokens up to `end`) is the chain key of hash id j with
                    // the `end - j * h` tokens of it the block covers: the test `id_hits` makes.
                    let h = (*block_tokens).max(1) as usize;
                    let chain = id_chain_keys(ids, h, content, scope);
                    for i in 0..content / bs {
                        let end = (i + 1) * bs;
                        let j = (end - 1) / h;
                        let Some(c) = chain.get(j) else { break };
                        let mut k = blake3::Hasher::new();
                        k.update(b"idblk")
                            .update(c)
                            .update(&((end - j * h) as u64).to_le_bytes());
                        push(short(k.finalize()), &mut out.keys);
                    }
                }
                p => {
                    let tokens = p.tokens();
                    let mut key = blake3::hash(&scope.to_le_bytes());
                    for chunk in tokens.chunks_exact(bs).take(content / bs) {
                        let mut h = blake3::Hasher::new();
                        h.update(key.as_bytes());
                        for t in chunk {
                            h.update(&t.to_le_bytes());
                        }
                        key = h.finalize();
                        push(short(key), &mut out.keys);
                    }
                }
            }
        }
        out.requests
            .push(((out.keys.len() - before) as u32, max_hits));
    }
    out.distinct_blocks = ids.len() as u32;
    out
}

/// A capacity as `--capacity` takes it: a bare integer is blocks; a size with a unit ("10 GiB")
/// is bytes, turned into whole blocks of `block_tokens` at `kv_bytes_per_token` (rounded down),
/// which it then needs.
pub fn capacity_blocks(
    text: &str,
    block_tokens: u32,
    kv_bytes_per_token: Option<u64>,
) -> Result<u64, String> {
    let t = text.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return t
            .replace('_', "")
            .parse()
            .map_err(|_| format!("capacity `{text}`: does not fit in 64 bits"));
    }
    let bytes = crate::units::parse_bytes(t).map_err(|e| format!("capacity `{text}`: {e}"))?;
    let per_token = kv_bytes_per_token.filter(|&b| b > 0).ok_or_else(|| {
        format!(
            "capacity `{text}` is a size: give --kv-bytes-per-token (the model's K and V bytes \
             per token, all layers) to turn it into blocks, or give a block count"
        )
    })?;
    let per_block = per_token
        .checked_mul(u64::from(block_tokens.max(1)))
        .ok_or_else(|| format!("capacity `{text}`: bytes per block overflow 64 bits"))?;
    Ok(bytes / per_block)
}

/// Leading-run hits of `kind` at `capacity` blocks (usize::MAX: the infinite ceiling).
fn policy_hits(
    s: &AccessString,
    next: &[usize],
    kind: PolicyKind,
    capacity: usize,
    lookup_blocks: u64,
) -> PolicyHits {
    let mut p = kind.make(capacity);
    // Per request: how far its leading run of hits reached, walked as its blocks are read.
    let mut req = s.requests.iter();
    let (mut left, mut max_hits, mut index, mut matching) = (0u32, 0u32, 0u32, false);
    let mut hit_blocks = 0u64;
    replay(p.as_mut(), &s.keys, next, |_, hit| {
        while left == 0 {
            let Some(&(n, m)) = req.next() else { return };
            (left, max_hits, index, matching) = (n, m, 0, true);
        }
        matching = matching && hit && index < max_hits;
        hit_blocks += u64::from(matching);
        index += 1;
        left -= 1;
    });
    let hit_tokens = hit_blocks * s.block_tokens as u64;
    let share = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    PolicyHits {
        policy: kind,
        hit_tokens,
        hit_blocks,
        hit_rate: share(hit_tokens, s.lookup_tokens),
        block_hit_rate: share(hit_blocks, lookup_blocks),
    }
}

/// Each policy at each capacity (in blocks), beside the infinite-cache ceiling.
pub fn eviction_bounds(s: &AccessString, capacities_blocks: &[u64]) -> Vec<EvictionBounds> {
    if capacities_blocks.is_empty() {
        return Vec::new();
    }
    let next = next_uses(&s.keys);
    let lookup_blocks: u64 = s.requests.iter().map(|&(n, m)| u64::from(n.min(m))).sum();
    let ceiling = policy_hits(s, &next, PolicyKind::Infinite, usize::MAX, lookup_blocks);
    capacities_blocks
        .iter()
        .map(|&c| {
            let cap = usize::try_from(c).unwrap_or(usize::MAX);
            EvictionBounds {
                capacity_blocks: c,
                block_tokens: s.block_tokens,
                lookup_tokens: s.lookup_tokens,
                lookup_blocks,
                distinct_blocks: s.distinct_blocks,
                ceiling,
                policies: PolicyKind::ALL
                    .iter()
                    .map(|&k| policy_hits(s, &next, k, cap, lookup_blocks))
                    .collect(),
            }
        })
        .collect()
}
