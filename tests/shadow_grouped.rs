//! The sim shadow payload verifies grouped layouts: random runs of starts, chunked prefills,
//! decodes, forks and cancellations, two steps in flight as the engine keeps them, driven
//! through the sim backend against the grouped managers over full + sliding, full + recurrent
//! and full + MLA layouts. Clean runs report no violation and a non-zero count of checked
//! grouped reads; each planted fault (a skipped copy-on-write, pages reused before the fence, a
//! wrong block table, a sliding table released one block too early) is caught by the shadow
//! itself.
//!
//! Seeded: each run prints its seed; `KVBENCH_SEED` replays one, `KVBENCH_SHADOW_GROUPED_SEEDS`
//! widens the sweep.

mod engine_support;
mod support;

use std::collections::{BTreeMap, VecDeque};

use kvbench::backend::sim::shadow::ShadowReport;
use kvbench::backend::sim::SimBackend;
use kvbench::backend::{Backend, RunSetup, SeqWork, StepPlan, SwapDirection, SwapOp, TierSetup};
use kvbench::cache::hybrid::{HybridKv, HybridLayout};
use kvbench::model::{Dtype, LayerGroup, ModelShape};
use kvbench_baselines::manager::GroupedContiguous;
use kvbench_cache_api::grouped::readable_from;
use kvbench_cache_api::{
    Accounting, AllocError, CacheMode, CopyOp, Fault, GroupTable, GroupedPool, KvCacheManager,
    PrefixStats, Probe, ReleaseReason, SeqId, SeqLayout, StartRequest, Started, StepId,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The largest prefill chunk the driver schedules (the contiguous rings are sized for it).
const CHUNK_TOKENS: u32 = 8;
const STEPS: u32 = 400;

// ---------------------------------------------------------------------------------------------
// Layouts and managers

fn shape(name: &str, groups: Vec<LayerGroup>) -> ModelShape {
    let layers = groups.iter().map(|g| g.layers()).sum();
    ModelShape {
        name: name.into(),
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

/// One layout mix: its layer groups, block size, pages and reserved recurrent states.
struct Mix {
    shape: ModelShape,
    block_size: u32,
    pages: u64,
    states: u32,
}

fn mixes() -> Vec<Mix> {
    vec![
        Mix {
            // A window of 10 over 4-token blocks: not whole blocks, so reads start mid-block.
            shape: shape(
                "full+sliding",
                vec![
                    LayerGroup::Sliding {
                        layers: 2,
                        window: 10,
                        kv_heads: 2,
                        head_dim: 4,
                    },
                    full(2),
                ],
            ),
            block_size: 4,
            pages: 160,
            states: 0,
        },
        Mix {
            shape: shape(
                "full+recurrent",
                vec![
                    full(2),
                    LayerGroup::Recurrent {
                        layers: 2,
                        state_bytes: 1000,
                    },
                ],
            ),
            block_size: 4,
            pages: 90,
            // Enough states that the pool, not the states, limits the streams: a wrong table
            // then lands on a page another stream writes.
            states: 16,
        },
        Mix {
            // 32 bytes a token a full layer, 18 an MLA layer: 7-token MLA blocks in 4-slot pages.
            shape: shape(
                "full+mla",
                vec![
                    full(2),
                    LayerGroup::Mla {
                        layers: 2,
                        latent_dim: 7,
                        rope_dim: 2,
                        q_lora_rank: 0,
                    },
                ],
            ),
            block_size: 4,
            pages: 120,
            states: 0,
        },
    ]
}

fn layout(mix: &Mix) -> HybridLayout {
    let probe = HybridLayout::new(&mix.shape, mix.block_size, 1 << 30, 0).expect("layout");
    let budget = probe.page_bytes * mix.pages + probe.state_bytes_per_sequence * mix.states as u64;
    let l = HybridLayout::new(&mix.shape, mix.block_size, budget, mix.states).expect("layout");
    assert_eq!(u64::from(l.pages), mix.pages, "{}", mix.shape.name);
    l
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Hybrid,
    Contiguous,
}

const MANAGERS: [Which; 2] = [Which::Hybrid, Which::Contiguous];

fn manager(which: Which, mix: &Mix) -> Box<dyn KvCacheManager> {
    match which {
        Which::Hybrid => Box::new(HybridKv::new(layout(mix))),
        Which::Contiguous => Box::new(GroupedContiguous::new(
            layout(mix).grouped_pool(),
            CHUNK_TOKENS,
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// A test double: sliding tables released one block too early

/// Hands out the inner manager's layouts with every sliding table's first needed block dropped
/// (the block holding the first position the window of the last written token reads), as a
/// manager that releases one block too early would.
struct EarlyRelease {
    inner: Box<dyn KvCacheManager>,
    shapes: Vec<kvbench_cache_api::TableShape>,
    page_slots: u32,
    tables: BTreeMap<SeqId, Vec<GroupTable>>,
    fired: u64,
}

impl EarlyRelease {
    fn new(inner: Box<dyn KvCacheManager>, pool: &GroupedPool) -> EarlyRelease {
        EarlyRelease {
            inner,
            shapes: pool.shapes.clone(),
            page_slots: pool.page_slots,
            tables: BTreeMap::new(),
            fired: 0,
        }
    }

    /// Recompute every live sequence's handed-out tables from the inner manager's.
    fn refresh(&mut self) {
        let ids: Vec<SeqId> = self.tables.keys().copied().collect();
        for seq in ids {
            let Some(SeqLayout::Grouped { tables, .. }) = self.inner.layout(seq) else {
                self.tables.remove(&seq);
                continue;
            };
            let written = u64::from(self.inner.seq_tokens(seq).unwrap_or(0));
            let mut out = tables.to_vec();
            for (t, shape) in out.iter_mut().zip(&self.shapes) {
                if shape.window.is_none() {
                    continue;
                }
                let needed = readable_from(shape, written) / u64::from(shape.block_tokens.max(1));
                let early = needed + 1;
                if early > t.first_block && early < t.end_block() {
                    let drop = (early - t.first_block) as usize;
                    t.pages.drain(..drop);
                    t.first_block = early;
                    self.fired += 1;
                }
            }
            self.tables.insert(seq, out);
        }
    }

    fn track(&mut self, seq: SeqId) {
        self.tables.insert(seq, Vec::new());
        self.refresh();
    }
}

impl KvCacheManager for EarlyRelease {
    fn mode(&self) -> CacheMode {
        self.inner.mode()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn probe_start(&self, req: &StartRequest<'_>) -> Probe {
        self.inner.probe_start(req)
    }
    fn start(&mut self, req: &StartRequest<'_>) -> Result<Started, AllocError> {
        let r = self.inner.start(req)?;
        self.track(req.seq);
        Ok(r)
    }
    fn fill(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        self.inner.fill(seq, n_tokens)?;
        self.refresh();
        Ok(())
    }
    fn append(&mut self, seq: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.inner.append(seq)?;
        self.refresh();
        Ok(r)
    }
    fn append_cost(&self, seq: SeqId) -> u64 {
        self.inner.append_cost(seq)
    }
    fn sequence_slots(&self, tokens: u64, reserve_tokens: u32) -> u64 {
        self.inner.sequence_slots(tokens, reserve_tokens)
    }
    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.inner.fork(parent, child)?;
        self.track(child);
        Ok(r)
    }
    fn release(&mut self, seq: SeqId, why: ReleaseReason) -> Result<(), AllocError> {
        self.inner.release(seq, why)?;
        self.tables.remove(&seq);
        self.refresh();
        Ok(())
    }
    fn begin_step(&mut self) -> StepId {
        self.inner.begin_step()
    }
    fn retire_step(&mut self, step: StepId) {
        self.inner.retire_step(step);
        self.refresh();
    }
    fn layout(&self, seq: SeqId) -> Option<SeqLayout<'_>> {
        let tables = self.tables.get(&seq)?;
        Some(SeqLayout::Grouped {
            page_slots: self.page_slots,
            shapes: &self.shapes,
            tables,
        })
    }
    fn seq_tokens(&self, seq: SeqId) -> Option<u32> {
        self.inner.seq_tokens(seq)
    }
    fn accounting(&self) -> Accounting {
        self.inner.accounting()
    }
    fn prefix_stats(&self) -> PrefixStats {
        self.inner.prefix_stats()
    }
    fn largest_free_extent(&self) -> u64 {
        self.inner.largest_free_extent()
    }
    fn flush_prefix_cache(&mut self) {
        self.inner.flush_prefix_cache();
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.inner.check_invariants()
    }
    fn assert_quiescent(&self) -> Result<(), String> {
        self.inner.assert_quiescent()
    }
    fn inject_fault(&mut self, fault: Fault) {
        self.inner.inject_fault(fault);
    }
    fn fault_fired(&self) -> u64 {
        self.fired
    }
}

// ---------------------------------------------------------------------------------------------
// The step driver

#[derive(Debug)]
struct Stream {
    prompt_tokens: u32,
    /// Positions written by completed or in-flight steps.
    written: u32,
    target_tokens: u32,
    busy: bool,
}

/// What a run did, for the assertions and the failure messages.
#[derive(Debug, Default)]
struct Tally {
    steps: u64,
    starts: u64,
    forks: u64,
    cancels: u64,
    preempted: u64,
    swaps: u64,
    finished: u64,
    invariant_errors: Vec<String>,
}

struct Driver {
    cache: Box<dyn KvCacheManager>,
    be: SimBackend,
    rng: ChaCha8Rng,
    streams: BTreeMap<SeqId, Stream>,
    /// Steps in flight: the manager's fence and the streams each wrote (`seq`, new tokens).
    in_flight: VecDeque<(StepId, Vec<(SeqId, u32)>)>,
    /// Streams swapped out (their pages released), oldest first.
    swapped: VecDeque<(SeqId, Stream)>,
    /// Swap a stream out once in this many steps, and one back in (0: never).
    swap_every: u32,
    /// Copies a fork asked for, carried by the next step.
    copies: Vec<CopyOp>,
    next_seq: SeqId,
    /// Release a stream right after submitting its step, once in this many steps (0: never).
    cancel_every: u32,
    tally: Tally,
}

impl Driver {
    fn new(cache: Box<dyn KvCacheManager>, seed: u64, cancel_every: u32) -> Driver {
        let slots = cache.accounting().total_slots;
        let paged = cache.mode() == CacheMode::Paged;
        let setup = RunSetup {
            model: ModelShape::tiny(),
            device: "cpu".into(),
            scenario_dir: None,
            cache_slots: slots,
            block_size: cache.block_size(),
            seed,
            max_tokens_per_step: 256,
            max_step_tokens: CHUNK_TOKENS,
            swap_gbytes_per_s: None,
            workspace_bytes: None,
            profile: Some(engine_support::engine_test_device()),
            clock: Default::default(),
            tiers: TierSetup::default(),
        };
        Driver {
            cache,
            be: SimBackend::new(&setup)
                .expect("sim")
                .with_shadow()
                .expect("shadow"),
            rng: ChaCha8Rng::seed_from_u64(seed),
            streams: BTreeMap::new(),
            in_flight: VecDeque::new(),
            copies: Vec::new(),
            swapped: VecDeque::new(),
            // The grouped contiguous baseline's rings take at most the largest step a step, so
            // a swap-in (a start filled whole) is the paged manager's alone.
            swap_every: if paged { 6 } else { 0 },
            next_seq: 1,
            cancel_every,
            tally: Tally::default(),
        }
    }

    fn start_some(&mut self) {
        for _ in 0..self.rng.gen_range(0..3) {
            let prompt_tokens = self.rng.gen_range(1..40u32);
            let target_tokens = prompt_tokens + self.rng.gen_range(1..40u32);
            let salt = self.rng.gen_range(0..1000u32);
            let tokens: Vec<u32> = (0..prompt_tokens).map(|i| (i * 31 + salt) % 500).collect();
            let seq = self.next_seq;
            let req = StartRequest {
                seq,
                tokens: &tokens,
                scope: None,
                reserve_tokens: target_tokens,
            };
            if !self.cache.probe_start(&req).fits {
                return;
            }
            let started = self.cache.start(&req).expect("a start that fits");
            self.next_seq += 1;
            self.be.register(seq, &tokens, None).expect("register");
            self.streams.insert(
                seq,
                Stream {
                    prompt_tokens,
                    written: started.cached_tokens,
                    target_tokens,
                    busy: false,
                },
            );
            self.tally.starts += 1;
        }
    }

    /// Plan, submit and follow up one step; false when nothing could be scheduled.
    fn submit(&mut self) -> bool {
        let mut plan = StepPlan {
            copies: std::mem::take(&mut self.copies),
            ..StepPlan::default()
        };
        let mut wrote = Vec::new();
        let swapped_out = self.swap_out(&mut plan);
        self.swap_in(&mut plan, &mut wrote);
        let ids: Vec<SeqId> = self.streams.keys().copied().collect();
        for seq in ids {
            let s = &self.streams[&seq];
            if s.busy || s.written >= s.target_tokens {
                continue;
            }
            let (context, prompt) = (s.written, s.prompt_tokens);
            let new = if context < prompt {
                let n = (prompt - context).min(self.rng.gen_range(1..=CHUNK_TOKENS));
                self.cache.fill(seq, n).expect("fill");
                n
            } else {
                match self.cache.append(seq) {
                    Ok(c) => plan.copies.extend(c),
                    // No room for the block (the paged manager admits on the prompt alone): the
                    // stream is preempted, as the engine's recompute preemption does.
                    Err(AllocError::NoSpace { .. }) => {
                        self.drop_stream(seq, ReleaseReason::Preempt);
                        self.tally.preempted += 1;
                        continue;
                    }
                    Err(e) => panic!("append of {seq}: {e:?}"),
                }
                1
            };
            plan.seqs.push(SeqWork {
                seq,
                context_tokens: context,
                new_tokens: new,
                sample: context + new >= prompt,
            });
            wrote.push((seq, new));
        }
        if plan.is_empty() {
            return false;
        }
        self.be.submit(&plan, &*self.cache).expect("submit");
        let fence = self.cache.begin_step();
        if let Some(seq) = swapped_out {
            // Its pages go once the swap-out has read them: fenced on this step.
            self.cache
                .release(seq, ReleaseReason::Preempt)
                .expect("release");
        }
        self.tally.steps += 1;
        for &(seq, new) in &wrote {
            if let Some(s) = self.streams.get_mut(&seq) {
                s.busy = true;
                s.written += new;
            }
        }
        self.fork_some(&wrote);
        if self.cancel_every > 0
            && self
                .tally
                .steps
                .is_multiple_of(u64::from(self.cancel_every))
        {
            // Released while its step still reads its pages, as a cancelled request is.
            if let Some(&(seq, _)) = wrote.iter().find(|(q, _)| self.streams.contains_key(q)) {
                self.drop_stream(seq, ReleaseReason::Cancel);
                self.tally.cancels += 1;
            }
        }
        self.in_flight.push_back((fence, wrote));
        if self.tally.steps.is_multiple_of(16) {
            if let Err(e) = self.cache.check_invariants() {
                self.tally.invariant_errors.push(e);
            }
        }
        true
    }

    /// Once in `swap_every` steps, swap out the first idle decoding stream: its tags go to the
    /// host and its pages are released after the step is submitted.
    fn swap_out(&mut self, plan: &mut StepPlan) -> Option<SeqId> {
        if self.swap_every == 0 || self.tally.steps % u64::from(self.swap_every) != 1 {
            return None;
        }
        let seq = self
            .streams
            .iter()
            .find(|(_, s)| !s.busy && s.written > s.prompt_tokens && s.written < s.target_tokens)
            .map(|(&seq, _)| seq)?;
        let s = self.streams.remove(&seq)?;
        plan.swaps.push(SwapOp {
            seq,
            direction: SwapDirection::Out,
            tokens: s.written,
        });
        self.swapped.push_back((seq, s));
        self.tally.swaps += 1;
        Some(seq)
    }

    /// Once in `swap_every` steps, bring the oldest swapped stream back if it fits: a fresh
    /// start and fill of its tokens, then the swap-in writes its tags; it decodes from the next
    /// step on.
    fn swap_in(&mut self, plan: &mut StepPlan, wrote: &mut Vec<(SeqId, u32)>) {
        if self.swap_every == 0 || !self.tally.steps.is_multiple_of(u64::from(self.swap_every)) {
            return;
        }
        let Some(&(seq, ref s)) = self.swapped.front() else {
            return;
        };
        let tokens = vec![0u32; s.written as usize];
        let req = StartRequest {
            seq,
            tokens: &tokens,
            scope: None,
            reserve_tokens: s.target_tokens,
        };
        if !self.cache.probe_start(&req).fits || self.cache.start(&req).is_err() {
            return;
        }
        let mut filled = 0;
        while filled < s.written {
            let n = (s.written - filled).min(CHUNK_TOKENS);
            self.cache
                .fill(seq, n)
                .expect("fill of a swapped-in stream");
            filled += n;
        }
        plan.swaps.push(SwapOp {
            seq,
            direction: SwapDirection::In,
            tokens: s.written,
        });
        if let Some((seq, mut s)) = self.swapped.pop_front() {
            // Not scheduled in the step that swaps it in.
            s.busy = true;
            self.streams.insert(seq, s);
            wrote.push((seq, 0));
        }
    }

    /// Streams that just sampled their first token may fork; the copies go with the next step.
    fn fork_some(&mut self, wrote: &[(SeqId, u32)]) {
        for &(parent, _) in wrote {
            let Some(p) = self.streams.get(&parent) else {
                continue;
            };
            if p.written != p.prompt_tokens || !self.rng.gen_bool(0.3) {
                continue;
            }
            let child = self.next_seq;
            let Ok(copies) = self.cache.fork(parent, child) else {
                continue;
            };
            self.next_seq += 1;
            self.copies.extend(copies);
            self.be.fork(parent, child, 0).expect("fork");
            let (prompt_tokens, target_tokens) = (p.prompt_tokens, p.target_tokens);
            self.streams.insert(
                child,
                Stream {
                    prompt_tokens,
                    written: prompt_tokens,
                    target_tokens,
                    busy: false,
                },
            );
            self.tally.forks += 1;
        }
    }

    fn drop_stream(&mut self, seq: SeqId, why: ReleaseReason) {
        self.streams.remove(&seq);
        self.cache.release(seq, why).expect("release");
        self.be.forget(seq).expect("forget");
    }

    fn complete(&mut self) {
        let Some((fence, wrote)) = self.in_flight.pop_front() else {
            return;
        };
        self.be.complete().expect("complete");
        self.cache.retire_step(fence);
        for (seq, _) in wrote {
            let Some(s) = self.streams.get_mut(&seq) else {
                continue;
            };
            s.busy = false;
            if s.written >= s.target_tokens {
                self.drop_stream(seq, ReleaseReason::Finish);
                self.tally.finished += 1;
            }
        }
    }

    /// `steps` steps, two in flight, then drain and release everything.
    fn run(&mut self, steps: u32) -> ShadowReport {
        for _ in 0..steps {
            self.start_some();
            let submitted = self.submit();
            if self.in_flight.len() >= 2 || !submitted {
                self.complete();
            }
        }
        while !self.in_flight.is_empty() {
            self.complete();
        }
        let ids: Vec<SeqId> = self.streams.keys().copied().collect();
        for seq in ids {
            self.drop_stream(seq, ReleaseReason::Finish);
        }
        for (seq, _) in std::mem::take(&mut self.swapped) {
            self.be.forget(seq).expect("forget");
        }
        self.be.shadow_report().expect("shadow carried")
    }
}

fn seeds() -> Vec<u64> {
    support::seeds("KVBENCH_SHADOW_GROUPED_SEEDS", 3, 1)
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn clean_grouped_runs_report_no_violation_and_check_every_table() {
    for mix in mixes() {
        for which in MANAGERS {
            for seed in seeds() {
                let name = format!("{} / {which:?} / seed {seed}", mix.shape.name);
                println!("{name} (replay: KVBENCH_SEED={seed})");
                let mut d = Driver::new(manager(which, &mix), seed, 7);
                let r = d.run(STEPS);
                let t = &d.tally;
                println!(
                    "  checked {} of {} grouped reads, wrote {}; {t:?}",
                    r.checked_slots, r.read_slots, r.written_slots
                );
                assert_eq!(r.violations, 0, "{name}: {:?} {t:?}", r.messages);
                assert!(t.invariant_errors.is_empty(), "{name}: {t:?}");
                assert!(
                    t.starts > 5 && t.finished > 3 && t.cancels > 3,
                    "{name}: the run exercised too little: {t:?}"
                );
                assert!(t.forks > 0, "{name}: no fork: {t:?}");
                assert!(
                    t.swaps > 0 || which == Which::Contiguous,
                    "{name}: no swap: {t:?}"
                );
                assert!(
                    r.checked_slots > 0 && r.read_slots >= r.checked_slots,
                    "{name}: {r:?}"
                );
                assert!(r.written_slots > 0, "{name}: {r:?}");
                assert!(r.allocated_bytes > 0, "{name}: {r:?}");
                d.cache.assert_quiescent().expect("quiescent");
            }
        }
    }
}

/// A run of `cache` (its fault armed): the shadow's report, how often the fault fired, and what
/// the run did.
fn faulty(cache: Box<dyn KvCacheManager>, seed: u64) -> (ShadowReport, u64, Tally) {
    let mut d = Driver::new(cache, seed, 5);
    let r = d.run(STEPS);
    let fired = d.cache.fault_fired();
    println!(
        "  fired {fired}, {} violations, first: {:?}; {:?}",
        r.violations,
        r.messages.first(),
        d.tally
    );
    (r, fired, d.tally)
}

#[test]
fn pages_reused_before_the_fence_are_caught_by_the_shadow() {
    for mix in mixes() {
        for which in MANAGERS {
            for seed in seeds() {
                let name = format!("{} / {which:?} / seed {seed}", mix.shape.name);
                println!("{name} (replay: KVBENCH_SEED={seed})");
                let mut cache = manager(which, &mix);
                cache.inject_fault(Fault::EarlyReuse);
                let (r, fired, t) = faulty(cache, seed);
                assert!(fired > 0, "{name}: the fault never fired: {t:?}");
                assert!(
                    r.violations > 0,
                    "{name}: early reuse not caught: {r:?} {t:?}"
                );
                assert!(
                    r.messages.iter().any(|m| m.contains("read position")),
                    "{name}: {:?}",
                    r.messages
                );
            }
        }
    }
}

#[test]
fn a_wrong_block_table_is_caught_by_the_shadow() {
    for mix in mixes() {
        for which in MANAGERS {
            for seed in seeds() {
                let name = format!("{} / {which:?} / seed {seed}", mix.shape.name);
                println!("{name} (replay: KVBENCH_SEED={seed})");
                let mut cache = manager(which, &mix);
                cache.inject_fault(Fault::BadBlockTable);
                let (r, fired, t) = faulty(cache, seed);
                assert!(fired > 0, "{name}: the fault never fired: {t:?}");
                assert!(
                    r.violations > 0,
                    "{name}: bad table not caught: {r:?} {t:?}"
                );
            }
        }
    }
}

#[test]
fn a_sliding_table_released_one_block_too_early_is_caught_by_the_shadow() {
    let mix = mixes().remove(0);
    for which in MANAGERS {
        for seed in seeds() {
            let name = format!("{} / {which:?} / seed {seed}", mix.shape.name);
            println!("{name} (replay: KVBENCH_SEED={seed})");
            let pool = layout(&mix).grouped_pool();
            let cache = Box::new(EarlyRelease::new(manager(which, &mix), &pool));
            let (r, fired, t) = faulty(cache, seed);
            assert!(fired > 0, "{name}: no table was cut: {t:?}");
            assert!(r.violations > 0, "{name}: {r:?} {t:?}");
            assert!(
                r.messages
                    .iter()
                    .any(|m| m.contains("of table 0, which the table no longer holds")),
                "{name}: {:?}",
                r.messages
            );
        }
    }
}

#[test]
fn a_write_into_a_shared_page_without_its_copy_is_caught_by_the_shadow() {
    // Only the hybrid manager shares pages (a fork's partial last page); the baseline copies.
    for mix in mixes() {
        for seed in seeds() {
            let name = format!("{} / Hybrid / seed {seed}", mix.shape.name);
            println!("{name} (replay: KVBENCH_SEED={seed})");
            let mut cache = manager(Which::Hybrid, &mix);
            cache.inject_fault(Fault::SkipCow);
            let (r, _, t) = faulty(cache, seed);
            assert!(t.forks > 0, "{name}: no fork, nothing shared: {t:?}");
            assert!(
                r.violations > 0,
                "{name}: skipped copy not caught: {r:?} {t:?}"
            );
            assert!(
                r.messages.iter().any(|m| m.contains("read position")),
                "{name}: {:?}",
                r.messages
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Through the engine

/// `quick-basic` on `sim` with a tiny grouped model and the grouped managers.
fn engine_run(preset: &str, fault: Option<Fault>) -> kvbench::experiment::Experiment {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/quick-basic.toml");
    let sets: Vec<String> = [
        format!("model.preset={preset}"),
        "cache.manager=hybrid".into(),
        "scheduler.prefix_cache=false".into(),
        "memory.kv_budget=1MiB".into(),
    ]
    .into();
    let s = kvbench::scenario::load(&path, &sets).expect("scenario loads");
    let opts = kvbench::experiment::RunOptions {
        fault,
        shadow: true,
        invariant_check_every: 0,
        trace_tokens: false,
        ..Default::default()
    };
    kvbench::experiment::run_scenario(&s, &opts).expect("run")
}

fn engine_shadow(exp: &kvbench::experiment::Experiment, mode: CacheMode) -> ShadowReport {
    exp.run(mode)
        .and_then(|r| r.shadow.clone())
        .expect("sim carries the shadow")
}

#[test]
fn engine_runs_of_grouped_models_are_shadowed_clean_in_both_modes() {
    for preset in ["tiny-sliding", "tiny-hybrid", "tiny-mla"] {
        let exp = engine_run(preset, None);
        for mode in [CacheMode::Paged, CacheMode::Contiguous] {
            let r = engine_shadow(&exp, mode);
            println!(
                "{preset} {mode:?}: checked {} of {} grouped reads",
                r.checked_slots, r.read_slots
            );
            assert_eq!(r.violations, 0, "{preset} {mode:?}: {:?}", r.messages);
            assert!(
                r.checked_slots > 0 && r.written_slots > 0,
                "{preset} {mode:?}: {r:?}"
            );
        }
    }
}

#[test]
fn a_wrong_block_table_in_an_engine_run_is_caught_by_the_shadow() {
    // `--check-every 0`: the manager's own checks run only at the end; the shadow sees it first.
    for preset in ["tiny-sliding", "tiny-mla"] {
        let exp = engine_run(preset, Some(Fault::BadBlockTable));
        let paged = exp.run(CacheMode::Paged).expect("paged run");
        assert!(paged.fault_fired > 0, "{preset}: never fired");
        let r = engine_shadow(&exp, CacheMode::Paged);
        assert!(r.violations > 0, "{preset}: not caught: {r:?}");
    }
}
