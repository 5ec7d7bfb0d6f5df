//! The reference model and the checks run after every operation.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kvbench_cache_api::{
    AllocError, BlockLoc, CopyOp, KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, SeqId,
    SeqLayout, StartRequest, StepId, Tier, TierOp,
};

use super::{FuzzConfig, FuzzFailure, FuzzSummary, Op};
use crate::cache::{build, CacheSpec, PagedCache, PagedConfig};

/// A sequence as the reference model sees it: its token ids and how many are written.
#[derive(Debug, Clone)]
pub(super) struct ModelSeq {
    pub(super) tokens: Vec<u32>,
    pub(super) filled: usize,
    pub(super) scope: usize,
}

/// Scope number 4 disables reuse; 0 and 1 are tenants, 2 is global, 3 another model.
fn scope_key(i: usize) -> ScopeKey {
    let (model, reuse) = match i {
        0 => ("m", ReuseScope::Tenant(0)),
        1 => ("m", ReuseScope::Tenant(1)),
        2 => ("m", ReuseScope::Global),
        3 => ("m2", ReuseScope::Tenant(0)),
        _ => ("m", ReuseScope::None),
    };
    ScopeKey {
        model: model.into(),
        tokenizer: "tok".into(),
        reuse,
    }
}

/// Drives one manager and the reference model side by side.
pub struct Harness {
    pub(super) cfg: FuzzConfig,
    pub(super) mgr: Box<dyn KvCacheManager>,
    pub(super) scopes: Vec<ScopeKey>,
    pub(super) seqs: BTreeMap<SeqId, ModelSeq>,
    pub(super) next_seq: SeqId,
    pub(super) next_tail: u32,
    /// Device memory: the token id each slot holds, and the scope of the sequence that wrote it.
    pub(super) payload: Vec<Option<(u32, usize)>>,
    /// Lower-tier memory: each slot's block of payload cells, as the drained tier ops wrote it.
    pub(super) tier_payload: HashMap<BlockLoc, Vec<Option<(u32, usize)>>>,
    pub(super) tier_ops: Vec<TierOp>,
    pub(super) in_flight: BTreeSet<StepId>,
    /// Writes since the last `begin_step` as (writer, position, token): they belong to the next
    /// step, whose backend resolves positions through the layout at submission (a copy-on-write
    /// in between moves the write with the sequence).
    pub(super) staged: Vec<(SeqId, usize, u32)>,
    pub(super) step_writes: BTreeMap<StepId, Vec<(u64, u32)>>,
    /// Slots released while steps were in flight: the fence step and the content at release.
    pub(super) fenced: BTreeMap<u64, (StepId, Option<u32>)>,
    pub(super) trace: Vec<String>,
    pub(super) summary: FuzzSummary,
    /// Skip the manager's own `check_invariants`: only the reference model judges (used to show
    /// the model alone catches each planted bug).
    pub(super) model_only: bool,
}

impl Harness {
    pub fn new(cfg: FuzzConfig) -> Self {
        let mut mgr: Box<dyn KvCacheManager> = match cfg.bug {
            Some(bug) => {
                let bs = cfg.block_size.max(1);
                let total_blocks = (cfg.total_slots / u64::from(bs)) as u32;
                let mut p = PagedCache::with_tiers(
                    PagedConfig {
                        total_blocks,
                        block_size: bs,
                        prefix_cache: true,
                        placement: cfg.placement,
                    },
                    cfg.eviction,
                    cfg.tiers,
                );
                p.plant_bug(bug);
                Box::new(p)
            }
            None => build(
                &CacheSpec::new(cfg.mode, cfg.total_slots, cfg.block_size, true)
                    .with_placement(cfg.placement)
                    .with_eviction(cfg.eviction)
                    .with_tiers(cfg.tiers),
            ),
        };
        if let Some(f) = cfg.fault {
            mgr.inject_fault(f);
        }
        let total = mgr.accounting().total_slots as usize;
        Harness {
            cfg,
            mgr,
            scopes: (0..5).map(scope_key).collect(),
            seqs: BTreeMap::new(),
            next_seq: 1,
            next_tail: 0,
            payload: vec![None; total],
            tier_payload: HashMap::new(),
            tier_ops: Vec::new(),
            in_flight: BTreeSet::new(),
            staged: Vec::new(),
            step_writes: BTreeMap::new(),
            fenced: BTreeMap::new(),
            trace: Vec::new(),
            summary: FuzzSummary::default(),
            model_only: false,
        }
    }

    /// Judge by the reference model only, not by the manager's self-checks.
    pub fn model_only(mut self, yes: bool) -> Self {
        self.model_only = yes;
        self
    }

