//! Structural invariants of the paged cache, recomputed from scratch (never from the counters
//! they check), and the quiescence check run after every scenario. The engine's per-step check
//! is incremental (`check_incremental.rs`: what changed since the last check, this full walk
//! every `walk_period` checks and whenever it finds anything); the pieces below are shared by both.

use kvbench_cache_api::{KvCacheManager, SeqId};

use super::block::{BlockMeta, BlockState};
use super::state::PagedCache;
use super::table::Seq;

/// Collects problems instead of stopping at the first, so one report explains a failure.
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, p: String) {
        if self.0.len() < 20 {
            self.0.push(p);
        }
    }
    fn into_result(self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0.join("; "))
        }
    }
}

/// Indices of the per-state block counts (`BlockState as usize`).
const FREE: usize = BlockState::Free as usize;
const MAPPED: usize = BlockState::Mapped as usize;
const PENDING: usize = BlockState::Pending as usize;
const CACHED: usize = BlockState::Cached as usize;

/// The engine's per-step check: incremental (see `check_incremental.rs`), reporting what the
/// full walk reports whenever it finds anything.
pub(crate) fn check_paged(c: &PagedCache) -> Result<(), String> {
    let mut inc = c.incremental.borrow_mut();
    if inc.full_due(c.pool.total_blocks()) || inc.update(&c.pool, &c.seqs).is_err() {
        inc.full_walks += 1;
        let out = check_full(c);
        if out.is_ok() {
            inc.rebuild(&c.pool, &c.seqs);
        } else {
            inc.invalidate();
        }
        return out;
    }
    let mut p = Problems(Vec::new());
    // Handing out a layout counts corrupted ones (`fault_fired`): a check that ends in the full
    // walk below must count them once, as the walk alone did.
    let bad_layouts_read = c.bad_layouts_read.get();
    recorded(c, &mut p);
    let bs = c.pool.block_size;
    for id in inc.changed() {
        if let Some(s) = c.seqs.get(id) {
            check_seq(*id, s, bs, &mut p);
        }
    }
    for (&id, s) in &c.seqs {
        if s.bad_layout.is_some() {
            check_layout(c, id, s, &mut p);
        }
    }
    let pool = &c.pool;
    for &b in inc.dirty() {
        let m = &pool.meta[b as usize];
        check_block(c, b, m, inc.refs(b), &mut p);
        let free = inc.on_free(b);
        if free > 1 {
            p.push(format!("block {b} is on the free list twice"));
        }
        if (free > 0) != (m.state == BlockState::Free) {
            p.push(format!(
                "block {b} is {:?} and on the free list {free} times",
                m.state
            ));
        }
        let evictable = pool.is_evictable(b);
        if evictable != (m.state == BlockState::Cached) {
            p.push(format!(
                "block {b} is {:?} and in the eviction order: {evictable}",
                m.state
            ));
        }
    }
    totals(
        c,
        &inc.counts,
        inc.live_slots,
        inc.keyed,
        pool.evictable_len(),
        false,
        &mut p,
    );
    inc.clear_dirty();
    if p.0.is_empty() {
        return Ok(());
    }
    // Reported as the full walk words it (what it finds first, in its order); the copies are
    // rebuilt by the next check's walk.
    inc.invalidate();
    inc.full_walks += 1;
    c.bad_layouts_read.set(bad_layouts_read);
    check_full(c).and(p.into_result())
}

