//! The reference model: the logical blocks and page versions each sequence holds per table,
//! the steps in flight and what their fences withhold, written from the layout's table shapes
//! alone (no manager code).
//!
//! It models `HybridKv`, the engine's trait: a start maps the prompt and `fill` writes it, a
//! sliding table trims by what is written, appends are one token each, released pages wait
//! behind the newest step in flight, and the slots split into live, unfilled, pending and free.
//! `support/cache_hybrid/model.rs` models the `HybridCache` beneath it, which has none of
//! these (token counts only, appends of any length, frees at once); the two agree on the part
//! they share — a version per logical block, copy-on-write of a shared partial block, a
//! sliding block kept while its last position is within the window — and each checks its own
//! layer's interface.

use std::collections::{BTreeMap, BTreeSet};

use kvbench::cache::hybrid::{HybridKv, TableKind};
use kvbench_cache_api::Accounting;

// ---------------------------------------------------------------------------------------------
// Operations and the reference model

#[derive(Clone)]
pub struct MSeq {
    pub mapped: u64,
    pub written: u64,
    /// Per table: logical block → version (one page's content).
    pub tables: Vec<BTreeMap<u64, u64>>,
}

/// Independent of the manager: tables by their block tokens and windows, read off the layout.
#[derive(Clone)]
pub struct Model {
    /// (block tokens, window) per table.
    pub specs: Vec<(u64, Option<u64>)>,
    pub pages: u64,
    pub page_slots: u64,
    /// Pages one sequence's recurrent state takes from the pool (0: no recurrent group).
    pub state_pages: u64,
    /// Slots a held state counts live.
    pub state_slots: u64,
    pub seqs: BTreeMap<u64, MSeq>,
    pub next_version: u64,
    pub next_step: u64,
    pub in_flight: BTreeSet<u64>,
    /// (fence step, table pages, states) withheld (a state withholds `state_pages` pages).
    pub pending: Vec<(u64, u64, u64)>,
}

/// What a model operation expects: success (with the copies made: old → new version, and the
/// versions released, each with its fence), or a refusal.
#[derive(Debug, PartialEq)]
pub enum Expect {
    Ok {
        copies: Vec<(u64, u64)>,
        released: Vec<(u64, Option<u64>)>,
    },
    NoSpace,
    TooLarge,
    Invalid,
}

pub fn ok() -> Expect {
    Expect::Ok {
        copies: Vec::new(),
        released: Vec::new(),
    }
}

impl Model {
    pub fn new(kv: &HybridKv) -> Model {
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
            state_pages: u64::from(layout.state_pages_per_sequence),
            state_slots: layout
                .state_bytes_per_sequence
                .div_ceil(slot_bytes)
                .min(u64::from(layout.state_pages_per_sequence) * u64::from(layout.block_size)),
            seqs: BTreeMap::new(),
            next_version: 0,
            next_step: 1,
            in_flight: BTreeSet::new(),
            pending: Vec::new(),
        }
    }

    pub fn holders(&self, version: u64) -> u64 {
        self.seqs
            .values()
            .flat_map(|s| s.tables.iter())
            .map(|t| t.values().filter(|&&v| v == version).count() as u64)
            .sum()
    }

    pub fn held_versions(&self) -> BTreeSet<u64> {
        self.seqs
            .values()
            .flat_map(|s| s.tables.iter())
            .flat_map(|t| t.values().copied())
            .collect()
    }

    /// Pages behind fences: table pages and the states' pages.
    pub fn pending_pages(&self) -> u64 {
        self.pending
            .iter()
            .map(|p| p.1 + p.2 * self.state_pages)
            .sum()
    }

    pub fn free_pages(&self) -> u64 {
        self.pages
            - self.held_versions().len() as u64
            - self.states_held() * self.state_pages
            - self.pending_pages()
    }

    pub fn states_held(&self) -> u64 {
        if self.state_pages > 0 {
            self.seqs.len() as u64
        } else {
            0
        }
    }

    pub fn new_version(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    /// Versions among `candidates` nobody holds any more go back: behind the newest step in
    /// flight, or free at once.
    pub fn drop_versions(&mut self, candidates: Vec<u64>, states: u64) -> Vec<(u64, Option<u64>)> {
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

    pub fn first_held(&self, t: usize, written: u64) -> u64 {
        let (bt, window) = self.specs[t];
        match window {
            Some(w) => (written.saturating_sub(w) / bt).min(written.div_ceil(bt)),
            None => 0,
        }
    }

    /// Sliding tables drop the blocks wholly before the window of the first `upto` tokens.
    pub fn trim(&mut self, seq: u64, upto: u64) -> Vec<u64> {
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

    /// Pages a start takes: every table's blocks of the prompt, and the state's.
    pub fn start_pages(&self, len: u64) -> u64 {
        self.specs
            .iter()
            .map(|(bt, _)| len.div_ceil(*bt))
            .sum::<u64>()
            + self.state_pages
    }

    pub fn start(&mut self, seq: u64, len: u64) -> Expect {
        let needed = self.start_pages(len);
        if needed > self.pages {
            return Expect::TooLarge;
        }
        if needed > self.free_pages() {
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

    pub fn fill(&mut self, seq: u64, n: u64) -> Expect {
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
    pub fn append_pages(&self, seq: u64) -> Vec<(usize, Option<u64>)> {
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

    pub fn append(&mut self, seq: u64) -> Expect {
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

    pub fn fork(&mut self, parent: u64, child: u64) -> Expect {
        let p = self.seqs[&parent].clone();
        if p.written != p.mapped {
            return Expect::Invalid;
        }
        if self.state_pages > self.free_pages() {
            return Expect::NoSpace;
        }
        self.seqs.insert(child, p);
        ok()
    }

    pub fn release(&mut self, seq: u64) -> Expect {
        let s = self.seqs.remove(&seq).unwrap();
        let versions = s.tables.into_iter().flat_map(|t| t.into_values()).collect();
        let states = u64::from(self.state_pages > 0);
        Expect::Ok {
            copies: Vec::new(),
            released: self.drop_versions(versions, states),
        }
    }

    pub fn begin(&mut self) -> u64 {
        let step = self.next_step;
        self.next_step += 1;
        self.in_flight.insert(step);
        step
    }

    /// Retire `step`; returns the watermark: fences below it are retired.
    pub fn retire(&mut self, step: u64) -> u64 {
        self.in_flight.remove(&step);
        let watermark = self.in_flight.first().copied().unwrap_or(self.next_step);
        self.pending.retain(|p| p.0 >= watermark);
        watermark
    }

    /// Slots the accounting must show, from the model alone.
    pub fn accounting(&self) -> Accounting {
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
        // A held state: its pages held, its bytes (in slots) live, the rest of them unfilled.
        let held = written.len() as u64 + self.states_held() * self.state_pages;
        let live = live_pages + self.states_held() * self.state_slots;
        Accounting {
            total_slots: self.pages * ps,
            live_slots: live,
            allocated_unfilled_slots: held * ps - live,
            cached_free_slots: 0,
            pending_free_slots: self.pending_pages() * ps,
            free_slots: self.free_pages() * ps,
        }
    }
}
