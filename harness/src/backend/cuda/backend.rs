//! The `cuda` backend: the seeded transformer on the GPU over the cache manager's layouts.
//!
//! `submit` enqueues a step — copy-on-write copies, swaps through pinned host memory, the
//! forward pass, an event, the logits' copy to the host — and returns without waiting;
//! `complete` waits for the oldest step's event, takes its logits and greedy tokens, and the
//! engine then retires its fence with the cache manager ([`super::fence::StepEvents`] keeps
//! the order: a block released while step `s` was in flight is handed out again only after
//! `s`'s event). Step time is measured by CUDA events around the step's device work, and
//! drives the virtual clock as on `cpu` (or the cost model under `--clock model`).
//!
//! Memory: weights, KV and workspace are plain device allocations made once at construction
//! ([`kvbench_cuda::model::sizes`]), counted exactly by the runtime seam; then every kernel and
//! the GEMM run once (warm-up), so the driver's own first-launch take is measured and stated
//! before the run. `device_used_bytes` is the free-memory drop since just before the
//! allocations (`cuMemGetInfo`), reconciled term by term by [`super::ledger`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use kvbench_cache_api::{CacheMode, KvCacheManager, ScopeKey, SeqId, SeqLayout};
use kvbench_cuda::device::{DevLayer, Gpu, PinnedKv};
use kvbench_cuda::emu::EmuConfig;
use kvbench_cuda::model::batch::{copy_launches, pack, SeqAddr, SeqChunk};
use kvbench_cuda::model::forward::{DevModel, RING};
use kvbench_cuda::model::sizes::COPY_PAIRS_PER_LAUNCH;
use kvbench_cuda::runtime::Event;
use kvbench_cuda::CudaError;
use kvbench_kernels::model::rope_inv_freq;
use kvbench_kernels::rank_token;

use super::check::{Checker, Reference};
use super::fence::{Completion, InOrder};
use super::ledger::{self, DeviceLedger, DeviceMem, Owned, Readings};
use super::setup::{
    self, CheckPolicy, SAMPLE_FORKS, SAMPLE_MAX_PROMPT_TOKENS, SAMPLE_SEQS, SAMPLE_STEPS,
};
use super::tier::{CudaTiers, Wait};
use crate::backend::cpu::oracle_for;
use crate::backend::seq_history::SeqTable;
use crate::backend::sim::cost::CostModel;
use crate::backend::{
    Backend, BackendError, Clock, MemoryParts, NumericsReport, RunSetup, Sampled, StepOutput,
    StepPlan, SwapDirection,
};

mod moves;

fn dev(e: CudaError) -> BackendError {
    BackendError::Step(format!("cuda: {e}"))
}

/// The event recorded after a step, as the fence bookkeeping sees it.
struct StepEvent(Arc<Event>);

impl Completion for StepEvent {
    fn done(&self) -> bool {
        // An error (a faulted device) counts as done here; the synchronize in `complete`
        // returns it.
        self.0.is_complete()
    }
}

struct InFlight {
    id: u64,
    ring: usize,
    /// (sequence, position) of each logits row.
    samples: Vec<(SeqId, usize)>,
    model_s: Option<f64>,
    /// Whether the step onloaded blocks from a lower tier (its onload wait is then measured
    /// from its start event to the event recorded after its tier ops).
    onloads: bool,
    /// Swap-in sources, kept alive until the copies have run.
    _swap_sources: Vec<Vec<PinnedKv>>,
    output: Option<StepOutput>,
}

/// One GPU per process: context, stream and compiled programs are opened once (NVRTC takes
/// seconds per program) and shared by every run.
pub fn shared_gpu() -> Result<Arc<Gpu>, BackendError> {
    use std::sync::OnceLock;
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    GPU.get_or_init(|| Gpu::open().map(Arc::new).map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| BackendError::Unavailable(format!("cuda: {e}")))
}

/// The emulated device for one run, its delays seeded by [`super::emu_seed`] (printed once).
/// A fresh device per backend: its teardown check then covers exactly this run's allocations.
fn emulated_gpu() -> Result<Arc<Gpu>, BackendError> {
    let seed = super::emu_seed();
    super::note_emu_seed(seed);
    let driver = super::emu_driver();
    Gpu::emulated_open(EmuConfig {
        driver_version: driver.version,
        noise_seed: driver.noise_seed,
        ..EmuConfig::new(seed)
    })
    .map(Arc::new)
    .map_err(|e| BackendError::Unavailable(format!("cuda-emu: {e}")))
}

