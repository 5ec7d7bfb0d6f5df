//! The shadow checker: a tag payload that stands in for K/V so that every read the cache
//! manager's layouts imply is checked at device scale, without tensor math.
//!
//! **What it checks.** Every slot holds a `Tag` — the position and token id written there and a
//! writer number that names the writing stream and its reuse scope (`ids.rs`) — in place of K/V. A
//! step writes tags through the layout the cache manager hands out at submit time (as a device
//! would), copy-on-write copies, swaps and tier transfers move tags as they would move data, and
//! every position a step reads must hold what the reading stream put (or was entitled to find)
//! there: the same position, the same token, the same reuse scope. So an address-translation fault,
//! a missed copy, a slot reused too early and a stale or cross-scope prefix hit all show up as a
//! wrong tag, whatever `--check-every` says, and independently of the cache manager's fence code.
//!
//! **Where it runs.** Inside the `sim` backend
//! ([`SimBackend::with_shadow`](crate::backend::sim::SimBackend::with_shadow)): `kvbench run`
//! carries it unless `--no-shadow`. The backend hands it each step at submit ([`Shadow::submit`])
//! and at completion ([`Shadow::complete`]); what it saw, [`ShadowReport`], goes into
//! `summary.json` as `runs[].shadow`.
//!
//! **Incremental.** A step does not re-read a stream's whole context. Each stream keeps the layout
//! it was last checked against: positions are checked when they first enter the context and when
//! the block-table entry (or contiguous base) covering them changes. What keeps the unchanged part
//! valid is the reverse index (`store/readers.rs`): every grain of slots (a paged block, or 16
//! contiguous slots) lists the streams whose checked context covers it, and a write that changes a
//! slot to something one of them does not expect marks that stream's chunk for re-checking at its
//! next read — and, when a step reading it is still in flight, adds the slot to that step's checks.
//!
//! **Cheap where it is common.** A decode step costs a comparison of the stream's block table
//! with the one it was checked against and one look at the reverse index for the written slot;
//! a prefill chunk's tags, and a copy's, are stored a grain at a time, with one look at the
//! index per grain.
//!
//! **When reads are checked.** Writes apply at submit; a step's reads are checked when it
//! completes. A slot handed out again and written while a step that reads it is in flight is
//! therefore seen by that step's check, as a device reading it late would see it.
//!
//! **Map.** This file holds [`Shadow`]: the streams' records and lifecycle (register, fork,
//! forget), a step's submit (tier transfers, copies, swaps, then each stream once: read, write,
//! sample) and the checks of its reads at completion. The rest are child modules, so they reach
//! that private state:
//! - `flat/`: the summed managers' layouts, one block table or contiguous region a stream:
//!   following a layout between steps (`observe.rs`), writing tags (`write.rs`), the fused decode
//!   (`decode.rs`).
//! - `grouped/`: the grouped layouts, one block table per table over one page pool: the records and
//!   general step (`mod.rs`), the cell store (`cells.rs`), a record's holds on pages
//!   (`reverse_index.rs`), writes and the fused decode (`write.rs`), the decode across a block
//!   boundary (`boundary.rs`), decodes left to store later (`pending.rs`), a stream's first step
//!   from nothing (`prompt.rs`), copies, swaps, foreign writes and completion (`moves.rs`).
//! - `store/`: the lazy tag array (`mod.rs`), the huge-page slabs its pages come from
//!   (`slabs.rs`), and the reverse index built on it (`readers.rs`).
//! - `tiers.rs`: tags through the lower tiers (offloads, onloads); `expect.rs`: what a reader
//!   expects at a position and the words for a mismatch; `ids.rs`: stream ids and writer numbers;
//!   `report.rs`: [`ShadowReport`].

use std::collections::{HashMap, VecDeque};

use crate::seam::{Sampled, SeqWork, StepPlan, SwapDirection};
use expect::{expects, mismatch, PRIVATE_SCOPE};
use flat::Flat;
use ids::{SeqIndex, Writers, NO_WRITER};
use kvbench_cache_api::{CacheMode, KvCacheManager, Pages, ScopeKey, SeqId, SeqLayout};
use store::readers::{Held, Holder, Readers, ANY_CHUNK};
use store::{LazyArray, Tag, MAX_ENTRIES};