/// Every invariant recomputed from the whole state: every block, the whole free list and
/// eviction order.
pub(crate) fn check_full(c: &PagedCache) -> Result<(), String> {
    let mut p = Problems(Vec::new());
    let pool = &c.pool;
    let bs = pool.block_size;
    let total = pool.total_blocks() as usize;
    recorded(c, &mut p);

    // Ref count = block-table references (the prefix cache holds none).
    let mut table_refs = vec![0u32; total];
    let mut ids: Vec<SeqId> = c.seqs.keys().copied().collect();
    ids.sort_unstable();
    for &id in &ids {
        let s = &c.seqs[&id];
        check_seq(id, s, bs, &mut p);
        for &b in &s.blocks {
            match table_refs.get_mut(b as usize) {
                Some(r) => *r += 1,
                None => p.push(format!("seq {id} maps block {b} beyond the pool")),
            }
        }
        check_layout(c, id, s, &mut p);
    }

    // Blocks in each state, counted in an array (a map keyed by the state's name compared
    // strings for every block at every check).
    let mut counts = [0u32; 4];
    let mut live_slots = 0u64;
    let mut keyed = 0usize;
    for (b, m) in pool.meta.iter().enumerate() {
        counts[m.state as usize] += 1;
        check_block(c, b as u32, m, table_refs[b], &mut p);
        if m.state == BlockState::Mapped {
            live_slots += u64::from(m.written_slots);
        }
        keyed += usize::from(m.key.is_some());
    }

    let mut on_free = vec![false; total];
    for b in pool.free_list() {
        if std::mem::replace(&mut on_free[b as usize], true) {
            p.push(format!("block {b} is on the free list twice"));
        }
        if pool.meta[b as usize].state != BlockState::Free {
            p.push(format!(
                "block {b} is on the free list but {:?}",
                pool.meta[b as usize].state
            ));
        }
    }
    let evictable = pool.eviction_order();
    let mut in_order = vec![false; total];
    for &b in &evictable {
        if std::mem::replace(&mut in_order[b as usize], true) {
            p.push(format!("block {b} is in the eviction order twice"));
        }
        if pool.meta[b as usize].state != BlockState::Cached {
            p.push(format!(
                "block {b} is in the eviction order but {:?}",
                pool.meta[b as usize].state
            ));
        }
    }
    totals(c, &counts, live_slots, keyed, evictable.len(), true, &mut p);
    p.into_result()
}

/// What the manager recorded as it went: protocol errors, fault effects, early reuse.
fn recorded(c: &PagedCache, p: &mut Problems) {
    for v in &c.violations {
        p.push(v.clone());
    }
    for &(block, fence) in &c.pool.early_reuse {
        p.push(format!(
            "block {block} handed out for new content while its fence step {fence} was in flight"
        ));
    }
}

/// One sequence's lengths against its table.
fn check_seq(id: SeqId, s: &Seq, bs: u32, p: &mut Problems) {
    if s.blocks.len() as u32 != s.len_tokens.div_ceil(bs) {
        p.push(format!(
            "seq {id}: {} blocks for {} tokens",
            s.blocks.len(),
            s.len_tokens
        ));
    }
    if s.filled_tokens > s.len_tokens {
        p.push(format!(
            "seq {id}: {} filled of {} tokens",
            s.filled_tokens, s.len_tokens
        ));
    }
}

/// The layout handed out (what a backend reads) against the block table.
fn check_layout(c: &PagedCache, id: SeqId, s: &Seq, p: &mut Problems) {
    if let Some(kvbench_cache_api::SeqLayout::Paged { blocks, .. }) = c.layout(id) {
        if let Some(i) = blocks.iter().zip(&s.blocks).position(|(a, b)| a != b) {
            p.push(format!(
                "seq {id}: layout maps logical block {i} to {} but the block table says {}",
                blocks[i], s.blocks[i]
            ));
        }
    }
}

/// One block's state against its `table_refs` block-table references and the prefix index.
fn check_block(c: &PagedCache, b: u32, m: &BlockMeta, table_refs: u32, p: &mut Problems) {
    if m.ref_count != table_refs {
        p.push(format!(
            "block {b}: ref count {} but {table_refs} block-table references",
            m.ref_count
        ));
    }
    if (m.state == BlockState::Mapped) != (table_refs > 0) {
        let name = match m.state {
            BlockState::Free => "free",
            BlockState::Mapped => "mapped",
            BlockState::Pending => "pending",
            BlockState::Cached => "cached",
        };
        p.push(format!(
            "block {b} is {name} with {table_refs} block-table references"
        ));
    }
    if m.state == BlockState::Cached && m.key.is_none() {
        p.push(format!("block {b} is cached without a prefix key"));
    }
    if m.state == BlockState::Free && m.key.is_some() {
        p.push(format!("block {b} is free but still published"));
    }
    if let Some(key) = &m.key {
        match c.index.get(key) {
            Some(e) if e.block == b => {}
            _ => p.push(format!(
                "block {b} carries a key the index does not map to it"
            )),
        }
    }
}

