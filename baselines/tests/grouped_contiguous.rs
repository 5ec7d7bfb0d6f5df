//! The grouped contiguous baseline (`kvbench_baselines::manager::GroupedContiguous`): random
//! operation strings through the trait over four pools (full + sliding, full + recurrent, full +
//! latent with a different block size, sliding only) against a reference model, checked after
//! every operation (invariants, accounting recomputed, fences, every position a step may still
//! read on a cell of its own that holds what was written there); planted faults caught; the
//! reservation of each table kind by hand; a sliding table's share of a long reservation.
//!
//! `KVBENCH_SEED` replays one seeded run; `KVBENCH_GROUPED_SEEDS` widens the sweep.

#[path = "grouped_contiguous/driver.rs"]
mod driver;
#[path = "grouped_contiguous/model.rs"]
mod model;
#[path = "grouped_contiguous/rng.rs"]
mod rng;

use kvbench_baselines::manager::GroupedContiguous;
use kvbench_cache_api::{
    AllocError, CacheMode, CopyOp, Fault, GroupTable, GroupedPool, GroupedState, KvCacheManager,
    ReleaseReason, SeqLayout, StartRequest, TableShape,
};

fn full(block_tokens: u32) -> TableShape {
    TableShape {
        block_tokens,
        window: None,
    }
}

fn sliding(block_tokens: u32, window: u32) -> TableShape {
    TableShape {
        block_tokens,
        window: Some(window),
    }
}

fn pool(shapes: Vec<TableShape>, pages: u32, state: Option<(u32, u64)>) -> GroupedPool {
    GroupedPool {
        shapes,
        page_slots: 4,
        slot_bytes: 1024,
        pages,
        state: state.map_or(GroupedState::None, |(sequences, slots_per_sequence)| {
            GroupedState::Reserved {
                sequences,
                slots_per_sequence,
            }
        }),
    }
}

/// (name, pool, largest step) of each mix the sweep runs.
fn mixes() -> Vec<(&'static str, GroupedPool, u32)> {
    vec![
        (
            "full+sliding",
            pool(vec![full(4), sliding(4, 6)], 64, None),
            4,
        ),
        ("full+recurrent", pool(vec![full(4)], 48, Some((3, 5))), 5),
        ("full+latent", pool(vec![full(4), full(8)], 64, None), 8),
        (
            "sliding only",
            pool(vec![sliding(4, 7), sliding(2, 5)], 48, None),
            3,
        ),
    ]
}

fn seeds() -> Vec<u64> {
    rng::seeds("KVBENCH_GROUPED_SEEDS", 24)
}

fn start(
    m: &mut GroupedContiguous,
    seq: u64,
    prompt: usize,
    reserve: u32,
) -> Result<(), AllocError> {
    let tokens = vec![1u32; prompt];
    m.start(&StartRequest {
        seq,
        tokens: &tokens,
        scope: None,
        reserve_tokens: reserve,
    })
    .map(|_| ())
}

#[test]
fn seeded_operation_strings_match_the_model() {
    let seeds = seeds();
    eprintln!("seeds {seeds:?} (replay one: KVBENCH_SEED=N)");
    for (name, pool, step) in mixes() {
        let mut reached = driver::Reached::default();
        for &seed in &seeds {
            let (result, r) = driver::run(seed, &pool, step, 300, None);
            if let Err(e) = result {
                panic!("{name}, seed {seed} (replay: KVBENCH_SEED={seed}): {e}");
            }
            reached += r;
        }
        eprintln!("{name}: {reached:?}");
        if seeds.len() < 8 {
            continue; // a replay: one seed need not reach every case
        }
        assert!(reached.forks > 0, "{name}: no fork copied a reservation");
        assert!(reached.refused > 0, "{name}: nothing was ever refused");
        assert!(reached.deferred > 0, "{name}: no release behind a fence");
        if pool.shapes.iter().any(|s| s.window.is_some()) {
            assert!(reached.ring_turns > 0, "{name}: no ring ever turned");
        }
    }
}

