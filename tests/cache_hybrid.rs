//! The hybrid paged manager (`kvbench::cache::hybrid`): random operation strings (start, append
//! n, fork, release) over several layer-group mixes, checked after every operation against a
//! plain reference model of the logical blocks each sequence must hold in each table, with the
//! manager's invariants, and quiescence at the end; a planted bug the same checks catch;
//! layouts and fits of the `gemma3-27b` and `gpt-oss-120b` presets computed by hand; the prefix
//! hit rule per table kind.
//!
//! `PROPTEST_CASES` raises the proptest case count; `KVBENCH_SEED` replays one seeded run and
//! `KVBENCH_HYBRID_SEEDS` widens the seeded sweep.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use kvbench::cache::hybrid::{
    compare_fit, prefix_hit_tokens, vllm_layers_per_table, HybridCache, HybridError, HybridFault,
    HybridLayout, TableKind, TableSpec,
};
use kvbench::model::{LayerGroup, ModelShape};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// Group mixes

use support::groups::{full, mix as shape, sliding};

/// One mix: its shape, block size and pages in the pool (recurrent states come out of them).
struct Mix {
    name: &'static str,
    shape: ModelShape,
    block_size: u32,
    pages: u64,
}

fn mixes() -> Vec<Mix> {
    vec![
        Mix {
            // Gemma-like: five sliding layers to one full, a window that is not whole blocks.
            name: "5 sliding : 1 full",
            shape: shape(vec![sliding(5, 10), full(1)]),
            block_size: 4,
            pages: 90,
        },
        Mix {
            name: "full + recurrent",
            shape: shape(vec![
                full(2),
                LayerGroup::Recurrent {
                    layers: 2,
                    state_bytes: 1000,
                },
            ]),
            block_size: 4,
            // 256-byte pages, a 2000-byte state: 8 pages a sequence before any token.
            pages: 60,
        },
        Mix {
            // 32 bytes a token a full layer, 18 an MLA layer: 7-token MLA blocks, 4-byte tails.
            name: "full + mla",
            shape: shape(vec![
                full(2),
                LayerGroup::Mla {
                    layers: 2,
                    latent_dim: 7,
                    rope_dim: 2,
                    q_lora_rank: 0,
                },
            ]),
            block_size: 4,
            pages: 40,
        },
        Mix {
            // gpt-oss-like: alternating sliding and full, a window of two blocks, block size 1 too.
            name: "1 sliding : 1 full, block 1",
            shape: shape(vec![sliding(2, 3), full(2)]),
            block_size: 1,
            pages: 60,
        },
    ]
}

fn build(mix: &Mix) -> HybridCache {
    let probe = HybridLayout::new(&mix.shape, mix.block_size, 1 << 30, 0).unwrap();
    let budget = probe.page_bytes * mix.pages;
    let layout = HybridLayout::new(&mix.shape, mix.block_size, budget, 0).unwrap();
    assert_eq!(layout.pages as u64, mix.pages, "{}", mix.name);
    HybridCache::new(layout)
}

// ---------------------------------------------------------------------------------------------
// Operations and the reference model

#[derive(Debug, Clone, Copy)]
enum Op {
    Start,
    Append { pick: u8, n: u8 },
    Fork { pick: u8 },
    Release { pick: u8 },
}

/// What each sequence must hold: per table, logical block → version. A version is one page's
/// content: a fork shares its parent's versions, a write into a shared partial block makes a
/// new one (copy-on-write), a new block is a new one. Pages in use = versions in use.
#[derive(Default, Clone)]
struct Model {
    seqs: BTreeMap<u64, (u64, Vec<BTreeMap<u64, u64>>)>,
    next_version: u64,
}

impl Model {
    fn holders(&self, table: usize, version: u64) -> usize {
        self.seqs
            .values()
            .map(|(_, t)| t[table].values().filter(|&&v| v == version).count())
            .sum()
    }

