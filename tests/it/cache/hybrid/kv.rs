//! The hybrid paged manager behind the engine's trait (`kvbench::cache::hybrid::HybridKv`):
//! random operation strings through `KvCacheManager` (start, fill, append, fork, release,
//! begin_step, retire_step) over several layer-group mixes, checked after every operation
//! against a plain reference model of the logical blocks, page versions, fences and states
//! each sequence holds: the manager's invariants and conservation, accounting totals
//! recomputed from the model, no released page in another table before its fence retired,
//! every written position inside its table's window in a cell no other sequence holds unless a
//! fork shares it; each planted fault fires and is caught; a proptest over the same strings;
//! a few cases by hand; and whole engine runs on `sim` (chunked prefill, forks, preemption,
//! steps in flight) with the invariants checked after every step and each fault reported.
//!
//! `KVBENCH_SEED` replays one seeded run, `KVBENCH_HYBRID_KV_SEEDS` widens the sweep,
//! `PROPTEST_CASES` raises the proptest case count.

use crate::support;
use crate::support::engine as engine_support;
use crate::support::hybrid_kv as hybrid_kv_support;

use std::collections::BTreeSet;

use hybrid_kv_support::checker::{run_blind, run_faulted, run_ops};
use hybrid_kv_support::{build, mixes, start, Op};
use kvbench::cache::hybrid::{HybridKv, HybridLayout};
use kvbench_cache_api::{
    AllocError, CopyOp, Fault, KvCacheManager, ReleaseReason, SeqLayout, StartRequest,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_ops(rng: &mut ChaCha8Rng, len: usize) -> Vec<Op> {
    (0..len)
        .map(|_| match rng.gen_range(0..20) {
            0..=2 => Op::Start {
                len: rng.gen_range(0..30),
            },
            3..=6 => Op::Fill {
                pick: rng.gen(),
                n: rng.gen_range(0..24),
            },
            7..=11 => Op::Append { pick: rng.gen() },
            12 | 13 => Op::Fork { pick: rng.gen() },
            14 | 15 => Op::Release { pick: rng.gen() },
            16 | 17 => Op::Begin,
            _ => Op::Retire { pick: rng.gen() },
        })
        .collect()
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..30u8).prop_map(|len| Op::Start { len }),
        4 => (any::<u8>(), 0..24u8).prop_map(|(pick, n)| Op::Fill { pick, n }),
        5 => any::<u8>().prop_map(|pick| Op::Append { pick }),
        2 => any::<u8>().prop_map(|pick| Op::Fork { pick }),
        2 => any::<u8>().prop_map(|pick| Op::Release { pick }),
        2 => Just(Op::Begin),
        2 => any::<u8>().prop_map(|pick| Op::Retire { pick }),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_trait_manager_matches_the_model(mix in 0..4usize, ops in prop::collection::vec(op(), 1..150)) {
        if let Err(e) = run_ops(&mixes()[mix], &ops, None, true) {
            prop_assert!(false, "{e}");
        }
    }
}

fn seeds() -> Vec<u64> {
    support::seeds("KVBENCH_HYBRID_KV_SEEDS", 24, 0)
}

#[test]
fn seeded_operation_strings_through_the_trait_match_the_model() {
    let seeds = seeds();
    eprintln!("seeds {seeds:?} (replay one: KVBENCH_SEED=N)");
    for seed in seeds {
        for mix in mixes() {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let ops = random_ops(&mut rng, 400);
            match run_ops(&mix, &ops, None, true) {
                Ok(0) => {}
                Ok(n) => panic!("seed {seed}: no fault armed, yet {n} fired"),
                Err(e) => panic!("seed {seed} (replay: KVBENCH_SEED={seed}): {e}"),
            }
        }
    }
}