    pub fn manager(&self) -> &dyn KvCacheManager {
        self.mgr.as_ref()
    }

    pub fn summary(&self) -> FuzzSummary {
        let mut s = self.summary;
        s.evictions = self.mgr.prefix_stats().evictions;
        s
    }

    pub fn failure(&self, op_index: Option<usize>, message: String) -> FuzzFailure {
        FuzzFailure {
            seed: None,
            op_index,
            message,
            trace: self.trace.clone(),
        }
    }

    fn pick(&self, pick: u8, want: impl Fn(&ModelSeq) -> bool) -> Option<SeqId> {
        let ids: Vec<SeqId> = self
            .seqs
            .iter()
            .filter(|(_, s)| want(s))
            .map(|(&id, _)| id)
            .collect();
        (!ids.is_empty()).then(|| ids[pick as usize % ids.len()])
    }

    /// Slot holding token position `pos` of `seq`, per the manager's layout.
    pub(super) fn slot(&self, seq: SeqId, pos: usize) -> Option<u64> {
        match self.mgr.layout(seq)? {
            SeqLayout::Paged { block_size, blocks } => {
                let bs = block_size as usize;
                blocks
                    .get(pos / bs)
                    .map(|&b| u64::from(b) * bs as u64 + (pos % bs) as u64)
            }
            SeqLayout::Contiguous {
                base_slot,
                capacity_tokens,
            } => (pos < capacity_tokens as usize).then_some(base_slot + pos as u64),
            // The fuzzer drives the paged and contiguous managers only.
            SeqLayout::Grouped { .. } => None,
        }
    }

    /// Every slot `seq` maps (paged: whole blocks; contiguous: the reservation), by position.
    pub(super) fn mapped_slots(&self, seq: SeqId) -> Vec<u64> {
        match self.mgr.layout(seq) {
            Some(SeqLayout::Paged { block_size, blocks }) => blocks
                .iter()
                .flat_map(|&b| {
                    (0..u64::from(block_size))
                        .map(move |o| u64::from(b) * u64::from(block_size) + o)
                })
                .collect(),
            Some(SeqLayout::Contiguous {
                base_slot,
                capacity_tokens,
            }) => (base_slot..base_slot + u64::from(capacity_tokens)).collect(),
            Some(SeqLayout::Grouped { .. }) | None => Vec::new(),
        }
    }

    fn write(&mut self, seq: SeqId, pos: usize) {
        let m = &self.seqs[&seq];
        let (token, scope) = (m.tokens[pos], m.scope);
        if let Some(slot) = self.slot(seq, pos) {
            if let Some(cell) = self.payload.get_mut(slot as usize) {
                *cell = Some((token, scope));
                self.staged.push((seq, pos, token));
            }
        }
    }

    fn copy(&mut self, c: &CopyOp) {
        for i in 0..u64::from(c.len_tokens) {
            let (src, dst) = ((c.src_slot + i) as usize, (c.dst_slot + i) as usize);
            if src < self.payload.len() && dst < self.payload.len() {
                self.payload[dst] = self.payload[src];
            }
        }
        self.summary.copies += 1;
    }

    pub fn apply(&mut self, op: Op) {
        let mut line = self.apply_inner(op);
        // Ops a call emitted after what the call itself performed (`begin_step`'s write-through).
        if let Some(t) = self.perform_tier_ops() {
            line.push_str(&t);
        }
        self.trace.push(format!("{op:?} => {line}"));
        self.summary.ops += 1;
    }

    /// Drain the manager's tier ops and perform them on the model's memories, in order (the
    /// model's memory is what every write so far left there, as for copies). `None` when
    /// there were none.
    pub(super) fn perform_tier_ops(&mut self) -> Option<String> {
        self.tier_ops.clear();
        self.mgr.drain_tier_ops(&mut self.tier_ops);
        if self.tier_ops.is_empty() {
            return None;
        }
        let bs = self.mgr.block_size() as usize;
        let ops = std::mem::take(&mut self.tier_ops);
        for op in &ops {
            let block: Vec<Option<(u32, usize)>> = match op.from.tier {
                Tier::Device => {
                    let base = op.from.slot as usize * bs;
                    self.payload
                        .get(base..base + bs)
                        .map_or_else(|| vec![None; bs], <[_]>::to_vec)
                }
                _ => self
                    .tier_payload
                    .get(&op.from)
                    .cloned()
                    .unwrap_or_else(|| vec![None; bs]),
            };
            match op.to.tier {
                Tier::Device => {
                    let base = op.to.slot as usize * bs;
                    if let Some(cells) = self.payload.get_mut(base..base + bs) {
                        cells.copy_from_slice(&block);
                    }
                }
                _ => {
                    self.tier_payload.insert(op.to, block);
                }
            }
        }
        self.summary.tier_ops += ops.len();
        let line = format!(", tier ops {ops:?}");
        self.tier_ops = ops;
        Some(line)
    }