pub struct CudaBackend {
    gpu: Arc<Gpu>,
    model: Option<DevModel>,
    kv: Vec<DevLayer>,
    kv_dtype: kvbench_cuda::KvDtype,
    num_slots: usize,
    inv_freq: Vec<f64>,
    checker: Checker,
    policy: CheckPolicy,
    seqs: SeqTable,
    host: BTreeMap<SeqId, Vec<PinnedKv>>,
    /// Host swap buffers of forgotten sequences, freed when nothing is in flight.
    graveyard: Vec<Vec<PinnedKv>>,
    events: InOrder<StepEvent>,
    in_flight: VecDeque<InFlight>,
    start_ev: Vec<Arc<Event>>,
    end_ev: Vec<Arc<Event>>,
    /// Recorded after each step's tier ops (per ring entry): the end of its onloads.
    onload_ev: Vec<Arc<Event>>,
    /// Recorded when the host must wait, mid-step, for tier copies queued so far.
    tier_fence: Arc<Event>,
    /// The host tier (pinned) and the disk's stand-in (`None`: no lower tier).
    tiers: Option<CudaTiers>,
    next_id: u64,
    forks_checked: u64,
    /// Registered sequences taken into the 8B sample so far.
    sampled_seqs: u64,
    clock_model: Option<CostModel>,
    measured_s: f64,
    /// Free device memory and kvbench's own allocations before this backend's allocations.
    baseline: DeviceMem,
    owned_baseline: Owned,
    /// The driver's take while every kernel and the GEMM ran once.
    driver_warmup_bytes: i64,
    weights_bytes: u64,
    workspace_bytes: u64,
    /// One KV block's bytes, and the planted leak's bytes once made.
    block_bytes: u64,
    planted_leak_bytes: Option<u64>,
}

fn owned(gpu: &Gpu) -> Owned {
    let o = gpu.owned();
    Owned {
        allocations: o.live_allocations,
        bytes: o.live_bytes,
        allocated_bytes: o.allocated_bytes,
        freed_bytes: o.freed_bytes,
    }
}

fn mem(gpu: &Gpu) -> Result<DeviceMem, BackendError> {
    let (free_bytes, total_bytes) = gpu.mem_info().map_err(dev)?;
    Ok(DeviceMem {
        free_bytes,
        total_bytes,
    })
}

