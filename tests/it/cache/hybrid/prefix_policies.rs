//! The hybrid prefix cache evicts logical blocks as the summed manager evicts its blocks, under
//! every `cache.eviction` policy.
//!
//! On a model of 2 sliding tables and 1 full table with 4-token blocks everywhere, a hybrid
//! pool of 3 × N pages holds N logical blocks, as a summed pool of N blocks does. One request
//! at a time (start, fill, a few generated tokens, release) over shared system prompts of
//! uneven popularity: the hybrid manager holds every page of a block as long as the summed one
//! holds the block, so a policy that orders and evicts whole blocks — weighed as the summed
//! manager weighs its block (depth, hits, shared), released tail first — hits exactly the
//! tokens the summed manager hits. Ordering pages one by one split blocks (a sliding page out
//! of a hit's window is never hit, so `lfu` and `priority` put it apart from its block's full
//! pages) and released a sequence head first (so `lru` evicted the prompt heads every later
//! hit needs).
//!
//! Prompts are random token ids from a seed printed by the test; `KVBENCH_SEED` replays one.

use crate::support;
use crate::support::hybrid_kv as hybrid_kv_support;

use hybrid_kv_support::{build, full, shape, sliding, Mix};
use kvbench::cache::{CacheMode, CacheSpec, EvictionPolicy};
use kvbench_cache_api::{KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Logical blocks each pool holds.
const BLOCKS: u64 = 24;
const BLOCK_TOKENS: u32 = 4;

fn mix() -> Mix {
    Mix {
        name: "2 sliding : 1 full",
        shape: shape(vec![sliding(2, 10), full(1)]),
        block_size: BLOCK_TOKENS,
        pages: 3 * BLOCKS,
    }
}

/// One request: its prompt and the tokens it generates.
struct Request {
    prompt: Vec<u32>,
    generated: Vec<u32>,
}

/// `n` requests: 6 system prompts of 20 tokens, the first ones far more popular, each followed
/// by 3..12 tokens of its own and 0..6 generated ones.
fn workload(seed: u64, n: usize) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ids = |rng: &mut ChaCha8Rng, len: usize| -> Vec<u32> {
        (0..len).map(|_| rng.gen_range(0..50_000)).collect()
    };
    let systems: Vec<Vec<u32>> = (0..6).map(|_| ids(&mut rng, 20)).collect();
    let weights = [32u32, 16, 8, 4, 2, 1];
    let total: u32 = weights.iter().sum();
    (0..n)
        .map(|_| {
            let mut pick = rng.gen_range(0..total);
            let mut s = 0;
            while pick >= weights[s] {
                pick -= weights[s];
                s += 1;
            }
            let mut prompt = systems[s].clone();
            let own = rng.gen_range(3..12);
            prompt.extend(ids(&mut rng, own));
            let gen = rng.gen_range(0..6);
            Request {
                prompt,
                generated: ids(&mut rng, gen),
            }
        })
        .collect()
}

/// Tokens looked up and hit over the requests, one at a time.
fn run(kv: &mut dyn KvCacheManager, requests: &[Request]) -> (u64, u64) {
    let scope = ScopeKey {
        model: "mix".into(),
        tokenizer: "tok".into(),
        reuse: ReuseScope::Global,
    };
    for (i, r) in requests.iter().enumerate() {
        let seq = i as u64 + 1;
        let st = kv
            .start(&StartRequest {
                seq,
                tokens: &r.prompt,
                scope: Some(&scope),
                reserve_tokens: r.prompt.len() as u32,
            })
            .unwrap_or_else(|e| panic!("request {i}: {e:?}"));
        kv.fill(seq, r.prompt.len() as u32 - st.cached_tokens)
            .unwrap();
        for &t in &r.generated {
            kv.append_token(seq, t).unwrap();
        }
        kv.release(seq, ReleaseReason::Finish).unwrap();
        if let Err(e) = kv.check_invariants() {
            panic!("request {i}: {e}");
        }
    }
    let s = kv.prefix_stats();
    (s.lookup_tokens, s.hit_tokens)
}

/// Under each policy the hybrid manager hits what the summed manager hits, on a workload that
/// evicts (both pools hold far fewer blocks than the prompts span).
#[test]
fn one_request_at_a_time_the_hybrid_manager_hits_what_the_summed_one_hits() {
    let base = support::seed_or(0x5eed_2026);
    for policy in EvictionPolicy::ALL {
        for round in 0..4u64 {
            let s = base ^ round;
            let requests = workload(s, 120);
            let mut hybrid = build(&mix()).with_eviction(policy);
            let mut summed = kvbench::cache::build(
                &CacheSpec::new(
                    CacheMode::Paged,
                    BLOCKS * u64::from(BLOCK_TOKENS),
                    BLOCK_TOKENS,
                    true,
                )
                .with_eviction(policy),
            );
            let (lookup_h, hit_h) = run(&mut hybrid, &requests);
            let (lookup_s, hit_s) = run(summed.as_mut(), &requests);
            let ctx = format!("{} seed {s}", policy.name());
            println!(
                "{ctx}: hybrid {hit_h}/{lookup_h} tokens hit, summed {hit_s}/{lookup_s}, {} evictions",
                hybrid.prefix_stats().evictions
            );
            assert_eq!(lookup_h, lookup_s, "{ctx}");
            assert!(
                hybrid.prefix_stats().evictions > 0,
                "{ctx}: the workload must evict"
            );
            assert!(hit_s > 0, "{ctx}: the workload must hit");
            assert_eq!(hit_h, hit_s, "{ctx}: hit tokens, hybrid vs summed");
        }
    }
}