    fn versions(&self) -> BTreeSet<(usize, u64)> {
        let mut all = BTreeSet::new();
        for (_, tables) in self.seqs.values() {
            for (t, blocks) in tables.iter().enumerate() {
                all.extend(blocks.values().map(|&v| (t, v)));
            }
        }
        all
    }

    /// The copies an append makes, or the pages it needed when they are not free.
    fn append(&mut self, specs: &[TableSpec], pages: u64, seq: u64, n: u64) -> Result<u64, u64> {
        let (tokens, tables) = self.seqs[&seq].clone();
        let mut needed = 0;
        let mut copies = 0;
        for (t, spec) in specs.iter().enumerate() {
            let bt = spec.block_tokens as u64;
            let last = tables[t].get(&(tokens.saturating_sub(1) / bt)).copied();
            if n > 0 && tokens % bt != 0 && last.is_some_and(|v| self.holders(t, v) > 1) {
                needed += 1;
                copies += 1;
            }
            needed += (tokens + n).div_ceil(bt) - tokens.div_ceil(bt);
        }
        let used = self.versions().len() as u64;
        if needed > pages - used {
            return Err(needed);
        }
        let mut tables = tables;
        let new_tokens = tokens + n;
        for (t, spec) in specs.iter().enumerate() {
            let bt = spec.block_tokens as u64;
            if n > 0 && tokens % bt != 0 {
                let last = tokens.saturating_sub(1) / bt;
                let v = tables[t][&last];
                if self.holders(t, v) > 1 {
                    tables[t].insert(last, self.next_version);
                    self.next_version += 1;
                }
            }
            for b in tokens.div_ceil(bt)..new_tokens.div_ceil(bt) {
                tables[t].insert(b, self.next_version);
                self.next_version += 1;
            }
            if let TableKind::Sliding { window } = spec.kind {
                // A block stays while its last position is within the last `window` tokens.
                tables[t].retain(|&b, _| (b + 1) * bt + window as u64 > new_tokens);
            }
        }
        self.seqs.insert(seq, (new_tokens, tables));
        Ok(copies)
    }
}

