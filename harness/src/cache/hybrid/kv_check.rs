//! `HybridKv`'s invariants: the hybrid manager's own (every page in one place, tables holding
//! what their kind keeps, fences and states counted right), the violations seen as they
//! happened, the live slots recomputed from the sequences' written tokens (never from the
//! pool's counter they check), conservation, and the layout handed out matching the tables.
//! This is the full walk; the engine's every-step check is `check_incremental.rs`, which runs it
//! every so many checks, and `assert_quiescent` (the run's end) always runs it.

use kvbench_cache_api::{KvCacheManager, SeqLayout};

use super::kv::HybridKv;

/// At most this many problems are listed, so one report stays readable.
const MAX_PROBLEMS: usize = 20;

pub(crate) fn into_result(mut bad: Vec<String>) -> Result<(), String> {
    if bad.is_empty() {
        return Ok(());
    }
    bad.truncate(MAX_PROBLEMS);
    Err(bad.join("; "))
}

/// The problems recorded as they happened: protocol errors, planted bugs, early reuse.
pub(crate) fn recorded(kv: &HybridKv) -> Vec<String> {
    let mut bad = kv.violations.clone();
    for &(page, fence) in &kv.cache.pool.early_reuse {
        bad.push(format!(
            "page {page} handed out for new content while its fence step {fence} was in flight"
        ));
    }
    let acc = kv.accounting();
    if !acc.is_conserved() {
        bad.push(format!("accounting not conserved: {acc:?}"));
    }
    bad
}

/// The layout handed out for each of `seqs` is its block tables (a sequence with no corrupted
/// layout armed is handed its tables themselves).
pub(crate) fn check_layouts(
    kv: &HybridKv,
    seqs: impl Iterator<Item = kvbench_cache_api::SeqId>,
    bad: &mut Vec<String>,
) {
    for seq in seqs {
        let Some(entry) = kv.cache.seqs.get(&seq) else {
            continue;
        };
        if let Some(SeqLayout::Grouped { tables, .. }) = kv.layout(seq) {
            if tables != entry.tables.as_slice() {
                bad.push(format!(
                    "seq {seq}: the layout handed out differs from its block tables"
                ));
            }
        }
    }
}

/// Every invariant, recomputed from the whole state.
pub(crate) fn check_full(kv: &HybridKv) -> Result<(), String> {
    let cache = &kv.cache;
    let mut bad = recorded(kv);
    bad.extend(cache.check_invariants());

    // Live slots, recomputed: each held page's written tokens from its holders' lengths.
    let ps = kv.page_slots();
    let mut written: Vec<Option<(u64, u64)>> = vec![None; cache.pool.pages() as usize];
    for (&seq, entry) in &cache.seqs {
        for (spec, table) in cache.layout.tables.iter().zip(&entry.tables) {
            let bt = u64::from(spec.block_tokens.max(1));
            for (i, &page) in table.pages.iter().enumerate() {
                let block = table.first_block + i as u64;
                let w = entry.written.saturating_sub(block * bt).min(bt);
                match written.get_mut(page as usize) {
                    Some(slot) => {
                        let prev = slot.map_or(0, |(w, _)| w);
                        *slot = Some((prev.max(w), bt));
                    }
                    None => bad.push(format!("seq {seq}: page {page} beyond the pool")),
                }
            }
        }
    }
    let live: u64 = written.iter().flatten().map(|&(w, bt)| w * ps / bt).sum();
    if live != cache.pool.live_slots() {
        bad.push(format!(
            "live page slots {live} recomputed, counter {}",
            cache.pool.live_slots()
        ));
    }
    for (page, w) in written.iter().enumerate() {
        let counted = u64::from(cache.pool.written(page as u32).unwrap_or(0));
        if let Some((w, _)) = w {
            if *w != counted {
                bad.push(format!(
                    "page {page}: {w} tokens written by its holders, pool says {counted}"
                ));
            }
        }
    }
    // The prefix cache: the index and the pool agree on which pages are published.
    let mut indexed = 0u64;
    for (page, points_back) in kv.prefix.published_pages() {
        indexed += 1;
        if !points_back {
            bad.push(format!(
                "published page {page}: its index entry names another page"
            ));
        }
        if !cache.pool.is_published(page) {
            bad.push(format!(
                "page {page} is indexed but the pool has it unpublished"
            ));
        }
    }
    if indexed != cache.pool.published_count() {
        bad.push(format!(
            "{indexed} pages indexed, {} published in the pool",
            cache.pool.published_count()
        ));
    }
    let (walked, counted) = cache.pool.cached.protected_pages_recounted();
    if walked != counted {
        bad.push(format!(
            "{walked} evictable pages in protected blocks, the counter says {counted}"
        ));
    }
    check_layouts(kv, cache.seqs.keys().copied(), &mut bad);
    into_result(bad)
}

pub(crate) fn quiescent(kv: &HybridKv) -> Result<(), String> {
    let mut bad = Vec::new();
    if let Err(e) = check_full(kv) {
        bad.push(e);
    }
    bad.extend(kv.cache.check_quiescent());
    into_result(bad)
}
