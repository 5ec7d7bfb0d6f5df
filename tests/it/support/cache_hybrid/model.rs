//! The operations of a string (start, append n, fork, release), drawn by proptest or from a
//! seeded ChaCha stream, and the reference model of the logical blocks each sequence must hold
//! in each table; `run_ops` runs a string through `HybridCache` and the model side by side.
//!
//! A second model of the hybrid manager lives in `support/hybrid_kv/model.rs`, for the layer
//! above this one: `HybridKv` (the engine's trait over a `HybridCache`) maps a prompt before it
//! writes it, appends a token at a time, withholds freed pages behind the fences of steps in
//! flight and reports slot accounting, none of which `HybridCache` has. This model stays the
//! smaller one on purpose: appends of any length with frees at once and the exact pages an
//! `OutOfPages` needs, so a wrong copy-on-write, window trim or state count in `HybridCache` is
//! pinned to the manager itself rather than to the trait's bookkeeping around it.

use std::collections::{BTreeMap, BTreeSet};

use kvbench::cache::hybrid::{HybridCache, HybridError, HybridFault, TableKind, TableSpec};
use proptest::prelude::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{build, Mix};

#[derive(Debug, Clone, Copy)]
pub enum Op {
    Start,
    Append { pick: u8, n: u8 },
    Fork { pick: u8 },
    Release { pick: u8 },
}

/// What each sequence must hold: per table, logical block → version. A version is one page's
/// content: a fork shares its parent's versions, a write into a shared partial block makes a
/// new one (copy-on-write), a new block is a new one. Pages in use = versions in use.
#[derive(Default, Clone)]
pub struct Model {
    pub seqs: BTreeMap<u64, (u64, Vec<BTreeMap<u64, u64>>)>,
    pub next_version: u64,
}

impl Model {
    pub fn holders(&self, table: usize, version: u64) -> usize {
        self.seqs
            .values()
            .map(|(_, t)| t[table].values().filter(|&&v| v == version).count())
            .sum()
    }

    pub fn versions(&self) -> BTreeSet<(usize, u64)> {
        let mut all = BTreeSet::new();
        for (_, tables) in self.seqs.values() {
            for (t, blocks) in tables.iter().enumerate() {
                all.extend(blocks.values().map(|&v| (t, v)));
            }
        }
        all
    }

    /// The copies an append makes, or the pages it needed when they are not free.
    pub fn append(
        &mut self,
        specs: &[TableSpec],
        pages: u64,
        seq: u64,
        n: u64,
    ) -> Result<u64, u64> {
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
pub fn run_ops(
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
                    state_refused(got, sp).map_err(at)?;
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
                    state_refused(got, sp).map_err(at)?;
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

/// A start or fork the pool cannot give a recurrent state's `sp` pages must be refused for
/// exactly those pages.
fn state_refused(got: Result<(), HybridError>, sp: u64) -> Result<(), String> {
    match got {
        Err(HybridError::OutOfPages { needed, .. }) if needed == sp => Ok(()),
        _ => Err(format!("expected OutOfPages for the state, got {got:?}")),
    }
}

/// The manager holds what the model says: the same sequences, lengths and logical blocks, one
/// page per version (the same page wherever a version is shared, a different one otherwise),
/// the recurrent states of the live sequences.
pub fn compare(cache: &HybridCache, model: &Model, specs: &[TableSpec]) -> Result<(), String> {
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

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Start),
        6 => (any::<u8>(), 0..40u8).prop_map(|(pick, n)| Op::Append { pick, n }),
        2 => any::<u8>().prop_map(|pick| Op::Fork { pick }),
        2 => any::<u8>().prop_map(|pick| Op::Release { pick }),
    ]
}

pub fn random_ops(rng: &mut ChaCha8Rng, len: usize) -> Vec<Op> {
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