/// Run `ops` on `mix`; `invariants` also runs the manager's own checks after each op (off, the
/// reference model alone must catch a planted bug).
fn run_ops(
    mix: &Mix,
    ops: &[Op],
    fault: Option<HybridFault>,
    invariants: bool,
) -> Result<(), String> {
    let mut cache = build(mix);
    if let Some(f) = fault {
        cache.plant_fault(f);
    }
    let specs = cache.layout().tables.clone();
    let pages = cache.layout().pages as u64;
    // Pages one sequence's recurrent state takes from the pool.
    let sp = u64::from(cache.layout().state_pages_per_sequence);
    let mut model = Model::default();
    let mut next_seq = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let live: Vec<u64> = model.seqs.keys().copied().collect();
        let pick = |p: u8| (!live.is_empty()).then(|| live[p as usize % live.len()]);
        let at = |e: String| format!("{}: op {i} {op:?}: {e}", mix.name);
        // The pages the tables may have: the pool less the live sequences' states.
        let table_pages = pages - sp * live.len() as u64;
        let free_pages = table_pages - model.versions().len() as u64;
        match *op {
            Op::Start => {
                let seq = next_seq;
                next_seq += 1;
                let got = cache.start(seq);
                if sp > free_pages {
                    if !matches!(got, Err(HybridError::OutOfPages { needed, .. }) if needed == sp) {
                        return Err(at(format!(
                            "expected OutOfPages for the state, got {got:?}"
                        )));
                    }
                } else {
                    got.map_err(|e| at(e.to_string()))?;
                    let empty = vec![BTreeMap::new(); specs.len()];
                    model.seqs.insert(seq, (0, empty));
                }
            }
            Op::Append { pick: p, n } => {
                let Some(seq) = pick(p) else { continue };
                let n = n as u64;
                let expect = model.clone().append(&specs, table_pages, seq, n);
                let got = cache.append(seq, n);
                let copies = cache.take_copies();
                match (expect, got) {
                    (Ok(c), Ok(())) => {
                        model.append(&specs, table_pages, seq, n).unwrap();
                        if copies.len() as u64 != c {
                            return Err(at(format!("{} copies, model says {c}", copies.len())));
                        }
                    }
                    (Err(needed), Err(HybridError::OutOfPages { needed: got, .. }))
                        if needed == got => {}
                    (e, g) => return Err(at(format!("model {e:?}, manager {g:?}"))),
                }
            }
            Op::Fork { pick: p } => {
                let Some(parent) = pick(p) else { continue };
                let child = next_seq;
                next_seq += 1;
                let got = cache.fork(parent, child);
                let copies = cache.take_copies();
                if sp > free_pages {
                    if !matches!(got, Err(HybridError::OutOfPages { needed, .. }) if needed == sp) {
                        return Err(at(format!(
                            "expected OutOfPages for the state, got {got:?}"
                        )));
                    }
                } else {
                    got.map_err(|e| at(e.to_string()))?;
                    // The parent's state is copied page by page into the child's own pages.
                    if copies.len() as u64 != sp || copies.iter().any(|c| c.src == c.dst) {
                        return Err(at(format!("fork copies {copies:?}, {sp} state pages")));
                    }
                    let entry = model.seqs[&parent].clone();
                    model.seqs.insert(child, entry);
                }
            }
            Op::Release { pick: p } => {
                let Some(seq) = pick(p) else { continue };
                cache.release(seq).map_err(|e| at(e.to_string()))?;
                model.seqs.remove(&seq);
            }
        }
        compare(&cache, &model, &specs).map_err(at)?;
        if invariants {
            let bad = cache.check_invariants();
            if !bad.is_empty() {
                return Err(at(bad.join("; ")));
            }
        }
    }
    for seq in model.seqs.keys() {
        cache
            .release(*seq)
            .map_err(|e| format!("{}: final release of {seq}: {e}", mix.name))?;
    }
    let bad = cache.check_quiescent();
    if !bad.is_empty() {
        return Err(format!("{}: not quiescent: {}", mix.name, bad.join("; ")));
    }
    Ok(())
}

/// The manager holds what the model says: the same sequences, lengths and logical blocks, one
/// page per version (the same page wherever a version is shared, a different one otherwise),
/// the recurrent states of the live sequences.
fn compare(cache: &HybridCache, model: &Model, specs: &[TableSpec]) -> Result<(), String> {
    let seqs: Vec<u64> = cache.sequences().collect();
    let want: Vec<u64> = model.seqs.keys().copied().collect();
    if seqs != want {
        return Err(format!("sequences {seqs:?}, model {want:?}"));
    }
    let mut page_of: BTreeMap<(usize, u64), u32> = BTreeMap::new();
    let mut version_of: BTreeMap<u32, (usize, u64)> = BTreeMap::new();
    for (&seq, (tokens, tables)) in &model.seqs {
        if cache.tokens(seq) != Some(*tokens) {
            return Err(format!(
                "seq {seq}: {:?} tokens, model {tokens}",
                cache.tokens(seq)
            ));
        }
        for (t, blocks) in tables.iter().enumerate() {
            let table = cache
                .table(seq, t)
                .ok_or(format!("seq {seq}: no table {t}"))?;
            let held: Vec<u64> = (table.first_block..table.end_block()).collect();
            let want: Vec<u64> = blocks.keys().copied().collect();
            if held != want {
                return Err(format!(
                    "seq {seq} table {t} ({:?}) holds blocks {held:?}, model {want:?}",
                    specs[t].kind
                ));
            }
            for (&page, (_, &v)) in table.pages.iter().zip(blocks) {
                if *page_of.entry((t, v)).or_insert(page) != page
                    || *version_of.entry(page).or_insert((t, v)) != (t, v)
                {
                    return Err(format!("seq {seq} table {t}: page {page} shared wrongly"));
                }
            }
        }
    }
    // Every version a page, and every live sequence's state its own pages.
    let sp = cache.layout().state_pages_per_sequence;
    let states = if sp > 0 { model.seqs.len() as u32 } else { 0 };
    let used = model.versions().len() as u32 + states * sp;
    if cache.used_pages() != used {
        return Err(format!("{} pages used, model {used}", cache.used_pages()));
    }
    if cache.states_held() != states {
        return Err(format!(
            "{} states held, model {states}",
            cache.states_held()
        ));
    }
    Ok(())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Start),
        6 => (any::<u8>(), 0..40u8).prop_map(|(pick, n)| Op::Append { pick, n }),
        2 => any::<u8>().prop_map(|pick| Op::Fork { pick }),
        2 => any::<u8>().prop_map(|pick| Op::Release { pick }),
    ]
}

