//! The `EarlyRelease` test double (`support/shadow_grouped/early_release.rs`) forwards a
//! swap to the grouped manager it wraps: a swap-out is priced by the inner manager's tables,
//! and a swap-in's restore reaches the inner manager (the grouped contiguous baseline restores
//! a whole sequence at once, which a fill of one step's ring refuses), after which the double
//! still cuts the sliding table it hands out. A double that dropped these calls would run a
//! swap as something else and hide what the shadow is there to see.

use crate::support::shadow_grouped as shadow_grouped_support;

use kvbench_cache_api::{KvCacheManager, ReleaseReason, SeqLayout, StartRequest};
use shadow_grouped_support::early_release::EarlyRelease;
use shadow_grouped_support::{layout, manager, mixes, CHUNK_TOKENS, MANAGERS};

/// Tokens of the swapped sequence: well past the sliding window of 10, so its table keeps
/// fewer blocks than the full one and the double has a block to cut.
const TOKENS: u32 = 30;

fn start(kv: &mut dyn KvCacheManager, tokens: &[u32]) {
    let req = StartRequest {
        seq: 1,
        tokens,
        scope: None,
        reserve_tokens: TOKENS,
    };
    kv.start(&req).expect("start");
}

/// Submit the step the calls since the last one planned, and retire it.
fn step(kv: &mut dyn KvCacheManager) {
    let s = kv.begin_step();
    kv.retire_step(s);
}

#[test]
fn a_swap_through_the_early_release_double_reaches_the_manager_it_wraps() {
    let mix = mixes().remove(0); // 2 sliding layers (window 10) and 2 full, 4-token blocks
    let pool = layout(&mix).grouped_pool();
    let tokens: Vec<u32> = (0..TOKENS).collect();
    for which in MANAGERS {
        let mut kv = EarlyRelease::new(manager(which, &mix), &pool);
        start(&mut kv, &tokens);
        // One step a chunk, as the engine runs a prefill: a chunk is written while its step is
        // planned, then the step is submitted and retires (without the steps, every chunk
        // would count as one step's writes, more than the baseline's ring keeps beyond the
        // window, and its check would rightly say so).
        for chunk in tokens.chunks(CHUNK_TOKENS as usize) {
            kv.fill(1, chunk.len() as u32).expect("fill");
            step(&mut kv);
        }
        kv.inner
            .check_invariants()
            .unwrap_or_else(|e| panic!("{which:?}: after the prefill: {e}"));
        // Swap-out: the inner manager's price, what its tables keep, not one slot a token.
        let moved = kv.swap_slots(1, TOKENS);
        assert_eq!(moved, kv.inner.swap_slots(1, TOKENS), "{which:?}");
        assert_ne!(
            moved,
            u64::from(TOKENS),
            "{which:?}: priced as one slot a token"
        );
        kv.release(1, ReleaseReason::Preempt).expect("swap-out");
        // Swap-in: the whole sequence restored in one call, as the engine does.
        start(&mut kv, &tokens);
        kv.restore(1, TOKENS)
            .unwrap_or_else(|e| panic!("{which:?}: restore: {e}"));
        step(&mut kv);
        assert_eq!(kv.inner.seq_tokens(1), Some(TOKENS), "{which:?}");
        // A whole sequence restored in one step reads only each ring's window of it.
        kv.inner
            .check_invariants()
            .unwrap_or_else(|e| panic!("{which:?}: after the swap-in: {e}"));
        let fired = kv.fault_fired();
        assert!(
            fired > 0,
            "{which:?}: the double cut nothing after the swap-in"
        );
        let Some(SeqLayout::Grouped { tables, .. }) = kv.layout(1) else {
            panic!("{which:?}: no grouped layout after the swap-in");
        };
        let Some(SeqLayout::Grouped { tables: inner, .. }) = kv.inner.layout(1) else {
            panic!("{which:?}: the inner manager holds no layout");
        };
        assert!(
            tables[0].first_block > inner[0].first_block,
            "{which:?}: the sliding table handed out is not cut after the swap-in"
        );
        kv.release(1, ReleaseReason::Finish).expect("release");
        assert_eq!(
            kv.inner.seq_tokens(1),
            None,
            "{which:?}: the release reached it"
        );
    }
}
