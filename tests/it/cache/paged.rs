//! Directed behaviour of the paged cache manager: sharing, copy-on-write, fences, eviction order,
//! scoped prefix reuse, failed allocations, and each planted fault being caught.

use kvbench::cache::{PagedCache, PagedConfig, Placement, PlantedBug};
use kvbench_cache_api::{
    AllocError, CopyOp, Fault, KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, SeqLayout,
    StartRequest,
};

const BS: u32 = 4;

fn paged(total_blocks: u32) -> PagedCache {
    PagedCache::new(PagedConfig {
        total_blocks,
        block_size: BS,
        prefix_cache: true,
        placement: Placement::Lifo,
    })
}

fn scope(reuse: ReuseScope) -> ScopeKey {
    ScopeKey {
        model: "m".into(),
        tokenizer: "t".into(),
        reuse,
    }
}

fn req<'a>(seq: u64, tokens: &'a [u32], scope: Option<&'a ScopeKey>) -> StartRequest<'a> {
    StartRequest {
        seq,
        tokens,
        scope,
        reserve_tokens: tokens.len() as u32 + 8,
    }
}

fn blocks_of(m: &dyn KvCacheManager, seq: u64) -> Vec<u32> {
    match m.layout(seq) {
        Some(SeqLayout::Paged { blocks, .. }) => blocks.to_vec(),
        other => panic!("expected a paged layout, got {other:?}"),
    }
}

/// Start and fully fill `tokens`.
fn admit(m: &mut dyn KvCacheManager, seq: u64, tokens: &[u32], s: Option<&ScopeKey>) -> u32 {
    let started = m.start(&req(seq, tokens, s)).expect("start");
    m.fill(seq, tokens.len() as u32 - started.cached_tokens)
        .expect("fill");
    started.cached_tokens
}

fn ok(m: &dyn KvCacheManager) {
    if let Err(e) = m.check_invariants() {
        panic!("invariants: {e}");
    }
}

#[test]
fn start_fill_release_round_trip_is_quiescent() {
    let mut m = paged(8);
    let toks: Vec<u32> = (0..9).collect();
    admit(&mut m, 1, &toks, None);
    let acc = m.accounting();
    assert_eq!(
        (acc.live_slots, acc.allocated_unfilled_slots, acc.free_slots),
        (9, 3, 20)
    );
    ok(&m);
    m.release(1, ReleaseReason::Finish).unwrap();
    ok(&m);
    m.assert_quiescent().unwrap();
    assert_eq!(m.accounting().free_slots, 32);
}

#[test]
fn fork_shares_and_append_copies_on_write() {
    let mut m = paged(8);
    let toks: Vec<u32> = (0..6).collect(); // blocks: [full, 2 of 4]
    admit(&mut m, 1, &toks, None);
    assert_eq!(m.fork(1, 2).unwrap(), Vec::<CopyOp>::new());
    let parent = blocks_of(&m, 1);
    assert_eq!(blocks_of(&m, 2), parent);
    assert!(parent.iter().all(|&b| m.ref_count(b) == 2));
    ok(&m);
    assert_eq!(
        m.append_cost(2),
        u64::from(BS),
        "a write into a shared partial block needs a copy"
    );
    let copies = m.append(2).unwrap();
    let child = blocks_of(&m, 2);
    assert_eq!(child[0], parent[0], "the full block stays shared");
    assert_ne!(child[1], parent[1]);
    assert_eq!(
        copies,
        vec![CopyOp {
            src_slot: u64::from(parent[1] * BS),
            dst_slot: u64::from(child[1] * BS),
            len_tokens: 2
        }]
    );
    assert_eq!(
        (
            m.ref_count(parent[0]),
            m.ref_count(parent[1]),
            m.ref_count(child[1])
        ),
        (2, 1, 1)
    );
    assert_eq!(
        m.append(1).unwrap(),
        vec![],
        "the parent now owns its block alone"
    );
    ok(&m);
    m.release(1, ReleaseReason::Finish).unwrap();
    m.release(2, ReleaseReason::Cancel).unwrap();
    m.assert_quiescent().unwrap();
}

