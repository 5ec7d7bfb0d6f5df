//! The ideal prefix reuse of a request list: the share of prompt tokens an infinite prefix
//! cache would serve, matching whole blocks the way the paged manager does (a chain of block
//! keys per reuse scope, at most `(prompt - 1) / block` blocks, so one token is always
//! computed). The ceiling a run's prefix hit rate is read against.
//!
//! Only blocks of shared content (a prompt's
//! [`Prompt::content_tokens`](crate::workload::Prompt::content_tokens)) are looked at and
//! remembered: a block holding a fresh id no other request holds can never be hit, so memory
//! follows the distinct content of the trace, not its length. A Mooncake row is matched by its
//! hash ids (its first `n` tokens are a function of the ids covering them and `n`): no token id
//! is made and one entry per distinct id is kept; other prompts are made one at a time.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::workload::types::Request;
use crate::workload::{Head, Prompt, Recipe};

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IdealReuse {
    pub block_tokens: u32,
    /// Prompt tokens of the requests that fit `max_seq_len` (the ones a run looks up).
    pub lookup_tokens: u64,
    pub hit_tokens: u64,
    pub hit_rate: f64,
}

pub(super) fn short(h: blake3::Hash) -> [u8; 16] {
    let mut k = [0u8; 16];
    k.copy_from_slice(&h.as_bytes()[..16]);
    k
}

/// The chain key of each hash id covering `content` tokens (`ids[..=j]` in `scope`).
pub(super) fn id_chain_keys(ids: &[u64], h: usize, content: usize, scope: u32) -> Vec<[u8; 16]> {
    let n = content.div_ceil(h).min(ids.len());
    let mut chain = blake3::Hasher::new();
    chain
        .update(b"ids")
        .update(&scope.to_le_bytes())
        .update(&(h as u64).to_le_bytes());
    ids[..n]
        .iter()
        .map(|id| short(chain.update(&id.to_le_bytes()).finalize()))
        .collect()
}

/// Hits of a Mooncake row by its hash ids: one entry per distinct chain of ids (`ids[..=j]` in a
/// scope) holding the most tokens of block `j` any earlier prompt had. Cache block `i` (tokens
/// up to `end`) is held iff an earlier prompt had `ids[..=j]` and `end - j * H` tokens of block
/// `j`: the same test as a set of block keys, in one entry per hash id instead of one per block.
fn id_hits(
    ids: &[u64],
    hash_block: u32,
    content: usize,
    scope: u32,
    bs: usize,
    max_hits: usize,
    seen: &mut HashMap<[u8; 16], u32>,
) -> usize {
    let h = hash_block.max(1) as usize;
    let keys = id_chain_keys(ids, h, content, scope);
    let mut hits = 0;
    for i in 0..(content / bs).min(max_hits) {
        let end = (i + 1) * bs;
        let j = (end - 1) / h;
        if seen
            .get(&keys[j])
            .is_some_and(|&have| have as usize >= end - j * h)
        {
            hits += 1;
        } else {
            break;
        }
    }
    for (j, k) in keys.iter().enumerate() {
        let covered = (content - j * h).min(h) as u32;
        let e = seen.entry(*k).or_insert(0);
        *e = (*e).max(covered);
    }
    hits
}

/// Hits of any other prompt, by the chain keys of its blocks of content (made from its ids).
fn token_hits(
    prompt: &Prompt,
    content_blocks: usize,
    scope: u32,
    bs: usize,
    max_hits: usize,
    seen: &mut HashSet<[u8; 16]>,
) -> usize {
    let tokens = prompt.tokens();
    let mut key = blake3::hash(&scope.to_le_bytes());
    let (mut hits, mut matching) = (0, true);
    for (i, chunk) in tokens.chunks_exact(bs).take(content_blocks).enumerate() {
        let mut h = blake3::Hasher::new();
        h.update(key.as_bytes());
        for t in chunk {
            h.update(&t.to_le_bytes());
        }
        key = h.finalize();
        let k = short(key);
        if matching && i < max_hits && seen.contains(&k) {
            hits += 1;
        } else {
            matching = false;
        }
        seen.insert(k);
    }
    hits
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
    let mut seen_ids: HashMap<[u8; 16], u32> = HashMap::new();
    let (mut lookup, mut hit) = (0u64, 0u64);
    let mut order: Vec<&Request> = requests.iter().collect();
    order.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms).then(a.id.cmp(&b.id)));
    for r in order {
        let len = r.prompt.len_tokens() as usize;
        if len == 0 || len as u64 + r.output_tokens as u64 > max_seq_len as u64 {
            continue;
        }
        lookup += len as u64;
        let content = (r.prompt.content_tokens() as usize).min(len);
        if content < bs {
            continue;
        }
        let scope = if per_tenant { r.tenant } else { 0 };
        let max_hits = (len - 1) / bs;
        let hits = match &r.prompt {
            Prompt::Recipe(Recipe {
                head: Head::HashIds { block_tokens, ids },
                ..
            }) => id_hits(
                ids,
                *block_tokens,
                content,
                scope,
                bs,
                max_hits,
                &mut seen_ids,
            ),
            p => token_hits(p, content / bs, scope, bs, max_hits, &mut seen),
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mooncake(id: u64, len: u32, ids: &[u64]) -> Request {
        Request {
            id,
            tenant: 0,
            arrival_ms: id as f64,
            prompt: Prompt::Recipe(Recipe {
                seed: 3,
                key: id,
                len_tokens: len,
                vocab: 50_000,
                head: Head::HashIds {
                    block_tokens: 64,
                    ids: ids.to_vec().into_boxed_slice(),
                },
            }),
            prefix_group: None,
            output_tokens: 1,
            samples: 1,
            cancel: None,
            session: None,
        }
    }

    /// The hash-id keys find exactly the reuse the prompts' own ids give.
    #[test]
    fn hash_id_keys_agree_with_token_keys() {
        let reqs = vec![
            mooncake(0, 200, &[1, 2, 3, 4]),
            mooncake(1, 150, &[1, 2, 9]),
            mooncake(2, 256, &[1, 2, 3, 4]),
            mooncake(3, 100, &[5, 2]),
            mooncake(4, 300, &[1, 2, 3]),
            mooncake(5, 70, &[1, 2]),
        ];
        let explicit: Vec<Request> = reqs
            .iter()
            .map(|r| Request {
                prompt: Prompt::Explicit(r.prompt.tokens().into_owned()),
                ..r.clone()
            })
            .collect();
        for bs in [16, 32, 48, 64, 100, 128] {
            let by_ids = ideal_prefix_reuse(&reqs, bs, 4096, true);
            let by_tokens = ideal_prefix_reuse(&explicit, bs, 4096, true);
            assert_eq!(by_ids, by_tokens, "block {bs}");
        }
        // Request 2 hits request 0's first 192 tokens at 64-token blocks, and so on: not zero.
        assert!(ideal_prefix_reuse(&reqs, 64, 4096, true).hit_tokens > 0);
    }
}