/// The pool's counters against the blocks counted per state (`counts`), their live slots and
/// keyed blocks, and the eviction order's length; the fence queue, the index's size, the
/// accounting and the lower tiers — every slot of them with `tier_walk`, else their counters.
fn totals(
    c: &PagedCache,
    counts: &[u32; 4],
    live_slots: u64,
    keyed: usize,
    evictable: usize,
    tier_walk: bool,
    p: &mut Problems,
) {
    let pool = &c.pool;
    // Every keyed block's key maps to it, so the keys are distinct and all in the index: the
    // index holds nothing else exactly when it has as many keys. Only then is it walked, to
    // name what it holds besides (walking and sorting it at every step was most of a run
    // checked at every step).
    if c.index.len() != keyed {
        let mut misnamed: Vec<u32> = c
            .index
            .entries()
            .filter(|&(b, key)| pool.meta.get(b as usize).and_then(|m| m.key) != Some(key))
            .map(|(b, _)| b)
            .collect();
        misnamed.sort_unstable();
        for &b in &misnamed {
            p.push(format!(
                "index names block {b} which does not carry that key"
            ));
        }
        if misnamed.is_empty() {
            p.push(format!(
                "the index holds {} keys but {keyed} blocks carry one",
                c.index.len()
            ));
        }
    }
    if counts[FREE] != pool.free_blocks() {
        p.push(format!(
            "{} free blocks but {} on the free list",
            counts[FREE],
            pool.free_blocks()
        ));
    }
    if counts[CACHED] != evictable as u32 || counts[CACHED] != pool.cached_blocks {
        p.push(format!(
            "{} cached blocks, {evictable} in the eviction order, counter {}",
            counts[CACHED], pool.cached_blocks
        ));
    }
    if counts[PENDING] != pool.pending_blocks || counts[MAPPED] != pool.mapped_blocks {
        p.push(format!(
            "pending {} (counter {}), mapped {} (counter {})",
            counts[PENDING], pool.pending_blocks, counts[MAPPED], pool.mapped_blocks
        ));
    }
    let fenced = pool
        .fence
        .pending()
        .filter(|(_, (b, generation))| {
            pool.meta
                .get(*b as usize)
                .is_some_and(|m| m.state == BlockState::Pending && m.generation == *generation)
        })
        .count();
    if fenced as u32 != counts[PENDING] {
        p.push(format!(
            "{} pending blocks but {fenced} live fence entries",
            counts[PENDING]
        ));
    }
    if live_slots != pool.live_slots {
        p.push(format!(
            "live slots {live_slots} but counter {}",
            pool.live_slots
        ));
    }
    let acc = c.accounting();
    if !acc.is_conserved() {
        p.push(format!("accounting not conserved: {acc:?}"));
    }
    if let Some(tiers) = &c.tiers {
        let mut found = Vec::new();
        if tier_walk {
            tiers.check(&mut found);
        } else {
            tiers.check_counters(&mut found);
        }
        for f in found {
            p.push(f);
        }
    }
}

pub(crate) fn quiescent_paged(c: &PagedCache) -> Result<(), String> {
    let mut p = Problems(Vec::new());
    if let Err(e) = check_full(c) {
        p.push(e);
    }
    if !c.seqs.is_empty() {
        let mut ids: Vec<SeqId> = c.seqs.keys().copied().collect();
        ids.sort_unstable();
        p.push(format!("{} live sequences: {ids:?}", ids.len()));
    }
    let held: Vec<u32> = c
        .pool
        .meta
        .iter()
        .enumerate()
        .filter(|(_, m)| m.ref_count > 0)
        .map(|(b, _)| b as u32)
        .collect();
    if !held.is_empty() {
        p.push(format!(
            "{} blocks with nonzero ref count (first {:?})",
            held.len(),
            &held[..held.len().min(8)]
        ));
    }
    if c.pool.pending_blocks > 0 {
        p.push(format!(
            "{} blocks pending behind fences",
            c.pool.pending_blocks
        ));
    }
    if c.pool.fence.in_flight_len() > 0 {
        let steps: Vec<_> = c.pool.fence.in_flight().collect();
        p.push(format!("steps still in flight: {steps:?}"));
    }
    if let Some(tiers) = &c.tiers {
        let mut found = Vec::new();
        tiers.quiescent(&mut found);
        for f in found {
            p.push(f);
        }
    }
    let free_or_cached = c.pool.free_blocks() + c.pool.cached_blocks;
    if free_or_cached != c.pool.total_blocks() {
        p.push(format!(
            "free {} + cached {} != total {}",
            c.pool.free_blocks(),
            c.pool.cached_blocks,
            c.pool.total_blocks()
        ));
    }
    p.into_result()
}