#[test]
fn release_waits_for_the_newest_in_flight_step() {
    let mut m = paged(2);
    let toks: Vec<u32> = (0..8).collect();
    admit(&mut m, 1, &toks, None);
    let s1 = m.begin_step();
    let s2 = m.begin_step();
    m.release(1, ReleaseReason::Cancel).unwrap();
    assert_eq!(m.accounting().pending_free_slots, 8);
    assert!(matches!(
        m.start(&req(2, &[1, 2, 3], None)),
        Err(AllocError::NoSpace { .. })
    ));
    m.retire_step(s1);
    assert_eq!(
        m.accounting().pending_free_slots,
        8,
        "an older step retiring releases nothing"
    );
    assert!(!m.probe_start(&req(2, &[1, 2, 3], None)).fits);
    m.retire_step(s2);
    assert_eq!(m.accounting().free_slots, 8);
    assert!(m.probe_start(&req(2, &[1, 2, 3], None)).fits);
    ok(&m);
    m.assert_quiescent().unwrap();
}

#[test]
fn out_of_order_retire_keeps_the_fence_of_the_older_step() {
    let mut m = paged(2);
    admit(&mut m, 1, &[1, 2, 3, 4, 5], None);
    let s1 = m.begin_step();
    m.release(1, ReleaseReason::Preempt).unwrap(); // fenced on s1
    let s2 = m.begin_step();
    m.retire_step(s2);
    assert_eq!(
        m.accounting().pending_free_slots,
        8,
        "s1 may still touch the blocks"
    );
    m.retire_step(s1);
    m.assert_quiescent().unwrap();
    m.retire_step(s1);
    assert!(
        m.check_invariants().unwrap_err().contains("not in flight"),
        "double retire is reported"
    );
}

#[test]
fn failed_allocation_has_no_side_effects() {
    let mut m = paged(3);
    let s = scope(ReuseScope::Tenant(1));
    admit(&mut m, 1, &[1, 2, 3, 4, 5, 6, 7, 8, 9], Some(&s));
    m.release(1, ReleaseReason::Finish).unwrap();
    admit(&mut m, 2, &[7, 7, 7, 7, 7], None);
    let before = (
        m.accounting(),
        m.prefix_stats(),
        m.eviction_order(),
        m.free_blocks(),
    );
    let long: Vec<u32> = (1..=13).collect(); // 4 blocks, 2 cached hits... but only 1 block allocatable
    let err = m.start(&req(3, &long, Some(&s))).unwrap_err();
    assert!(
        matches!(
            err,
            AllocError::TooLarge { .. } | AllocError::NoSpace { .. }
        ),
        "{err:?}"
    );
    let prompt: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8, 90, 91, 92, 93];
    assert!(matches!(
        m.start(&req(3, &prompt, Some(&s))),
        Err(AllocError::NoSpace { .. })
    ));
    assert_eq!(
        before,
        (
            m.accounting(),
            m.prefix_stats(),
            m.eviction_order(),
            m.free_blocks()
        )
    );
    assert!(matches!(
        m.start(&req(2, &[1], None)),
        Err(AllocError::DuplicateSeq(2))
    ));
    assert!(matches!(m.fill(2, 1), Err(AllocError::InvalidOp { .. })));
    ok(&m);
}

#[test]
fn eviction_is_lru_tail_blocks_first_and_reuse_drops_the_hash() {
    let mut m = paged(4);
    let s = scope(ReuseScope::Tenant(1));
    let toks: Vec<u32> = (100..113).collect(); // 3 full blocks + 1 token
    admit(&mut m, 1, &toks, Some(&s));
    let table = blocks_of(&m, 1);
    m.release(1, ReleaseReason::Finish).unwrap();
    // The partial tail block has no key and is free; full blocks are cached, tail first.
    assert_eq!(m.eviction_order(), vec![table[2], table[1], table[0]]);
    admit(&mut m, 2, &[1, 2], None); // takes the free block
    admit(&mut m, 3, &[1, 2], None); // evicts the tail of seq 1's prefix first
    assert_eq!(blocks_of(&m, 3), vec![table[2]]);
    assert!(
        !m.is_published(table[2]),
        "a block reused for new content loses its key"
    );
    assert_eq!(m.eviction_order(), vec![table[1], table[0]]);
    assert_eq!(m.prefix_stats().evictions, 1);
    // The remaining prefix still hits: two blocks.
    m.release(2, ReleaseReason::Finish).unwrap();
    let hit = m.start(&req(4, &toks[..10], Some(&s))).unwrap();
    assert_eq!(hit.cached_tokens, 8);
    assert_eq!(
        hit.hits.iter().map(|h| h.block).collect::<Vec<_>>(),
        vec![table[0], table[1]]
    );
    assert!(hit.hits.iter().all(|h| h.publisher == 1 && h.scope == s));
    ok(&m);
}

