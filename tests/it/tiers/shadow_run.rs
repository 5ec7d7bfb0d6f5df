//! End to end on `sim`: the engine drives a tiered paged manager whose device cache is too small
//! for the workload's shared prefixes, so blocks are offloaded to the host tier and later
//! onloaded; the shadow payload follows every block and every reader of an onloaded block
//! checks it. A clean run has tier hits and no shadow violation, with every transfer the manager
//! counted carried out by the shadow; with `stale-onload` armed the fault fires and the shadow
//! catches it by itself (per-step invariant checks off) — over a grid of cache sizes, exactly in
//! the runs where it fired.
//!
//! Two harnesses: the engine as it is (it hands the backend `StepPlan::tier_ops` once it drains
//! the manager's ops; until then the shadow sees none and that variant SKIPs, saying so), and
//! the engine with a pass-through adapter that drains the manager after each call that may emit
//! an op and adds them to the next submitted plan — the order the engine's own drain gives
//! (ops decided while planning a step belong to it; those decided after its submit, to the next).

use std::sync::{Arc, Mutex};

use kvbench::backend::sim::SimBackend;
use kvbench::backend::{
    Backend, BackendError, DiskLink, MemoryParts, NumericsReport, RunSetup, StepOutput, StepPlan,
    TierSetup,
};
use kvbench::cache::{CacheSpec, TierConfig};
use kvbench::engine::{self, EngineConfig, RunRecord};
use kvbench::model::ModelShape;
use kvbench::scenario::{Reservation, SchedulerSpec};
use kvbench::shadow::ShadowReport;
use kvbench::workload::{Request, Workload};
use kvbench_cache_api::{
    Accounting, AllocError, CacheMode, CopyOp, Fault, KvCacheManager, OffloadMode, PrefixStats,
    Probe, ReleaseReason, ScopeKey, SeqId, SeqLayout, StartRequest, Started, StepId, TierOp,
    TierStats,
};

use crate::support::engine as engine_support;

const BS: u32 = 16;

/// Ops the manager emitted that the engine has not taken: filled by [`Draining`], emptied into
/// the next plan by [`Injecting`].
type Queue = Arc<Mutex<Vec<TierOp>>>;

/// A manager that moves its inner manager's tier ops into the queue after every call that may
/// emit one.
struct Draining {
    inner: Box<dyn KvCacheManager>,
    queue: Queue,
}

impl Draining {
    fn pump<T>(&mut self, r: T) -> T {
        let mut q = self.queue.lock().expect("queue");
        self.inner.drain_tier_ops(&mut q);
        r
    }
}

impl KvCacheManager for Draining {
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
        let r = self.inner.start(req);
        self.pump(r)
    }
    fn fill(&mut self, seq: SeqId, n_tokens: u32) -> Result<(), AllocError> {
        let r = self.inner.fill(seq, n_tokens);
        self.pump(r)
    }
    fn append(&mut self, seq: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.inner.append(seq);
        self.pump(r)
    }
    fn append_token(&mut self, seq: SeqId, token: u32) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.inner.append_token(seq, token);
        self.pump(r)
    }
    fn append_cost(&self, seq: SeqId) -> u64 {
        self.inner.append_cost(seq)
    }
    fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<Vec<CopyOp>, AllocError> {
        let r = self.inner.fork(parent, child);
        self.pump(r)
    }
    fn release(&mut self, seq: SeqId, why: ReleaseReason) -> Result<(), AllocError> {
        let r = self.inner.release(seq, why);
        self.pump(r)
    }
    fn begin_step(&mut self) -> StepId {
        let r = self.inner.begin_step();
        self.pump(r)
    }
    fn retire_step(&mut self, step: StepId) {
        self.inner.retire_step(step);
        self.pump(())
    }
    fn layout(&self, seq: SeqId) -> Option<SeqLayout<'_>> {
        self.inner.layout(seq)
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
        self.pump(())
    }
    fn drain_tier_ops(&mut self, out: &mut Vec<TierOp>) {
        self.pump(());
        out.append(&mut self.queue.lock().expect("queue"));
    }
    fn tier_stats(&self) -> Vec<TierStats> {
        self.inner.tier_stats()
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.inner.check_invariants()
    }
    fn assert_quiescent(&self) -> Result<(), String> {
        self.inner.assert_quiescent()
    }
    fn inject_fault(&mut self, fault: Fault) {
        self.inner.inject_fault(fault)
    }
    fn fault_fired(&self) -> u64 {
        self.inner.fault_fired()
    }
}