#[test]
fn planted_faults_are_caught_by_the_checks() {
    let (_, pool, step) = mixes().remove(0);
    for fault in [Fault::EarlyReuse, Fault::Leak, Fault::BadBlockTable] {
        let (mut fired_runs, mut caught) = (0, 0);
        for seed in 0..12u64 {
            let (result, r) = driver::run(seed, &pool, step, 200, Some(fault));
            if r.fired > 0 {
                fired_runs += 1;
                match result {
                    Err(_) => caught += 1,
                    Ok(()) => panic!(
                        "{}: fired {} times on seed {seed} and nothing noticed",
                        fault.name(),
                        r.fired
                    ),
                }
            } else if let Err(e) = result {
                panic!("{}: never fired on seed {seed}, yet {e}", fault.name());
            }
        }
        assert!(fired_runs > 0, "{} never fired", fault.name());
        assert_eq!(caught, fired_runs, "{}", fault.name());
    }
}

#[test]
fn each_table_kind_reserves_its_hand_computed_pages() {
    // Full, block 16: ⌈1000 / 16⌉ = 63. Sliding window 100, largest step 64, block 16:
    // ⌈164 / 16⌉ + 1 = 12. Latent, block 32: ⌈1000 / 32⌉ = 32. 107 pages of 4 slots, and a
    // recurrent state of 9 slots.
    let p = GroupedPool {
        shapes: vec![full(16), sliding(16, 100), full(32)],
        page_slots: 4,
        slot_bytes: 4096,
        pages: 300,
        state: GroupedState::Reserved {
            sequences: 2,
            slots_per_sequence: 9,
        },
    };
    let mut m = GroupedContiguous::new(p, 64);
    assert_eq!(m.mode(), CacheMode::Contiguous);
    assert_eq!(m.block_size(), 4);
    assert_eq!(m.table_pages(1000), Some(vec![63, 12, 32]));
    assert_eq!(m.sequence_slots(5000, 1000), 107 * 4 + 9);
    // A window longer than the reservation: the ring is the whole reservation, ⌈100 / 16⌉ = 7.
    assert_eq!(m.table_pages(100), Some(vec![7, 7, 4]));
    start(&mut m, 1, 40, 1000).unwrap();
    assert_eq!(m.reservation(1), Some((0, 107)));
    m.fill(1, 40).unwrap();
    let acc = m.accounting();
    assert_eq!(acc.total_slots, 300 * 4 + 2 * 9);
    // 40 tokens: full 2 pages + 8/16 of a page = 8 + 2 slots; the ring the same; latent 40/32
    // of a page = 4 + ⌊8 · 4 / 32⌋ = 5 slots; the state 9.
    assert_eq!(acc.live_slots, 10 + 10 + 5 + 9);
    assert_eq!(acc.allocated_unfilled_slots, 107 * 4 - 25);
    assert_eq!(acc.free_slots, (300 - 107) * 4 + 9);
    assert!(acc.is_conserved());
    m.check_invariants().unwrap();
}

#[test]
fn a_4096_window_of_a_32k_reservation_takes_an_eighth_and_the_step() {
    // One sliding table of window 4096 beside one full table, 16-token blocks, the largest
    // step 512: the ring is 4096 / 16 + 512 / 16 + 1 = 289 pages, the full table 2048.
    let (w, r, bt, step) = (4096u32, 32768u32, 16u32, 512u32);
    let p = pool(vec![full(bt), sliding(bt, w)], 4096, None);
    let m = GroupedContiguous::new(p, step);
    let pages = m.table_pages(r).unwrap();
    let ring_by_formula = (w + step).div_ceil(bt) + 1;
    assert_eq!(pages, vec![r / bt, ring_by_formula]);
    // ring / full = 1/8 + (step / bt + 1) / (r / bt), exactly.
    assert_eq!(8 * pages[1], pages[0] + 8 * (step / bt + 1));
    let ratio = f64::from(pages[1]) / f64::from(pages[0]);
    assert!((0.125..0.15).contains(&ratio), "ratio {ratio}");
}

