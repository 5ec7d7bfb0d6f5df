//! The hybrid manager's prefix cache: each table's full blocks published under a chained,
//! scoped key, looked up at start under [`super::prefix_hit_tokens`]' rule.
//!
//! key(table t, block i) = blake3(key(t, i−1) or zeros, scope digest, t, the block's tokens at
//! t's block tokens). Each table chains its own keys because its blocks are its own size. A hit
//! never trusts the hash alone: the stored table, parent key, scope and tokens must match.
//!
//! Keys cost a blake3 each, and the engine probes a waiting sequence at every step until it
//! starts, so a sequence's keys are computed once: a [`Chain`] (its tokens, and per table the
//! keys of its leading full blocks so far) is kept for a probed sequence, moves with it when it
//! starts, is extended as its blocks are published, and goes back to the probed ones when it is
//! preempted (it will be probed again with the same tokens and more). A chain is checked against
//! the tokens of every probe (a slice comparison), so a changed prompt recomputes from where it
//! differs, never reuses a wrong key. The index hashes the keys, already uniform, with the
//! summed manager's `KeyHasher`.
//!
//! The pages themselves live in the pool (`pool.rs`): a published page whose last reference
//! goes is kept cached-free (evicted in `cache.eviction`'s order when the pool needs a page,
//! never handed out while a step in flight at its release runs; `cached_free.rs`). The pool
//! reports evictions in `evicted` and a flush's unpublished pages in `unpublished`, and
//! [`PrefixCache::sync`] unpublishes both here before the next lookup.
//!
//! A model with a recurrent group keeps its state only at checkpoints (`checkpoint_tokens`
//! apart, 0: none): the state after a prefix is overwritten by the next token, so a hit is cut
//! down to the deepest checkpoint it reaches, and the rest of the prompt is recomputed. A
//! checkpoint is `state_pages` pages of the pool, indexed under its own key (the key of the
//! first table's block ending at it, hashed again) and published in the logical block it ends,
//! so it is evicted with that block; evicting or flushing any page of it drops all of it.
//! Without checkpoints such a model publishes nothing and never hits.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use kvbench_cache_api::{KeyedTokens, PrefixHit, PrefixStats, ReleaseReason, ScopeKey, SeqId};

use crate::cache::prefix::{KeyHasher, PrefixKey, ScopeInfo};

use super::layout::{HybridLayout, TableKind};
use super::pool::{PageId, PagePool};
use super::table::SeqEntry;

/// At most this many probed-but-not-started sequences keep their chain (the engine probes the
/// head of its queue, so a few; the oldest id goes first past it).
const MAX_WAITING_CHAINS: usize = 256;

/// What the index keeps for one published block, to verify hits and report them.
#[derive(Debug)]
struct Entry {
    table: usize,
    page: PageId,
    parent: Option<PrefixKey>,
    tokens: Box<[u32]>,
    scope: Arc<ScopeInfo>,
    publisher: SeqId,
}

/// A recurrent-state checkpoint in the index: the state after the first `tokens` tokens.
#[derive(Debug)]
struct Checkpoint {
    pages: Vec<PageId>,
    tokens: u64,
    scope: Arc<ScopeInfo>,
}

/// The key a checkpoint after a prefix is indexed under, from the first table's key of the
/// block that ends at it (distinct from every block key).
fn checkpoint_key(block: &PrefixKey) -> PrefixKey {
    let mut msg = Vec::with_capacity(64);
    msg.extend_from_slice(block);
    msg.extend_from_slice(b"recurrent state checkpoint");
    *blake3::hash(&msg).as_bytes()
}

/// A sequence's tokens and, per table, the keys of its leading full blocks computed so far
/// (`keys[t][b]` covers `tokens[..(b + 1) × block_tokens]`).
#[derive(Debug, Clone)]
struct Chain {
    scope: Arc<ScopeInfo>,
    tokens: Vec<u32>,
    block_tokens: Vec<usize>,
    keys: Vec<Vec<PrefixKey>>,
}