// The pieces that follow layouts and move tags are child modules, so they keep access to the
// shadow's private state.
mod expect;
mod flat;
mod grouped;
mod ids;
mod report;
mod store;
mod tiers;

pub use report::ShadowReport;

/// Grain of the reverse index for contiguous layouts, slots.
const CONTIGUOUS_GRAIN: u32 = 16;
const NEVER: u64 = u64::MAX;
const NO_GRAIN: u64 = u64::MAX;
/// No list's version (`Pages` never reaches it): a record not compared since it changed.
const UNCHECKED: u64 = u64::MAX;

/// The layout a stream was last checked against.
#[derive(Debug, Clone)]
enum Table {
    None,
    /// Physical block of each checked chunk.
    Paged(Vec<u32>),
    /// Base slot; `grains` grains from `base / grain` on are registered.
    Contiguous {
        base: u64,
        grains: u32,
    },
}

/// One stream's shadow state, laid out by heat: a decode through an unchanged table (almost
/// every stream-step) reads and writes the first cache line and the first half of the second,
/// nothing else of it. `repr(C)` keeps that order and the alignment keeps each record on its own
/// two lines: with fields where the compiler put them, a record straddled three or four lines,
/// and each was a cache miss per stream-step once the batch's records outgrew the L1 cache.
#[derive(Debug)]
#[repr(C, align(64))]
struct SeqShadow {
    // First line: what every decode reads.
    /// Token id at each position: the prompt, then every sampled token.
    history: Vec<u32>,
    table: Table,
    /// Positions covered by `table` and checked (or queued for checking).
    extent: u32,
    /// Writer number of this stream, which its tags carry.
    writer: u32,
    /// A grain this stream is known to be the only reader of ([`NO_GRAIN`] if none): its own
    /// writes there need no look at the reverse index. Cleared when anyone else starts reading
    /// the grain or the stream stops.
    sole: u64,
    // Second line: what a decode writes, then what only the general path reads.
    /// The newest step that read this stream's slots.
    last_step: u64,
    id: SeqId,
    /// Position the latest sampled token occupies (a fork continues from there).
    last_sample_pos: Option<u32>,
    /// Chunks a conflicting write invalidated: re-checked at the next read.
    recheck: Vec<u32>,
    /// Tags copied out by a swap-out, written back by the swap-in. Boxed so that this rare
    /// field is one word and the record stays two lines (a boxed slice is two words).
    #[allow(clippy::box_collection)]
    host: Option<Box<Vec<Tag>>>,
    /// Reuse scope (interned; private scopes from [`PRIVATE_SCOPE`] on): what its reads expect.
    scope: u32,
    forgotten: bool,
}

/// The record stays two cache lines (see [`SeqShadow`]).
const _: () = assert!(std::mem::size_of::<SeqShadow>() == 128);

/// Slots `slot..slot + len` must hold stream `seq`'s positions `pos..pos + len` when the step
/// completes.
#[derive(Debug, Clone, Copy)]
struct Check {
    seq: u32,
    pos: u32,
    slot: u64,
    len: u32,
    /// Queued by a write made while the step was in flight.
    clobbered: bool,
}

pub struct Shadow {
    tags: LazyArray<Tag>,
    /// Sized at the first step, when the layout kind is known.
    readers: Readers,
    grain: u32,
    mode: Option<CacheMode>,
    seqs: Vec<SeqShadow>,
    /// Per stream index, beside `seqs` (whose records are full): the version of the manager's
    /// block list (`Pages`) the record's `Table::Paged` blocks were last found a prefix of
    /// ([`UNCHECKED`] since the record's table was replaced). While the manager hands out that
    /// version, its blocks are the ones compared: a decode skips the comparison.
    checked: Vec<u64>,
    free: Vec<u32>,
    index: SeqIndex,
    /// Emptied check lists, reused.
    spare: Vec<Vec<Check>>,
    /// Block-table buffers of removed streams, reused by the next paged tables.
    spare_tables: Vec<Vec<u32>>,
    scope_keys: Vec<ScopeKey>,
    scope_ids: HashMap<ScopeKey, u32>,
    /// Scope and id of every writer number a tag may carry.
    writers: Writers,
    /// The writer numbers ran out (said once).
    writers_spent: bool,
    in_flight: VecDeque<Vec<Check>>,
    submitted: u64,
    completed: u64,
    /// Forgotten streams whose slots an in-flight step still reads.
    deferred: Vec<u32>,
    changed: Vec<u32>,
    /// Readers of a grain, copied out while a write updates them.
    scratch: Vec<Holder>,
    /// Host and disk slots' tags, and the onloads of in-flight steps.
    tiers: tiers::TierStores,
    grouped: grouped::GroupedState,
    report: ShadowReport,
}