    fn apply_inner(&mut self, op: Op) -> String {
        match op {
            Op::Start {
                family,
                shared_len,
                tail_len,
                scope,
            } => self.start(family, shared_len, tail_len, scope),
            Op::Fill { pick, n } => {
                let Some(id) = self.pick(pick, |s| s.filled < s.tokens.len()) else {
                    return "no-op".into();
                };
                let m = &self.seqs[&id];
                let n = (n as usize).clamp(1, m.tokens.len() - m.filled);
                if let Err(e) = self.mgr.fill(id, n as u32) {
                    return format!("seq {id}: unexpected error {e}");
                }
                let from = self.seqs[&id].filled;
                if let Some(m) = self.seqs.get_mut(&id) {
                    m.filled += n;
                }
                for pos in from..from + n {
                    self.write(id, pos);
                }
                format!("seq {id} filled {from}..{}", from + n)
            }
            Op::Append { pick, token } => {
                let Some(id) = self.pick(pick, |s| s.filled == s.tokens.len()) else {
                    return "no-op".into();
                };
                let before = self.mgr.accounting();
                match self.mgr.append(id) {
                    Ok(copies) => {
                        // A step runs its tier ops (an evicted block's offload) before copies.
                        let offloads = self.perform_tier_ops().unwrap_or_default();
                        copies.iter().for_each(|c| self.copy(c));
                        let m = self.seqs.get_mut(&id).expect("picked");
                        m.tokens.push(2_000_000 + u32::from(token));
                        m.filled += 1;
                        let pos = m.filled - 1;
                        self.write(id, pos);
                        format!("seq {id} appended at {pos}, copies {copies:?}{offloads}")
                    }
                    Err(e) => self.failed_alloc(before, e),
                }
            }
            Op::Fork { pick } => {
                let Some(parent) = self.pick(pick, |s| s.filled == s.tokens.len()) else {
                    return "no-op".into();
                };
                let child = self.next_seq;
                let before = self.mgr.accounting();
                match self.mgr.fork(parent, child) {
                    Ok(copies) => {
                        self.next_seq += 1;
                        copies.iter().for_each(|c| self.copy(c));
                        let m = self.seqs[&parent].clone();
                        self.seqs.insert(child, m);
                        format!("seq {child} forked from {parent}, copies {copies:?}")
                    }
                    Err(e) => self.failed_alloc(before, e),
                }
            }
            Op::Release { pick, why } => {
                let Some(id) = self.pick(pick, |_| true) else {
                    return "no-op".into();
                };
                self.release(
                    id,
                    [
                        ReleaseReason::Finish,
                        ReleaseReason::Cancel,
                        ReleaseReason::Preempt,
                    ][why as usize % 3],
                )
            }
            Op::BeginStep => {
                let step = self.mgr.begin_step();
                self.in_flight.insert(step);
                let writes = std::mem::take(&mut self.staged)
                    .into_iter()
                    .filter_map(|(seq, pos, t)| self.slot(seq, pos).map(|s| (s, t)))
                    .collect();
                self.step_writes.insert(step, writes);
                format!("step {step} began")
            }
            Op::RetireStep { pick } => {
                let steps: Vec<StepId> = self.in_flight.iter().copied().collect();
                if steps.is_empty() {
                    return "no-op".into();
                }
                let step = steps[pick as usize % steps.len()];
                self.mgr.retire_step(step);
                self.retire(step);
                format!("step {step} retired")
            }
            Op::Flush => {
                self.mgr.flush_prefix_cache();
                "flushed".into()
            }
        }
    }