fn random_ops(rng: &mut ChaCha8Rng, len: usize) -> Vec<Op> {
    (0..len)
        .map(|_| match rng.gen_range(0..12) {
            0 | 1 => Op::Start,
            2..=7 => Op::Append {
                pick: rng.gen(),
                // Mostly decode-sized steps, sometimes a prefill chunk.
                n: if rng.gen_bool(0.7) {
                    rng.gen_range(0..3)
                } else {
                    rng.gen_range(0..40)
                },
            },
            8 | 9 => Op::Fork { pick: rng.gen() },
            _ => Op::Release { pick: rng.gen() },
        })
        .collect()
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
    fn hybrid_matches_the_model(mix in 0..4usize, ops in prop::collection::vec(op(), 1..120)) {
        if let Err(e) = run_ops(&mixes()[mix], &ops, None, true) {
            prop_assert!(false, "{e}");
        }
    }
}

fn seeds() -> Vec<u64> {
    support::seeds("KVBENCH_HYBRID_SEEDS", 32, 0)
}

#[test]
fn seeded_operation_strings_match_the_model() {
    let seeds = seeds();
    eprintln!("seeds {seeds:?} (replay one: KVBENCH_SEED=N)");
    for seed in seeds {
        for mix in mixes() {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let ops = random_ops(&mut rng, 300);
            if let Err(e) = run_ops(&mix, &ops, None, true) {
                panic!("seed {seed} (replay: KVBENCH_SEED={seed}): {e}");
            }
        }
    }
}

#[test]
fn keeping_out_of_window_blocks_is_caught() {
    let gemma_like = &mixes()[0];
    let (mut by_model, mut by_invariants, mut runs) = (0, 0, 0);
    for seed in 0..16u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ops = random_ops(&mut rng, 300);
        assert_eq!(
            run_ops(gemma_like, &ops, None, true),
            Ok(()),
            "seed {seed}: the unplanted manager must pass"
        );
        runs += 1;
        let fault = Some(HybridFault::KeepOutOfWindow);
        if let Err(e) = run_ops(gemma_like, &ops, fault, false) {
            assert!(e.contains("holds blocks"), "seed {seed}: {e}");
            by_model += 1;
        }
        if let Err(e) = run_ops(gemma_like, &ops, fault, true) {
            assert!(
                e.contains("holds blocks") || e.contains("should hold"),
                "seed {seed}: {e}"
            );
            by_invariants += 1;
        }
    }
    // Every string grows some sequence past its 10-token window.
    assert_eq!((by_model, by_invariants), (runs, runs));

    // And the smallest case by hand: 14 tokens, window 10, blocks of 4: block 0 (tokens 0–3)
    // is wholly before the window (tokens 4–13).
    let ops = [Op::Start, Op::Append { pick: 0, n: 14 }];
    assert_eq!(run_ops(gemma_like, &ops, None, true), Ok(()));
    let err = run_ops(gemma_like, &ops, Some(HybridFault::KeepOutOfWindow), true).unwrap_err();
    assert!(
        err.contains("holds blocks [0, 1, 2, 3], model [1, 2, 3]"),
        "{err}"
    );
}

