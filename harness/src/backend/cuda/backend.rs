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
//! ([`kvbench_cuda::model::sizes`]); `device_used_bytes` is the free-memory drop since just
//! before them (`cuMemGetInfo`), reconciled with the ledger by [`super::ledger`].

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
use super::ledger::{self, Accounted, DeviceMem, Reconciliation};
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
    Gpu::emulated_open(EmuConfig::new(seed))
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
    baseline: DeviceMem,
    accounted: Accounted,
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
        // The cuda backend refuses models with non-full groups before any work, so no grouped
        // manager reaches it; a grouped layout maps nothing, so every read fails.
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
        let kv_pool_bytes =
            (cc.dims.layers * 2 * num_slots * shape.kv_row() * cc.kv.bytes()) as u64;
        let accounted = Accounted {
            weights_bytes: model.weight_bytes(),
            kv_pool_bytes,
            workspace_bytes: model.workspace_bytes(),
            other_bytes: 0,
            allocations: model.allocations + 2 * cc.dims.layers as u64,
        };
        Ok(CudaBackend {
            inv_freq: rope_inv_freq(cc.dims.head_dim, cc.cfg.rope_theta),
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
            accounted,
        })
    }

    fn model(&mut self) -> Result<&mut DevModel, BackendError> {
        self.model
            .as_mut()
            .ok_or_else(|| BackendError::Step("cuda: model already torn down".into()))
    }

    /// The run's device use against the ledger (weights + KV + workspace).
    pub fn reconciliation(&self) -> Result<Reconciliation, BackendError> {
        let now = mem(&self.gpu)?;
        ledger::reconcile(self.baseline, now, &self.accounted)
            .map_err(|e| BackendError::Step(e.to_string()))
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
            weights_bytes: self.accounted.weights_bytes,
            workspace_bytes: self.accounted.workspace_bytes,
            other_bytes: 0,
            host_tier_bytes: self.tiers.as_ref().map_or(0, CudaTiers::host_bytes),
            device_used_bytes: used,
        }
    }

    fn measured_step_s(&self) -> Option<f64> {
        Some(self.measured_s)
    }

    fn numerics(&self) -> Option<NumericsReport> {
        Some(self.checker.report(self.seqs.live_checked()))
    }
}

/// What a backend's teardown found: the ledger against the device's free-memory drop, the
/// free memory back at its pre-run figure, and any error the device's stream still held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Teardown {
    pub backend: &'static str,
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
        let reconciled = match self.reconciliation() {
            Ok(r) => {
                eprintln!(
                    "{name} backend: ledger {} B, device {} B, unaccounted {} B (allowed {} B): {}",
                    r.accounted_bytes,
                    r.device_used_bytes,
                    r.unaccounted_bytes,
                    r.allowed_overhead_bytes,
                    if r.ok { "reconciled" } else { "NOT RECONCILED" }
                );
                r.ok
            }
            Err(e) => {
                eprintln!("{name} backend: ledger not reconciled: {e}");
                false
            }
        };
        self.in_flight.clear();
        self.graveyard.clear();
        self.host.clear();
        self.tiers = None;
        self.kv.clear();
        self.model = None;
        if let Err(e) = self.gpu.release_freed() {
            stream_error.get_or_insert(e.to_string());
        }
        let returned = match mem(&self.gpu) {
            Ok(after) => {
                let ok = ledger::returned_to_baseline(self.baseline, after);
                eprintln!(
                    "{name} backend: device free memory {} B before, {} B after teardown: {}",
                    self.baseline.free_bytes,
                    after.free_bytes,
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
