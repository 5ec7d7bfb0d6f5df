//! The hybrid manager's prefix cache: each table's full blocks published under a chained,
//! scoped key, looked up at start under [`super::prefix_hit_tokens`]' rule.
//!
//! key(table t, block i) = blake3(key(t, i−1) or zeros, scope digest, t, the block's tokens at
//! t's block tokens). Each table chains its own keys because its blocks are its own size. A hit
//! never trusts the hash alone: the stored parent key, scope and tokens must match.
//!
//! The pages themselves live in the pool (`pool.rs`): a published page whose last reference
//! goes is kept cached-free (LRU, evicted when the pool needs a page, never handed out while a
//! step in flight at its release runs). The pool reports evictions in `evicted`, and
//! [`PrefixCache::sync`] unpublishes them here before the next lookup.
//!
//! A model with a recurrent group publishes nothing and never hits: the state after a prefix
//! is overwritten by the next token and is not kept per cached prefix.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kvbench_cache_api::{PrefixHit, PrefixStats, ScopeKey, SeqId};

use crate::cache::prefix::{PrefixKey, ScopeInfo};

use super::layout::{HybridLayout, TableKind};
use super::pool::{PageId, PagePool};
use super::table::SeqEntry;

/// What the index keeps for one published block, to verify hits and report them.
#[derive(Debug)]
struct Entry {
    page: PageId,
    parent: Option<PrefixKey>,
    tokens: Box<[u32]>,
    scope: Arc<ScopeInfo>,
    publisher: SeqId,
}

/// What a sequence publishes: its tokens so far and, per table, the blocks published and the
/// key of the last one (the next block's parent).
#[derive(Debug, Clone)]
struct SeqPrefix {
    scope: Arc<ScopeInfo>,
    tokens: Vec<u32>,
    published_blocks: Vec<u64>,
    last_key: Vec<Option<PrefixKey>>,
}

/// A lookup's answer: the hit tokens and, per table, the pages of the blocks to share (from
/// the table's first held block at the hit) and the key chain up to the hit.
#[derive(Debug, Default)]
pub(crate) struct Lookup {
    pub(crate) hit_tokens: u64,
    /// Per table: (first block shared, its pages in block order).
    pub(crate) pages: Vec<(u64, Vec<PageId>)>,
    pub(crate) hits: Vec<PrefixHit>,
    last_key: Vec<Option<PrefixKey>>,
    pub(crate) scope: Option<Arc<ScopeInfo>>,
}

impl Lookup {
    /// Every page the hit shares.
    pub(crate) fn all_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.pages.iter().flat_map(|(_, p)| p.iter().copied())
    }
}

#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    index: HashMap<(usize, PrefixKey), Entry>,
    /// The key each published page is indexed under.
    page_key: BTreeMap<PageId, (usize, PrefixKey)>,
    seqs: BTreeMap<SeqId, SeqPrefix>,
    pub(crate) stats: PrefixStats,
}

fn block_key(
    parent: Option<&PrefixKey>,
    scope: &ScopeInfo,
    table: usize,
    tokens: &[u32],
) -> PrefixKey {
    let mut msg = Vec::with_capacity(72 + 4 * tokens.len());
    msg.extend_from_slice(parent.unwrap_or(&[0u8; 32]));
    msg.extend_from_slice(&scope.digest);
    msg.extend_from_slice(&(table as u64).to_le_bytes());
    for t in tokens {
        msg.extend_from_slice(&t.to_le_bytes());
    }
    *blake3::hash(&msg).as_bytes()
}

impl PrefixCache {
    /// Unpublish the pages the pool evicted (or flushed) since the last call.
    pub(crate) fn sync(&mut self, pool: &mut PagePool) {
        for page in std::mem::take(&mut pool.evicted) {
            if let Some(key) = self.page_key.remove(&page) {
                self.index.remove(&key);
                self.stats.evictions += 1;
            }
        }
    }