impl Shadow {
    /// A shadow for a cache of `total_slots` device slots; refused (with the message a run
    /// prints) past what it can track.
    pub fn new(total_slots: u64) -> Result<Shadow, String> {
        Shadow::with_tiers(total_slots, 0, 0)
    }

    /// A shadow for a cache of `total_slots` device slots whose manager may offload to
    /// `host_blocks` host-tier and `disk_blocks` disk-tier slots (`RunSetup::tiers`).
    pub fn with_tiers(
        total_slots: u64,
        host_blocks: u32,
        disk_blocks: u32,
    ) -> Result<Shadow, String> {
        let tags = LazyArray::zeroed(total_slots).ok_or_else(|| {
            format!(
                "the shadow payload tracks at most {MAX_ENTRIES} slots, the cache has {total_slots} \
                 (run with --no-shadow)"
            )
        })?;
        Ok(Shadow {
            tags,
            readers: Readers::new(0).expect("an empty index fits"),
            grain: 1,
            mode: None,
            seqs: Vec::new(),
            checked: Vec::new(),
            free: Vec::new(),
            index: SeqIndex::default(),
            spare: Vec::new(),
            spare_tables: Vec::new(),
            scope_keys: Vec::new(),
            scope_ids: HashMap::new(),
            writers: Writers::default(),
            writers_spent: false,
            in_flight: VecDeque::new(),
            submitted: 0,
            completed: 0,
            deferred: Vec::new(),
            changed: Vec::new(),
            scratch: Vec::new(),
            tiers: tiers::TierStores::new(host_blocks, disk_blocks),
            grouped: grouped::GroupedState::default(),
            report: ShadowReport::default(),
        })
    }

    /// Whether grouped steps may take the shortcuts of the general path (the fused decode, a
    /// fresh stream's first step, a decode's blind store); on by default. Off, every grouped step
    /// goes the general way: for tests that the shortcuts report exactly what it does.
    pub fn set_grouped_shortcuts(&mut self, on: bool) {
        self.grouped.set_shortcuts(on);
    }

    pub fn report(&self) -> ShadowReport {
        let mut r = self.report.clone();
        r.allocated_bytes = self.tags.allocated_bytes()
            + self.readers.allocated_bytes()
            + self.tiers.allocated_bytes()
            + self.grouped.allocated_bytes()
            + self.writers.allocated_bytes();
        r
    }

    fn violation(&mut self, msg: String) {
        self.report.violation(msg);
    }

    fn add_seq(&mut self, id: SeqId, s: SeqShadow) {
        if self.index.get(id).is_some() {
            self.violation(format!("stream {id} registered twice"));
            return;
        }
        let idx = match self.free.pop() {
            Some(i) => {
                self.seqs[i as usize] = s;
                self.checked[i as usize] = UNCHECKED;
                i
            }
            None => {
                self.seqs.push(s);
                self.checked.push(UNCHECKED);
                (self.seqs.len() - 1) as u32
            }
        };
        self.index.insert(id, idx);
    }