fn seq_addr(layout: SeqLayout<'_>) -> SeqAddr<'_> {
    match layout {
        SeqLayout::Paged { block_size, blocks } => SeqAddr::Paged {
            block_size: block_size as usize,
            blocks,
        },
        SeqLayout::Contiguous {
            base_slot,
            capacity_tokens,
        } => SeqAddr::Contiguous {
            base_slot,
            capacity_tokens: capacity_tokens as u64,
        },
        // The cuda backend maps one block table a sequence (`HybridSupport::Unsupported`), so
        // no grouped manager reaches it; a grouped layout maps nothing, so every read fails.
        SeqLayout::Grouped { .. } => SeqAddr::Contiguous {
            base_slot: 0,
            capacity_tokens: 0,
        },
    }
}

impl CudaBackend {
    /// The backend on the GPU, or on the emulated device when `emulated`.
    pub fn new(setup: &RunSetup, emulated: bool) -> Result<CudaBackend, BackendError> {
        let cc = setup::config(&setup.model)?;
        let gpu = if emulated {
            emulated_gpu()?
        } else {
            shared_gpu()?
        };
        let num_slots = usize::try_from(setup.cache_slots)
            .map_err(|_| BackendError::Config("cache slots exceed usize".into()))?;
        let host = setup::host_model(&cc, setup.seed)?;
        let reference = match cc.policy {
            CheckPolicy::Every => Reference::Oracle(oracle_for(&host)?),
            CheckPolicy::Sample => Reference::Cpu(host.clone()),
        };
        let clock_model = match setup.clock {
            Clock::Measured => None,
            Clock::Model => Some(CostModel::new(
                &setup.model,
                &setup.device_profile()?,
                setup.swap_gbytes_per_s.map(|g| g * 1e9),
            )),
        };
        gpu.release_freed().map_err(dev)?;
        let baseline = mem(&gpu)?;
        let owned_baseline = owned(&gpu);
        let shape = cc.dims.attn_shape();
        let mut kv = Vec::with_capacity(cc.dims.layers);
        for _ in 0..cc.dims.layers {
            kv.push(gpu.new_layer(cc.kv, num_slots, shape).map_err(|e| {
                BackendError::Config(format!("cuda: KV storage of {num_slots} slots: {e}"))
            })?);
        }
        let num_blocks = num_slots / (setup.block_size.max(1) as usize);
        let model = DevModel::new(
            &gpu,
            cc.dims,
            cc.weights,
            &setup::host_weights(&host),
            setup.max_step_tokens.max(1) as usize,
            num_blocks,
        )
        .map_err(|e| BackendError::Config(format!("cuda: model: {e}")))?;
        let mut model = model;
        model
            .set_windows(&cc.windows)
            .map_err(|e| BackendError::Config(format!("cuda: model: {e}")))?;
        let event = || gpu.new_event().map(Arc::new).map_err(dev);
        let start_ev = (0..RING).map(|_| event()).collect::<Result<Vec<_>, _>>()?;
        let end_ev = (0..RING).map(|_| event()).collect::<Result<Vec<_>, _>>()?;
        let onload_ev = (0..RING).map(|_| event()).collect::<Result<Vec<_>, _>>()?;
        let tier_fence = event()?;
        let t = &setup.tiers;
        let tiers = if t.host_blocks > 0 || t.disk_blocks > 0 {
            Some(CudaTiers::new(
                &gpu,
                &kv,
                cc.kv,
                t.host_blocks,
                t.disk_blocks,
                setup.block_size,
            )?)
        } else {
            None
        };
        gpu.sync().map_err(dev)?;
        let block_bytes = (cc.dims.layers
            * 2
            * (setup.block_size.max(1) as usize)
            * shape.kv_row()
            * cc.kv.bytes()) as u64;
        let inv_freq = rope_inv_freq(cc.dims.head_dim, cc.cfg.rope_theta);
        warm_up(
            &gpu,
            &mut model,
            &mut kv,
            num_slots,
            setup.block_size,
            &inv_freq,
            &start_ev[0],
        )?;
        gpu.release_freed().map_err(dev)?;
        // The driver's take from the baseline through the warm-up, beyond kvbench's own bytes
        // (its allocation rounding included): stated, and no part of the run's residue.
        let after_warmup = mem(&gpu)?;
        let held = owned(&gpu).bytes.saturating_sub(owned_baseline.bytes);
        let driver_warmup_bytes = (baseline.free_bytes as i64 - after_warmup.free_bytes as i64)
            .saturating_sub(i64::try_from(held).unwrap_or(i64::MAX));
        let (model_weight_bytes, model_workspace_bytes) =
            (model.weight_bytes(), model.workspace_bytes());
        Ok(CudaBackend {
            inv_freq,
            checker: Checker::new(reference, cc.tolerance),
            policy: cc.policy,
            kv_dtype: cc.kv,
            gpu,
            model: Some(model),
            kv,
            num_slots,
            seqs: SeqTable::default(),
            host: BTreeMap::new(),
            graveyard: Vec::new(),
            events: InOrder::default(),
            in_flight: VecDeque::new(),
            start_ev,
            end_ev,
            onload_ev,
            tier_fence,
            tiers,
            next_id: 1,
            forks_checked: 0,
            sampled_seqs: 0,
            clock_model,
            measured_s: 0.0,
            baseline,
            owned_baseline,
            driver_warmup_bytes,
            weights_bytes: model_weight_bytes,
            workspace_bytes: model_workspace_bytes,
            block_bytes,
            planted_leak_bytes: None,
        })
    }

    fn model(&mut self) -> Result<&mut DevModel, BackendError> {
        self.model
            .as_mut()
            .ok_or_else(|| BackendError::Step("cuda: model already torn down".into()))
    }

    /// The device's free memory against kvbench's allocations and the driver's warm-up, now.
    pub fn reconciliation(&self) -> Result<DeviceLedger, BackendError> {
        let now = mem(&self.gpu)?;
        let mut l = ledger::reconcile(&Readings {
            baseline: self.baseline,
            owned_baseline: self.owned_baseline,
            now,
            owned_now: owned(&self.gpu),
            driver_warmup_bytes: self.driver_warmup_bytes,
        })
        .map_err(|e| BackendError::Step(e.to_string()))?;
        let entry = self.gpu.entry_points();
        l.driver_version = kvbench_cuda::runtime::entry::version_name(entry.driver_version);
        l.event_timing_call = entry.elapsed.name().to_string();
        l.emu_driver_noise_seed = self.gpu.emulated().and_then(|d| d.config.noise_seed);
        l.planted_leak_bytes = self.planted_leak_bytes;
        Ok(l)
    }

    /// The planted device leak (`--inject-fault device-leak`): one KV block's bytes, allocated
    /// at the first step and never freed.
    fn plant_device_leak(&mut self) -> Result<(), BackendError> {
        if self.planted_leak_bytes.is_some() || !super::device_leak() {
            return Ok(());
        }
        self.gpu
            .leak_for_fault(self.block_bytes as usize)
            .map_err(dev)?;
        self.planted_leak_bytes = Some(self.block_bytes);
        super::note_device_leak_planted();
        eprintln!(
            "{}: planted fault device-leak fired: one KV block ({} B) allocated on the device and never freed",
            self.name(),
            self.block_bytes
        );
        Ok(())
    }

    fn keep_steps(&self) -> usize {
        match self.policy {
            CheckPolicy::Every => usize::MAX,
            CheckPolicy::Sample => SAMPLE_STEPS,
        }
    }

    /// Waits for in-flight steps up to and including index `upto` and applies their results.
    fn resolve(&mut self, upto: usize) -> Result<(), BackendError> {
        let n = self.in_flight.len().min(upto.saturating_add(1));
        for i in 0..n {
            if self.in_flight[i].output.is_some() {
                continue;
            }
            let ring = self.in_flight[i].ring;
            let end = self.end_ev[ring].clone();
            end.synchronize().map_err(dev)?;
            let elapsed_ms = self.start_ev[ring].elapsed_ms(&end).map_err(dev)?;
            let measured_s = f64::from(elapsed_ms) / 1e3;
            self.measured_s += measured_s;
            let rows = self.in_flight[i].samples.len();
            let keep = self.keep_steps();
            let model = self
                .model
                .as_ref()
                .ok_or_else(|| BackendError::Step("cuda: model torn down".into()))?;
            let (logits, tokens) = model.read_fetched(ring, rows).map_err(dev)?;
            let vocab = model.dims.vocab;
            let mut sampled = Vec::with_capacity(rows);
            for (r, (&(seq, pos), &t)) in self.in_flight[i].samples.iter().zip(tokens).enumerate() {
                let token = u32::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < vocab)
                    .ok_or_else(|| {
                        BackendError::Step(format!(
                            "cuda: device argmax {t} outside the vocabulary"
                        ))
                    })?;
                if let Some(st) = self.seqs.get_mut(seq) {
                    // Logits are copied out only where they are used: checked sequences, and a
                    // sequence's first sample (a fork picks its continuation from it). Those rows
                    // also cross-check the device's argmax against the host's.
                    let row = if st.checked || !st.sampled_once {
                        let l = logits[r * vocab..(r + 1) * vocab].to_vec();
                        let host = rank_token(&l, 0)
                            .ok_or_else(|| BackendError::Step("empty vocabulary".into()))?;
                        if host != token {
                            return Err(BackendError::Step(format!(
                                "cuda: sequence {seq} position {pos}: device argmax {token}, host {host} over the same logits"
                            )));
                        }
                        Some(l)
                    } else {
                        None
                    };
                    st.sampled(pos, row, token, keep);
                }
                sampled.push(Sampled { seq, token });
            }
            let inf = &mut self.in_flight[i];
            // Onloads run before the step's compute on the one stream (blocking): the wait is
            // from the step's start to the end of its tier ops. Under the model clock the cost
            // model prices transfers, so nothing measured is reported.
            let onload_wait_s = if inf.onloads && inf.model_s.is_none() {
                let ms = self.start_ev[ring]
                    .elapsed_ms(&self.onload_ev[ring])
                    .map_err(dev)?;
                f64::from(ms) / 1e3
            } else {
                0.0
            };
            inf.output = Some(StepOutput {
                duration_s: inf.model_s.unwrap_or(measured_s),
                sampled,
                onload_wait_s,
            });
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        if self.gpu.emulated().is_some() {
            "cuda-emu"
        } else {
            "cuda"
        }
    }

    fn computes(&self) -> bool {
        true
    }

    fn register(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        _scope: Option<&ScopeKey>,
    ) -> Result<(), BackendError> {
        let checked = match self.policy {
            CheckPolicy::Every => true,
            CheckPolicy::Sample => {
                self.sampled_seqs < SAMPLE_SEQS && prompt.len() <= SAMPLE_MAX_PROMPT_TOKENS
            }
        };
        self.sampled_seqs += u64::from(checked && self.policy == CheckPolicy::Sample);
        self.seqs.register(seq, prompt, checked)
    }

    fn fork(&mut self, parent: SeqId, child: SeqId, sample_rank: u32) -> Result<u32, BackendError> {
        // The step that sampled the parent may still be on the device: wait for it.
        if let Some(i) = self
            .in_flight
            .iter()
            .rposition(|f| f.samples.iter().any(|&(s, _)| s == parent))
        {
            self.resolve(i)?;
        }
        let policy = self.policy;
        let forks_checked = &mut self.forks_checked;
        self.seqs
            .fork(parent, child, sample_rank, |parent_checked, _| {
                let checked = match policy {
                    CheckPolicy::Every => true,
                    CheckPolicy::Sample => parent_checked || *forks_checked < SAMPLE_FORKS,
                };
                if checked && policy == CheckPolicy::Sample {
                    *forks_checked += 1;
                }
                checked
            })
    }

    fn forget(&mut self, seq: SeqId) -> Result<(), BackendError> {
        let st = self.seqs.forget(seq)?;
        if let Some(h) = self.host.remove(&seq) {
            // A swap-out still in flight may be writing into it: free it only once idle.
            if !self.in_flight.is_empty() {
                self.graveyard.push(h);
            }
        }
        self.checker.check_forgotten("cuda", seq, &st);
        Ok(())
    }

    fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> Result<(), BackendError> {
        if self.in_flight.len() >= RING {
            return Err(BackendError::Step(format!(
                "cuda: more than {RING} steps in flight"
            )));
        }
        // A sequence sampled by a step still in flight needs that token now (its ids are
        // packed on the host): wait for the newest such step and take its results.
        if let Some(i) = self.in_flight.iter().rposition(|f| {
            f.output.is_none()
                && f.samples
                    .iter()
                    .any(|&(s, _)| plan.seqs.iter().any(|w| w.seq == s))
        }) {
            self.resolve(i)?;
        }
        self.plant_device_leak()?;
        let ring = (self.next_id as usize) % RING;
        let id = self.next_id;
        self.next_id += 1;
        self.gpu.record(&self.start_ev[ring]).map_err(dev)?;
        let mut sources = self.tier_ops(plan, cache, id)?;
        self.gpu.record(&self.onload_ev[ring]).map_err(dev)?;
        let swapped = match self.transfer(plan, cache) {
            Ok(s) => s,
            Err(e) => {
                self.graveyard.append(&mut sources);
                return Err(e);
            }
        };
        sources.extend(swapped);
        // Pack the step from the layouts as they are now.
        let mut layouts = Vec::with_capacity(plan.seqs.len());
        for w in &plan.seqs {
            layouts.push(cache.layout(w.seq).ok_or_else(|| {
                BackendError::Step(format!("sequence {} has no cache layout", w.seq))
            })?);
        }
        let mut chunks = Vec::with_capacity(plan.seqs.len());
        for (w, layout) in plan.seqs.iter().zip(&layouts) {
            let (start, tokens) = self.seqs.step_tokens(w)?;
            chunks.push(SeqChunk {
                addr: seq_addr(*layout),
                start_pos: start,
                tokens,
                want_logits: w.sample,
            });
        }
        let vocab = self.model.as_ref().map_or(0, |m| m.dims.vocab);
        let batch = pack(&chunks, self.num_slots, vocab, &self.inv_freq).map_err(dev)?;
        let samples: Vec<(SeqId, usize)> = batch
            .logit_seqs
            .iter()
            .map(|&i| {
                let w = &plan.seqs[i];
                (w.seq, (w.context_tokens + w.new_tokens) as usize - 1)
            })
            .collect();
        if samples.len() != plan.seqs.iter().filter(|w| w.sample).count() {
            return Err(BackendError::Step(
                "cuda: a sampled sequence has no new tokens".into(),
            ));
        }
        let gpu = self.gpu.clone();
        let mut kv = std::mem::take(&mut self.kv);
        let r = self
            .model()
            .and_then(|m| m.forward(&gpu, &mut kv, &batch, ring).map_err(dev));
        self.kv = kv;
        r?;
        // The logits' copies go on the stream before the step's end event: `resolve` waits on
        // that event only, and the pinned buffers carry no event of their own.
        let n = samples.len();
        let end = self.end_ev[ring].clone();
        self.model()?
            .finish_step(&gpu, ring, n, &end)
            .map_err(dev)?;
        self.events
            .record(id, StepEvent(self.end_ev[ring].clone()))
            .map_err(|e| BackendError::Step(e.to_string()))?;
        let model_s = self.clock_model.as_ref().map(|m| {
            let paged = cache.mode() == CacheMode::Paged;
            m.step(&plan.seqs, &plan.copies, &plan.swaps, paged).total_s
        });
        self.in_flight.push_back(InFlight {
            id,
            ring,
            samples,
            model_s,
            onloads: plan.tier_ops.iter().any(|o| o.is_onload()),
            _swap_sources: sources,
            output: None,
        });
        Ok(())
    }

    fn complete(&mut self) -> Result<StepOutput, BackendError> {
        if self.in_flight.is_empty() {
            return Err(BackendError::Step("complete with no step in flight".into()));
        }
        self.resolve(0)?;
        let inf = self
            .in_flight
            .pop_front()
            .ok_or_else(|| BackendError::Step("complete with no step in flight".into()))?;
        // Its event completed: the fence bookkeeping must retire exactly this step next (a
        // newer event never retires an older step).
        self.events
            .complete(inf.id)
            .map_err(|e| BackendError::Step(format!("cuda: {e}")))?;
        if self.in_flight.is_empty() {
            self.graveyard.clear();
        }
        inf.output
            .ok_or_else(|| BackendError::Step("cuda: step resolved without output".into()))
    }

    fn memory(&self) -> MemoryParts {
        let used = mem(&self.gpu)
            .ok()
            .and_then(|m| self.baseline.free_bytes.checked_sub(m.free_bytes));
        MemoryParts {
            weights_bytes: self.weights_bytes,
            workspace_bytes: self.workspace_bytes,
            other_bytes: 0,
            host_tier_bytes: self.tiers.as_ref().map_or(0, CudaTiers::host_bytes),
            device_used_bytes: used,
        }
    }

    fn owned_device(&self) -> Option<(u64, u64)> {
        let o = owned(&self.gpu);
        Some((o.allocations, o.bytes))
    }

    fn device_ledger(&mut self) -> Option<Result<DeviceLedger, String>> {
        let name = self.name();
        let r = self
            .gpu
            .release_freed()
            .map_err(dev)
            .and_then(|()| self.reconciliation())
            .map_err(|e| e.to_string());
        match &r {
            Ok(l) => eprintln!("{}", l.line(name)),
            Err(e) => eprintln!("{name} device memory: not reconciled: {e}"),
        }
        Some(r)
    }

    fn measured_step_s(&self) -> Option<f64> {
        Some(self.measured_s)
    }

    fn numerics(&self) -> Option<NumericsReport> {
        Some(self.checker.report(self.seqs.live_checked()))
    }
}

/// What a backend's teardown found: kvbench's own allocations back at their figure from before
/// the backend (exact), the device's free memory back within the allowance after the stated
/// warm-up, and any error the device's stream still held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Teardown {
    pub backend: &'static str,
    /// kvbench holds exactly what it held before this backend.
    pub reconciled: bool,
    pub returned: bool,
    pub stream_error: Option<String>,
}

