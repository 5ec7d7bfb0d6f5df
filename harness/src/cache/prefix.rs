//! The prefix index: full blocks published under a chained, scoped content key.
//!
//! key(block i) = blake3(key(block i−1) or zeros, scope digest, the block's token ids). The scope
//! digest covers the model identity, the tokenizer identity and the reuse scope, so two tenants
//! (or two tokenizers) with the same prompt compute different keys. A lookup never trusts the
//! hash alone: a hit must match the stored token ids, the stored scope and the stored parent key.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use kvbench_cache_api::{PrefixStats, ReuseScope, ScopeKey, SeqId};

/// A 256-bit content key (blake3 output).
pub type PrefixKey = [u8; 32];

/// A scope with its digest computed once per request.
#[derive(Debug)]
pub(crate) struct ScopeInfo {
    pub key: ScopeKey,
    pub digest: [u8; 32],
}

impl ScopeInfo {
    /// `None` when the scope disables reuse.
    pub fn new(scope: &ScopeKey) -> Option<Arc<ScopeInfo>> {
        let tag: [u8; 5] = match scope.reuse {
            ReuseScope::None => return None,
            ReuseScope::Global => [1, 0, 0, 0, 0],
            ReuseScope::Tenant(t) => {
                let b = t.to_le_bytes();
                [2, b[0], b[1], b[2], b[3]]
            }
        };
        let mut h = blake3::Hasher::new();
        // Length-prefixed so ("ab","c") and ("a","bc") differ.
        h.update(&(scope.model.len() as u64).to_le_bytes());
        h.update(scope.model.as_bytes());
        h.update(&(scope.tokenizer.len() as u64).to_le_bytes());
        h.update(scope.tokenizer.as_bytes());
        h.update(&tag);
        Some(Arc::new(ScopeInfo {
            key: scope.clone(),
            digest: *h.finalize().as_bytes(),
        }))
    }
}

/// What the index keeps for one published block, to verify hits and report them.
#[derive(Debug)]
pub(crate) struct Published {
    pub block: u32,
    pub parent: Option<PrefixKey>,
    pub tokens: Box<[u32]>,
    pub scope: Arc<ScopeInfo>,
    pub publisher: SeqId,
}

/// Keys are already uniform (blake3), so the map hashes their first 8 bytes and nothing else.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // `[u8; 32]` hashes as its bytes (arrays do not write a length prefix).
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct PrefixIndex {
    map: HashMap<PrefixKey, Published, BuildHasherDefault<KeyHasher>>,
    pub stats: PrefixStats,
    /// Planted bug for tests: keys and verification ignore the scope (a cross-scope hit).
    pub ignore_scope: bool,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher")
    }
}

impl PrefixIndex {
    pub fn block_key(
        &self,
        parent: Option<&PrefixKey>,
        scope: &ScopeInfo,
        tokens: &[u32],
    ) -> PrefixKey {
        // One contiguous message (parent, scope, tokens as little-endian u32s) hashed in one call:
        // per-token `update` calls cost more than the hashing itself.
        let mut msg = Vec::with_capacity(64 + 4 * tokens.len());
        msg.extend_from_slice(parent.unwrap_or(&[0u8; 32]));
        if !self.ignore_scope {
            msg.extend_from_slice(&scope.digest);
        }
        for t in tokens {
            msg.extend_from_slice(&t.to_le_bytes());
        }
        *blake3::hash(&msg).as_bytes()
    }

    /// Leading full blocks of `tokens` found in the index, at most `max_blocks`, each verified.
    pub fn lookup(
        &self,
        scope: &ScopeInfo,
        tokens: &[u32],
        block_size: u32,
        max_blocks: usize,
    ) -> Vec<(u32, PrefixKey)> {
        let mut hits = Vec::new();
        let mut parent: Option<PrefixKey> = None;
        for chunk in tokens.chunks_exact(block_size as usize).take(max_blocks) {
            let key = self.block_key(parent.as_ref(), scope, chunk);
            match self.map.get(&key) {
                Some(p) if self.verify(p, parent.as_ref(), scope, chunk) => {
                    hits.push((p.block, key))
                }
                _ => break,
            }
            parent = Some(key);
        }
        hits
    }

    /// Whether a stored entry (device block or lower-tier slot) is the block a lookup asks for.
    pub fn verify(
        &self,
        p: &Published,
        parent: Option<&PrefixKey>,
        scope: &ScopeInfo,
        chunk: &[u32],
    ) -> bool {
        let scope_ok = self.ignore_scope || p.scope.key == scope.key;
        scope_ok && p.parent.as_ref() == parent && *p.tokens == *chunk
    }

    pub fn contains(&self, key: &PrefixKey) -> bool {
        self.map.contains_key(key)
    }

