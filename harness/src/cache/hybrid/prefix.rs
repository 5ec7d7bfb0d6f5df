//! What a prefix hit may reuse, table by table: the rule the prefix cache (`cached.rs`)
//! applies at start.
//!
//! - **Full and MLA:** a hit of `h` tokens needs every block before `h` cached.
//! - **Sliding:** only the blocks holding positions `h − window .. h` — what the sequence would
//!   hold at `h` tokens — need to be cached; earlier ones may have been released. So a hit is
//!   checked from the longest candidate down, not from the first block up.
//! - **Recurrent:** only where a copy of the state was kept. The state after `h` tokens is
//!   overwritten by the next token, so the manager keeps checkpoints (the state at every
//!   `checkpoint_tokens`, pages of the pool, a Qwen3-Next state being 36 × 1.05 MiB) and a hit
//!   is cut down to the deepest checkpoint the tables' hit reaches (`cached.rs`). Without
//!   checkpoints a model with a recurrent group gets no prefix hit (and publishes nothing):
//!   [`prefix_hit_tokens`] answers for that case.
//!
//! A hit is whole blocks of every table (a multiple of each table's block tokens) and leaves at
//! least one prompt token to compute, whose logits start the output.

use super::layout::{HybridLayout, TableKind};

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The longest prefix of a `prompt_tokens`-token prompt every table can reuse, given which of
/// each table's logical blocks are cached (`cached(table, block)`).
pub fn prefix_hit_tokens(
    layout: &HybridLayout,
    prompt_tokens: u64,
    cached: impl Fn(usize, u64) -> bool,
) -> u64 {
    if layout.state_bytes_per_sequence != 0 {
        return 0;
    }
    hit_tokens_by_tables(layout, prompt_tokens, cached)
}

/// Tokens every table's block holds a whole number of (their least common multiple): the
/// grain of a hit.
pub fn block_step(layout: &HybridLayout) -> u64 {
    layout.tables.iter().fold(1u64, |acc, t| {
        let bt = u64::from(t.block_tokens.max(1));
        acc.saturating_mul(bt / gcd(acc, bt))
    })
}

/// [`prefix_hit_tokens`] by the tables alone, whatever the recurrent state allows.
pub(crate) fn hit_tokens_by_tables(
    layout: &HybridLayout,
    prompt_tokens: u64,
    cached: impl Fn(usize, u64) -> bool,
) -> u64 {
    if prompt_tokens == 0 {
        return 0;
    }
    let step = block_step(layout);
    let mut limit = (prompt_tokens - 1) / step * step;
    // Full and MLA tables: the cached run from block 0.
    for (i, t) in layout.tables.iter().enumerate() {
        if matches!(t.kind, TableKind::Sliding { .. }) {
            continue;
        }
        let bt = t.block_tokens as u64;
        let mut run = 0u64;
        while run < limit / bt && cached(i, run) {
            run += 1;
        }
        limit = limit.min(run * bt / step * step);
    }
    // Sliding tables: the longest candidate whose window is cached.
    let mut h = limit;
    while h > 0 {
        let window_cached = layout.tables.iter().enumerate().all(|(i, t)| {
            let TableKind::Sliding { .. } = t.kind else {
                return true;
            };
            let (first, end) = t.held_blocks(h);
            (first..end).all(|b| cached(i, b))
        });
        if window_cached {
            return h;
        }
        h -= step;
    }
    0
}