impl Teardown {
    pub fn ok(&self) -> bool {
        self.reconciled && self.returned && self.stream_error.is_none()
    }
}

thread_local! {
    static TEARDOWNS: std::cell::RefCell<Vec<Teardown>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The teardowns of the cuda backends this thread dropped since the last call (tests check
/// that every run on the emulated device freed all it allocated).
pub fn take_teardowns() -> Vec<Teardown> {
    TEARDOWNS.with(|t| std::mem::take(&mut *t.borrow_mut()))
}

impl Drop for CudaBackend {
    /// Tears down in order and says whether the device's free memory came back to its figure
    /// from before this backend's allocations (the reclamation check on the device).
    fn drop(&mut self) {
        let name = self.name();
        let mut stream_error = self.gpu.sync().err().map(|e| e.to_string());
        self.in_flight.clear();
        self.graveyard.clear();
        self.host.clear();
        self.tiers = None;
        self.kv.clear();
        self.model = None;
        if let Err(e) = self.gpu.release_freed() {
            stream_error.get_or_insert(e.to_string());
        }
        let held = owned(&self.gpu);
        let reconciled = held.bytes == self.owned_baseline.bytes
            && held.allocations == self.owned_baseline.allocations;
        eprintln!(
            "{name} backend: kvbench holds {} B in {} device allocations after teardown, {} B in {} before: {}",
            held.bytes,
            held.allocations,
            self.owned_baseline.bytes,
            self.owned_baseline.allocations,
            if reconciled { "all freed" } else { "NOT FREED" }
        );
        let returned = match mem(&self.gpu) {
            Ok(after) => {
                let ok =
                    ledger::returned_to_baseline(self.baseline, after, self.driver_warmup_bytes);
                eprintln!(
                    "{name} backend: device free memory {} B before, {} B after teardown, driver warm-up {} B: {}",
                    self.baseline.free_bytes,
                    after.free_bytes,
                    self.driver_warmup_bytes,
                    if ok { "returned" } else { "NOT RETURNED" }
                );
                ok
            }
            Err(_) => false,
        };
        if let Some(e) = &stream_error {
            eprintln!("{name} backend: device error at teardown: {e}");
        }
        let t = Teardown {
            backend: name,
            reconciled,
            returned,
            stream_error,
        };
        TEARDOWNS.with(|v| v.borrow_mut().push(t));
    }
}

/// Runs every kernel and the GEMM once before the run — a prefill and a decode step in each
/// addressing (paged, contiguous), a slot copy — so that what the driver takes for itself at a
/// kernel's first launch (its local-memory reserve) and at the first GEMM (cuBLAS's workspace)
/// is taken here and stated, not in the middle of the run. Writes only slots 0..3 of the KV
/// layers, which no sequence reads before writing.
fn warm_up(
    gpu: &Gpu,
    model: &mut DevModel,
    kv: &mut [DevLayer],
    num_slots: usize,
    block_size: u32,
    inv_freq: &[f64],
    ev: &Event,
) -> Result<(), BackendError> {
    let bs = block_size.max(1) as usize;
    let positions = 3usize;
    if num_slots < positions.max(bs) {
        return Ok(());
    }
    let blocks = vec![0u32; positions.div_ceil(bs)];
    let addrs = [
        SeqAddr::Paged {
            block_size: bs,
            blocks: &blocks,
        },
        SeqAddr::Contiguous {
            base_slot: 0,
            capacity_tokens: positions as u64,
        },
    ];
    let vocab = model.dims.vocab;
    let werr = |e: CudaError| BackendError::Config(format!("cuda: warm-up: {e}"));
    for addr in addrs {
        for (start_pos, tokens) in [(0usize, &[0u32, 0][..]), (2, &[0u32][..])] {
            let chunk = SeqChunk {
                addr,
                start_pos,
                tokens,
                want_logits: true,
            };
            let batch = pack(&[chunk], num_slots, vocab, inv_freq).map_err(werr)?;
            model.forward(gpu, kv, &batch, 0).map_err(werr)?;
            model.finish_step(gpu, 0, 1, ev).map_err(werr)?;
            ev.synchronize().map_err(werr)?;
            model.read_fetched(0, 1).map_err(werr)?;
        }
    }
    let launches = copy_launches(&[(0, 1, 1)], num_slots, COPY_PAIRS_PER_LAUNCH).map_err(werr)?;
    model.copy(gpu, kv, &launches).map_err(werr)?;
    gpu.sync().map_err(werr)
}