#[test]
fn a_fork_reserves_again_and_copies_written_pages_as_page_ops() {
    // Full block 4 then a ring (window 6, step 2: ⌈8 / 4⌉ + 1 = 3 pages); reserve 20: 5 + 3.
    let p = pool(vec![full(4), sliding(4, 6)], 40, None);
    let mut m = GroupedContiguous::new(p, 2);
    start(&mut m, 1, 2, 20).unwrap();
    m.fill(1, 2).unwrap();
    for _ in 0..13 {
        // One decode a step, as the engine runs them.
        let step = m.begin_step();
        assert!(m.append(1).unwrap().is_empty());
        m.retire_step(step);
    }
    // 15 tokens: full blocks 0..4 on pages 0..4; the ring holds blocks 1..4 on pages 6, 7, 5.
    match m.layout(1) {
        Some(SeqLayout::Grouped { tables, .. }) => {
            assert_eq!(
                tables,
                &[
                    GroupTable {
                        first_block: 0,
                        pages: vec![0, 1, 2, 3].into()
                    },
                    GroupTable {
                        first_block: 1,
                        pages: vec![6, 7, 5].into()
                    }
                ]
            );
        }
        other => panic!("layout {other:?}"),
    }
    let ops = m.fork(1, 2).unwrap();
    // The child's run starts at page 8. The full table's unwritten page 4 lies between its 4
    // written pages and the ring, so they are two ops, not one run.
    assert_eq!(
        ops,
        vec![
            CopyOp {
                src_slot: 0,
                dst_slot: 8 * 4,
                len_tokens: 4 * 4
            },
            CopyOp {
                src_slot: 5 * 4,
                dst_slot: 13 * 4,
                len_tokens: 3 * 4
            }
        ]
    );
    assert_eq!(m.reservation(2), Some((8, 8)));
    m.check_invariants().unwrap();
    // Appends stop at the reservation: 5 more reach 20 tokens.
    for _ in 0..5 {
        let step = m.begin_step();
        m.append(2).unwrap();
        m.retire_step(step);
    }
    assert_eq!(m.append_cost(2), 4);
    assert!(matches!(m.append(2), Err(AllocError::NoSpace { .. })));
}

#[test]
fn a_fill_larger_than_the_step_is_refused_only_where_a_ring_turns() {
    let p = pool(vec![full(4), sliding(4, 6)], 40, None);
    let mut m = GroupedContiguous::new(p, 2);
    start(&mut m, 1, 10, 20).unwrap();
    let err = m.fill(1, 3).unwrap_err();
    assert!(
        matches!(err, AllocError::InvalidOp { seq: 1, .. }),
        "{err:?}"
    );
    m.fill(1, 2).unwrap();
    // Reserve 8: the ring is capped at the reservation (2 pages), so it never turns.
    start(&mut m, 2, 8, 8).unwrap();
    m.fill(2, 8).unwrap();
    m.check_invariants().unwrap();
}