#[test]
fn a_fork_shares_pages_and_copies_a_partial_last_block_on_write() {
    let mix = &mixes()[0]; // 6 tables of 1 layer, blocks of 4 tokens
    let mut cache = build(mix);
    cache.start(1).unwrap();
    cache.append(1, 6).unwrap(); // 2 blocks a table, the second half full
    assert_eq!(cache.used_pages(), 12);
    cache.fork(1, 2).unwrap();
    assert_eq!(cache.used_pages(), 12, "a fork takes no page");
    let shared = cache.table(1, 5).unwrap().pages.clone();
    assert!(shared.iter().all(|&p| cache.page_refs(p) == Some(2)));
    cache.append(2, 1).unwrap();
    let copies = cache.take_copies();
    assert_eq!(
        copies.len(),
        6,
        "one copy of the partial last block a table"
    );
    assert!(copies.iter().all(|c| c.src != c.dst));
    assert_eq!(cache.used_pages(), 18);
    assert_eq!(
        cache.page_refs(shared[0]),
        Some(2),
        "full blocks stay shared"
    );
    assert_eq!(
        cache.page_refs(shared[1]),
        Some(1),
        "the parent keeps its partial block"
    );
    cache.append(1, 1).unwrap();
    assert!(
        cache.take_copies().is_empty(),
        "no longer shared: written in place"
    );
    assert!(cache.check_invariants().is_empty());
    cache.release(1).unwrap();
    cache.release(2).unwrap();
    assert!(cache.check_quiescent().is_empty());
    assert_eq!(cache.start(3), Ok(()));
    assert_eq!(cache.start(3), Err(HybridError::DuplicateSeq(3)));
    assert_eq!(cache.append(9, 1), Err(HybridError::UnknownSeq(9)));
    let before = cache.free_pages();
    assert!(matches!(
        cache.append(3, 10_000),
        Err(HybridError::OutOfPages { .. })
    ));
    assert_eq!(
        cache.free_pages(),
        before,
        "a refused append changes nothing"
    );
}

#[test]
fn a_sliding_table_releases_blocks_as_the_window_moves() {
    let mix = &mixes()[0]; // window 10, blocks of 4; table 0 is sliding, table 5 full
    let mut cache = build(mix);
    cache.start(7).unwrap();
    let mut held = Vec::new();
    for tokens in 1..=40u64 {
        cache.append(7, 1).unwrap();
        let t = cache.table(7, 0).unwrap();
        held.push((t.first_block, t.end_block()));
        assert_eq!(cache.table(7, 5).unwrap().first_block, 0);
        assert_eq!(cache.table(7, 5).unwrap().end_block(), tokens.div_ceil(4));
    }
    // At 12 tokens the window is tokens 2..12: block 0 (tokens 0..4) still holds token 2–3.
    assert_eq!(held[11], (0, 3));
    // At 14 tokens the window is 4..14: block 0 is gone.
    assert_eq!(held[13], (1, 4));
    // At 40 tokens: window 30..40, blocks 7 (28..32), 8, 9.
    assert_eq!(held[39], (7, 10));
    // One unshared sequence: 3 sliding blocks × 5 tables + 10 full blocks.
    assert_eq!(cache.used_pages(), 25);
}

// ---------------------------------------------------------------------------------------------
// Presets by hand

