//! Recurrent-state checkpoints in the hybrid paged manager, through the engine's trait, on the
//! full + recurrent mix (4-token blocks, 256-byte pages, a state of 8 pages, 56 pages in all):
//! a sequence takes a checkpoint's pages at each checkpoint its writes pass and names them for
//! the step to save; once that step began they are indexed and cached-free, and a later prompt
//! that starts the same way resumes from the deepest one its tables' hit reaches; a checkpoint
//! whose step never began (its sequence preempted first) is never indexed; evicting it drops it
//! whole; without checkpoints a recurrent model never hits; the planted off-by-one resumes from
//! the previous checkpoint and fires. Invariants (full walk and incremental) and conservation
//! are checked after every operation.
//!
//! Prompts are random token ids from a seed printed by each test; `KVBENCH_SEED` replays one.

use crate::support::hybrid_kv as hybrid_kv_support;
use crate::support::hybrid_prefix as cache_hybrid_prefix_support;

use cache_hybrid_prefix_support::{ok, probe_cached, prompt, seed, start, RECURRENT};
use hybrid_kv_support::{build, mixes};
use kvbench::cache::hybrid::HybridKv;
use kvbench_cache_api::{Fault, KvCacheManager, ReleaseReason, StateCheckpoint};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The full + recurrent mix with a checkpoint every 2 blocks (8 tokens).
fn kv() -> HybridKv {
    build(&mixes()[RECURRENT]).with_checkpoints(2)
}

/// Every invariant, and the accounting conserved.
fn checked(kv: &HybridKv) {
    ok(kv);
    kv.check_invariants_full().unwrap();
    let a = kv.accounting();
    assert_eq!(
        a.live_slots
            + a.allocated_unfilled_slots
            + a.cached_free_slots
            + a.pending_free_slots
            + a.free_slots,
        a.total_slots,
        "{a:?}"
    );
}

fn rng() -> ChaCha8Rng {
    let s = seed();
    println!("seed {s}");
    ChaCha8Rng::seed_from_u64(s)
}

#[test]
fn a_later_prompt_resumes_from_the_deepest_checkpoint_its_hit_reaches() {
    let mut kv = kv();
    assert_eq!(kv.checkpoint_tokens(), 8);
    let p = prompt(&mut rng(), 23);
    start(&mut kv, 1, &p).unwrap();
    kv.fill(1, 23).unwrap();
    checked(&kv);
    // Checkpoints at 8 and 16 are taken for the step to save; none is indexed before it began.
    let save: Vec<u64> = kv
        .state_checkpoints(1)
        .save
        .iter()
        .map(|c| c.tokens)
        .collect();
    assert_eq!(save, [8, 16]);
    assert_eq!(probe_cached(&kv, 2, &p).0, 0, "not saved yet");
    let before = kv.accounting();
    let step = kv.begin_step();
    checked(&kv);
    assert_eq!(kv.checkpoint_counts(), (2, 2));
    // Two states of 8 pages (4 slots a page) are cached-free now, out of the held pages.
    let after = kv.accounting();
    assert_eq!(
        after.cached_free_slots,
        before.cached_free_slots + 2 * 8 * 4
    );
    assert!(kv.state_checkpoints(1).save.is_empty());
    // The tables could give 20 tokens; the deepest checkpoint at or below is 16.
    assert_eq!(probe_cached(&kv, 2, &p).0, 16);
    let s = start(&mut kv, 2, &p).unwrap();
    checked(&kv);
    assert_eq!(s.cached_tokens, 16);
    let resume = kv.state_checkpoints(2).resume.expect("a resume");
    assert_eq!(resume.tokens, 16);
    kv.fill(2, 23 - 16).unwrap();
    checked(&kv);
    kv.retire_step(step);
    let step = kv.begin_step();
    kv.retire_step(step);
    checked(&kv);
    // Longer prompts sharing the first 23 tokens: the same checkpoint at 16; one of 9 tokens
    // only the one at 8.
    assert_eq!(probe_cached(&kv, 3, &p[..9]).0, 8);
    for seq in [1, 2] {
        kv.release(seq, ReleaseReason::Finish).unwrap();
        checked(&kv);
    }
    kv.assert_quiescent().unwrap();
    assert_eq!(probe_cached(&kv, 3, &p).0, 16, "kept cached-free");
}

#[test]
fn a_checkpoint_whose_step_never_began_is_never_indexed() {
    let mut kv = kv();
    let p = prompt(&mut rng(), 23);
    start(&mut kv, 1, &p).unwrap();
    kv.fill(1, 23).unwrap();
    let held = kv.accounting();
    // Preempted before the step that would save them was submitted.
    kv.release(1, ReleaseReason::Preempt).unwrap();
    checked(&kv);
    assert_eq!(kv.checkpoint_counts(), (0, 0));
    let step = kv.begin_step();
    kv.retire_step(step);
    checked(&kv);
    assert_eq!(probe_cached(&kv, 2, &p).0, 0);
    assert!(held.allocated_unfilled_slots >= 2 * 8 * 4, "{held:?}");
    let a = kv.accounting();
    assert_eq!(a.free_slots + a.cached_free_slots, a.total_slots, "{a:?}");
}