    /// A record for stream `id`, with a new writer number (a violation, once, when the run
    /// registered more streams than a tag can number: its tags then read as unknown writers').
    fn new_seq(&mut self, id: SeqId, history: Vec<u32>, scope: u32) -> SeqShadow {
        let writer = match self.writers.add(id, scope) {
            Some(w) => w,
            None => {
                if !self.writers_spent {
                    self.writers_spent = true;
                    self.violation(format!(
                        "stream {id}: more streams than the shadow's {} writer numbers",
                        u32::MAX
                    ));
                }
                NO_WRITER
            }
        };
        SeqShadow {
            id,
            history,
            last_sample_pos: None,
            writer,
            scope,
            table: Table::None,
            extent: 0,
            last_step: NEVER,
            recheck: Vec::new(),
            sole: NO_GRAIN,
            host: None,
            forgotten: false,
        }
    }

    pub fn register(&mut self, seq: SeqId, prompt: &[u32], scope: Option<&ScopeKey>) {
        let scope = match scope {
            Some(k) => match self.scope_ids.get(k) {
                Some(&id) => id,
                None => {
                    let id = self.scope_keys.len() as u32;
                    self.scope_keys.push(k.clone());
                    self.scope_ids.insert(k.clone(), id);
                    id
                }
            },
            None => PRIVATE_SCOPE | (seq as u32 & (PRIVATE_SCOPE - 1)),
        };
        let mut history = self.spare_history();
        history.extend_from_slice(prompt);
        let s = self.new_seq(seq, history, scope);
        self.add_seq(seq, s);
    }

    /// An empty history buffer: the one of the record `add_seq` fills next, kept by `remove`, so
    /// a new stream neither allocates nor regrows (by doubling, as it decodes) what a finished
    /// one already held.
    fn spare_history(&mut self) -> Vec<u32> {
        let mut h = match self.free.last() {
            Some(&i) => std::mem::take(&mut self.seqs[i as usize].history),
            None => Vec::new(),
        };
        h.clear();
        h
    }

    /// `child` continues `parent` from the parent's latest sample, taking `token` there.
    pub fn fork(&mut self, parent: SeqId, child: SeqId, token: u32) {
        let Some(pi) = self.index.get(parent) else {
            self.violation(format!("fork of unknown stream {parent}"));
            return;
        };
        let Some(pos) = self.seqs[pi as usize].last_sample_pos else {
            self.violation(format!("fork of stream {parent} before it sampled a token"));
            return;
        };
        let mut history = self.spare_history();
        let p = &self.seqs[pi as usize];
        history.extend_from_slice(&p.history[..(pos as usize).min(p.history.len())]);
        history.push(token);
        let scope = p.scope;
        let s = self.new_seq(child, history, scope);
        self.add_seq(child, s);
    }

    /// The stream is gone; its slots stop being protected once no in-flight step reads them.
    pub fn forget(&mut self, seq: SeqId) {
        let Some(idx) = self.index.get(seq) else {
            self.violation(format!("forget of unknown stream {seq}"));
            return;
        };
        let s = &mut self.seqs[idx as usize];
        s.forgotten = true;
        if s.last_step == NEVER || s.last_step < self.completed {
            self.remove(idx);
        } else {
            self.deferred.push(idx);
        }
    }

    fn remove(&mut self, idx: u32) {
        let table = std::mem::replace(&mut self.seqs[idx as usize].table, Table::None);
        self.checked[idx as usize] = UNCHECKED;
        self.unhold_from(idx, &table, 0);
        self.drop_records(idx, NEVER);
        if let Table::Paged(v) = table {
            self.spare_tables.push(v);
        }
        let s = &mut self.seqs[idx as usize];
        self.index.remove(s.id);
        s.history.clear();
        s.recheck = Vec::new();
        s.host = None;
        self.free.push(idx);
    }

    fn ensure_mode(&mut self, cache: &dyn KvCacheManager) {
        if self.mode.is_some() {
            return;
        }
        let mode = cache.mode();
        self.grain = match mode {
            CacheMode::Paged => cache.block_size().max(1),
            CacheMode::Contiguous => CONTIGUOUS_GRAIN,
        };
        if let Some(r) = Readers::new(self.tags.len().div_ceil(u64::from(self.grain))) {
            self.readers = r;
        }
        self.mode = Some(mode);
        if mode == CacheMode::Paged {
            self.ensure_tier_stores(self.grain);
        }
    }