#[test]
fn a_hit_is_capped_before_the_last_prompt_token() {
    let mut m = paged(8);
    let s = scope(ReuseScope::Global);
    let toks: Vec<u32> = (0..8).collect(); // exactly two full blocks
    admit(&mut m, 1, &toks, Some(&s));
    let again = m.start(&req(2, &toks, Some(&s))).unwrap();
    assert_eq!(
        again.cached_tokens, 4,
        "the last block is recomputed to produce logits"
    );
    assert_eq!(m.probe_start(&req(3, &toks, Some(&s))).cached_tokens, 4);
    let stats = m.prefix_stats();
    assert_eq!(
        (
            stats.lookups,
            stats.hit_blocks,
            stats.hit_tokens,
            stats.lookup_tokens
        ),
        (2, 1, 4, 16)
    );
}

#[test]
fn prefix_reuse_is_scoped_paired() {
    let prompt: Vec<u32> = (0..12).collect();
    let t1 = scope(ReuseScope::Tenant(1));
    let t2 = scope(ReuseScope::Tenant(2));
    let other_tok = ScopeKey {
        tokenizer: "t2".into(),
        ..t1.clone()
    };
    let other_model = ScopeKey {
        model: "m2".into(),
        ..t1.clone()
    };
    let none = scope(ReuseScope::None);
    for bug in [false, true] {
        let mut m = paged(16);
        if bug {
            m.plant_bug(PlantedBug::CrossScopeHit);
        }
        admit(&mut m, 1, &prompt, Some(&t1));
        m.release(1, ReleaseReason::Finish).unwrap();
        let cross: Vec<u32> = [&t2, &other_tok, &other_model]
            .iter()
            .enumerate()
            .map(|(i, s)| {
                m.probe_start(&req(10 + i as u64, &prompt, Some(s)))
                    .cached_tokens
            })
            .collect();
        let same = m.probe_start(&req(20, &prompt, Some(&t1))).cached_tokens;
        assert_eq!(
            same, 8,
            "the same scope must hit (else the isolation check is vacuous)"
        );
        if bug {
            assert_eq!(cross, vec![8, 8, 8], "the planted bug shares across scopes");
        } else {
            assert_eq!(
                cross,
                vec![0, 0, 0],
                "another tenant, tokenizer or model must miss"
            );
        }
        assert_eq!(
            m.probe_start(&req(21, &prompt, Some(&none))).cached_tokens,
            0
        );
    }
    // A `None` scope neither publishes nor looks up.
    let mut m = paged(16);
    admit(&mut m, 1, &prompt, Some(&none));
    m.release(1, ReleaseReason::Finish).unwrap();
    assert!(m.eviction_order().is_empty());
    m.assert_quiescent().unwrap();
}

#[test]
fn a_pending_block_revived_by_a_hit_survives_its_stale_fence() {
    let mut m = paged(4);
    let s = scope(ReuseScope::Tenant(3));
    let toks: Vec<u32> = (0..5).collect();
    admit(&mut m, 1, &toks, Some(&s));
    let b0 = blocks_of(&m, 1)[0];
    let step = m.begin_step();
    m.release(1, ReleaseReason::Cancel).unwrap();
    let hit = m.start(&req(2, &toks, Some(&s))).unwrap();
    assert_eq!((hit.cached_tokens, blocks_of(&m, 2)[0]), (4, b0));
    m.retire_step(step);
    assert_eq!(m.ref_count(b0), 1);
    ok(&m);
    m.release(2, ReleaseReason::Finish).unwrap();
    m.flush_prefix_cache();
    m.assert_quiescent().unwrap();
    assert_eq!(m.free_blocks(), 4, "free == total after a flush");
}