/// A sim backend that adds the queued tier ops to each plan it is handed.
struct Injecting {
    inner: SimBackend,
    queue: Queue,
    plan: StepPlan,
}

impl Backend for Injecting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn computes(&self) -> bool {
        self.inner.computes()
    }
    fn register(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        scope: Option<&ScopeKey>,
    ) -> Result<(), BackendError> {
        self.inner.register(seq, prompt, scope)
    }
    fn fork(&mut self, parent: SeqId, child: SeqId, sample_rank: u32) -> Result<u32, BackendError> {
        self.inner.fork(parent, child, sample_rank)
    }
    fn forget(&mut self, seq: SeqId) -> Result<(), BackendError> {
        self.inner.forget(seq)
    }
    fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> Result<(), BackendError> {
        let mut q = self.queue.lock().expect("queue");
        if q.is_empty() {
            return self.inner.submit(plan, cache);
        }
        self.plan.clone_from(plan);
        self.plan.tier_ops.append(&mut q);
        drop(q);
        self.inner.submit(&self.plan, cache)
    }
    fn complete(&mut self) -> Result<StepOutput, BackendError> {
        self.inner.complete()
    }
    fn memory(&self) -> MemoryParts {
        self.inner.memory()
    }
    fn numerics(&self) -> Option<NumericsReport> {
        self.inner.numerics()
    }
}

/// `docs` shared documents of `doc_blocks` full blocks, asked for in turn (request `i` reads
/// document `i % docs`, then a suffix of its own), one request every `gap_ms`: a document comes
/// back after the others have pushed it out of a small device cache.
fn workload(requests: u64, docs: u32, doc_blocks: u32, gap_ms: f64) -> Workload {
    let requests = (0..requests)
        .map(|id| {
            let d = id as u32 % docs;
            let mut prompt: Vec<u32> = (0..doc_blocks * BS)
                .map(|i| (d * 1000 + i * 7) % 50_000)
                .collect();
            prompt.extend((0..BS / 2).map(|i| 60_000 + (id as u32 * 13 + i) % 5_000));
            Request {
                id,
                tenant: 0,
                arrival_ms: id as f64 * gap_ms,
                prompt: prompt.into(),
                prefix_group: None,
                output_tokens: 4,
                samples: 1,
                cancel: None,
                session: None,
            }
        })
        .collect();
    Workload {
        requests,
        closed_loop: None,
        workload_hash: "tier-shadow".into(),
        trace: None,
    }
}

struct Case {
    docs: u32,
    device_blocks: u32,
    host_blocks: u32,
    disk_blocks: u32,
    offload: OffloadMode,
    /// Milliseconds between arrivals: 5 runs requests one after another, 0.5 overlaps them.
    gap_ms: f64,
    async_steps: bool,
    fault: Option<Fault>,
}

struct Outcome {
    rec: RunRecord,
    shadow: ShadowReport,
    tiers: Vec<TierStats>,
    fault_fired: u64,
}