    /// Published pages, for the invariants: (page, whether the index entry points back at it).
    pub(crate) fn published_pages(&self) -> impl Iterator<Item = (PageId, bool)> + '_ {
        self.page_key
            .iter()
            .map(|(&p, k)| (p, self.index.get(k).is_some_and(|e| e.page == p)))
    }

    /// The longest hit for `tokens` under `scope` (none without a scope, with reuse off, or
    /// with a recurrent group). No side effects.
    pub(crate) fn lookup(
        &self,
        layout: &HybridLayout,
        scope: Option<&ScopeKey>,
        tokens: &[u32],
    ) -> Lookup {
        let n = layout.tables.len();
        let none = Lookup {
            pages: vec![(0, Vec::new()); n],
            last_key: vec![None; n],
            ..Lookup::default()
        };
        let Some(scope) = scope.and_then(ScopeInfo::new) else {
            return none;
        };
        if layout.state_bytes_per_sequence != 0 || tokens.len() < 2 {
            return Lookup {
                scope: Some(scope),
                ..none
            };
        }
        // Per table: the key chain over the blocks a hit could cover, and the page each
        // block's key is cached under (None: not cached).
        // Full and MLA tables first, each up to its first miss (a hit needs every block
        // before it); the sliding tables' chains then only up to the shortest of those runs.
        let mut limit = tokens.len() - 1;
        let mut chains: Vec<Vec<(PrefixKey, Option<&Entry>)>> = vec![Vec::new(); n];
        let sliding_last = |t: &usize| matches!(layout.tables[*t].kind, TableKind::Sliding { .. });
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(sliding_last);
        for t in order {
            let spec = &layout.tables[t];
            let sliding = matches!(spec.kind, TableKind::Sliding { .. });
            let bt = spec.block_tokens.max(1) as usize;
            let mut chain = Vec::with_capacity(limit / bt);
            let mut parent: Option<PrefixKey> = None;
            for chunk in tokens[..limit / bt * bt].chunks_exact(bt) {
                let key = block_key(parent.as_ref(), &scope, t, chunk);
                let entry = self.index.get(&(t, key)).filter(|e| {
                    e.parent == parent && e.scope.key == scope.key && *e.tokens == *chunk
                });
                if entry.is_none() && !sliding {
                    break;
                }
                chain.push((key, entry));
                parent = Some(key);
            }
            if !sliding {
                limit = limit.min(chain.len() * bt);
            }
            chains[t] = chain;
        }
        let cached = |t: usize, b: u64| chains[t].get(b as usize).is_some_and(|(_, e)| e.is_some());
        let h = super::prefix_hit_tokens(layout, tokens.len() as u64, cached);
        let mut out = Lookup {
            hit_tokens: h,
            scope: Some(scope.clone()),
            ..none
        };
        for (t, spec) in layout.tables.iter().enumerate() {
            let bt = u64::from(spec.block_tokens.max(1));
            let (first, end) = spec.held_blocks(h);
            let mut pages = Vec::new();
            for b in first..end {
                // The rule checked every held block is cached.
                if let Some((_, Some(e))) = chains[t].get(b as usize) {
                    pages.push(e.page);
                    out.hits.push(PrefixHit {
                        block: e.page,
                        tokens: bt as u32,
                        scope: scope.key.clone(),
                        publisher: e.publisher,
                    });
                }
            }
            out.pages[t] = (first, pages);
            out.last_key[t] = end
                .checked_sub(1)
                .and_then(|b| chains[t].get(b as usize))
                .map(|c| c.0);
        }
        out
    }

    /// `seq` started with `tokens` after `hit` (from [`Self::lookup`]): it publishes its
    /// blocks past the hit as they are written.
    pub(crate) fn track(
        &mut self,
        layout: &HybridLayout,
        seq: SeqId,
        tokens: &[u32],
        hit: &Lookup,
    ) {
        let Some(scope) = hit.scope.clone() else {
            return;
        };
        if layout.state_bytes_per_sequence != 0 {
            return;
        }
        let published_blocks = layout
            .tables
            .iter()
            .map(|s| hit.hit_tokens / u64::from(s.block_tokens.max(1)))
            .collect();
        self.seqs.insert(
            seq,
            SeqPrefix {
                scope,
                tokens: tokens.to_vec(),
                published_blocks,
                last_key: hit.last_key.clone(),
            },
        );
    }

    /// A forked child publishes like its parent from where the parent is.
    pub(crate) fn fork(&mut self, parent: SeqId, child: SeqId) {
        if let Some(p) = self.seqs.get(&parent).cloned() {
            self.seqs.insert(child, p);
        }
    }

    /// `token` is at `position` of `seq`. When a plain `append` (no token) left a gap, the
    /// sequence publishes nothing more: its later blocks' tokens are not known.
    pub(crate) fn push_token(&mut self, seq: SeqId, token: u32, position: u64) -> bool {
        let Some(p) = self.seqs.get_mut(&seq) else {
            return false;
        };
        if p.tokens.len() as u64 != position {
            self.seqs.remove(&seq);
            return false;
        }
        p.tokens.push(token);
        true
    }

    pub(crate) fn pop_token(&mut self, seq: SeqId) {
        if let Some(p) = self.seqs.get_mut(&seq) {
            p.tokens.pop();
        }
    }

    pub(crate) fn forget(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }

    /// Publish every full block `seq` has written that it has not published yet, before the
    /// sliding tables trim (a trimmed published page stays cached-free). A block whose key is
    /// already cached (another sequence wrote the same prefix) stays private. Blocks past the
    /// tokens it knows (an `append` without its token) are never published, and the chain
    /// stops there.
    pub(crate) fn publish(
        &mut self,
        layout: &HybridLayout,
        pool: &mut PagePool,
        seq: SeqId,
        entry: &SeqEntry,
    ) {
        let Some(p) = self.seqs.get_mut(&seq) else {
            return;
        };
        let known = (entry.written).min(p.tokens.len() as u64);
        for (t, (spec, table)) in layout.tables.iter().zip(&entry.tables).enumerate() {
            let bt = u64::from(spec.block_tokens.max(1));
            let full = known / bt;
            while p.published_blocks[t] < full {
                let b = p.published_blocks[t];
                let chunk = &p.tokens[(b * bt) as usize..((b + 1) * bt) as usize];
                let key = block_key(p.last_key[t].as_ref(), &p.scope, t, chunk);
                let page = b
                    .checked_sub(table.first_block)
                    .and_then(|i| table.pages.get(i as usize).copied());
                if let Some(page) = page {
                    if !self.index.contains_key(&(t, key)) && !pool.is_published(page) {
                        pool.publish(page);
                        self.page_key.insert(page, (t, key));
                        self.index.insert(
                            (t, key),
                            Entry {
                                page,
                                parent: p.last_key[t],
                                tokens: chunk.into(),
                                scope: p.scope.clone(),
                                publisher: seq,
                            },
                        );
                    }
                }
                p.last_key[t] = Some(key);
                p.published_blocks[t] = b + 1;
            }
        }
    }
}