#[test]
fn evicting_a_checkpoint_drops_it_whole_and_the_hit_falls_back() {
    let mut kv = kv();
    let mut rng = rng();
    let p = prompt(&mut rng, 17);
    start(&mut kv, 1, &p).unwrap();
    kv.fill(1, 17).unwrap();
    let step = kv.begin_step();
    kv.retire_step(step);
    kv.release(1, ReleaseReason::Finish).unwrap();
    checked(&kv);
    assert_eq!(kv.checkpoint_counts(), (2, 2));
    assert_eq!(probe_cached(&kv, 9, &p).0, 16);
    // Fill the pool with other prompts until something is evicted.
    let mut seq = 10;
    while kv.checkpoint_counts().1 == 2 {
        let q = prompt(&mut rng, 4);
        if start(&mut kv, seq, &q).is_err() {
            break;
        }
        kv.fill(seq, 4).unwrap();
        checked(&kv);
        seq += 1;
    }
    assert!(kv.checkpoint_counts().1 < 2, "nothing was evicted");
    let hit = probe_cached(&kv, 9, &p).0;
    assert!(hit == 0 || hit == 8, "hit {hit} after an eviction");
    checked(&kv);
}

#[test]
fn without_checkpoints_a_recurrent_model_never_hits() {
    let mut kv = build(&mixes()[RECURRENT]).with_checkpoints(0);
    let p = prompt(&mut rng(), 23);
    start(&mut kv, 1, &p).unwrap();
    kv.fill(1, 23).unwrap();
    let step = kv.begin_step();
    kv.retire_step(step);
    checked(&kv);
    assert_eq!(kv.checkpoint_counts(), (0, 0));
    assert_eq!(probe_cached(&kv, 2, &p).0, 0);
}

#[test]
fn the_planted_off_by_one_resumes_from_the_previous_checkpoint_and_fires() {
    let mut kv = kv();
    kv.inject_fault(Fault::CheckpointOffByOne);
    let p = prompt(&mut rng(), 23);
    start(&mut kv, 1, &p).unwrap();
    kv.fill(1, 23).unwrap();
    let step = kv.begin_step();
    kv.retire_step(step);
    assert_eq!(kv.fault_fired(), 0);
    let s = start(&mut kv, 2, &p).unwrap();
    checked(&kv);
    assert_eq!(s.cached_tokens, 16, "the hit is where it was");
    let resume = kv.state_checkpoints(2).resume.expect("a resume");
    assert_eq!(resume.tokens, 16, "it claims the hit's checkpoint");
    // The pages it names are those of the checkpoint at 8: a 9-token prompt resumes there.
    kv.release(2, ReleaseReason::Finish).unwrap();
    let s9 = start(&mut kv, 3, &p[..9]).unwrap();
    assert_eq!(s9.cached_tokens, 8);
    let at8: StateCheckpoint = kv.state_checkpoints(3).resume.expect("a resume");
    assert_eq!(
        resume.page, at8.page,
        "resumed from the checkpoint one interval back"
    );
    assert_eq!(kv.fault_fired(), 1);
}

#[test]
fn taking_the_state_of_a_start_never_evicts_the_checkpoint_its_hit_shares() {
    let mut kv = kv();
    let mut rng = rng();
    // Two 9-token prompts cached with a checkpoint at 8 each: 2 table pages and 8 checkpoint
    // pages apiece, the first one's the least recently released.
    let p = prompt(&mut rng, 9);
    let q = prompt(&mut rng, 9);
    for (seq, t) in [(1, &p), (2, &q)] {
        start(&mut kv, seq, t).unwrap();
        kv.fill(seq, 9).unwrap();
        let step = kv.begin_step();
        kv.retire_step(step);
        kv.release(seq, ReleaseReason::Finish).unwrap();
        checked(&kv);
    }
    assert_eq!(kv.checkpoint_counts(), (2, 2));
    // Hold every free page: four 4-token sequences of 9 pages each.
    for seq in 10..14 {
        start(&mut kv, seq, &prompt(&mut rng, 4)).unwrap();
        kv.fill(seq, 4).unwrap();
    }
    checked(&kv);
    assert_eq!(kv.accounting().free_slots, 0);
    // The hit (8 tokens: 2 table pages and the checkpoint) is revived before the state's 8
    // pages are taken, so those evict the second prompt's block, never the hit's.
    let (hit, fits) = probe_cached(&kv, 9, &p);
    assert_eq!((hit, fits), (8, true));
    let s = start(&mut kv, 9, &p).unwrap();
    checked(&kv);
    assert_eq!(s.cached_tokens, 8);
    assert_eq!(
        kv.checkpoint_counts().1,
        1,
        "the other prompt's checkpoint was evicted"
    );
    assert_eq!(probe_cached(&kv, 20, &q).0, 0);
}