/// One run; `adapter`: through [`Draining`] and [`Injecting`].
fn run(case: &Case, adapter: bool) -> Outcome {
    let w = workload(60, case.docs, 4, case.gap_ms);
    let model = ModelShape::tiny();
    let cfg = EngineConfig {
        mode: CacheMode::Paged,
        block_size: BS,
        kv_bytes_per_token: model.kv_bytes_per_token(),
        slot_bytes: model.kv_bytes_per_token(),
        max_seq_len: 1024,
        reservation: Reservation::PromptPlusOutput,
        scheduler: SchedulerSpec {
            max_tokens_per_step: 256,
            max_seqs_per_step: 8,
            async_steps: case.async_steps,
            ..SchedulerSpec::default()
        },
        model_name: model.name.clone(),
        trace_tokens: false,
        invariant_check_every: if case.fault.is_some() { 0 } else { 1 },
        fault: case.fault,
    };
    let total_slots = u64::from(case.device_blocks * BS);
    let setup = RunSetup {
        model,
        device: "cpu".into(),
        scenario_dir: None,
        cache_slots: total_slots,
        block_size: BS,
        seed: 1,
        max_step_tokens: cfg.scheduler.max_tokens_per_step,
        swap_gbytes_per_s: None,
        workspace_bytes: None,
        profile: Some(engine_support::engine_test_device()),
        clock: Default::default(),
        tiers: TierSetup {
            host_blocks: case.host_blocks,
            disk_blocks: case.disk_blocks,
            // A disk tier comes with its link (the cost model refuses disk traffic without).
            disk: (case.disk_blocks > 0).then_some(DiskLink {
                read_bytes_per_s: 7e9,
                write_bytes_per_s: 5e9,
                latency_s: 80e-6,
            }),
            ..TierSetup::default()
        },
    };
    let manager = kvbench::cache::build(
        &CacheSpec::new(CacheMode::Paged, total_slots, BS, true).with_tiers(TierConfig {
            host_blocks: case.host_blocks,
            disk_blocks: case.disk_blocks,
            offload: case.offload,
            ..TierConfig::default()
        }),
    );
    let sim = SimBackend::new(&setup)
        .expect("sim")
        .with_shadow()
        .expect("shadow");
    let queue = Queue::default();
    let (rec, shadow, tiers, fault_fired) = if adapter {
        let mut cache = Draining {
            inner: manager,
            queue: queue.clone(),
        };
        let mut be = Injecting {
            inner: sim,
            queue,
            plan: StepPlan::default(),
        };
        let rec = engine::run(&cfg, &w, &mut cache, &mut be).expect("run");
        let sh = be.inner.shadow_report().expect("shadow");
        (rec, sh, cache.tier_stats(), cache.fault_fired())
    } else {
        let (mut cache, mut be) = (manager, sim);
        let rec = engine::run(&cfg, &w, cache.as_mut(), &mut be).expect("run");
        let sh = be.shadow_report().expect("shadow");
        (rec, sh, cache.tier_stats(), cache.fault_fired())
    };
    Outcome {
        rec,
        shadow,
        tiers,
        fault_fired,
    }
}

/// A device cache of 16 blocks holds about three of the six documents: the others come back
/// from the host tier, or from disk when the host tier holds one document and passes the rest
/// down. Offloaded on eviction, the tier receives the documents the device lets go of (16 blocks
/// hold the three that are not on the device); written through, it receives every document as it
/// is prefilled again, so it holds them all (32 blocks).
const CLEAN: [Case; 4] = [
    Case {
        docs: 6,
        device_blocks: 16,
        host_blocks: 16,
        disk_blocks: 0,
        offload: OffloadMode::OnEvict,
        gap_ms: 5.0,
        async_steps: false,
        fault: None,
    },
    Case {
        docs: 6,
        device_blocks: 16,
        host_blocks: 32,
        disk_blocks: 0,
        offload: OffloadMode::WriteThrough,
        gap_ms: 0.5,
        async_steps: true,
        fault: None,
    },
    Case {
        docs: 6,
        device_blocks: 16,
        host_blocks: 4,
        disk_blocks: 16,
        offload: OffloadMode::OnEvict,
        gap_ms: 5.0,
        async_steps: false,
        fault: None,
    },
    Case {
        docs: 6,
        device_blocks: 16,
        host_blocks: 4,
        disk_blocks: 32,
        offload: OffloadMode::WriteThrough,
        gap_ms: 0.5,
        async_steps: true,
        fault: None,
    },
];

/// A host tier of 8 blocks: two documents. A start that onloads one evicts device blocks whose
/// offloads need host slots, and without the pins the slots being onloaded are the victims.
const STALE: Case = Case {
    docs: 6,
    device_blocks: 16,
    host_blocks: 8,
    disk_blocks: 0,
    offload: OffloadMode::OnEvict,
    gap_ms: 5.0,
    async_steps: false,
    fault: Some(Fault::StaleOnload),
};