    /// Register `idx` as a reader of grain `g` (chunk `chunk` of its layout).
    #[inline]
    fn hold(&mut self, g: u64, idx: u32, chunk: u32) {
        if let Held::Joined(was) = self.readers.hold(g, Holder { seq: idx, chunk }) {
            let s = &mut self.seqs[was.seq as usize];
            if s.sole == g {
                s.sole = NO_GRAIN;
            }
        }
    }

    #[inline]
    fn unhold(&mut self, g: u64, idx: u32, chunk: u32) {
        self.readers.unhold(g, Holder { seq: idx, chunk });
        let s = &mut self.seqs[idx as usize];
        if s.sole == g {
            s.sole = NO_GRAIN;
        }
    }

    /// Drop the reader entries of `table` from chunk `from` on.
    fn unhold_from(&mut self, idx: u32, table: &Table, from: u32) {
        match table {
            Table::None => {}
            Table::Paged(blocks) => {
                for (k, &b) in blocks.iter().enumerate().skip(from as usize) {
                    self.unhold(u64::from(b), idx, k as u32);
                }
            }
            Table::Contiguous { base, grains } => {
                let g0 = base / u64::from(self.grain);
                for k in from..*grains {
                    self.unhold(g0 + u64::from(k), idx, k);
                }
            }
        }
    }

    #[inline]
    fn queue(&mut self, c: Check) {
        if c.len > 0 {
            if let Some(s) = self.in_flight.back_mut() {
                s.push(c);
            }
        }
    }

    #[inline]
    fn idx_of(&mut self, seq: SeqId, step: u64, what: &str) -> Option<u32> {
        let idx = self.index.get(seq);
        if idx.is_none() {
            self.unknown(seq, step, what);
        }
        idx
    }

    #[cold]
    fn unknown(&mut self, seq: SeqId, step: u64, what: &str) {
        self.violation(format!(
            "step {step}: {what} of stream {seq}, which the backend does not know"
        ));
    }

