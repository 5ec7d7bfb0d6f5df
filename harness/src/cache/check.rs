//! Structural invariants of the paged cache, recomputed from scratch (never from the counters
//! they check), and the quiescence check run after every scenario.

use kvbench_cache_api::{KvCacheManager, SeqId};

use super::block::BlockState;
use super::state::PagedCache;

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

/// Indices of [`check_paged`]'s per-state block counts.
const FREE: usize = 0;
const MAPPED: usize = 1;
const PENDING: usize = 2;
const CACHED: usize = 3;

pub(crate) fn check_paged(c: &PagedCache) -> Result<(), String> {
    let mut p = Problems(Vec::new());
    let pool = &c.pool;
    let bs = pool.block_size;
    let total = pool.total_blocks() as usize;

    for v in &c.violations {
        p.push(v.clone());
    }
    for &(block, fence) in &pool.early_reuse {
        p.push(format!(
            "block {block} handed out for new content while its fence step {fence} was in flight"
        ));
    }

    // Ref count = block-table references (the prefix cache holds none).
    let mut table_refs = vec![0u32; total];
    let mut ids: Vec<SeqId> = c.seqs.keys().copied().collect();
    ids.sort_unstable();
    for &id in &ids {
        let s = &c.seqs[&id];
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
        for &b in &s.blocks {
            match table_refs.get_mut(b as usize) {
                Some(r) => *r += 1,
                None => p.push(format!("seq {id} maps block {b} beyond the pool")),
            }
        }
        if let Some(kvbench_cache_api::SeqLayout::Paged { blocks, .. }) = c.layout(id) {
            if let Some(i) = blocks.iter().zip(&s.blocks).position(|(a, b)| a != b) {
                p.push(format!(
                    "seq {id}: layout maps logical block {i} to {} but the block table says {}",
                    blocks[i], s.blocks[i]
                ));
            }
        }
    }

    // Blocks in each state, counted in an array (a map keyed by the state's name compared
    // strings for every block at every check).
    let mut counts = [0u32; 4];
    let mut live_slots = 0u64;
    let mut keyed = 0usize;
    for (b, m) in pool.meta.iter().enumerate() {
        let (name, at) = match m.state {
            BlockState::Free => ("free", FREE),
            BlockState::Mapped => ("mapped", MAPPED),
            BlockState::Pending => ("pending", PENDING),
            BlockState::Cached => ("cached", CACHED),
        };
        counts[at] += 1;
        if m.ref_count != table_refs[b] {
            p.push(format!(
                "block {b}: ref count {} but {} block-table references",
                m.ref_count, table_refs[b]
            ));
        }
        if (m.state == BlockState::Mapped) != (table_refs[b] > 0) {
            p.push(format!(
                "block {b} is {name} with {} block-table references",
                table_refs[b]
            ));
        }
        if m.state == BlockState::Mapped {
            live_slots += u64::from(m.written_slots);
        }
        if m.state == BlockState::Cached && m.key.is_none() {
            p.push(format!("block {b} is cached without a prefix key"));
        }
        if m.state == BlockState::Free && m.key.is_some() {
            p.push(format!("block {b} is free but still published"));
        }
        if let Some(key) = &m.key {
            keyed += 1;
            match c.index.get(key) {
                Some(e) if e.block == b as u32 => {}
                _ => p.push(format!(
                    "block {b} carries a key the index does not map to it"
                )),
            }
        }
    }
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
    if counts[FREE] != pool.free_blocks() {
        p.push(format!(
            "{} free blocks but {} on the free list",
            counts[FREE],
            pool.free_blocks()
        ));
    }
    if counts[CACHED] != evictable.len() as u32 || counts[CACHED] != pool.cached_blocks {
        p.push(format!(
            "{} cached blocks, {} in the eviction order, counter {}",
            counts[CACHED],
            evictable.len(),
            pool.cached_blocks
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
            let m = &pool.meta[*b as usize];
            m.state == BlockState::Pending && m.generation == *generation
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
        tiers.check(&mut found);
        for f in found {
            p.push(f);
        }
    }
    p.into_result()
}

pub(crate) fn quiescent_paged(c: &PagedCache) -> Result<(), String> {
    let mut p = Problems(Vec::new());
    if let Err(e) = check_paged(c) {
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
}