    pub fn get(&self, key: &PrefixKey) -> Option<&Published> {
        self.map.get(key)
    }

    pub fn insert(&mut self, key: PrefixKey, published: Published) {
        self.map.insert(key, published);
    }

    pub fn remove(&mut self, key: &PrefixKey) -> Option<Published> {
        self.map.remove(key)
    }

    /// Keys published.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Every (block, key) pair, in no order: the invariant check walks them at every step and
    /// sorts only what it reports (sorting every entry was a third of a checked run).
    pub fn entries(&self) -> impl Iterator<Item = (u32, PrefixKey)> + '_ {
        self.map.iter().map(|(k, p)| (p.block, *k))
    }
}

#[cfg(test)]
mod tests {
    //! A key match alone is never a hit: each test plants an entry under the very key a lookup
    //! computes, with one stored field different, and requires a miss.
    use super::*;

    const BLOCK: u32 = 4;

    fn scope(tenant: u32) -> Arc<ScopeInfo> {
        ScopeInfo::new(&ScopeKey {
            model: "tiny".into(),
            tokenizer: "tiny".into(),
            reuse: ReuseScope::Tenant(tenant),
        })
        .expect("a tenant scope reuses")
    }

    fn entry(
        block: u32,
        parent: Option<PrefixKey>,
        tokens: &[u32],
        scope: &Arc<ScopeInfo>,
    ) -> Published {
        Published {
            block,
            parent,
            tokens: tokens.into(),
            scope: Arc::clone(scope),
            publisher: 1,
        }
    }

    /// An index holding the honest first block of `tokens` under `s`, and that block's key.
    fn with_first_block(tokens: &[u32], s: &Arc<ScopeInfo>) -> (PrefixIndex, PrefixKey) {
        let mut idx = PrefixIndex::default();
        let first = &tokens[..BLOCK as usize];
        let key = idx.block_key(None, s, first);
        idx.insert(key, entry(7, None, first, s));
        (idx, key)
    }

    #[test]
    fn an_honest_entry_hits() {
        let s = scope(0);
        let tokens: Vec<u32> = (0..8).collect();
        let (mut idx, k0) = with_first_block(&tokens, &s);
        let k1 = idx.block_key(Some(&k0), &s, &tokens[4..8]);
        idx.insert(k1, entry(9, Some(k0), &tokens[4..8], &s));
        assert_eq!(idx.lookup(&s, &tokens, BLOCK, 8), vec![(7, k0), (9, k1)]);
    }

    #[test]
    fn stored_tokens_that_differ_under_a_matching_key_miss() {
        let s = scope(0);
        let tokens: Vec<u32> = (0..4).collect();
        let mut idx = PrefixIndex::default();
        let key = idx.block_key(None, &s, &tokens);
        idx.insert(key, entry(7, None, &[0, 1, 2, 99], &s));
        assert_eq!(idx.lookup(&s, &tokens, BLOCK, 8), vec![]);
    }

    #[test]
    fn a_stored_scope_that_differs_under_a_matching_key_misses() {
        let (mine, other) = (scope(0), scope(1));
        let tokens: Vec<u32> = (0..4).collect();
        let mut idx = PrefixIndex::default();
        let key = idx.block_key(None, &mine, &tokens);
        idx.insert(key, entry(7, None, &tokens, &other));
        assert_eq!(idx.lookup(&mine, &tokens, BLOCK, 8), vec![]);
    }

    #[test]
    fn a_stored_parent_that_differs_under_a_matching_key_misses() {
        let s = scope(0);
        let tokens: Vec<u32> = (0..8).collect();
        let (mut idx, k0) = with_first_block(&tokens, &s);
        let k1 = idx.block_key(Some(&k0), &s, &tokens[4..8]);
        // Same tokens and scope, but published as the second block of another prefix.
        idx.insert(k1, entry(9, Some([0xAB; 32]), &tokens[4..8], &s));
        assert_eq!(idx.lookup(&s, &tokens, BLOCK, 8), vec![(7, k0)]);
        // A first block stored as if it had a parent is not a first block.
        let (mut idx, k0) = with_first_block(&tokens, &s);
        idx.insert(k0, entry(7, Some([0xCD; 32]), &tokens[..4], &s));
        assert_eq!(idx.lookup(&s, &tokens, BLOCK, 8), vec![]);
    }

    #[test]
    fn tenants_with_one_prompt_compute_different_keys() {
        let tokens: Vec<u32> = (0..4).collect();
        let idx = PrefixIndex::default();
        assert_ne!(
            idx.block_key(None, &scope(0), &tokens),
            idx.block_key(None, &scope(1), &tokens)
        );
    }
}