/// Tokens `a` and `b` agree on from the start (slice comparisons, a 64-token run at a time).
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 64 <= n && a[i..i + 64] == b[i..i + 64] {
        i += 64;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

impl Chain {
    fn new(scope: Arc<ScopeInfo>, layout: &HybridLayout) -> Chain {
        Chain {
            scope,
            tokens: Vec::new(),
            block_tokens: layout
                .tables
                .iter()
                .map(|s| s.block_tokens.max(1) as usize)
                .collect(),
            keys: vec![Vec::new(); layout.tables.len()],
        }
    }

    /// The chain now describes `tokens`: keys of blocks they no longer agree with are dropped.
    fn follow(&mut self, tokens: &[u32]) {
        if self.tokens.as_slice() == tokens {
            return;
        }
        let common = common_prefix(&self.tokens, tokens);
        for (keys, bt) in self.keys.iter_mut().zip(&self.block_tokens) {
            keys.truncate(common / bt);
        }
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
    }

    /// The key of table `t`'s block `b` (its tokens must be known), computing the missing ones
    /// before it; `hashed` counts the blake3 calls.
    fn key(&mut self, t: usize, b: usize, hashed: &Cell<u64>) -> PrefixKey {
        let bt = self.block_tokens[t];
        while self.keys[t].len() <= b {
            let i = self.keys[t].len();
            let parent = i.checked_sub(1).map(|j| self.keys[t][j]);
            let chunk = &self.tokens[i * bt..(i + 1) * bt];
            let key = block_key(parent.as_ref(), &self.scope, t, chunk);
            hashed.set(hashed.get() + 1);
            self.keys[t].push(key);
        }
        self.keys[t][b]
    }

    /// The key before table `t`'s block `b` (none for the first), already computed.
    fn parent(&self, t: usize, b: usize) -> Option<PrefixKey> {
        b.checked_sub(1).map(|j| self.keys[t][j])
    }
}

/// What a started sequence publishes: its chain and, per table, the blocks published.
#[derive(Debug, Clone)]
struct SeqPrefix {
    chain: Chain,
    published_blocks: Vec<u64>,
}

/// A lookup's answer: the hit tokens and, per table, the pages of the blocks to share (from
/// the table's first held block at the hit).
#[derive(Debug, Default)]
pub(crate) struct Lookup {
    pub(crate) hit_tokens: u64,
    /// Per table: (first block shared, its pages in block order).
    pub(crate) pages: Vec<(u64, Vec<PageId>)>,
    pub(crate) hits: Vec<PrefixHit>,
    pub(crate) scope: Option<Arc<ScopeInfo>>,
    /// A recurrent model's hit: the checkpoint it resumes from (its pages), the state after
    /// the hit's `hit_tokens` (under the planted off-by-one, one interval before them).
    pub(crate) checkpoint: Option<Vec<PageId>>,
    /// The planted off-by-one moved this hit a block past its checkpoint.
    pub(crate) shifted: bool,
}

impl Lookup {
    /// Every page the hit shares (a checkpoint's pages with the tables').
    pub(crate) fn all_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.pages
            .iter()
            .flat_map(|(_, p)| p.iter().copied())
            .chain(self.checkpoint.iter().flatten().copied())
    }
}

