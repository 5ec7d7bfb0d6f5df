//! Helpers shared by the engine tests: hand-built requests and a run on `sim` (tiny model, cpu
//! profile) that asserts no invariant violation and a clean reclamation.
#![allow(dead_code)]

use kvbench::backend::sim::SimBackend;
use kvbench::backend::RunSetup;
use kvbench::engine::{self, EngineConfig, RunRecord, StreamStatus};
use kvbench::model::ModelShape;
use kvbench::scenario::{Reservation, SchedulerSpec};
use kvbench::workload::{Request, Workload};
use kvbench_cache_api::CacheMode;

pub fn req(id: u64, arrival_ms: f64, prompt: u32, output: u32) -> Request {
    Request {
        id,
        tenant: 0,
        arrival_ms,
        prompt: (0..prompt)
            .map(|i| (i * 7 + id as u32 * 13) % 500)
            .collect(),
        prefix_group: None,
        output_tokens: output,
        samples: 1,
        cancel: None,
        session: None,
    }
}

pub fn workload(requests: Vec<Request>) -> Workload {
    Workload {
        requests,
        closed_loop: None,
        workload_hash: "test".into(),
        trace: None,
    }
}

pub fn sched() -> SchedulerSpec {
    SchedulerSpec {
        max_tokens_per_step: 256,
        max_seqs_per_step: 64,
        ..SchedulerSpec::default()
    }
}

pub fn config(mode: CacheMode, scheduler: SchedulerSpec) -> EngineConfig {
    EngineConfig {
        mode,
        block_size: 16,
        kv_bytes_per_token: ModelShape::tiny().kv_bytes_per_token(),
        slot_bytes: ModelShape::tiny().kv_bytes_per_token(),
        max_seq_len: 1024,
        reservation: Reservation::PromptPlusOutput,
        scheduler,
        model_name: "tiny".into(),
        trace_tokens: true,
        invariant_check_every: 1,
        fault: None,
    }
}

/// The `sim` set-up of an engine run of `model` under `cfg` over `cache_slots` slots, as the
/// engine tests' runs share it: their device profile, seed 1, the step bound and block size
/// `cfg` runs with, no swap link, workspace or lower tier.
pub fn sim_setup(model: &ModelShape, cfg: &EngineConfig, cache_slots: u64) -> RunSetup {
    RunSetup {
        model: model.clone(),
        ..bare_sim_setup(
            cache_slots,
            cfg.block_size,
            cfg.scheduler.max_tokens_per_step,
        )
    }
}

/// The same without an engine config, for tests that drive a backend by hand: the tiny model,
/// the engine tests' device profile, seed 1, no swap link, workspace or lower tier.
pub fn bare_sim_setup(cache_slots: u64, block_size: u32, max_step_tokens: u32) -> RunSetup {
    RunSetup {
        model: ModelShape::tiny(),
        device: "cpu".into(),
        scenario_dir: None,
        cache_slots,
        block_size,
        seed: 1,
        max_step_tokens,
        swap_gbytes_per_s: None,
        workspace_bytes: None,
        profile: Some(engine_test_device()),
        clock: Default::default(),
        tiers: Default::default(),
    }
}

/// One stream (id 1) driven by hand through `cache` on a shadowed sim backend: its prompt
/// started, filled and registered; each [`HandStream::step`] submits one step of it, completes
/// it and retires the manager's fence, and says the shadow's violations so far.
pub struct HandStream {
    pub cache: Box<dyn kvbench_cache_api::KvCacheManager>,
    be: SimBackend,
}

impl HandStream {
    pub fn start(
        mut cache: Box<dyn kvbench_cache_api::KvCacheManager>,
        prompt: &[u32],
        reserve_tokens: u32,
    ) -> HandStream {
        let setup = bare_sim_setup(cache.accounting().total_slots, cache.block_size(), 256);
        let be = SimBackend::new(&setup)
            .expect("sim")
            .with_shadow()
            .expect("shadow");
        cache
            .start(&kvbench_cache_api::StartRequest {
                seq: 1,
                tokens: prompt,
                scope: None,
                reserve_tokens,
            })
            .expect("start");
        cache.fill(1, prompt.len() as u32).expect("fill");
        let mut h = HandStream { cache, be };
        kvbench::backend::Backend::register(&mut h.be, 1, prompt, None).expect("register");
        h
    }

    /// A step of `new` tokens after `context`, sampled; the shadow's violations after it.
    pub fn step(&mut self, context: u32, new: u32) -> u64 {
        use kvbench::backend::{Backend, SeqWork, StepPlan};
        let plan = StepPlan {
            seqs: vec![SeqWork {
                seq: 1,
                context_tokens: context,
                new_tokens: new,
                sample: true,
            }],
            ..StepPlan::default()
        };
        self.be.submit(&plan, &*self.cache).expect("submit");
        let fence = self.cache.begin_step();
        self.be.complete().expect("complete");
        self.cache.retire_step(fence);
        self.be.shadow_report().expect("shadow").violations
    }
}

pub fn run(cfg: &EngineConfig, w: &Workload, total_slots: u64) -> RunRecord {
    let setup = sim_setup(&ModelShape::tiny(), cfg, total_slots);
    let mut backend = SimBackend::new(&setup).expect("sim backend");
    let mut cache = kvbench::cache::build(&kvbench::cache::CacheSpec::new(
        cfg.mode,
        total_slots,
        cfg.block_size,
        cfg.scheduler.prefix_cache,
    ));
    let r = engine::run(cfg, w, cache.as_mut(), &mut backend).expect("engine run");
    assert_eq!(
        r.end.violation, None,
        "{:?} run violated an invariant",
        cfg.mode
    );
    assert!(
        r.end.reclamation.ok,
        "{:?} reclamation: {}",
        cfg.mode, r.end.reclamation.detail
    );
    r
}

pub fn both(scheduler: SchedulerSpec, w: &Workload, total_slots: u64) -> [RunRecord; 2] {
    [
        run(&config(CacheMode::Paged, scheduler.clone()), w, total_slots),
        run(&config(CacheMode::Contiguous, scheduler), w, total_slots),
    ]
}

pub fn count(r: &RunRecord, status: StreamStatus) -> usize {
    r.streams.iter().filter(|s| s.status == status).count()
}

pub fn events(r: &RunRecord, name: &str) -> usize {
    r.events.iter().filter(|e| e.kind.name() == name).count()
}

/// The fixed device the engine tests time their steps with: the round assumptions the `cpu`
/// profile had before it was fitted, so these tests' timings (cancellation delays landing at
/// each lifecycle point) do not move whenever `scenarios/devices/cpu.toml` is refitted.
pub fn engine_test_device() -> kvbench::backend::sim::profile::DeviceProfile {
    kvbench::backend::sim::profile::DeviceProfile {
        name: "engine-test".into(),
        memory_bytes: 16 << 30,
        hbm_datasheet_bytes_per_s: 76.8e9,
        hbm_effective_bytes_per_s: 46e9,
        peak_flops_per_s: 0.75e12,
        host_link_bytes_per_s: 46e9,
        step_overhead_s: 100e-6,
        paged_attention_efficiency: 0.95,
        seq_overhead_s: 0.0,
        attention_flops_per_s: None,
        attention_half_tokens: None,
        weight_bytes_per_s: None,
        copy_bytes_per_s: None,
        combine: Default::default(),
        host_link_latency_s: None,
        nvlink_bytes_per_s: None,
        nvlink_latency_s: None,
    }
}
