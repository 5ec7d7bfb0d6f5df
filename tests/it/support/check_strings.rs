//! Seeded operation strings through the `KvCacheManager` trait, for the tests that compare a
//! manager's incremental invariant check with its full walk after every operation: starts of
//! prompts sharing a few prefixes, chunked fills, generated tokens, forks, releases for finish
//! and preemption, steps begun and retired, now and then a flush.

use kvbench_cache_api::{KvCacheManager, ReleaseReason, ScopeKey, StartRequest, StepId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The shape of the prompts a string starts.
pub struct Prompts<'a> {
    /// Tokens of each of the three shared prefixes.
    pub prefix_tokens: usize,
    /// Random tokens after the prefix: `0..extra_tokens`.
    pub extra_tokens: usize,
    /// A start takes one of these at random.
    pub scopes: &'a [ScopeKey],
}

fn ids(rng: &mut ChaCha8Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(0..50_000)).collect()
}

/// Runs `ops` operations from seed `seed` on `m`, calling `after(m, i)` after operation `i`. With
/// `drain`, the live sequences are released and the steps retired at the end (the manager is
/// then quiescent unless a fault kept something).
pub fn run<M: KvCacheManager>(
    m: &mut M,
    prompts: &Prompts<'_>,
    seed: u64,
    ops: usize,
    drain: bool,
    mut after: impl FnMut(&mut M, usize),
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let prefixes: Vec<Vec<u32>> = (0..3)
        .map(|_| ids(&mut rng, prompts.prefix_tokens))
        .collect();
    // (seq, prompt tokens left to fill)
    let mut live: Vec<(u64, u32)> = Vec::new();
    let mut steps: Vec<StepId> = Vec::new();
    let mut next = 1u64;
    for i in 0..ops {
        match rng.gen_range(0..12) {
            0..=2 => {
                let mut p = prefixes[rng.gen_range(0..3)].clone();
                let extra = rng.gen_range(0..prompts.extra_tokens);
                p.extend(ids(&mut rng, extra));
                let scope = match prompts.scopes {
                    [one] => one,
                    all => &all[rng.gen_range(0..all.len())],
                };
                let started = m.start(&StartRequest {
                    seq: next,
                    tokens: &p,
                    scope: Some(scope),
                    reserve_tokens: p.len() as u32,
                });
                if let Ok(st) = started {
                    live.push((next, p.len() as u32 - st.cached_tokens));
                }
                next += 1;
            }
            3 | 4 if !live.is_empty() => {
                let k = rng.gen_range(0..live.len());
                let (seq, left) = live[k];
                if left > 0 {
                    let n = rng.gen_range(1..=left);
                    if m.fill(seq, n).is_ok() {
                        live[k].1 -= n;
                    }
                } else {
                    let _ = m.append_token(seq, rng.gen_range(0..50_000));
                }
            }
            5 if !live.is_empty() => {
                let (seq, left) = live[rng.gen_range(0..live.len())];
                if left == 0 && m.fork(seq, next).is_ok() {
                    live.push((next, 0));
                }
                next += 1;
            }
            6 if !live.is_empty() => {
                let (seq, _) = live.swap_remove(rng.gen_range(0..live.len()));
                let why = if rng.gen_bool(0.3) {
                    ReleaseReason::Preempt
                } else {
                    ReleaseReason::Finish
                };
                m.release(seq, why).unwrap();
            }
            7 | 8 => steps.push(m.begin_step()),
            9 if rng.gen_bool(0.05) => m.flush_prefix_cache(),
            _ if !steps.is_empty() => {
                let step = steps.remove(0);
                m.retire_step(step);
            }
            _ => {}
        }
        after(m, i);
    }
    if drain {
        for (seq, _) in live {
            m.release(seq, ReleaseReason::Finish).unwrap();
        }
        for step in steps {
            m.retire_step(step);
        }
    }
}