#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    index: HashMap<PrefixKey, Entry, BuildHasherDefault<KeyHasher>>,
    checkpoints: HashMap<PrefixKey, Checkpoint, BuildHasherDefault<KeyHasher>>,
    /// Tokens between a recurrent model's state checkpoints (0: none kept, and no hit).
    pub(crate) checkpoint_tokens: u64,
    /// Test fault (`Fault::CheckpointOffByOne`): a hit reaches one block past its checkpoint.
    pub(crate) checkpoint_off_by_one: bool,
    /// The key each published page is indexed under, by page.
    page_key: Vec<Option<PrefixKey>>,
    seqs: BTreeMap<SeqId, SeqPrefix>,
    /// Chains of sequences probed (or preempted) and not started since.
    waiting: RefCell<BTreeMap<SeqId, Chain>>,
    /// blake3 block keys computed, ever (what the chains save).
    keys_hashed: Cell<u64>,
    /// Test fault ([`super::HybridFault::PublishEarly`]): publish mapped, unwritten blocks.
    pub(crate) publish_early: bool,
    /// Blocks published before they were written (the fault fired).
    pub(crate) published_early: u64,
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
    /// Unpublish the pages the pool evicted (counted) or a flush unpublished (not counted: the
    /// summed manager counts evictions for new content only) since the last call.
    pub(crate) fn sync(&mut self, pool: &mut PagePool) {
        for page in std::mem::take(&mut pool.evicted) {
            pool.touch(page);
            if let Some(key) = self.page_key.get_mut(page as usize).and_then(Option::take) {
                if self.index.remove(&key).is_some() {
                    self.stats.evictions += 1;
                } else {
                    self.drop_checkpoint(pool, &key);
                }
            }
        }
        for page in std::mem::take(&mut pool.unpublished) {
            pool.touch(page);
            if let Some(key) = self.page_key.get_mut(page as usize).and_then(Option::take) {
                if self.index.remove(&key).is_none() {
                    self.drop_checkpoint(pool, &key);
                }
            }
        }
    }

    /// The checkpoint under `key` leaves the index, every page of it with it.
    fn drop_checkpoint(&mut self, pool: &mut PagePool, key: &PrefixKey) {
        let Some(cp) = self.checkpoints.remove(key) else {
            return;
        };
        for page in cp.pages {
            if let Some(k) = self.page_key.get_mut(page as usize) {
                if *k == Some(*key) {
                    *k = None;
                    pool.unpublish_page(page);
                }
            }
        }
    }

    /// The key `seq`'s checkpoint after its first `tokens` tokens goes under, and its scope;
    /// `None` where its tokens there are not known, `tokens` is not a whole number of the first
    /// table's blocks, or the index already keeps that checkpoint.
    pub(crate) fn checkpoint_key(
        &mut self,
        seq: SeqId,
        tokens: u64,
    ) -> Option<(PrefixKey, Arc<ScopeInfo>)> {
        let p = self.seqs.get_mut(&seq)?;
        let bt = *p.chain.block_tokens.first()? as u64;
        if tokens == 0 || !tokens.is_multiple_of(bt) || (p.chain.tokens.len() as u64) < tokens {
            return None;
        }
        let block = p
            .chain
            .key(0, (tokens / bt - 1) as usize, &self.keys_hashed);
        let key = checkpoint_key(&block);
        if self.checkpoints.contains_key(&key) {
            return None;
        }
        Some((key, p.chain.scope.clone()))
    }

    /// Index `pages` (held) as the checkpoint under `key`, the state after `tokens` tokens of
    /// `seq` (the step that saves it has begun): they are published in the logical block
    /// ending at `tokens`, so they are evicted with it. `false` (nothing done) when the index
    /// has one under that key already.
    pub(crate) fn publish_checkpoint(
        &mut self,
        pool: &mut PagePool,
        seq: SeqId,
        tokens: u64,
        (key, scope): (PrefixKey, Arc<ScopeInfo>),
        pages: &[PageId],
    ) -> bool {
        if self.checkpoints.contains_key(&key) {
            return false;
        }
        let depth = tokens.saturating_sub(1) / self.checkpoint_tokens.max(1);
        for &page in pages {
            pool.publish(page, depth, (seq, tokens));
            let i = page as usize;
            if self.page_key.len() <= i {
                self.page_key.resize(i + 1, None);
            }
            self.page_key[i] = Some(key);
        }
        self.checkpoints.insert(
            key,
            Checkpoint {
                pages: pages.to_vec(),
                tokens,
                scope,
            },
        );
        true
    }

    /// Recurrent-state checkpoints in the index.
    pub(crate) fn checkpoints_kept(&self) -> usize {
        self.checkpoints.len()
    }

    /// Whether a model with this layout may hit at all: one with a recurrent group only where
    /// it keeps checkpoints.
    fn hits_possible(&self, layout: &HybridLayout) -> bool {
        layout.state_bytes_per_sequence == 0 || self.checkpoint_tokens > 0
    }

    /// Published pages, for the invariants: (page, whether the index entry points back at it).
    pub(crate) fn published_pages(&self) -> impl Iterator<Item = (PageId, bool)> + '_ {
        self.page_key.iter().enumerate().filter_map(|(p, k)| {
            let p = p as PageId;
            k.map(|k| (p, self.names(&k, p)))
        })
    }

    /// Whether the entry under `key` (a block's or a checkpoint's) names `page`.
    fn names(&self, key: &PrefixKey, page: PageId) -> bool {
        match self.index.get(key) {
            Some(e) => e.page == page,
            None => self
                .checkpoints
                .get(key)
                .is_some_and(|c| c.pages.contains(&page)),
        }
    }

    /// Whether `page` is indexed, and if so whether its entry names it.
    pub(crate) fn indexed(&self, page: PageId) -> Option<bool> {
        let key = self.page_key.get(page as usize).copied().flatten()?;
        Some(self.names(&key, page))
    }

    /// blake3 block keys computed so far.
    pub(crate) fn keys_hashed(&self) -> u64 {
        self.keys_hashed.get()
    }

    /// The longest hit for `seq`'s `tokens` under `scope` (none without a scope, with reuse
    /// off, or with a recurrent group). Changes nothing but `seq`'s cached chain.
    pub(crate) fn lookup(
        &self,
        layout: &HybridLayout,
        seq: SeqId,
        scope: Option<&ScopeKey>,
        tokens: &[u32],
    ) -> Lookup {
        let n = layout.tables.len();
        let none = Lookup {
            pages: vec![(0, Vec::new()); n],
            ..Lookup::default()
        };
        let Some(scope) = scope else {
            return none;
        };
        let mut waiting = self.waiting.borrow_mut();
        let known = waiting
            .get(&seq)
            .filter(|c| c.scope.key == *scope)
            .map(|c| c.scope.clone());
        let Some(info) = known.or_else(|| ScopeInfo::new(scope)) else {
            return none;
        };
        if !self.hits_possible(layout) || tokens.len() < 2 {
            return Lookup {
                scope: Some(info),
                ..none
            };
        }
        if waiting
            .get(&seq)
            .is_none_or(|c| !Arc::ptr_eq(&c.scope, &info))
        {
            if waiting.len() >= MAX_WAITING_CHAINS {
                waiting.pop_first();
            }
            waiting.insert(seq, Chain::new(info.clone(), layout));
        }
        let Some(chain) = waiting.get_mut(&seq) else {
            return none;
        };
        chain.follow(tokens);
        // Per table, the page each block's key is cached under (None: not cached). Full and
        // MLA tables first, each up to its first miss (a hit needs every block before it); the
        // sliding tables only up to the shortest of those runs.
        let mut limit = tokens.len() - 1;
        let mut found: Vec<Vec<Option<&Entry>>> = vec![Vec::new(); n];
        let sliding_last = |t: &usize| matches!(layout.tables[*t].kind, TableKind::Sliding { .. });
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(sliding_last);
        for t in order {
            let sliding = sliding_last(&t);
            let bt = chain.block_tokens[t];
            let blocks = limit / bt;
            let mut run = Vec::with_capacity(blocks);
            for b in 0..blocks {
                let key = chain.key(t, b, &self.keys_hashed);
                let parent = chain.parent(t, b);
                let chunk = &tokens[b * bt..(b + 1) * bt];
                let entry = self.index.get(&key).filter(|e| {
                    e.table == t
                        && e.parent == parent
                        && e.scope.key == info.key
                        && *e.tokens == *chunk
                });
                if entry.is_none() && !sliding {
                    break;
                }
                run.push(entry);
            }
            if !sliding {
                limit = limit.min(run.len() * bt);
            }
            found[t] = run;
        }
        let cached = |t: usize, b: u64| found[t].get(b as usize).is_some_and(Option::is_some);
        let mut h = super::prefix::hit_tokens_by_tables(layout, tokens.len() as u64, cached);
        let mut checkpoint = None;
        let mut shifted = false;
        if layout.state_bytes_per_sequence != 0 {
            // The deepest checkpoint the tables' hit reaches, where every table holds what a
            // sequence of that many tokens needs (a sliding table's window there).
            let tables_hold = |h: u64| {
                layout.tables.iter().enumerate().all(|(i, t)| {
                    let (first, end) = t.held_blocks(h);
                    (first..end).all(|b| cached(i, b))
                })
            };
            let ct = self.checkpoint_tokens;
            let bt0 = chain.block_tokens[0] as u64;
            let mut kept = |c: u64| {
                let key = checkpoint_key(&chain.key(0, (c / bt0 - 1) as usize, &self.keys_hashed));
                self.checkpoints
                    .get(&key)
                    .filter(|cp| cp.tokens == c && cp.scope.key == info.key)
                    .map(|cp| cp.pages.clone())
            };
            let mut c = h / ct * ct;
            h = 0;
            while c > 0 {
                if let Some(pages) = kept(c).filter(|_| tables_hold(c)) {
                    h = c;
                    checkpoint = Some(pages);
                    break;
                }
                c -= ct;
            }
            // The planted bug: resume from the checkpoint one interval before the hit's.
            if self.checkpoint_off_by_one && h > ct {
                if let Some(pages) = kept(h - ct) {
                    checkpoint = Some(pages);
                    shifted = true;
                }
            }
        }
        let mut out = Lookup {
            hit_tokens: h,
            scope: Some(info.clone()),
            checkpoint,
            shifted,
            ..none
        };
        for (t, spec) in layout.tables.iter().enumerate() {
            let (first, end) = spec.held_blocks(h);
            let mut pages = Vec::new();
            for b in first..end {
                // The rule checked every held block is cached.
                if let Some(Some(e)) = found[t].get(b as usize) {
                    pages.push(e.page);
                    out.hits.push(PrefixHit {
                        block: e.page,
                        tokens: spec.block_tokens.max(1),
                        scope: info.key.clone(),
                        publisher: e.publisher,
                    });
                }
            }
            out.pages[t] = (first, pages);
        }
        out
    }

    /// `seq` started with `tokens` after `hit` (from [`Self::lookup`]): it takes its chain from
    /// the probed ones and publishes its blocks past the hit as they are written.
    pub(crate) fn track(
        &mut self,
        layout: &HybridLayout,
        seq: SeqId,
        tokens: &[u32],
        hit: &Lookup,
    ) {
        let chain = self.waiting.get_mut().remove(&seq);
        let Some(scope) = hit.scope.clone() else {
            return;
        };
        if !self.hits_possible(layout) {
            return;
        }
        let mut chain = chain
            .filter(|c| Arc::ptr_eq(&c.scope, &scope))
            .unwrap_or_else(|| Chain::new(scope, layout));
        chain.follow(tokens);
        let published_blocks = chain
            .block_tokens
            .iter()
            .map(|&bt| hit.hit_tokens / bt as u64)
            .collect();
        self.seqs.insert(
            seq,
            SeqPrefix {
                chain,
                published_blocks,
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
        if p.chain.tokens.len() as u64 != position {
            self.seqs.remove(&seq);
            return false;
        }
        p.chain.tokens.push(token);
        true
    }

    /// The tokens `seq`'s keys are built from (`KvCacheManager::keyed_tokens`).
    pub(crate) fn keyed_tokens(&self, seq: SeqId) -> Option<KeyedTokens<'_>> {
        self.seqs.get(&seq).map(|p| KeyedTokens {
            head: &p.chain.tokens,
            tail: &[],
        })
    }

    /// A refused append takes its token back (and any key that covered it).
    pub(crate) fn pop_token(&mut self, seq: SeqId) {
        if let Some(p) = self.seqs.get_mut(&seq) {
            p.chain.tokens.pop();
            let len = p.chain.tokens.len();
            for (keys, bt) in p.chain.keys.iter_mut().zip(&p.chain.block_tokens) {
                keys.truncate(len / bt);
            }
        }
    }

    /// `seq` let go of its pages. A preempted one will be probed again with the tokens it knew
    /// (and its keys): its chain waits for that.
    pub(crate) fn forget(&mut self, seq: SeqId, why: ReleaseReason) {
        let Some(p) = self.seqs.remove(&seq) else {
            return;
        };
        if why == ReleaseReason::Preempt {
            let waiting = self.waiting.get_mut();
            if waiting.len() >= MAX_WAITING_CHAINS {
                waiting.pop_first();
            }
            waiting.insert(seq, p.chain);
        }
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
        // The planted bug: what is mapped counts as written.
        let upto = if self.publish_early {
            entry.tokens
        } else {
            entry.written
        };
        let known = upto.min(p.chain.tokens.len() as u64);
        for (t, table) in entry.tables.iter().enumerate().take(layout.tables.len()) {
            let bt = p.chain.block_tokens[t] as u64;
            let full = known / bt;
            while p.published_blocks[t] < full {
                let b = p.published_blocks[t];
                let key = p.chain.key(t, b as usize, &self.keys_hashed);
                let page = b
                    .checked_sub(table.first_block)
                    .and_then(|i| table.pages.get(i as usize).copied());
                if let Some(page) = page {
                    // A block this sequence computed itself although its key is cached (a hit
                    // another table's window cut short): its copy supersedes the cached one, so
                    // every table's page of the block belongs to one logical block again, held
                    // while this sequence runs. Keeping the old entry would split the block: the
                    // old full pages would stay cached while this sequence's window pages, in a
                    // block of their own that no table holds, are evicted first — and every
                    // later hit of the prompt needs them.
                    let stale = self
                        .index
                        .get(&key)
                        .map(|e| e.page)
                        .filter(|&old| old != page && !pool.is_published(page));
                    if let Some(old) = stale {
                        self.index.remove(&key);
                        if let Some(k) = self.page_key.get_mut(old as usize) {
                            *k = None;
                        }
                        pool.unpublish_page(old);
                    }
                    if !self.index.contains_key(&key) && !pool.is_published(page) {
                        if (b + 1) * bt > entry.written {
                            self.published_early += 1;
                        }
                        pool.publish(page, b, (seq, (b + 1) * bt));
                        let i = page as usize;
                        if self.page_key.len() <= i {
                            self.page_key.resize(i + 1, None);
                        }
                        self.page_key[i] = Some(key);
                        let chunk = &p.chain.tokens[(b * bt) as usize..((b + 1) * bt) as usize];
                        self.index.insert(
                            key,
                            Entry {
                                table: t,
                                page,
                                parent: p.chain.parent(t, b as usize),
                                tokens: chunk.into(),
                                scope: p.chain.scope.clone(),
                                publisher: seq,
                            },
                        );
                    }
                }
                p.published_blocks[t] = b + 1;
            }
        }
    }
}
