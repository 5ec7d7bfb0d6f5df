//! What the hybrid prefix cache's tests share: which of `support::hybrid_kv`'s mixes is which,
//! the printed seed, random prompts, one reuse scope, and starting, probing and filling a
//! prompt through the trait with the invariants checked.
#![allow(dead_code)]

use kvbench::cache::hybrid::HybridKv;
use kvbench_cache_api::{AllocError, KvCacheManager, ReuseScope, ScopeKey, StartRequest, Started};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub const SLIDING: usize = 0; // "2 sliding : 1 full": sliding tables 0 and 1, full table 2
pub const RECURRENT: usize = 1;
pub const MLA: usize = 2;

pub fn seed() -> u64 {
    crate::support::seed_or(0x5eed_2026)
}

pub fn prompt(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(0..50_000)).collect()
}

pub fn scope() -> ScopeKey {
    ScopeKey {
        model: "mix".into(),
        tokenizer: "tok".into(),
        reuse: ReuseScope::Global,
    }
}

pub fn start(kv: &mut HybridKv, seq: u64, tokens: &[u32]) -> Result<Started, AllocError> {
    let scope = scope();
    kv.start(&StartRequest {
        seq,
        tokens,
        scope: Some(&scope),
        reserve_tokens: tokens.len() as u32,
    })
}

pub fn probe_cached(kv: &HybridKv, seq: u64, tokens: &[u32]) -> (u32, bool) {
    let scope = scope();
    let p = kv.probe_start(&StartRequest {
        seq,
        tokens,
        scope: Some(&scope),
        reserve_tokens: tokens.len() as u32,
    });
    (p.cached_tokens, p.fits)
}

pub fn ok(kv: &HybridKv) {
    if let Err(e) = kv.check_invariants() {
        panic!("invariants: {e}");
    }
}

/// Start and fill `tokens` as `seq` in one chunk.
pub fn run_prompt(kv: &mut HybridKv, seq: u64, tokens: &[u32]) -> Started {
    let s = start(kv, seq, tokens).expect("start");
    kv.fill(seq, tokens.len() as u32 - s.cached_tokens)
        .expect("fill");
    ok(kv);
    s
}
