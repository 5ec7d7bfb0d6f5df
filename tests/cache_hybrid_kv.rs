//! The hybrid paged manager behind the engine's trait (`kvbench::cache::hybrid::HybridKv`):
//! random operation strings through `KvCacheManager` (start, fill, append, fork, release,
//! begin_step, retire_step) over several layer-group mixes, checked after every operation
//! against a plain reference model of the logical blocks, page versions, fences and states
//! each sequence holds: the manager's invariants and conservation, accounting totals
//! recomputed from the model, no released page in another table before its fence retired,
//! every written position inside its table's window in a cell no other sequence holds unless a
//! fork shares it; each planted fault fires and is caught; a proptest over the same strings;
//! a few cases by hand.
//!
//! `KVBENCH_SEED` replays one seeded run, `KVBENCH_HYBRID_KV_SEEDS` widens the sweep,
//! `PROPTEST_CASES` raises the proptest case count.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use kvbench::cache::hybrid::{HybridKv, HybridLayout, TableKind};
use kvbench::model::{Dtype, LayerGroup, ModelShape};
use kvbench_cache_api::grouped::{cell, readable_from};
use kvbench_cache_api::{
    Accounting, AllocError, CopyOp, Fault, KvCacheManager, Probe, ReleaseReason, SeqLayout,
    StartRequest,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------------------------
// Group mixes

fn shape(groups: Vec<LayerGroup>) -> ModelShape {
    let layers = groups.iter().map(|g| g.layers()).sum();
    ModelShape {
        name: "mix".into(),
        layers,
        kv_dtype: Dtype::Bf16,
        layer_groups: groups,
        ..ModelShape::tiny()
    }
}

fn full(layers: u32) -> LayerGroup {
    LayerGroup::Full {
        layers,
        kv_heads: 2,
        head_dim: 4,
    }
}

fn sliding(layers: u32, window: u32) -> LayerGroup {
    LayerGroup::Sliding {
        layers,
        window,
        kv_heads: 2,
        head_dim: 4,
    }
}

struct Mix {
    name: &'static str,
    shape: ModelShape,
    block_size: u32,
    pages: u64,
    states: u32,
}

fn mixes() -> Vec<Mix> {
    vec![
        Mix {
            name: "2 sliding : 1 full",
            shape: shape(vec![sliding(2, 10), full(1)]),
            block_size: 4,
            pages: 48,
            states: 0,
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
            pages: 30,
            states: 3,
        },
        Mix {
            // 32 bytes a token a full layer, 18 an MLA layer: 7-token MLA blocks.
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
            states: 0,
        },
        Mix {
            name: "sliding only",
            shape: shape(vec![sliding(2, 6)]),
            block_size: 4,
            pages: 24,
            states: 0,
        },
    ]
}

fn build(mix: &Mix) -> HybridKv {
    let probe = HybridLayout::new(&mix.shape, mix.block_size, 1 << 30, 0).unwrap();
    let budget = probe.page_bytes * mix.pages + probe.state_bytes_per_sequence * mix.states as u64;
    let layout = HybridLayout::new(&mix.shape, mix.block_size, budget, mix.states).unwrap();
    assert_eq!(layout.pages as u64, mix.pages, "{}", mix.name);
    HybridKv::new(layout)
}

// ---------------------------------------------------------------------------------------------
// Operations and the reference model

#[derive(Debug, Clone, Copy)]
enum Op {
    Start {
        len: u8,
    },
    /// `n` below 20: at most what is left to fill; 20 and above: `n` as is (may overrun).
    Fill {
        pick: u8,
        n: u8,
    },
    Append {
        pick: u8,
    },
    Fork {
        pick: u8,
    },
    Release {
        pick: u8,
    },
    Begin,
    Retire {
        pick: u8,
    },
}

#[derive(Clone)]
struct MSeq {
    mapped: u64,
    written: u64,
    /// Per table: logical block → version (one page's content).
    tables: Vec<BTreeMap<u64, u64>>,
}

/// Independent of the manager: tables by their block tokens and windows, read off the layout.
#[derive(Clone)]
struct Model {
    /// (block tokens, window) per table.
    specs: Vec<(u64, Option<u64>)>,
    pages: u64,
    page_slots: u64,
    state_cap: Option<u64>,
    state_slots: u64,
    seqs: BTreeMap<u64, MSeq>,
    next_version: u64,
    next_step: u64,
    in_flight: BTreeSet<u64>,
    /// (fence step, pages, states) withheld.
    pending: Vec<(u64, u64, u64)>,
}

/// What a model operation expects: success (with the copies made: old → new version, and the
/// versions released, each with its fence), or a refusal.
#[derive(Debug, PartialEq)]
enum Expect {
    Ok {
        copies: Vec<(u64, u64)>,
        released: Vec<(u64, Option<u64>)>,
    },
    NoSpace,
    TooLarge,
    Invalid,
}

fn ok() -> Expect {
    Expect::Ok {
        copies: Vec::new(),
        released: Vec::new(),
    }
}

impl Model {
    fn new(kv: &HybridKv) -> Model {
        let layout = kv.hybrid_layout();
        let slot_bytes = layout.page_bytes / u64::from(layout.block_size);
        Model {
            specs: layout
                .tables
                .iter()
                .map(|t| {
                    let window = match t.kind {
                        TableKind::Sliding { window } => Some(u64::from(window)),
                        _ => None,
                    };
                    (u64::from(t.block_tokens), window)
                })
                .collect(),
            pages: u64::from(layout.pages),
            page_slots: u64::from(layout.block_size),
            state_cap: layout.state_sequences.map(u64::from),
            state_slots: layout.state_bytes_per_sequence.div_ceil(slot_bytes),
            seqs: BTreeMap::new(),
            next_version: 0,
            next_step: 1,
            in_flight: BTreeSet::new(),
            pending: Vec::new(),
        }
    }

    fn holders(&self, version: u64) -> u64 {
        self.seqs
            .values()
            .flat_map(|s| s.tables.iter())
            .map(|t| t.values().filter(|&&v| v == version).count() as u64)
            .sum()
    }

    fn held_versions(&self) -> BTreeSet<u64> {
        self.seqs
            .values()
            .flat_map(|s| s.tables.iter())
            .flat_map(|t| t.values().copied())
            .collect()
    }

    fn pending_pages(&self) -> u64 {
        self.pending.iter().map(|p| p.1).sum()
    }

    fn pending_states(&self) -> u64 {
        self.pending.iter().map(|p| p.2).sum()
    }

    fn free_pages(&self) -> u64 {
        self.pages - self.held_versions().len() as u64 - self.pending_pages()
    }

    fn states_held(&self) -> u64 {
        if self.state_cap.is_some() {
            self.seqs.len() as u64
        } else {
            0
        }
    }

    fn state_free(&self) -> bool {
        self.state_cap
            .is_none_or(|cap| self.states_held() + self.pending_states() < cap)
    }

    fn new_version(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    /// Versions among `candidates` nobody holds any more go back: behind the newest step in
    /// flight, or free at once.
    fn drop_versions(&mut self, candidates: Vec<u64>, states: u64) -> Vec<(u64, Option<u64>)> {
        let held = self.held_versions();
        let gone: BTreeSet<u64> = candidates
            .into_iter()
            .filter(|v| !held.contains(v))
            .collect();
        let fence = self.in_flight.last().copied();
        if let Some(f) = fence {
            if !gone.is_empty() || states > 0 {
                self.pending.push((f, gone.len() as u64, states));
            }
        }
        gone.into_iter().map(|v| (v, fence)).collect()
    }

    fn first_held(&self, t: usize, written: u64) -> u64 {
        let (bt, window) = self.specs[t];
        match window {
            Some(w) => (written.saturating_sub(w) / bt).min(written.div_ceil(bt)),
            None => 0,
        }
    }

    /// Sliding tables drop the blocks wholly before the window of the first `upto` tokens.
    fn trim(&mut self, seq: u64, upto: u64) -> Vec<u64> {
        let firsts: Vec<u64> = (0..self.specs.len())
            .map(|t| self.first_held(t, upto))
            .collect();
        let s = self.seqs.get_mut(&seq).unwrap();
        let mut gone = Vec::new();
        for (t, blocks) in s.tables.iter_mut().enumerate() {
            let keep = blocks.split_off(&firsts[t]);
            gone.extend(std::mem::replace(blocks, keep).into_values());
        }
        gone
    }

    fn start_pages(&self, len: u64) -> u64 {
        self.specs.iter().map(|(bt, _)| len.div_ceil(*bt)).sum()
    }

    fn start(&mut self, seq: u64, len: u64) -> Expect {
        let needed = self.start_pages(len);
        if needed > self.pages {
            return Expect::TooLarge;
        }
        if needed > self.free_pages() || !self.state_free() {
            return Expect::NoSpace;
        }
        let mut tables = Vec::new();
        for (bt, _) in self.specs.clone() {
            tables.push(
                (0..len.div_ceil(bt))
                    .map(|b| (b, self.new_version()))
                    .collect(),
            );
        }
        let s = MSeq {
            mapped: len,
            written: 0,
            tables,
        };
        self.seqs.insert(seq, s);
        ok()
    }

    fn fill(&mut self, seq: u64, n: u64) -> Expect {
        let s = &self.seqs[&seq];
        if s.written + n > s.mapped {
            return Expect::Invalid;
        }
        if n == 0 {
            return ok();
        }
        let before = s.written;
        self.seqs.get_mut(&seq).unwrap().written += n;
        let gone = self.trim(seq, before);
        Expect::Ok {
            copies: Vec::new(),
            released: self.drop_versions(gone, 0),
        }
    }

    /// Tables whose next append takes a page: a new block, or a shared partial one copied.
    fn append_pages(&self, seq: u64) -> Vec<(usize, Option<u64>)> {
        let s = &self.seqs[&seq];
        let l = s.mapped;
        let mut out = Vec::new();
        for (t, &(bt, _)) in self.specs.iter().enumerate() {
            if l.is_multiple_of(bt) {
                out.push((t, None));
            } else {
                let v = s.tables[t][&(l / bt)];
                if self.holders(v) > 1 {
                    out.push((t, Some(v)));
                }
            }
        }
        out
    }

    fn append(&mut self, seq: u64) -> Expect {
        let s = &self.seqs[&seq];
        if s.written != s.mapped {
            return Expect::Invalid;
        }
        let l = s.mapped;
        let takes = self.append_pages(seq);
        if takes.len() as u64 > self.free_pages() {
            return Expect::NoSpace;
        }
        let mut copies = Vec::new();
        let mut candidates = Vec::new();
        for (t, old) in takes {
            let bt = self.specs[t].0;
            let v = self.new_version();
            self.seqs.get_mut(&seq).unwrap().tables[t].insert(l / bt, v);
            if let Some(old) = old {
                copies.push((old, v));
                candidates.push(old);
            }
        }
        let s = self.seqs.get_mut(&seq).unwrap();
        s.mapped += 1;
        s.written += 1;
        candidates.extend(self.trim(seq, l));
        Expect::Ok {
            copies,
            released: self.drop_versions(candidates, 0),
        }
    }

    fn fork(&mut self, parent: u64, child: u64) -> Expect {
        let p = self.seqs[&parent].clone();
        if p.written != p.mapped {
            return Expect::Invalid;
        }
        if !self.state_free() {
            return Expect::NoSpace;
        }
        self.seqs.insert(child, p);
        ok()
    }

    fn release(&mut self, seq: u64) -> Expect {
        let s = self.seqs.remove(&seq).unwrap();
        let versions = s.tables.into_iter().flat_map(|t| t.into_values()).collect();
        let states = u64::from(self.state_cap.is_some());
        Expect::Ok {
            copies: Vec::new(),
            released: self.drop_versions(versions, states),
        }
    }

    fn begin(&mut self) -> u64 {
        let step = self.next_step;
        self.next_step += 1;
        self.in_flight.insert(step);
        step
    }

    /// Retire `step`; returns the watermark: fences below it are retired.
    fn retire(&mut self, step: u64) -> u64 {
        self.in_flight.remove(&step);
        let watermark = self.in_flight.first().copied().unwrap_or(self.next_step);
        self.pending.retain(|p| p.0 >= watermark);
        watermark
    }

    /// Slots the accounting must show, from the model alone.
    fn accounting(&self) -> Accounting {
        let ps = self.page_slots;
        let mut written: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for s in self.seqs.values() {
            for (t, blocks) in s.tables.iter().enumerate() {
                let bt = self.specs[t].0;
                for (&b, &v) in blocks {
                    let w = s.written.saturating_sub(b * bt).min(bt);
                    let e = written.entry(v).or_insert((0, bt));
                    e.0 = e.0.max(w);
                }
            }
        }
        let live_pages: u64 = written.values().map(|&(w, bt)| w * ps / bt).sum();
        let cap = self.state_cap.unwrap_or(0);
        let st = self.state_slots;
        let held = written.len() as u64;
        let total = self.pages * ps + cap * st;
        let live = live_pages + self.states_held() * st;
        let pending = self.pending_pages() * ps + self.pending_states() * st;
        Accounting {
            total_slots: total,
            live_slots: live,
            allocated_unfilled_slots: held * ps - live_pages,
            cached_free_slots: 0,
            pending_free_slots: pending,
            free_slots: self.free_pages() * ps
                + (cap - self.states_held() - self.pending_states()) * st,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The checker: runs one string through the trait and the model side by side

struct Checker {
    kv: HybridKv,
    model: Model,
    /// The page each held version lives in, as last observed.
    page_of: BTreeMap<u64, u32>,
    /// Pages released behind a fence not yet retired: page → fence step.
    banned: BTreeMap<u32, u64>,
    invariants: bool,
}

fn outcome<T>(r: &Result<T, AllocError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(AllocError::NoSpace { .. }) => "no-space",
        Err(AllocError::TooLarge { .. }) => "too-large",
        Err(AllocError::InvalidOp { .. }) => "invalid",
        Err(_) => "other error",
    }
}

fn expected(e: &Expect) -> &'static str {
    match e {
        Expect::Ok { .. } => "ok",
        Expect::NoSpace => "no-space",
        Expect::TooLarge => "too-large",
        Expect::Invalid => "invalid",
    }
}

impl Checker {
    fn new(mix: &Mix, fault: Option<Fault>, invariants: bool) -> Checker {
        let mut kv = build(mix);
        if let Some(f) = fault {
            kv.inject_fault(f);
        }
        let model = Model::new(&kv);
        Checker {
            kv,
            model,
            page_of: BTreeMap::new(),
            banned: BTreeMap::new(),
            invariants,
        }
    }

    fn apply(&mut self, op: Op, next_seq: &mut u64) -> Result<(), String> {
        let live: Vec<u64> = self.model.seqs.keys().copied().collect();
        let pick = |p: u8| (!live.is_empty()).then(|| live[p as usize % live.len()]);
        let (expect, got_copies, got): (Expect, Vec<CopyOp>, &'static str) = match op {
            Op::Start { len } => {
                let seq = *next_seq;
                *next_seq += 1;
                let tokens: Vec<u32> = (0..u32::from(len)).collect();
                let req = StartRequest {
                    seq,
                    tokens: &tokens,
                    scope: None,
                    reserve_tokens: u32::from(len) + 8,
                };
                let probe = self.kv.probe_start(&req);
                let expect = self.model.start(seq, u64::from(len));
                let st = if self.model.state_cap.is_some() {
                    self.model.state_slots
                } else {
                    0
                };
                let want = Probe {
                    cached_tokens: 0,
                    new_slots: self.model.start_pages(u64::from(len)) * self.model.page_slots + st,
                    fits: expect == ok(),
                    onload_tokens: 0,
                };
                if probe != want {
                    return Err(format!("probe {probe:?}, model {want:?}"));
                }
                let r = self.kv.start(&req);
                if let Ok(started) = &r {
                    if started.cached_tokens != 0 || !started.hits.is_empty() {
                        return Err(format!("no prefix cache, yet {started:?}"));
                    }
                }
                (expect, Vec::new(), outcome(&r))
            }
            Op::Fill { pick: p, n } => {
                let Some(seq) = pick(p) else { return Ok(()) };
                let s = &self.model.seqs[&seq];
                let n = if n < 20 {
                    u64::from(n).min(s.mapped - s.written)
                } else {
                    u64::from(n)
                };
                let expect = self.model.fill(seq, n);
                let r = self.kv.fill(seq, n as u32);
                (expect, Vec::new(), outcome(&r))
            }
            Op::Append { pick: p } => {
                let Some(seq) = pick(p) else { return Ok(()) };
                let r = self.kv.append(seq);
                let expect = self.model.append(seq);
                let got = outcome(&r);
                (expect, r.unwrap_or_default(), got)
            }
            Op::Fork { pick: p } => {
                let Some(parent) = pick(p) else {
                    return Ok(());
                };
                let child = *next_seq;
                *next_seq += 1;
                let expect = self.model.fork(parent, child);
                let r = self.kv.fork(parent, child);
                let got = outcome(&r);
                (expect, r.unwrap_or_default(), got)
            }
            Op::Release { pick: p } => {
                let Some(seq) = pick(p) else { return Ok(()) };
                let expect = self.model.release(seq);
                let r = self.kv.release(seq, ReleaseReason::Finish);
                (expect, Vec::new(), outcome(&r))
            }
            Op::Begin => {
                let want = self.model.begin();
                let got = self.kv.begin_step();
                if got != want {
                    return Err(format!("step {got}, model {want}"));
                }
                (ok(), Vec::new(), "ok")
            }
            Op::Retire { pick: p } => {
                let steps: Vec<u64> = self.model.in_flight.iter().copied().collect();
                let Some(&step) = steps.get(p as usize % steps.len().max(1)) else {
                    return Ok(());
                };
                let watermark = self.model.retire(step);
                self.kv.retire_step(step);
                self.banned.retain(|_, fence| *fence >= watermark);
                (ok(), Vec::new(), "ok")
            }
        };
        if got != expected(&expect) {
            return Err(format!("manager {got}, model {}", expected(&expect)));
        }
        if let Expect::Ok { copies, released } = expect {
            for (version, fence) in released {
                let page = self.page_of.remove(&version);
                if let (Some(page), Some(fence)) = (page, fence) {
                    self.banned.insert(page, fence);
                }
            }
            self.compare()?;
            self.check_copies(&copies, &got_copies)?;
        } else {
            self.compare()?;
        }
        Ok(())
    }

    /// Each copy names the old version's page and the new one's, a whole page long.
    fn check_copies(&self, want: &[(u64, u64)], got: &[CopyOp]) -> Result<(), String> {
        let ps = self.model.page_slots;
        let want: BTreeSet<(u64, u64, u32)> = want
            .iter()
            .map(|(old, new)| {
                (
                    u64::from(self.page_of[old]) * ps,
                    u64::from(self.page_of[new]) * ps,
                    ps as u32,
                )
            })
            .collect();
        let got_set: BTreeSet<(u64, u64, u32)> = got
            .iter()
            .map(|c| (c.src_slot, c.dst_slot, c.len_tokens))
            .collect();
        if want != got_set || got.len() != want.len() {
            return Err(format!("copies {got:?}, model wants {want:?}"));
        }
        Ok(())
    }

    fn compare(&mut self) -> Result<(), String> {
        let kv = &self.kv;
        let model = &self.model;
        let want = model.accounting();
        let acc = kv.accounting();
        if acc != want {
            return Err(format!("accounting {acc:?}, model {want:?}"));
        }
        if !acc.is_conserved() {
            return Err(format!("accounting not conserved: {acc:?}"));
        }
        if self.invariants {
            kv.check_invariants()?;
        }
        let ps = model.page_slots;
        // page → (seq, table, version) of every holder.
        let mut holders: BTreeMap<u32, Vec<(u64, usize, u64)>> = BTreeMap::new();
        let mut page_of = BTreeMap::new();
        for (&seq, s) in &model.seqs {
            if kv.seq_tokens(seq) != Some(s.written as u32)
                || kv.mapped_tokens(seq) != Some(s.mapped)
            {
                return Err(format!(
                    "seq {seq}: {:?} written, {:?} mapped; model {} and {}",
                    kv.seq_tokens(seq),
                    kv.mapped_tokens(seq),
                    s.written,
                    s.mapped
                ));
            }
            let cost = if s.written == s.mapped {
                model.append_pages(seq).len() as u64 * ps
            } else {
                kv.append_cost(seq) // not appendable yet: nothing to compare
            };
            if kv.append_cost(seq) != cost {
                return Err(format!(
                    "seq {seq}: append cost {}, model {cost}",
                    kv.append_cost(seq)
                ));
            }
            let Some(SeqLayout::Grouped {
                page_slots,
                shapes,
                tables,
            }) = kv.layout(seq)
            else {
                return Err(format!("seq {seq}: no grouped layout"));
            };
            if u64::from(page_slots) != ps || shapes.len() != model.specs.len() {
                return Err(format!("seq {seq}: layout page slots {page_slots}"));
            }
            for (t, blocks) in s.tables.iter().enumerate() {
                let table = &tables[t];
                let held: Vec<u64> = (table.first_block..table.end_block()).collect();
                let want: Vec<u64> = blocks.keys().copied().collect();
                if held != want {
                    return Err(format!(
                        "seq {seq} table {t} holds blocks {held:?}, model {want:?}"
                    ));
                }
                for (&page, &v) in table.pages.iter().zip(blocks.values()) {
                    if *page_of.entry(v).or_insert(page) != page {
                        return Err(format!("seq {seq} table {t}: version {v} in two pages"));
                    }
                    holders.entry(page).or_default().push((seq, t, v));
                    if let Some(fence) = self.banned.get(&page) {
                        return Err(format!(
                            "page {page} reappeared in seq {seq} table {t} before its fence step {fence} retired"
                        ));
                    }
                }
                // Every written position the window still reads has a cell of its own.
                let shape = &shapes[t];
                for pos in readable_from(shape, s.written)..s.written {
                    let Some((page, _)) = cell(shape, table, pos) else {
                        return Err(format!(
                            "seq {seq} table {t}: written position {pos} has no cell"
                        ));
                    };
                    let v = blocks[&(pos / u64::from(shape.block_tokens))];
                    let others = holders
                        .get(&page)
                        .map_or(0, |h| h.iter().filter(|x| x.2 != v).count());
                    if others > 0 {
                        return Err(format!(
                            "seq {seq} table {t}: position {pos}'s page {page} holds another content"
                        ));
                    }
                }
            }
        }
        for (page, h) in &holders {
            let v = h[0].2;
            if h.iter().any(|x| x.2 != v) {
                return Err(format!("page {page} holds versions {h:?}"));
            }
            if h.len() as u64 != model.holders(v) {
                return Err(format!(
                    "page {page}: {} holders, model {}",
                    h.len(),
                    model.holders(v)
                ));
            }
        }
        self.page_of = page_of;
        Ok(())
    }

    /// Release everything, retire every step: the manager must be quiescent.
    fn drain(&mut self) -> Result<(), String> {
        let seqs: Vec<u64> = self.model.seqs.keys().copied().collect();
        for seq in seqs {
            self.model.release(seq);
            self.kv
                .release(seq, ReleaseReason::Cancel)
                .map_err(|e| format!("final release of {seq}: {e}"))?;
        }
        let steps: Vec<u64> = self.model.in_flight.iter().copied().collect();
        for step in steps {
            self.model.retire(step);
            self.kv.retire_step(step);
        }
        self.page_of.clear();
        self.banned.clear();
        self.compare()?;
        self.kv.assert_quiescent()
    }
}

fn run_ops(mix: &Mix, ops: &[Op], fault: Option<Fault>, invariants: bool) -> Result<u64, String> {
    let mut c = Checker::new(mix, fault, invariants);
    let mut next_seq = 0;
    for (i, op) in ops.iter().enumerate() {
        c.apply(*op, &mut next_seq)
            .map_err(|e| format!("{}: op {i} {op:?}: {e}", mix.name))?;
    }
    c.drain()
        .map_err(|e| format!("{}: at the end: {e}", mix.name))?;
    Ok(c.kv.fault_fired())
}

/// Run with `fault` armed: how often it fired, and what caught it (`None`: nothing did).
fn run_faulted(mix: &Mix, ops: &[Op], fault: Fault, invariants: bool) -> (u64, Option<String>) {
    let mut c = Checker::new(mix, Some(fault), invariants);
    let mut next_seq = 0;
    for (i, op) in ops.iter().enumerate() {
        if let Err(e) = c.apply(*op, &mut next_seq) {
            return (c.kv.fault_fired(), Some(format!("op {i} {op:?}: {e}")));
        }
    }
    let end = c.drain().err();
    (c.kv.fault_fired(), end)
}

/// Run with `fault` armed and no model: the manager's own checks after every operation and
/// at the end. How often the fault fired, and what the checks caught (`None`: nothing).
fn run_blind(mix: &Mix, ops: &[Op], fault: Fault) -> (u64, Option<String>) {
    let mut kv = build(mix);
    kv.inject_fault(fault);
    let mut live: Vec<u64> = Vec::new();
    let mut in_flight: Vec<u64> = Vec::new();
    let mut next_seq = 0u64;
    let pick = |live: &[u64], p: u8| (!live.is_empty()).then(|| live[p as usize % live.len()]);
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Start { len } => {
                if start(&mut kv, next_seq, u32::from(len)).is_ok() {
                    live.push(next_seq);
                }
                next_seq += 1;
            }
            Op::Fill { pick: p, n } => {
                if let Some(seq) = pick(&live, p) {
                    let _ = kv.fill(seq, u32::from(n));
                }
            }
            Op::Append { pick: p } => {
                if let Some(seq) = pick(&live, p) {
                    let _ = kv.append(seq);
                }
            }
            Op::Fork { pick: p } => {
                if let Some(parent) = pick(&live, p) {
                    if kv.fork(parent, next_seq).is_ok() {
                        live.push(next_seq);
                    }
                    next_seq += 1;
                }
            }
            Op::Release { pick: p } => {
                if let Some(seq) = pick(&live, p) {
                    live.retain(|&s| s != seq);
                    let _ = kv.release(seq, ReleaseReason::Finish);
                }
            }
            Op::Begin => in_flight.push(kv.begin_step()),
            Op::Retire { pick: p } => {
                if !in_flight.is_empty() {
                    let step = in_flight.remove(p as usize % in_flight.len());
                    kv.retire_step(step);
                }
            }
        }
        if let Err(e) = kv.check_invariants() {
            return (kv.fault_fired(), Some(format!("op {i} {op:?}: {e}")));
        }
    }
    for seq in live {
        let _ = kv.release(seq, ReleaseReason::Finish);
    }
    for step in in_flight {
        kv.retire_step(step);
    }
    (kv.fault_fired(), kv.assert_quiescent().err())
}

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

fn start(kv: &mut HybridKv, seq: u64, len: u32) -> Result<(), AllocError> {
    let tokens: Vec<u32> = (0..len).collect();
    kv.start(&StartRequest {
        seq,
        tokens: &tokens,
        scope: None,
        reserve_tokens: len,
    })
    .map(|_| ())
}

fn tables(kv: &HybridKv, seq: u64) -> Vec<(u64, Vec<u32>)> {
    match kv.layout(seq) {
        Some(SeqLayout::Grouped { tables, .. }) => tables
            .iter()
            .map(|t| (t.first_block, t.pages.clone()))
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
    let slot_bytes = layout.page_bytes / 4;
    let state_slots = (2 * 1000u64).div_ceil(slot_bytes);
    assert_eq!(layout.state_bytes_per_sequence, 2000);
    assert_eq!(kv.sequence_slots(9, 0), 3 * 4 + state_slots);
    assert_eq!(
        kv.accounting().total_slots,
        30 * 4 + 3 * state_slots,
        "the reserved states count in the total"
    );
}