#[test]
fn each_planted_fault_fires_and_is_caught() {
    let seeds = seeds();
    eprintln!("seeds {seeds:?} (replay one: KVBENCH_SEED=N)");
    for fault in Fault::ALL {
        let (mut fired, mut caught_by_model, mut caught_by_invariants) = (0, 0, 0);
        for &seed in &seeds {
            for mix in mixes() {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let ops = random_ops(&mut rng, 400);
                let (n, by_model) = run_faulted(&mix, &ops, fault, false);
                let (blind_fired, by_invariants) = run_blind(&mix, &ops, fault);
                if blind_fired > 0 {
                    assert!(
                        by_invariants.is_some(),
                        "seed {seed} (replay: KVBENCH_SEED={seed}) {}: {} fired {blind_fired} times, the manager's checks caught nothing",
                        mix.name,
                        fault.name()
                    );
                    caught_by_invariants += 1;
                }
                if n > 0 {
                    fired += 1;
                    assert!(
                        by_model.is_some(),
                        "seed {seed} (replay: KVBENCH_SEED={seed}) {}: {} fired {n} times, the model caught nothing",
                        mix.name,
                        fault.name()
                    );
                    caught_by_model += 1;
                }
            }
        }
        eprintln!(
            "{}: fired in {fired} runs, caught by the model in {caught_by_model}, by the manager's own checks in {caught_by_invariants}",
            fault.name()
        );
        assert!(
            fired >= seeds.len() as u64,
            "{} fired in only {fired} runs over {} seeds",
            fault.name(),
            seeds.len()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// By hand

fn tables(kv: &HybridKv, seq: u64) -> Vec<(u64, Vec<u32>)> {
    match kv.layout(seq) {
        Some(SeqLayout::Grouped { tables, .. }) => tables
            .iter()
            .map(|t| (t.first_block, t.pages.to_vec()))
            .collect(),
        other => panic!("seq {seq}: {other:?}"),
    }
}

#[test]
fn a_prompt_is_mapped_whole_and_trimmed_as_it_is_written() {
    let mix = &mixes()[3]; // sliding only: 1 table of 2 layers, window 6, blocks of 4
    let mut kv = build(mix);
    start(&mut kv, 1, 20).unwrap();
    let t = tables(&kv, 1);
    assert_eq!(t[0], (0, t[0].1.clone()));
    assert_eq!(
        t[0].1.len(),
        5,
        "every prompt token mapped before it is written"
    );
    assert_eq!(kv.accounting().allocated_unfilled_slots, 5 * 4);
    kv.fill(1, 8).unwrap();
    assert_eq!(
        tables(&kv, 1)[0].0,
        0,
        "the chunk's first queries read from token 0"
    );
    assert_eq!(kv.accounting().live_slots, 8);
    kv.fill(1, 12).unwrap();
    // Trimmed by the 8 tokens before the chunk: window 2..8, block 0 still reached.
    assert_eq!(tables(&kv, 1)[0].0, 0);
    assert_eq!(kv.append(1).unwrap(), Vec::new());
    // Trimmed by the 20 written before it: window 14..20, from block 3.
    assert_eq!(tables(&kv, 1)[0].0, 3);
    assert_eq!(tables(&kv, 1)[0].1.len(), 3);
    kv.check_invariants().unwrap();
    assert_eq!(
        kv.fill(1, 1),
        Err(AllocError::InvalidOp {
            seq: 1,
            reason: "fill past the started tokens"
        })
    );
}

#[test]
fn released_pages_wait_for_the_fence_of_every_step_in_flight() {
    let mix = &mixes()[0]; // 3 tables, blocks of 4; 48 pages
    let mut kv = build(mix);
    start(&mut kv, 1, 8).unwrap();
    kv.fill(1, 8).unwrap();
    let s1 = kv.begin_step();
    let s2 = kv.begin_step();
    let pages: BTreeSet<u32> = tables(&kv, 1).into_iter().flat_map(|t| t.1).collect();
    assert_eq!(pages.len(), 6);
    kv.release(1, ReleaseReason::Finish).unwrap();
    let a = kv.accounting();
    assert_eq!(a.pending_free_slots, 6 * 4);
    assert!(a.is_conserved());
    // The pool cannot hand them out: a start that needs all 48 pages does not fit.
    let whole = 16 * 4; // 16 blocks × 3 tables
    assert!(matches!(
        start(&mut kv, 2, whole),
        Err(AllocError::NoSpace { .. })
    ));
    kv.retire_step(s2);
    assert_eq!(
        kv.accounting().pending_free_slots,
        6 * 4,
        "s1 still in flight"
    );
    kv.retire_step(s1);
    assert_eq!(kv.accounting().pending_free_slots, 0);
    start(&mut kv, 2, whole).unwrap();
    kv.check_invariants().unwrap();
    // Retiring a step that is not in flight is reported.
    kv.retire_step(s1);
    assert!(kv.check_invariants().unwrap_err().contains("not in flight"));
}

#[test]
fn a_fork_shares_pages_and_an_append_copies_a_shared_partial_page() {
    let mix = &mixes()[2]; // full (4-token blocks) + MLA (7-token blocks)
    let mut kv = build(mix);
    start(&mut kv, 1, 6).unwrap();
    assert!(matches!(kv.fork(1, 2), Err(AllocError::InvalidOp { .. })));
    kv.fill(1, 6).unwrap();
    kv.fork(1, 2).unwrap();
    assert_eq!(tables(&kv, 1), tables(&kv, 2));
    // Full tables: position 6 is in block 1 (partial, shared) → copy; MLA: block 0 partial → copy.
    let n_tables = kv.shapes().len() as u64;
    assert_eq!(kv.append_cost(2), n_tables * 4);
    let copies = kv.append(2).unwrap();
    assert_eq!(copies.len() as u64, n_tables);
    for c in &copies {
        assert_eq!(c.len_tokens, 4, "a whole page");
        assert_eq!(c.src_slot % 4, 0);
        assert_eq!(c.dst_slot % 4, 0);
        assert_ne!(c.src_slot, c.dst_slot);
    }
    assert_eq!(kv.append_cost(1), 0, "the parent's pages are its own again");
    kv.check_invariants().unwrap();
    assert_eq!(kv.prefix_stats(), Default::default());
}

#[test]
fn sequence_slots_count_every_table_whole_and_the_state() {
    let kv = build(&mixes()[0]); // 2 sliding + 1 full table, 4-token blocks
    assert_eq!(kv.sequence_slots(100, 0), 3 * 25 * 4);
    let kv = build(&mixes()[1]); // 2 full layers in one table + 2 recurrent layers
    let layout = kv.hybrid_layout().clone();
    // A page: 2 layers × 4 tokens × 32 bytes = 256 bytes; the state 2 × 1000 bytes = 8 pages.
    assert_eq!(layout.page_bytes, 256);
    assert_eq!(layout.state_bytes_per_sequence, 2000);
    assert_eq!(layout.state_pages_per_sequence, 8);
    // 9 tokens: 3 pages of the table and the state's 8, 4 slots each.
    assert_eq!(kv.sequence_slots(9, 0), (3 + 8) * 4);
    assert_eq!(
        kv.accounting().total_slots,
        56 * 4,
        "the pool is the whole budget: no state reserved off it"
    );
}

#[test]
fn a_state_is_pages_of_the_pool_live_while_held_and_fenced_when_released() {
    let mix = &mixes()[1]; // full + recurrent: 56 pages of 256 bytes, 8 a state
    let mut kv = build(mix);
    // Each 4-token sequence takes one table page and 8 state pages: 6 of them take 54 pages.
    for seq in 0..6 {
        start(&mut kv, seq, 4).unwrap();
    }
    let a = kv.accounting();
    // A state's 2000 bytes are 32 live slots of 64 bytes (nothing written yet).
    assert_eq!(a.live_slots, 6 * 32, "{a:?}");
    assert_eq!(a.allocated_unfilled_slots, 6 * 4, "{a:?}");
    assert_eq!(a.free_slots, 2 * 4, "{a:?}");
    assert!(matches!(
        start(&mut kv, 6, 4),
        Err(AllocError::NoSpace { .. })
    ));
    let step = kv.begin_step();
    let released: Vec<u32> = kv.state_pages(0).unwrap().to_vec();
    kv.release(0, ReleaseReason::Preempt).unwrap();
    // The state's 8 pages and the one table page of seq 0 wait behind the step.
    assert_eq!(kv.accounting().pending_free_slots, 9 * 4);
    assert!(
        !kv.probe_start(&StartRequest {
            seq: 6,
            tokens: &[1, 2],
            scope: None,
            reserve_tokens: 2,
        })
        .fits
    );
    kv.fill(1, 4).unwrap();
    assert!(matches!(kv.fork(1, 6), Err(AllocError::NoSpace { .. })));
    kv.check_invariants().unwrap();
    kv.retire_step(step);
    assert_eq!(kv.accounting().pending_free_slots, 0);
    let copies = kv.fork(1, 6).unwrap();
    let (from, to) = (kv.state_pages(1).unwrap(), kv.state_pages(6).unwrap());
    let want: Vec<CopyOp> = from
        .iter()
        .zip(to)
        .map(|(&s, &d)| CopyOp {
            src_slot: u64::from(s) * 4,
            dst_slot: u64::from(d) * 4,
            len_tokens: 4,
        })
        .collect();
    assert_eq!(
        copies, want,
        "a fork copies the parent's state, page by page"
    );
    assert!(
        to.iter().all(|p| released.contains(p)),
        "the fenced state pages came back once the step retired"
    );
    kv.check_invariants().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Driven by the engine (on `sim`, without the shadow payload, which does not read grouped
// layouts): the engine's own protocol — chunked prefill, decode, forks of every sample,
// preemption, fences of steps in flight — with the invariants checked after every step.

fn engine_run(
    shape: &kvbench::model::ModelShape,
    pages: u64,
    async_steps: bool,
    fault: Option<Fault>,
) -> (kvbench::engine::RunRecord, u64) {
    use kvbench::backend::sim::SimBackend;
    use kvbench_cache_api::CacheMode;

    // Besides `pages` for the tables, the states of 8 sequences (where there is one).
    let probe = HybridLayout::new(shape, 16, 1 << 30, 0).unwrap();
    let pages = pages + 8 * u64::from(probe.state_pages_per_sequence);
    let layout = HybridLayout::new(shape, 16, probe.page_bytes * pages, 0).unwrap();
    assert_eq!(u64::from(layout.pages), pages);
    let mut kv = HybridKv::new(layout);
    let total = kv.accounting().total_slots;
    let mut sched = engine_support::sched();
    sched.max_tokens_per_step = 64; // chunked prefill of the longer prompts
    sched.async_steps = async_steps; // releases while the next step is in flight
    let mut cfg = engine_support::config(CacheMode::Paged, sched);
    cfg.fault = fault;
    let requests = (0..24u64)
        .map(|i| {
            let mut r = engine_support::req(i, i as f64 * 2.0, 20 + (i as u32 * 37) % 150, 30);
            r.samples = 1 + (i % 3) as u32;
            r
        })
        .collect();
    let w = engine_support::workload(requests);
    let setup = engine_support::sim_setup(shape, &cfg, total);
    let mut backend = SimBackend::new(&setup).expect("sim backend");
    let r = kvbench::engine::run(&cfg, &w, &mut kv, &mut backend).expect("engine run");
    (r, kv.fault_fired())
}

#[test]
fn the_engine_drives_it_through_a_run_and_it_ends_quiescent() {
    // Pools tight enough that admission waits and sequences are preempted.
    for (shape, pages) in [
        (kvbench::model::ModelShape::tiny_sliding(), 60),
        (kvbench::model::ModelShape::tiny_mla(), 20),
        (kvbench::model::ModelShape::tiny_hybrid(), 20),
    ] {
        for async_steps in [false, true] {
            let (r, fired) = engine_run(&shape, pages, async_steps, None);
            assert_eq!(r.end.violation, None, "{}", shape.name);
            assert!(
                r.end.reclamation.ok,
                "{}: {}",
                shape.name, r.end.reclamation.detail
            );
            assert_eq!(fired, 0);
            let completed = engine_support::count(&r, kvbench::engine::StreamStatus::Completed);
            assert_eq!(
                completed,
                r.streams.len(),
                "{}: every stream completes",
                shape.name
            );
            assert!(r.end.peak_running > 1, "{}", shape.name);
            eprintln!(
            "{} (async steps {async_steps}): {} streams, peak running {}, {} prefill chunks, {} preemptions",
            shape.name,
            r.streams.len(),
            r.end.peak_running,
            engine_support::events(&r, "prefill_chunk"),
            engine_support::events(&r, "preempt")
        );
            assert!(
                engine_support::events(&r, "preempt") > 0,
                "{}: the pool is tight enough to preempt",
                shape.name
            );
        }
    }
}

#[test]
fn each_planted_fault_fires_in_an_engine_run_and_is_reported() {
    let shape = kvbench::model::ModelShape::tiny_sliding();
    for fault in Fault::ALL {
        let (r, fired) = engine_run(&shape, 60, true, Some(fault));
        assert!(fired > 0, "{} never fired", fault.name());
        assert!(
            r.end.violation.is_some() || !r.end.reclamation.ok,
            "{} fired {fired} times and the run reported nothing",
            fault.name()
        );
    }
}