#[test]
fn gemma3_27b_layout_by_hand() {
    let shape = ModelShape::gemma3_27b();
    let layout = HybridLayout::new(&shape, 16, 16 * GIB, 0).unwrap();
    // 52 sliding and 10 full layers: gcd 2, so 26 + 5 tables of 2 layers, no padding.
    assert_eq!(layout.layers_per_table, 2);
    assert_eq!(layout.tables.len(), 31);
    let sliding = layout
        .tables
        .iter()
        .filter(|t| t.kind == TableKind::Sliding { window: 1024 })
        .count();
    assert_eq!(sliding, 26);
    // A layer's token: 2 (K, V) × 16 heads × 128 × 2 bytes = 8192; a page 2 × 16 × 8192.
    assert_eq!(layout.page_bytes, 262_144);
    assert!(layout.tables.iter().all(|t| t.block_tokens == 16
        && t.tail_bytes_per_page == 0
        && t.bytes_per_token == 16_384));
    assert_eq!(layout.pages, 65_536); // 16 GiB / 256 KiB
                                      // 4096 tokens: 5 full tables × 256 blocks + 26 sliding × 64 blocks (tokens 3072..4096).
    assert_eq!(layout.pages_per_sequence(4096), Some(1280 + 1664));
    assert_eq!(layout.bytes_per_sequence(4096), Some(771_751_936));
    assert_eq!(
        layout.bytes_per_sequence(32_768),
        Some((10_240 + 1664) * 262_144)
    );
    // vLLM's rule for 52 + 10: groups of 10, the sliding ones padded to 60 layers.
    assert_eq!(vllm_layers_per_table(&[52, 10]), Some(10));
    assert_eq!(vllm_layers_per_table(&[12, 13]), Some(13));
    assert_eq!(vllm_layers_per_table(&[18, 18]), Some(18));
}

#[test]
fn gpt_oss_120b_layout_by_hand() {
    let shape = ModelShape::gpt_oss_120b();
    let layout = HybridLayout::new(&shape, 16, 6 * GIB, 0).unwrap();
    assert_eq!(layout.layers_per_table, 18);
    assert_eq!(layout.tables.len(), 2);
    // 2 × 8 heads × 64 × 2 bytes = 2048 a layer's token; a page 18 × 16 × 2048.
    assert_eq!(layout.page_bytes, 589_824);
    assert_eq!(layout.pages, 10_922); // ⌊6 GiB / 576 KiB⌋
                                      // 4096 tokens: 256 full blocks + 8 sliding (window 128).
    assert_eq!(layout.pages_per_sequence(4096), Some(264));
    assert_eq!(layout.bytes_per_sequence(4096), Some(155_713_536));
    assert_eq!(layout.bytes_per_sequence(32_768), Some(2056 * 589_824));
}

#[test]
fn preset_fits_against_the_summed_bytes_slots_by_hand() {
    // gemma3-27b on one H100 (16 GiB of KV, as scenarios/gemma3-27b-h100.toml).
    let g4 = compare_fit(&ModelShape::gemma3_27b(), 16, 16 * GIB, 4096).unwrap();
    // Summed: 62 × 8192 = 507,904 bytes a token; 33,825 slots, 2114 blocks, 256 a sequence.
    assert_eq!(g4.summed_bytes_per_sequence, 2_080_374_784);
    assert_eq!(g4.summed_sequences, 8);
    assert_eq!(g4.hybrid_bytes_per_sequence, 771_751_936);
    assert_eq!(g4.hybrid_sequences, 22);
    // vLLM: 1 full table of 10 layers × 256 blocks + 6 sliding of 10 × 64, pages of 1.25 MiB.
    assert_eq!(g4.vllm_bytes_per_sequence, Some(640 * 1_310_720));
    assert_eq!(g4.vllm_sequences, Some(20));
    let g32 = compare_fit(&ModelShape::gemma3_27b(), 16, 16 * GIB, 32_768).unwrap();
    assert_eq!(g32.summed_bytes_per_sequence, 16_642_998_272);
    assert_eq!(g32.summed_sequences, 1);
    assert_eq!(g32.hybrid_bytes_per_sequence, 3_120_562_176);
    assert_eq!(g32.hybrid_sequences, 5);
    assert_eq!(g32.vllm_bytes_per_sequence, Some(2432 * 1_310_720));
    assert_eq!(g32.vllm_sequences, Some(5));

    // gpt-oss-120b on one H200 (6 GiB of KV, as scenarios/gpt-oss-120b-h200.toml).
    let o4 = compare_fit(&ModelShape::gpt_oss_120b(), 16, 6 * GIB, 4096).unwrap();
    // Summed: 36 × 2048 = 73,728 bytes a token; 87,381 slots, 5461 blocks.
    assert_eq!(o4.summed_bytes_per_sequence, 301_989_888);
    assert_eq!(o4.summed_sequences, 21);
    assert_eq!(o4.hybrid_bytes_per_sequence, 155_713_536);
    assert_eq!(o4.hybrid_sequences, 41);
    assert_eq!(
        o4.vllm_bytes_per_sequence,
        Some(155_713_536),
        "18 + 18: no padding either way"
    );
    let o32 = compare_fit(&ModelShape::gpt_oss_120b(), 16, 6 * GIB, 32_768).unwrap();
    assert_eq!(o32.summed_bytes_per_sequence, 2_415_919_104);
    assert_eq!(o32.summed_sequences, 2);
    assert_eq!(o32.hybrid_bytes_per_sequence, 1_212_678_144);
    assert_eq!(o32.hybrid_sequences, 5);
    assert_eq!(o32.vllm_sequences, Some(5));
}