#[test]
fn planted_faults_are_caught_paged() {
    // Leak: quiescence fails.
    let mut m = paged(4);
    m.inject_fault(Fault::Leak);
    admit(&mut m, 1, &[1, 2, 3], None);
    m.release(1, ReleaseReason::Finish).unwrap();
    assert!(m.assert_quiescent().is_err());
    assert!(m.check_invariants().unwrap_err().contains("ref count"));

    // Skip-cow: a write into a shared block is reported.
    let mut m = paged(4);
    m.inject_fault(Fault::SkipCow);
    admit(&mut m, 1, &[1, 2], None);
    m.fork(1, 2).unwrap();
    assert!(m.append(2).unwrap().is_empty());
    assert!(m
        .check_invariants()
        .unwrap_err()
        .contains("without copy-on-write"));

    // Early reuse: a block handed out while its fence is in flight.
    let mut m = paged(1);
    m.inject_fault(Fault::EarlyReuse);
    admit(&mut m, 1, &[1, 2], None);
    let _step = m.begin_step();
    m.release(1, ReleaseReason::Cancel).unwrap();
    admit(&mut m, 2, &[3], None);
    assert!(m.check_invariants().unwrap_err().contains("fence"));

    // Bad block table: the layout disagrees with the table.
    let mut m = paged(4);
    m.inject_fault(Fault::BadBlockTable);
    admit(&mut m, 1, &[1, 2, 3, 4, 5], None);
    assert_ne!(blocks_of(&m, 1), m.block_table(1).unwrap());
    assert!(m.check_invariants().unwrap_err().contains("layout"));
}

#[test]
fn scope_identity_is_unambiguous_and_global_is_its_own_scope() {
    let prompt: Vec<u32> = (0..9).collect();
    let ab_c = ScopeKey {
        model: "ab".into(),
        tokenizer: "c".into(),
        reuse: ReuseScope::Global,
    };
    let a_bc = ScopeKey {
        model: "a".into(),
        tokenizer: "bc".into(),
        reuse: ReuseScope::Global,
    };
    let mut m = paged(16);
    admit(&mut m, 1, &prompt, Some(&ab_c));
    assert_eq!(
        m.probe_start(&req(2, &prompt, Some(&a_bc))).cached_tokens,
        0
    );
    assert_eq!(
        m.probe_start(&req(3, &prompt, Some(&ab_c))).cached_tokens,
        8
    );
    let tenant = ScopeKey {
        reuse: ReuseScope::Tenant(0),
        ..ab_c.clone()
    };
    assert_eq!(
        m.probe_start(&req(4, &prompt, Some(&tenant))).cached_tokens,
        0,
        "a global publication is not a tenant's"
    );
}

/// A conversation's next turn continues the previous turn's prompt *and output*: blocks the
/// decode filled (through `append_token`) are published like prompt blocks, including the one
/// straddling the prompt's end, so the follow-up hits them; plain `append` publishes nothing.
#[test]
fn generated_blocks_are_published_for_the_next_turn() {
    for with_tokens in [true, false] {
        let mut m = paged(16);
        let s = scope(ReuseScope::Tenant(3));
        let prompt: Vec<u32> = (100..106).collect(); // one full block and half of the next
        admit(&mut m, 1, &prompt, Some(&s));
        let generated: Vec<u32> = (200..206).collect(); // fills block 1, then all of block 2
        for &t in &generated {
            let copies = if with_tokens {
                m.append_token(1, t)
            } else {
                m.append(1)
            };
            assert!(copies.expect("append").is_empty());
        }
        ok(&m);
        m.release(1, ReleaseReason::Finish).unwrap();
        let mut next_turn = prompt.clone();
        next_turn.extend(&generated);
        next_turn.extend([300, 301, 302]); // the user's new tokens
        let hit = m
            .start(&req(2, &next_turn, Some(&s)))
            .unwrap()
            .cached_tokens;
        let expected = if with_tokens { 3 * BS } else { BS };
        assert_eq!(hit, expected, "with_tokens={with_tokens}");
        // A prompt that diverges inside the generated part hits only up to the divergence.
        let mut diverged = next_turn.clone();
        diverged[9] = 999;
        let partial = m.probe_start(&req(3, &diverged, Some(&s))).cached_tokens;
        assert_eq!(partial, if with_tokens { 2 * BS } else { BS });
        ok(&m);
    }
}
