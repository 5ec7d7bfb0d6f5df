//! Structural invariants of the paged cache, recomputed from scratch (never from the counters
//! they check), and the quiescence check run after every scenario.

use std::collections::BTreeMap;

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

    let mut counts = BTreeMap::<&'static str, u32>::new();
    let mut live_slots = 0u64;
    for (b, m) in pool.meta.iter().enumerate() {
        let name = match m.state {
            BlockState::Free => "free",
            BlockState::Mapped => "mapped",
            BlockState::Pending => "pending",
            BlockState::Cached => "cached",
        };
        *counts.entry(name).or_default() += 1;
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
            match c.index.get(key) {
                Some(e) if e.block == b as u32 => {}
                _ => p.push(format!(
                    "block {b} carries a key the index does not map to it"
                )),
            }
        }
    }
    for (b, key) in c.index.entries_by_block() {
        if pool.meta.get(b as usize).and_then(|m| m.key) != Some(key) {
            p.push(format!(
                "index names block {b} which does not carry that key"
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
    let count = |k: &str| counts.get(k).copied().unwrap_or(0);
    if count("free") != pool.free_blocks() {
        p.push(format!(
            "{} free blocks but {} on the free list",
            count("free"),
            pool.free_blocks()
        ));
    }
    if count("cached") != evictable.len() as u32 || count("cached") != pool.cached_blocks {
        p.push(format!(
            "{} cached blocks, {} in the eviction order, counter {}",
            count("cached"),
            evictable.len(),
            pool.cached_blocks
        ));
    }
    if count("pending") != pool.pending_blocks || count("mapped") != pool.mapped_blocks {
        p.push(format!(
            "pending {} (counter {}), mapped {} (counter {})",
            count("pending"),
            pool.pending_blocks,
            count("mapped"),
            pool.mapped_blocks
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
    if fenced as u32 != count("pending") {
        p.push(format!(
            "{} pending blocks but {fenced} live fence entries",
            count("pending")
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
