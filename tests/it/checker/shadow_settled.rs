//! The grouped shadow's fused decode asks whether a stream's tables still read the blocks they
//! read last step once a table shape, not once a table: it trusts that every record was left
//! exactly as its shape reads at the last step's end (the stream is "settled"). A step whose
//! read range a table does not map leaves that table's record short — the shadow records only
//! what is mapped and reports the rest — so the stream is not settled, and the next decode
//! through the same unmapped block must be reported again. A shadow that called every stream
//! settled would take the fused decode there, find the short record equal to the table, store
//! the token into the last page the record holds (another block's) and report less.

use crate::support::engine as engine_support;
use crate::support::shadow_grouped as shadow_grouped_support;

use kvbench_cache_api::KvCacheManager;

use engine_support::HandStream;
use shadow_grouped_support::{manager, mixes, Which};

/// One block of prompt at blocks of 4 tokens (every mix): the first decode reads block 1.
const PROMPT_TOKENS: u32 = 4;

/// The shadow's violations after the prompt's step and after each of `decodes` decodes that
/// the manager was never asked to map (no `append`): each reads block 1, which the table does
/// not map.
fn violations_by_step(cache: Box<dyn KvCacheManager>, decodes: u32) -> Vec<u64> {
    let prompt: Vec<u32> = (0..PROMPT_TOKENS).map(|i| (i * 41 + 3) % 500).collect();
    let mut h = HandStream::start(cache, &prompt, PROMPT_TOKENS);
    std::iter::once((0, PROMPT_TOKENS))
        .chain((0..decodes).map(|i| (PROMPT_TOKENS + i, 1)))
        .map(|(context, new)| h.step(context, new))
        .collect()
}

#[test]
fn a_block_a_table_does_not_map_is_reported_at_every_decode_that_reads_it() {
    for mix in mixes() {
        let label = format!("{} / {:?}", mix.shape.name, Which::Hybrid);
        let v = violations_by_step(manager(Which::Hybrid, &mix), 3);
        println!("{label}: violations after each step {v:?}");
        assert_eq!(v[0], 0, "{label}: the prompt's step was clean");
        assert!(
            v[1] > 0,
            "{label}: the first decode's unmapped block went unseen"
        );
        // Every decode reads and writes the same unmapped block in the same tables: reported
        // as the first was, table by table.
        for k in 2..v.len() {
            assert_eq!(
                v[k] - v[k - 1],
                v[1],
                "{label}: decode {k} through the unmapped block was not reported as the first \
                 ({v:?})"
            );
        }
    }
}