/// A swap-in restores every token at once; the step after it reads only the ring's window of
/// them, so the fill's one-step bound does not apply: the ring holds the window of the last
/// restored token, the full table every block, and the sequence decodes on.
#[test]
fn a_restore_writes_past_the_step_bound_and_the_ring_holds_its_window() {
    // Full and sliding (window 6) tables of 4-token blocks, a 2-token step: a ring of
    // ⌈(6 + 2) / 4⌉ + 1 = 3 pages against 5 for a 20-token reservation.
    let p = pool(vec![full(4), sliding(4, 6)], 40, Some((4, 3)));
    let mut m = GroupedContiguous::new(p, 2);
    start(&mut m, 1, 13, 20).unwrap();
    assert!(matches!(
        m.fill(1, 13),
        Err(AllocError::InvalidOp { seq: 1, .. })
    ));
    m.restore(1, 13).unwrap();
    assert_eq!(m.seq_tokens(1), Some(13));
    m.check_invariants().unwrap();
    let Some(SeqLayout::Grouped { tables, shapes, .. }) = m.layout(1) else {
        panic!("grouped layout");
    };
    assert_eq!((tables[0].first_block, tables[0].end_block()), (0, 4));
    // The window of position 12 is 7..13: blocks 1..4, all on the ring.
    for pos in kvbench_cache_api::grouped::readable_from(&shapes[1], 13)..13 {
        assert!(
            kvbench_cache_api::grouped::cell(&shapes[1], &tables[1], pos).is_some(),
            "position {pos} restored on the ring"
        );
    }
    // What a swap of it moves: 4 full pages, 3 window pages, and its state.
    assert_eq!(m.swap_slots(1, 13), (4 + 3) * 4 + 3);
    let step = m.begin_step();
    m.append(1).unwrap();
    m.retire_step(step);
    m.check_invariants().unwrap();
    // A restore is of a fresh start's every token, nothing else.
    start(&mut m, 2, 8, 8).unwrap();
    assert!(matches!(
        m.restore(2, 4),
        Err(AllocError::InvalidOp { seq: 2, .. })
    ));
    m.fill(2, 4).unwrap();
    assert!(matches!(
        m.restore(2, 8),
        Err(AllocError::InvalidOp { seq: 2, .. })
    ));
    m.check_invariants().unwrap();
}

#[test]
fn recurrent_states_run_out_and_wait_for_their_fence() {
    let p = pool(vec![full(4)], 100, Some((2, 3)));
    let mut m = GroupedContiguous::new(p.clone(), 4);
    start(&mut m, 1, 4, 8).unwrap();
    start(&mut m, 2, 4, 8).unwrap();
    assert!(matches!(
        start(&mut m, 3, 4, 8),
        Err(AllocError::NoSpace { .. })
    ));
    let step = m.begin_step();
    m.release(1, ReleaseReason::Finish).unwrap();
    assert_eq!(m.accounting().pending_free_slots, 2 * 4 + 3);
    assert!(
        matches!(start(&mut m, 3, 4, 8), Err(AllocError::NoSpace { .. })),
        "the released state waits for the step"
    );
    m.retire_step(step);
    start(&mut m, 3, 4, 8).unwrap();
    m.check_invariants().unwrap();
    let none = GroupedPool {
        state: GroupedState::Reserved {
            sequences: 0,
            slots_per_sequence: 9,
        },
        ..p.clone()
    };
    let mut m = GroupedContiguous::new(none, 4);
    assert!(matches!(
        start(&mut m, 1, 4, 8),
        Err(AllocError::TooLarge { .. })
    ));
    // States taken from the pages on demand are the paged manager's rule: the baseline, which
    // reserves its states up front, has none to take and says so at every start.
    let paged = GroupedPool {
        state: GroupedState::Paged {
            pages_per_sequence: 3,
            slots_per_sequence: 9,
        },
        ..p
    };
    let mut m = GroupedContiguous::new(paged, 4);
    assert!(matches!(
        start(&mut m, 1, 4, 8),
        Err(AllocError::TooLarge { .. })
    ));
}

#[test]
fn first_fit_leaves_holes_that_the_largest_extent_reports() {
    let p = pool(vec![full(4)], 30, None);
    let mut m = GroupedContiguous::new(p, 4);
    for (seq, reserve) in [(1u64, 40u32), (2, 20), (3, 40)] {
        start(&mut m, seq, 1, reserve).unwrap();
    }
    m.release(2, ReleaseReason::Finish).unwrap();
    // Pages 10..15 free, 25..30 free: 5 pages of 4 slots each.
    assert_eq!(m.largest_free_extent(), 20);
    assert!(matches!(
        start(&mut m, 4, 1, 24),
        Err(AllocError::NoSpace {
            needed_slots: 24,
            available_slots: 20
        })
    ));
    assert!(matches!(
        start(&mut m, 5, 1, 200),
        Err(AllocError::TooLarge { .. })
    ));
    m.release(1, ReleaseReason::Finish).unwrap();
    start(&mut m, 4, 1, 24).unwrap();
    assert_eq!(
        m.reservation(4),
        Some((0, 6)),
        "first fit takes the lowest hole"
    );
    m.check_invariants().unwrap();
}