fn clean(adapter: bool) -> bool {
    for case in &CLEAN {
        let o = run(case, adapter);
        let sh = &o.shadow;
        if !adapter && sh.offloads + sh.onloads == 0 {
            println!(
                "SKIP: the engine handed the backend no tier op (it does not drain the \
                 manager's tier ops yet); the adapter variant covers the run"
            );
            return false;
        }
        let r = &o.rec;
        assert_eq!(r.end.violation, None);
        assert!(r.end.reclamation.ok, "{}", r.end.reclamation.detail);
        assert_eq!(sh.violations, 0, "{:?}", sh.messages);
        let hits: u64 = o.tiers.iter().map(|t| t.hit_blocks).sum();
        let onloaded: u64 = o.tiers.iter().map(|t| t.onloaded_blocks).sum();
        let offloaded: u64 = o.tiers.iter().map(|t| t.offloaded_blocks).sum();
        assert!(hits > 0, "no tier hit: {:?}", o.tiers);
        if case.disk_blocks > 0 {
            assert!(
                o.tiers.get(1).is_some_and(|d| d.hit_blocks > 0),
                "no disk hit: {:?}",
                o.tiers
            );
        }
        // Every transfer the manager counted reached the shadow, and every onload was read.
        assert_eq!(
            (sh.onloads, sh.offloads),
            (onloaded, offloaded),
            "{:?}",
            o.tiers
        );
        assert!(sh.checked_slots >= onloaded * u64::from(BS));
    }
    true
}

fn stale(adapter: bool) -> bool {
    // The same run without the fault: tier hits, nothing wrong.
    let fine = run(
        &Case {
            fault: None,
            ..STALE
        },
        adapter,
    );
    if !adapter && fine.shadow.offloads + fine.shadow.onloads == 0 {
        println!("SKIP: the engine handed the backend no tier op (it does not drain them yet)");
        return false;
    }
    assert_eq!(fine.shadow.violations, 0, "{:?}", fine.shadow.messages);
    assert_eq!(fine.fault_fired, 0);
    assert!(fine.shadow.onloads > 0, "{:?}", fine.tiers);
    let o = run(&STALE, adapter);
    let sh = &o.shadow;
    assert!(o.fault_fired > 0, "stale-onload never fired: {:?}", o.tiers);
    assert!(sh.onloads > 0, "{:?}", o.tiers);
    assert!(sh.violations > 0, "the shadow saw nothing: {sh:?}");
    assert!(
        sh.messages[0].contains("read position"),
        "{:?}",
        sh.messages
    );
    true
}

#[test]
fn a_clean_tiered_run_passes_the_shadow_with_tier_hits() {
    assert!(clean(true), "the adapter always hands tier ops on");
    clean(false);
}

#[test]
fn stale_onload_fires_and_the_shadow_catches_it() {
    assert!(stale(true), "the adapter always hands tier ops on");
    stale(false);
}

#[test]
fn the_shadow_flags_exactly_the_runs_where_stale_onload_fired() {
    // Over a grid of cache sizes, requests one after another on synchronous steps or
    // overlapping on pipelined ones: where the fault fired (a pinned slot was reused) the shadow
    // saw a bad read, where it did not the shadow saw nothing, and each run without the fault is
    // clean.
    let grid = [3, 4, 6]
        .into_iter()
        .flat_map(|d| [8, 12, 16].map(|v| (d, v)))
        .flat_map(|(d, v)| [2, 4, 8, 12, 16].map(|h| (d, v, h)))
        .flat_map(|(d, v, h)| [false, true].map(|dense| (d, v, h, dense)));
    let (mut fired, mut quiet) = (0, 0);
    for (docs, device_blocks, host_blocks, dense) in grid {
        let case = Case {
            docs,
            device_blocks,
            host_blocks,
            disk_blocks: 0,
            offload: OffloadMode::OnEvict,
            gap_ms: if dense { 0.5 } else { 5.0 },
            async_steps: dense,
            fault: Some(Fault::StaleOnload),
        };
        let at =
            format!("{docs} documents, device {device_blocks}, host {host_blocks}, dense {dense}");
        let o = run(&case, true);
        if o.fault_fired > 0 {
            fired += 1;
            assert!(o.shadow.violations > 0, "{at}: fired, not caught");
        } else {
            quiet += 1;
            assert_eq!(o.shadow.violations, 0, "{at}: {:?}", o.shadow.messages);
        }
        let clean = run(
            &Case {
                fault: None,
                ..case
            },
            true,
        );
        assert_eq!(
            clean.shadow.violations, 0,
            "{at}: {:?}",
            clean.shadow.messages
        );
    }
    println!(
        "stale-onload fired in {fired} of {} configurations",
        fired + quiet
    );
    assert!(fired > 0 && quiet > 0, "fired {fired}, quiet {quiet}");
}
