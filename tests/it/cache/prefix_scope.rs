//! Prefix reuse stays inside its scope: with per-tenant scopes, tenant B repeating the prompt
//! tenant A published gets no hit on A's blocks, publishes its own copy, and from then on each
//! tenant hits its own copy and never the other's. (Dropping the scope digest from prefix keys
//! makes B's copy collide with A's key and never be published, so B's repeat misses here.)

use kvbench::cache;
use kvbench_cache_api::{
    CacheMode, KvCacheManager, PrefixHit, ReleaseReason, ReuseScope, ScopeKey, SeqId, StartRequest,
};

const BLOCK: u32 = 4;

fn tenant(t: u32) -> ScopeKey {
    ScopeKey {
        model: "tiny".into(),
        tokenizer: "tiny".into(),
        reuse: ReuseScope::Tenant(t),
    }
}

/// Start, prefill and finish one sequence; returns the prefix hits its start found.
fn serve(
    c: &mut dyn KvCacheManager,
    seq: SeqId,
    prompt: &[u32],
    scope: &ScopeKey,
) -> Vec<PrefixHit> {
    let started = c
        .start(&StartRequest {
            seq,
            tokens: prompt,
            scope: Some(scope),
            reserve_tokens: prompt.len() as u32 + 1,
        })
        .expect("start");
    assert_eq!(
        started.cached_tokens,
        started.hits.iter().map(|h| h.tokens).sum::<u32>()
    );
    c.fill(seq, prompt.len() as u32 - started.cached_tokens)
        .expect("fill");
    c.release(seq, ReleaseReason::Finish).expect("release");
    c.check_invariants().expect("invariants");
    started.hits
}

#[test]
fn tenant_b_repeating_tenant_a_prompt_hits_its_own_copy_never_a_copy_of_a() {
    let mut c = cache::build(&cache::CacheSpec::new(
        CacheMode::Paged,
        64 * u64::from(BLOCK),
        BLOCK,
        true,
    ));
    // Two full blocks and one more token (the last token is always recomputed).
    let prompt: Vec<u32> = (100..109).collect();
    let (a, b) = (tenant(0), tenant(1));

    assert!(serve(c.as_mut(), 1, &prompt, &a).is_empty(), "cold cache");
    let b_first = serve(c.as_mut(), 2, &prompt, &b);
    assert!(
        b_first.is_empty(),
        "B must not reuse A's blocks: {b_first:?}"
    );

    let a_again = serve(c.as_mut(), 3, &prompt, &a);
    let b_again = serve(c.as_mut(), 4, &prompt, &b);
    assert_eq!(a_again.len(), 2, "A hits its own two blocks: {a_again:?}");
    assert_eq!(b_again.len(), 2, "B hits its own two blocks: {b_again:?}");
    assert!(a_again.iter().all(|h| h.publisher == 1 && h.scope == a));
    assert!(b_again.iter().all(|h| h.publisher == 2 && h.scope == b));
    for h in &b_again {
        assert!(
            a_again.iter().all(|g| g.block != h.block),
            "B was given A's block {}",
            h.block
        );
    }
}

#[test]
fn a_global_scope_shares_one_copy_across_tenants_for_contrast() {
    let mut c = cache::build(&cache::CacheSpec::new(
        CacheMode::Paged,
        64 * u64::from(BLOCK),
        BLOCK,
        true,
    ));
    let prompt: Vec<u32> = (100..109).collect();
    let global = ScopeKey {
        reuse: ReuseScope::Global,
        ..tenant(0)
    };
    assert!(serve(c.as_mut(), 1, &prompt, &global).is_empty());
    let hits = serve(c.as_mut(), 2, &prompt, &global);
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert!(hits.iter().all(|h| h.publisher == 1));
}
