//! Runs one operation string through the trait and the model side by side, comparing after
//! every operation; and blind, through the trait alone, with the manager's own checks.

use std::collections::{BTreeMap, BTreeSet};

use kvbench::cache::hybrid::HybridKv;
use kvbench_cache_api::grouped::{cell, readable_from};
use kvbench_cache_api::{
    AllocError, CopyOp, Fault, KvCacheManager, Probe, ReleaseReason, SeqLayout, StartRequest,
};

use super::model::{ok, Expect, Model};
use super::{build, start, Mix, Op};

// ---------------------------------------------------------------------------------------------
// The checker: runs one string through the trait and the model side by side

pub struct Checker {
    kv: HybridKv,
    model: Model,
    /// The page each held version lives in, as last observed.
    page_of: BTreeMap<u64, u32>,
    /// Pages released behind a fence not yet retired: page → fence step.
    banned: BTreeMap<u32, u64>,
    invariants: bool,
}

pub fn outcome<T>(r: &Result<T, AllocError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(AllocError::NoSpace { .. }) => "no-space",
        Err(AllocError::TooLarge { .. }) => "too-large",
        Err(AllocError::InvalidOp { .. }) => "invalid",
        Err(_) => "other error",
    }
}

pub fn expected(e: &Expect) -> &'static str {
    match e {
        Expect::Ok { .. } => "ok",
        Expect::NoSpace => "no-space",
        Expect::TooLarge => "too-large",
        Expect::Invalid => "invalid",
    }
}

impl Checker {
    pub fn new(mix: &Mix, fault: Option<Fault>, invariants: bool) -> Checker {
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

    pub fn apply(&mut self, op: Op, next_seq: &mut u64) -> Result<(), String> {
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
                let want = Probe {
                    cached_tokens: 0,
                    new_slots: self.model.start_pages(u64::from(len)) * self.model.page_slots,
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
                if let Ok(copies) = &r {
                    self.check_state_copies(parent, child, copies)?;
                }
                // The state copies are checked; the model's page copies (none) are the rest.
                (expect, Vec::new(), got)
            }
            Op::Release { pick: p } => {
                let Some(seq) = pick(p) else { return Ok(()) };
                let state: Vec<u32> = self.kv.state_pages(seq).unwrap_or_default().to_vec();
                let expect = self.model.release(seq);
                let r = self.kv.release(seq, ReleaseReason::Finish);
                // A released state's pages wait for the steps in flight, like a table's.
                if let (Ok(()), Some(&fence)) = (&r, self.model.in_flight.last()) {
                    for page in state {
                        self.banned.insert(page, fence);
                    }
                }
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

    /// A fork copies each of the parent's state pages into the child's, a whole page each.
    pub fn check_state_copies(
        &self,
        parent: u64,
        child: u64,
        got: &[CopyOp],
    ) -> Result<(), String> {
        let ps = self.model.page_slots;
        let (Some(from), Some(to)) = (self.kv.state_pages(parent), self.kv.state_pages(child))
        else {
            return Err(format!("fork {parent} → {child}: a sequence has no state"));
        };
        let want: Vec<(u64, u64, u32)> = from
            .iter()
            .zip(to)
            .map(|(&a, &b)| (u64::from(a) * ps, u64::from(b) * ps, ps as u32))
            .collect();
        let got: Vec<(u64, u64, u32)> = got
            .iter()
            .map(|c| (c.src_slot, c.dst_slot, c.len_tokens))
            .collect();
        if got != want || want.len() as u64 != self.model.state_pages {
            return Err(format!(
                "fork {parent} → {child} copies {got:?}, the state pages want {want:?}"
            ));
        }
        Ok(())
    }

    /// Each copy names the old version's page and the new one's, a whole page long.
    pub fn check_copies(&self, want: &[(u64, u64)], got: &[CopyOp]) -> Result<(), String> {
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

    pub fn compare(&mut self) -> Result<(), String> {
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
            // The backend's tables name what the pool holds: a page handed out in a layout has
            // exactly as many references as layouts naming it.
            let refs = kv.cache().page_refs(*page);
            if refs != Some(h.len() as u32) {
                return Err(format!(
                    "page {page} is in {} layouts, the pool counts {refs:?} references",
                    h.len()
                ));
            }
        }
        // Each live state is its own pages: as many as the layout says, in no table, in no
        // other state, held by one reference, not behind a fence not yet retired.
        let mut state_owner: BTreeMap<u32, u64> = BTreeMap::new();
        for &seq in model.seqs.keys() {
            let state = kv.state_pages(seq).unwrap_or_default();
            if state.len() as u64 != model.state_pages {
                return Err(format!(
                    "seq {seq}: {} state pages, model {}",
                    state.len(),
                    model.state_pages
                ));
            }
            for &page in state {
                if let Some(other) = state_owner.insert(page, seq) {
                    return Err(format!("state page {page} of seqs {other} and {seq}"));
                }
                if holders.contains_key(&page) {
                    return Err(format!("state page {page} of seq {seq} is in a table"));
                }
                if kv.cache().page_refs(page) != Some(1) {
                    return Err(format!("state page {page} of seq {seq} is shared"));
                }
                if let Some(fence) = self.banned.get(&page) {
                    return Err(format!(
                        "state page {page} of seq {seq} handed out before its fence step {fence} retired"
                    ));
                }
            }
        }
        // A version's content stays in the page it was written to for as long as it is held.
        for (v, page) in &page_of {
            if let Some(before) = self.page_of.get(v) {
                if before != page {
                    return Err(format!(
                        "version {v} moved from page {before} to page {page}"
                    ));
                }
            }
        }
        self.page_of = page_of;
        Ok(())
    }

    /// Release everything, retire every step: the manager must be quiescent.
    pub fn drain(&mut self) -> Result<(), String> {
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

pub fn run_ops(
    mix: &Mix,
    ops: &[Op],
    fault: Option<Fault>,
    invariants: bool,
) -> Result<u64, String> {
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
pub fn run_faulted(mix: &Mix, ops: &[Op], fault: Fault, invariants: bool) -> (u64, Option<String>) {
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
pub fn run_blind(mix: &Mix, ops: &[Op], fault: Fault) -> (u64, Option<String>) {
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