    /// A step is handed to the device: move tags (tier transfers, copies, swaps), then, stream
    /// by stream, check its layout, write the new tokens' tags and queue the step's reads for
    /// checking at completion.
    ///
    /// Tier transfers come first, in the manager's order (`tiers.rs`): an offload reads
    /// its device block before this step's copies or writes reuse it, an onload fills a fresh
    /// device block before this step's streams read it. Copies and swaps come next, as on a device, where they land before the step's compute:
    /// a copy-on-write target must hold the copied prefix before its stream writes the new
    /// token there, and a swap-out must see the tags before anything of this step overwrites
    /// them. Against the reads the order does not matter, since reads are checked at
    /// completion, after every write of the step: a copy or swap-in over a slot some stream
    /// already reads is a changed tag that stream does not expect, found through the reverse
    /// index whichever of the two comes first; over a slot that enters a stream's context in
    /// this step, found by the check that entry queues.
    pub fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager, sampled: &[Sampled]) {
        self.ensure_mode(cache);
        let grouped = self.ensure_grouped(plan, cache);
        let step = self.submitted;
        self.submitted += 1;
        self.grouped.forget_shapes();
        let checks = self.spare.pop().unwrap_or_default();
        self.in_flight.push_back(checks);
        if !plan.tier_ops.is_empty() {
            self.tier_ops(&plan.tier_ops, step);
        }
        for c in &plan.copies {
            if grouped {
                self.copy_grouped(c, step);
                continue;
            }
            self.copy(c.src_slot, c.dst_slot, c.len_tokens, step);
        }
        for s in &plan.swaps {
            if grouped {
                self.swap_grouped(s.seq, s.direction, s.tokens, cache, step);
                continue;
            }
            self.swap(s.seq, s.direction, s.tokens, cache, step);
        }
        self.submit_streams(plan, cache, sampled, step);
    }

    /// The step's streams, one at a time while its state is in cache: read, write, sample. The
    /// order across streams does not matter: a write another stream of the step does not
    /// expect is a bad read whether it is queued as a clobbered slot (that stream already
    /// observed) or found when its invalidated chunk is re-checked (not yet observed).
    fn submit_streams(
        &mut self,
        plan: &StepPlan,
        cache: &dyn KvCacheManager,
        sampled: &[Sampled],
        step: u64,
    ) {
        let mut sampled = sampled.iter();
        for w in &plan.seqs {
            let sm = if w.sample { sampled.next() } else { None };
            let Some(idx) = self.idx_of(w.seq, step, "a step") else {
                continue;
            };
            let layout = match cache.layout(w.seq) {
                Some(SeqLayout::Grouped {
                    page_slots,
                    shapes,
                    tables,
                }) => {
                    self.step_grouped(idx, page_slots, shapes, tables, w, step);
                    if let Some(sm) = sm {
                        self.sampled(idx, w, sm.token);
                    }
                    continue;
                }
                Some(SeqLayout::Paged { block_size, blocks }) => {
                    Some(Flat::Paged { block_size, blocks })
                }
                Some(SeqLayout::Contiguous {
                    base_slot,
                    capacity_tokens,
                }) => Some(Flat::Contiguous {
                    base_slot,
                    capacity_tokens,
                }),
                None => None,
            };
            let fast = w.new_tokens == 1
                && match layout {
                    Some(Flat::Paged { block_size, blocks }) => {
                        self.decode_paged(idx, block_size, blocks, w, step)
                    }
                    Some(Flat::Contiguous {
                        base_slot,
                        capacity_tokens,
                    }) => self.decode_contiguous(idx, base_slot, capacity_tokens, w, step),
                    None => false,
                };
            if fast {
                if let Some(sm) = sm {
                    self.sampled(idx, w, sm.token);
                }
                continue;
            }
            match layout {
                Some(l) => {
                    let end = w.context_tokens.saturating_add(w.new_tokens);
                    self.observe(idx, &l, end, w.context_tokens, step)
                }
                None => self.violation(format!(
                    "step {step}: stream {} is scheduled but has no cache layout",
                    w.seq
                )),
            }
            self.write_step(idx, w, step);
            if let Some(sm) = sm {
                self.sampled(idx, w, sm.token);
            }
        }
    }

    /// The token sampled after the step extends the history (a recompute re-derives the same).
    #[inline]
    fn sampled(&mut self, idx: u32, w: &SeqWork, token: u32) {
        let s = &mut self.seqs[idx as usize];
        let pos = w.context_tokens.saturating_add(w.new_tokens);
        s.history.truncate(pos as usize);
        s.history.push(token);
        s.last_sample_pos = Some(pos);
    }

    /// The oldest in-flight step completed: check what it read against what its readers expect.
    pub fn complete(&mut self) {
        let Some(mut done) = self.in_flight.pop_front() else {
            return;
        };
        let step = self.completed;
        for c in &done {
            let r = &self.seqs[c.seq as usize];
            let mut k = 0u32;
            while k < c.len {
                let slot = c.slot + u64::from(k);
                let run = self
                    .tags
                    .run(slot, u64::from(c.len - k))
                    .unwrap_or(std::slice::from_ref(&Tag::EMPTY));
                for (j, tag) in run.iter().enumerate() {
                    let pos = c.pos + k + j as u32;
                    if expects(&r.history, r.scope, pos, tag, &self.writers) {
                        continue;
                    }
                    let why = mismatch(
                        &r.history,
                        r.scope,
                        pos,
                        tag,
                        &self.writers,
                        &self.scope_keys,
                    )
                    .unwrap_or_default();
                    self.report.violation(format!(
                        "step {step}: stream {} read position {pos} at slot {}, but {why}{}",
                        r.id,
                        slot + j as u64,
                        if c.clobbered {
                            " (overwritten while the step was in flight)"
                        } else {
                            ""
                        }
                    ));
                }
                self.report.checked_slots += run.len() as u64;
                k += run.len() as u32;
            }
        }
        done.clear();
        self.spare.push(done);
        self.complete_grouped(step);
        self.completed += 1;
        if self.tiers.has_pending() {
            self.tier_step_done();
        }
        let mut i = 0;
        while i < self.deferred.len() {
            let idx = self.deferred[i];
            if self.seqs[idx as usize].last_step < self.completed {
                self.deferred.swap_remove(i);
                self.remove(idx);
            } else {
                i += 1;
            }
        }
    }
}