    fn start(&mut self, family: u8, shared_len: u8, tail_len: u8, scope: u8) -> String {
        let mut tokens: Vec<u32> = (0..u32::from(shared_len))
            .map(|i| u32::from(family) * 10_000 + i)
            .collect();
        for _ in 0..tail_len.max(u8::from(shared_len == 0)) {
            self.next_tail += 1;
            tokens.push(1_000_000 + self.next_tail);
        }
        let scope = scope as usize % self.scopes.len();
        let id = self.next_seq;
        let key = self.scopes[scope].clone();
        let req = StartRequest {
            seq: id,
            tokens: &tokens,
            scope: Some(&key),
            reserve_tokens: tokens.len() as u32 + 6,
        };
        let probe = self.mgr.probe_start(&req);
        let before = self.mgr.accounting();
        match self.mgr.start(&req) {
            Ok(started) => {
                self.next_seq += 1;
                self.summary.starts += 1;
                // Onloads (and the offloads before them) run before anything reads the blocks.
                let onloads = self.perform_tier_ops().unwrap_or_default();
                self.summary.onloaded_tokens += u64::from(started.tier_hits.onload_tokens());
                self.summary.prefix_hit_blocks += started.hits.len() as u64;
                let mut problems = Vec::new();
                if !probe.fits
                    || probe.cached_tokens != started.cached_tokens
                    || probe.onload_tokens != started.tier_hits.onload_tokens()
                {
                    problems.push(format!("probe {probe:?} disagrees with start"));
                }
                if started.cached_tokens as usize >= tokens.len() {
                    problems.push(format!(
                        "hit of {} tokens is not capped below {}",
                        started.cached_tokens,
                        tokens.len()
                    ));
                }
                self.seqs.insert(
                    id,
                    ModelSeq {
                        tokens: tokens.clone(),
                        filled: started.cached_tokens as usize,
                        scope,
                    },
                );
                for hit in &started.hits {
                    if hit.scope != key {
                        problems.push(format!(
                            "hit on block {} reports scope {:?}",
                            hit.block, hit.scope
                        ));
                    }
                }
                // Every cached token must have been written by a sequence of the same scope and
                // hold this prompt's token.
                for (pos, &token) in tokens
                    .iter()
                    .enumerate()
                    .take(started.cached_tokens as usize)
                {
                    match self.slot(id, pos).and_then(|s| self.payload.get(s as usize).copied().flatten()) {
                        Some((t, s)) if t == token && s == scope => {}
                        other => problems.push(format!(
                            "cached position {pos} holds {other:?}, expected token {token} of scope {scope}"
                        )),
                    }
                }
                if problems.is_empty() {
                    format!(
                        "seq {id} started: {} tokens, {} cached, scope {scope}{onloads}",
                        tokens.len(),
                        started.cached_tokens
                    )
                } else {
                    format!(
                        "seq {id} started: VIOLATION {}{onloads}",
                        problems.join("; ")
                    )
                }
            }
            Err(e) => {
                if probe.fits {
                    return format!("seq {id}: VIOLATION probe said it fits but start failed: {e}");
                }
                self.failed_alloc(before, e)
            }
        }
    }

    fn failed_alloc(&mut self, before: kvbench_cache_api::Accounting, e: AllocError) -> String {
        self.summary.failed_allocations += 1;
        let after = self.mgr.accounting();
        match e {
            AllocError::NoSpace { .. } | AllocError::TooLarge { .. } if after == before => {
                format!("refused: {e}")
            }
            AllocError::NoSpace { .. } | AllocError::TooLarge { .. } => {
                format!("VIOLATION failed allocation changed accounting {before:?} -> {after:?}")
            }
            other => format!("VIOLATION unexpected error {other}"),
        }
    }

    pub(super) fn release(&mut self, id: SeqId, why: ReleaseReason) -> String {
        let mine = self.mapped_slots(id);
        let others: BTreeSet<u64> = self
            .seqs
            .keys()
            .filter(|&&s| s != id)
            .flat_map(|&s| self.mapped_slots(s))
            .collect();
        if let Err(e) = self.mgr.release(id, why) {
            return format!("VIOLATION release of seq {id} failed: {e}");
        }
        self.seqs.remove(&id);
        self.staged.retain(|&(w, _, _)| w != id);
        let fence = self.in_flight.last().copied();
        let mut fenced = 0;
        if let Some(fence) = fence {
            for slot in mine.into_iter().filter(|s| !others.contains(s)) {
                let content = self
                    .payload
                    .get(slot as usize)
                    .copied()
                    .flatten()
                    .map(|(t, _)| t);
                self.fenced.insert(slot, (fence, content));
                fenced += 1;
            }
            self.summary.fenced_releases += 1;
        }
        format!("seq {id} released ({why:?}), {fenced} slots fenced on {fence:?}")
    }

    pub(super) fn retire(&mut self, step: StepId) {
        self.in_flight.remove(&step);
        // The device's late writes land now: harmless unless the slot was handed to someone else.
        for (slot, token) in self.step_writes.remove(&step).unwrap_or_default() {
            if let Some(Some(cell)) = self.payload.get_mut(slot as usize) {
                cell.0 = token;
            }
        }
        let watermark = self.in_flight.first().copied().unwrap_or(StepId::MAX);
        self.fenced.retain(|_, (fence, _)| *fence >= watermark);
    }
}