#[test]
fn recurrent_state_comes_out_of_the_pool_on_demand() {
    let shape = ModelShape::qwen3_next_80b();
    // 36 layers × 1,097,728 bytes of state a sequence; 12 full layers of 2 × 2 × 256 × 2 bytes.
    let state = 36 * 1_097_728u64;
    let page = 12 * 16 * 2048u64;
    let layout = HybridLayout::new(&shape, 16, 4 * GIB, 10).unwrap();
    assert_eq!(layout.state_bytes_per_sequence, state);
    assert_eq!(layout.tables.len(), 1);
    assert_eq!(layout.page_bytes, page);
    // ⌈39,518,208 ÷ 393,216⌉ = 101 pages (100.5 of state, the last page half used).
    assert_eq!(layout.state_pages_per_sequence, 101);
    assert_eq!(state.div_ceil(page), 101);
    // The paged pool is the whole budget; the contiguous baseline's is less its 10 states.
    assert_eq!(layout.pages as u64, 4 * GIB / page);
    assert_eq!(layout.state_sequences, Some(10));
    assert_eq!(
        layout.contiguous_pages as u64,
        (4 * GIB - 10 * state) / page
    );
    let pages = layout.pages;
    let mut cache = HybridCache::new(layout);
    // 10,922 pages hold 108 states of 101 pages (10,908), no 109th.
    let fit = u64::from(pages) / 101;
    assert_eq!(fit, 108);
    for s in 0..fit {
        cache.start(s).unwrap();
    }
    assert_eq!(cache.state_bytes_held(), fit * state);
    assert_eq!(cache.used_pages() as u64, fit * 101);
    assert!(matches!(
        cache.start(fit),
        Err(HybridError::OutOfPages { needed: 101, .. })
    ));
    assert!(matches!(
        cache.fork(0, fit),
        Err(HybridError::OutOfPages { needed: 101, .. })
    ));
    cache.release(3).unwrap();
    assert_eq!(cache.fork(0, fit), Ok(()));
    let copies = cache.take_copies();
    assert_eq!(copies.len(), 101, "a fork copies every state page");
    assert!(cache.check_invariants().is_empty());
}

