//! The sim shadow compares a stream's block table with its own copy only when the manager's
//! list took a new version (`Pages` renumbers every change). A table changed in the middle of a
//! stream's decodes — an earlier block swapped for another, here by the bad-block-table fault
//! armed after several decodes — must be caught at the very step it is first handed out, on
//! the paged manager (flat tables) and on both grouped managers. A shadow that trusted its
//! record once it had compared it (or compared only the block being written) passes every other
//! test and fails this one.

use crate::support::engine as engine_support;
use crate::support::shadow_grouped as shadow_grouped_support;

use kvbench_cache_api::{CacheMode, Fault, KvCacheManager};

use engine_support::HandStream;

use shadow_grouped_support::{manager, mixes, MANAGERS};

/// Blocks of 4 tokens (every mix, and the paged manager here): the prompt is one block, the
/// first decode enters the second (the general path), the next two take the fused decode — the
/// first comparing, the second skipping the comparison. The fault lands on the fourth decode
/// (the fused decode) or the fifth (the next block entered: the flat shadow's grown-table
/// path), before a 10-token sliding window leaves block 0, so the block it changes is read.
const PROMPT_TOKENS: u32 = 4;
const FAULT_AFTER_DECODES: [u32; 2] = [3, 4];

/// One stream through `cache` on a shadowed sim backend: its prompt, `decodes` decodes, then
/// the fault armed and one decode more. Returns the shadow's violations after each step.
fn violations_by_step(cache: Box<dyn KvCacheManager>, decodes: u32, label: &str) -> Vec<u64> {
    let prompt: Vec<u32> = (0..PROMPT_TOKENS).map(|i| (i * 37 + 5) % 500).collect();
    let mut h = HandStream::start(cache, &prompt, PROMPT_TOKENS + decodes + 1);
    let mut out = vec![h.step(0, PROMPT_TOKENS)];
    for i in 0..=decodes {
        if i == decodes {
            h.cache.inject_fault(Fault::BadBlockTable);
        }
        assert!(h.cache.append(1).expect("append").is_empty(), "{label}");
        out.push(h.step(PROMPT_TOKENS + i, 1));
    }
    assert!(h.cache.fault_fired() > 0, "{label}: the fault never fired");
    out
}

fn assert_caught_at_once(violations: &[u64], label: &str) {
    println!("{label}: violations after each step {violations:?}");
    let (last, before) = violations.split_last().expect("steps");
    assert!(
        before.iter().all(|&v| v == 0),
        "{label}: a clean stream reported {before:?}"
    );
    assert!(
        *last > 0,
        "{label}: a block table changed under a decode went unseen at that step"
    );
}

#[test]
fn a_table_changed_between_decodes_is_caught_at_that_step_on_a_flat_paged_manager() {
    for decodes in FAULT_AFTER_DECODES {
        let label = format!("paged, fault after {decodes} decodes");
        let cache = kvbench::cache::build(&kvbench::cache::CacheSpec::new(
            CacheMode::Paged,
            64 * 4,
            4,
            false,
        ));
        let v = violations_by_step(cache, decodes, &label);
        assert_caught_at_once(&v, &label);
    }
}

#[test]
fn a_table_changed_between_decodes_is_caught_at_that_step_on_both_grouped_managers() {
    for mix in mixes() {
        for which in MANAGERS {
            for decodes in FAULT_AFTER_DECODES {
                let label = format!(
                    "{} / {which:?}, fault after {decodes} decodes",
                    mix.shape.name
                );
                let v = violations_by_step(manager(which, &mix), decodes, &label);
                assert_caught_at_once(&v, &label);
            }
        }
    }
}