/// Prefill 64 tokens in chunks of 8 with two steps in flight (the engine's pipelined mode: a
/// chunk is planned while the previous one runs); the first error `check_invariants` reports.
fn pipelined_prefill(max_step: u32) -> Result<(), String> {
    // Window 8, 4-token blocks.
    let p = pool(vec![full(4), sliding(4, 8)], 64, None);
    let mut m = GroupedContiguous::new(p, max_step);
    start(&mut m, 1, 64, 64).map_err(|e| e.to_string())?;
    let mut in_flight = std::collections::VecDeque::new();
    for _ in 0..8 {
        m.fill(1, 8).map_err(|e| e.to_string())?;
        in_flight.push_back(m.begin_step());
        if in_flight.len() == 2 {
            m.check_invariants()?;
            let oldest = in_flight.pop_front().expect("two in flight");
            m.retire_step(oldest);
        }
    }
    for step in in_flight {
        m.retire_step(step);
    }
    m.check_invariants()
}

#[test]
fn a_ring_sized_for_one_step_is_reported_when_two_are_in_flight() {
    // Sized for one 8-token step: ⌈16 / 4⌉ + 1 = 5 pages. At 24 tokens the ring holds blocks
    // 1.. while the step that wrote 8..16 still reads from position 0.
    let err = pipelined_prefill(8).unwrap_err();
    assert!(
        err.contains("fewer than the steps in flight write"),
        "{err}"
    );
    // Sized for both steps' 16 tokens: ⌈24 / 4⌉ + 1 = 7 pages, and nothing is reported.
    pipelined_prefill(16).unwrap();
}

/// Gemma 3 27B as the hybrid layout cuts it (block size 16): 26 sliding tables (window 1024)
/// and 5 full ones of 2 layers each, one page = 2 layers × 16 tokens × 8 KiB = 256 KiB, and a
/// 16 GiB budget of 65,536 pages (`scenarios/gemma3-27b-h100.toml`).
fn gemma3_27b_pool() -> GroupedPool {
    let mut shapes = vec![sliding(16, 1024); 26];
    shapes.extend([full(16); 5]);
    GroupedPool {
        shapes,
        page_slots: 16,
        slot_bytes: 16 * 1024,
        pages: 65_536,
        state: GroupedState::None,
    }
}

#[test]
fn gemma3_27b_reservations_by_hand() {
    // (reservation, largest step) → (pages a sequence, sequences that start before NoSpace).
    // Rings: ⌈(1024 + 4096) / 16⌉ + 1 = 321 pages, capped at 256 for a 4,096-token
    // reservation; ⌈(1024 + 512) / 16⌉ + 1 = 97. Full tables 256 or 2,048 pages.
    let cases = [
        ((4096u32, 4096u32), (31 * 256u64, 8u64)),
        ((4096, 512), (26 * 97 + 5 * 256, 17)),
        ((32768, 4096), (26 * 321 + 5 * 2048, 3)),
        ((32768, 512), (26 * 97 + 5 * 2048, 5)),
    ];
    for ((reserve, step), (pages, fit)) in cases {
        let mut m = GroupedContiguous::new(gemma3_27b_pool(), step);
        assert_eq!(
            m.sequence_slots(u64::from(reserve), reserve),
            pages * 16,
            "{reserve} tokens, step {step}"
        );
        let mut started = 0u64;
        while start(&mut m, started, 1, reserve).is_ok() {
            started += 1;
        }
        assert_eq!(started, fit, "{reserve} tokens, step {step}");
        assert_eq!(fit, 65_536 / pages);
        m.check_invariants().unwrap();
    }
}