/// Per-block FP8 scales in the page: a full layer of 2 KV heads of 4 stores 16 bytes a token
/// and 2 × 2 f32 scales (16 bytes) a block; a sliding layer of 1 head 8 bytes and 8 bytes of
/// scales. The page is the larger block of 4 tokens, 4 × 16 + 16 = 80 bytes; the sliding table
/// fits ⌊(80 − 8) / 8⌋ = 9 tokens a page.
#[test]
fn per_block_fp8_scales_are_counted_in_each_page() {
    use kvbench::model::{Dtype, KvScale};
    let mut m = shape(vec![
        full(1),
        LayerGroup::Sliding {
            layers: 1,
            window: 20,
            kv_heads: 1,
            head_dim: 4,
        },
    ]);
    m.kv_dtype = Dtype::Fp8E4m3;
    m.kv_scale = Some((KvScale::PerBlock, 4));
    let layout = HybridLayout::new(&m, 4, 800, 0).unwrap();
    assert_eq!(layout.page_bytes, 80);
    assert_eq!(layout.pages, 10);
    let (f, s) = (&layout.tables[0], &layout.tables[1]);
    assert_eq!(
        (
            f.block_tokens,
            f.bytes_per_token,
            f.scale_bytes_per_block,
            f.tail_bytes_per_page
        ),
        (4, 16, 16, 0)
    );
    assert_eq!(
        (
            s.block_tokens,
            s.bytes_per_token,
            s.scale_bytes_per_block,
            s.tail_bytes_per_page
        ),
        (9, 8, 8, 0)
    );
    // The summed layout: 16 + 8 bytes a token, and (16 + 8) bytes of scales a 4-token block.
    assert_eq!(m.kv_bytes_per_token(), 16 + 8 + 6);
}

#[test]
fn layouts_refuse_what_they_cannot_lay_out() {
    use kvbench::cache::hybrid::LayoutError;
    let tiny = shape(vec![full(1)]);
    assert_eq!(
        HybridLayout::new(&tiny, 0, GIB, 0),
        Err(LayoutError::ZeroBlockSize)
    );
    assert!(matches!(
        HybridLayout::new(&tiny, 16, 10, 0),
        Err(LayoutError::BudgetTooSmall { .. })
    ));
    let only_state = shape(vec![LayerGroup::Recurrent {
        layers: 2,
        state_bytes: 64,
    }]);
    assert!(matches!(
        HybridLayout::new(&only_state, 16, GIB, 1),
        Err(LayoutError::NothingPaged(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Prefix hits per table kind

#[test]
fn prefix_hits_follow_each_table_kind() {
    // One sliding (window 8) and one full table, blocks of 4.
    let layout = HybridLayout::new(&shape(vec![sliding(1, 8), full(1)]), 4, GIB, 0).unwrap();
    assert_eq!(layout.tables[0].kind, TableKind::Sliding { window: 8 });
    let sliding_cached = |set: &'static [u64]| {
        move |t: usize, b: u64| if t == 0 { set.contains(&b) } else { b <= 8 }
    };
    // A 40-token prompt: at most 36 tokens (whole blocks, one token left to compute). At 36 the
    // window is tokens 28..36, blocks 7 and 8.
    assert_eq!(prefix_hit_tokens(&layout, 40, sliding_cached(&[7, 8])), 36);
    // Only blocks 2 and 3 cached: the longest hit whose window they cover is 16 (tokens 8..16).
    assert_eq!(prefix_hit_tokens(&layout, 40, sliding_cached(&[2, 3])), 16);
    assert_eq!(prefix_hit_tokens(&layout, 40, sliding_cached(&[])), 0);
    // The full table caps it: its blocks 0..3 only (12 tokens), window 4..12 = blocks 1, 2.
    let full_short = |t: usize, b: u64| if t == 0 { b == 1 || b == 2 } else { b < 3 };
    assert_eq!(prefix_hit_tokens(&layout, 40, full_short), 12);
    // Recurrent state has no checkpoints: never a hit.
    let hybrid = HybridLayout::new(
        &shape(vec![
            full(1),
            LayerGroup::Recurrent {
                layers: 1,
                state_bytes: 64,
            },
        ]),
        4,
        GIB,
        1,
    )
    .unwrap();
    assert_eq!(prefix_hit_tokens(&hybrid, 40, |_, _| true), 0);
}