impl PagedCache {
    /// Every invariant recomputed from the whole state, as the run's end does (the engine's
    /// `check_invariants` is incremental).
    pub fn check_invariants_full(&self) -> Result<(), String> {
        check_full(self)
    }

    /// Full walks the invariant checks ran so far (the first check, then one every
    /// `max(64, blocks / 8)` checks, and the check after any problem).
    pub fn invariant_full_walks(&self) -> u64 {
        self.incremental.borrow().full_walks
    }
}

#[cfg(test)]
mod tests {
    //! The index cross-check, which no longer walks the index unless its size disagrees: a key
    //! taken out of the index and an entry naming a block that does not carry its key are both
    //! still named.
    use kvbench_cache_api::{KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest};

    use crate::cache::prefix::Published;
    use crate::cache::{PagedCache, PagedConfig, Placement};

    fn cached_prompt() -> PagedCache {
        let mut c = PagedCache::new(PagedConfig {
            total_blocks: 16,
            block_size: 4,
            prefix_cache: true,
            placement: Placement::Lifo,
        });
        let scope = ScopeKey {
            model: "m".into(),
            tokenizer: "t".into(),
            reuse: ReuseScope::Tenant(0),
        };
        let tokens: Vec<u32> = (0..12).collect();
        c.start(&StartRequest {
            seq: 1,
            tokens: &tokens,
            scope: Some(&scope),
            reserve_tokens: 12,
        })
        .expect("fits");
        c.fill(1, 12).expect("fill");
        let step = c.begin_step();
        c.release(1, ReleaseReason::Finish).expect("release");
        c.retire_step(step);
        c.check_invariants().expect("a consistent cache");
        assert_eq!(c.index.len(), 3, "three full blocks published");
        c
    }

    #[test]
    fn a_key_missing_from_the_index_or_a_stray_entry_is_named() {
        let mut c = cached_prompt();
        let (block, key) = c.index.entries().next().expect("an entry");
        // Taken out: the block still carries a key the index does not map.
        let published = c.index.remove(&key).expect("present");
        let why = c.check_invariants().expect_err("a missing key");
        assert!(
            why.contains(&format!(
                "block {block} carries a key the index does not map to it"
            )),
            "{why}"
        );
        let stray = Published {
            block: published.block,
            parent: published.parent,
            tokens: published.tokens.clone(),
            scope: published.scope.clone(),
            publisher: published.publisher,
        };
        c.index.insert(key, published);
        c.check_invariants().expect("restored");
        // A second entry for the same block under a key it does not carry.
        let mut other = key;
        other[0] ^= 1;
        c.index.insert(other, stray);
        let why = c.check_invariants().expect_err("a stray entry");
        assert!(
            why.contains(&format!(
                "index names block {block} which does not carry that key"
            )),
            "{why}"
        );
        c.index.remove(&other);
        c.check_invariants().expect("restored");
    }

    /// A table entry changed behind the pool's back (no block touched): the incremental check
    /// sees it by comparing the table with its copy, and words it as the full walk does.
    #[test]
    fn a_table_changed_behind_the_pools_back_is_reported_as_the_full_walk_words_it() {
        let mut c = cached_prompt();
        let tokens: Vec<u32> = (100..108).collect();
        c.start(&StartRequest {
            seq: 2,
            tokens: &tokens,
            scope: None,
            reserve_tokens: 8,
        })
        .expect("fits");
        for _ in 0..3 {
            c.check_invariants().expect("consistent");
        }
        let walks = c.invariant_full_walks();
        let seq = c.seqs.get_mut(&2).expect("seq 2");
        let was = seq.blocks[0];
        seq.blocks.set(0, (was + 1) % c.pool.total_blocks());
        let full = c
            .check_invariants_full()
            .expect_err("the full walk sees it");
        let why = c
            .check_invariants()
            .expect_err("the incremental check sees it");
        assert_eq!(why, full);
        assert!(
            why.contains(&format!("block {was}: ref count 1 but 0")),
            "{why}"
        );
        assert_eq!(
            c.invariant_full_walks(),
            walks + 1,
            "worded by one full walk"
        );
        c.seqs.get_mut(&2).expect("seq 2").blocks.set(0, was);
        c.check_invariants().expect("restored");
    }
}
