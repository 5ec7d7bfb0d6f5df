//! The `cpu` backend: real tensor math on the seeded tiny transformer (`kvbench-kernels`),
//! reading K/V through whatever layout the cache manager hands out, checked against the f64
//! oracle (`kvbench-oracle`).
//!
//! Execution is synchronous: `submit` performs the step's copies, swap transfers and forward
//! pass, and `complete` returns the result. `duration_s` is the wall time of that work only
//! (oracle checks run when a sequence is forgotten and are never timed) — or, under
//! [`Clock::Model`], the device profile's cost model of the same step, so that the schedule does
//! not depend on the machine or its load while the math stays real and checked. The measured
//! time is kept either way ([`Backend::measured_step_s`]).
//!
//! Each sequence's token history (prompt, then every sampled token) lives here: a step's
//! `SeqWork` names positions `context_tokens .. context_tokens + new_tokens` of it, so a prefix
//! hit, a chunked prefill, a recompute after preemption and a decode all read the same history.
//!
//! A step performs its tier ops first — the manager's order with each onload as late as it
//! allows ([`late_onload_order`], shared with `cuda`), so a tier slot reused under an onload is
//! read after it was overwritten and the oracle sees it — then its copies, swaps and compute.
//!
//! A recurrent layer's per-sequence state lives here, outside the KV store, with the position it
//! reached: a step starts from zeros at position 0 (a new sequence, or a recompute), at that
//! position, or — a prefix hit — at the checkpoint the manager names
//! ([`KvCacheManager::state_checkpoints`]), restored from the copy saved when a step passed
//! it; anything else fails the step. A step saves the state at each checkpoint its chunk passes
//! (the chunk computed in pieces cut there), keyed by the checkpoint's first page, as a device
//! would hold it in those pages. A sequence resumed from a checkpoint is always checked by the
//! oracle, which recomputes it from zeros. A fork copies the parent's state, a swap leaves it in
//! place, `forget` drops it. Only the hybrid manager keeps checkpoints:
//! `setup::prefix_cache_refusal` refuses a recurrent model with the prefix cache on under the
//! summed managers before any request runs.

mod addr;
pub mod bench;
mod check;
mod grouped;
mod setup;
mod store;
mod tier;

pub use check::{
    kv_tolerance, sampled as is_sampled, BF16_TOLERANCE, CHECK_ALL_FIRST, F32_TOLERANCE,
    FP8_E4M3_TOLERANCE, FP8_E5M2_TOLERANCE, SAMPLE_ONE_IN,
};
pub use setup::{
    kv_storage, layer_kinds, model_config, oracle_for, prefix_cache_refusal, seeded_model,
    shape_config, KvStorage, FP8_CALIBRATION_TOKENS, MAX_PARAMETERS, NORM_EPS, ROPE_THETA,
};
pub use tier::{late_onload_order, MAX_POOL_BYTES as MAX_TIER_POOL_BYTES};

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use kvbench_cache_api::{KvCacheManager, ScopeKey, SeqId, SeqLayout};
use kvbench_kernels::{rank_token, KernelError, StepSeq, Transformer};

use self::addr::Addr;
use self::check::Checker;
use self::grouped::GroupedMap;
use self::store::{HostKv, KvStore};
use self::tier::Tiers;
use super::seq_history::SeqTable;
use super::sim::cost::CostModel;
use super::{
    Backend, BackendError, Clock, MemoryParts, NumericsReport, RunSetup, Sampled, StepOutput,
    StepPlan, SwapDirection,
};

pub struct CpuBackend {
    model: Transformer,
    kv: KvStore,
    /// How the store was made (a grouped run remakes it once, sized by pages).
    storage: KvStorage,
    /// The cache manager's slots (a grouped pool's pages are at most this ÷ the page's slots).
    cache_slots: u64,
    /// The model's shape: its layer groups say which layers a grouped layout's tables hold.
    model_shape: crate::model::ModelShape,
    /// `Some` once the run handed out a grouped layout: each layer's table and the store's
    /// page stride.
    grouped: Option<GroupedMap>,
    checker: Checker,
    seqs: SeqTable,
    host: BTreeMap<SeqId, HostKv>,
    /// Each live sequence's recurrent state (models with recurrent layers only), held outside
    /// the KV store, with the position it has reached: a step must start there, or at 0
    /// (a new sequence, or a recompute after preemption), which starts from zeros.
    states: BTreeMap<SeqId, (usize, Vec<f32>)>,
    /// Recurrent states saved at the manager's checkpoints, by the checkpoint's first page: what
    /// a device would hold in those pages. Overwritten when the page holds a checkpoint again;
    /// trusted as the manager names it (a wrong name restores a wrong state, which the oracle
    /// sees).
    checkpoints: BTreeMap<u32, Vec<f32>>,
    /// The host and disk tiers' pools (`None`: the run has no lower tier).
    tiers: Option<Tiers>,
    done: VecDeque<StepOutput>,
    workspace_bytes: u64,
    /// `Some` under [`Clock::Model`]: the cost model that times each step.
    clock_model: Option<CostModel>,
    measured_s: f64,
}

/// The most host memory the KV store may take.
const MAX_STORE_BYTES: u64 = 16 << 30;

fn step_err(e: KernelError) -> BackendError {
    BackendError::Step(e.to_string())
}

/// Activation buffers of one step of `tokens` tokens, in bytes (f32); saturating.
fn workspace_bytes(m: &Transformer, tokens: u64) -> u64 {
    let c = &m.cfg;
    let per_token = 3 * c.d_model + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.ffn_dim;
    (per_token as u64)
        .saturating_add(c.vocab as u64)
        .saturating_mul(4)
        .saturating_mul(tokens)
}

impl CpuBackend {
    pub fn new(setup: &RunSetup) -> Result<CpuBackend, BackendError> {
        let model = seeded_model(&setup.model, setup.seed)?;
        let storage = kv_storage(&setup.model, &model)?;
        let slots = usize::try_from(setup.cache_slots).map_err(|_| {
            BackendError::Config(format!(
                "{} cache slots do not fit in memory",
                setup.cache_slots
            ))
        })?;
        let kv_bytes = setup
            .cache_slots
            .saturating_mul(setup.model.kv_bytes_per_token());
        if kv_bytes > MAX_STORE_BYTES {
            return Err(BackendError::Config(format!(
                "KV storage of {kv_bytes} bytes ({} slots) is too large for the cpu backend",
                setup.cache_slots
            )));
        }
        let kv = KvStore::new(&model, slots, &storage).map_err(step_err)?;
        let t = &setup.tiers;
        let tiers = if t.host_blocks > 0 || t.disk_blocks > 0 {
            Some(Tiers::new(
                &kv,
                t.host_blocks,
                t.disk_blocks,
                setup.block_size.max(1),
            )?)
        } else {
            None
        };
        let tolerance = kv_tolerance(setup.model.kv_dtype);
        let checker = Checker::new(oracle_for(&model)?, tolerance);
        // Sized for the largest step the policy can schedule (`prefill_first` runs a prompt
        // whole), as `cuda` sizes its own.
        let workspace_bytes = workspace_bytes(&model, setup.max_step_tokens.max(1) as u64);
        let clock_model = match setup.clock {
            Clock::Measured => None,
            Clock::Model => Some(CostModel::new(
                &setup.model,
                &setup.device_profile()?,
                setup.swap_gbytes_per_s.map(|g| g * 1e9),
            )),
        };
        Ok(CpuBackend {
            model,
            kv,
            storage,
            cache_slots: setup.cache_slots,
            model_shape: setup.model.clone(),
            grouped: None,
            checker,
            seqs: SeqTable::default(),
            host: BTreeMap::new(),
            states: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            tiers,
            done: VecDeque::new(),
            workspace_bytes,
            clock_model,
            measured_s: 0.0,
        })
    }

    /// The model this backend computes with (tests compare against it).
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// Recurrent states held now, one per live sequence of a model with recurrent layers (tests
    /// read it after a run: every release dropped its state).
    pub fn recurrent_states(&self) -> usize {
        self.states.len()
    }

    /// Whether the run handed out grouped layouts (each layer addressed through its table).
    pub fn is_grouped(&self) -> bool {
        self.grouped.is_some()
    }

    /// A sequence's token history so far.
    pub fn history(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(seq).map(|s| s.history.as_slice())
    }

    /// The step's tier ops, in the order given (onloads as late as it allows:
    /// [`late_onload_order`]), before anything else of the step; returns the seconds spent on
    /// onloads (the part of the step that waited for them).
    fn tier_ops(
        &mut self,
        plan: &StepPlan,
        cache: &dyn KvCacheManager,
    ) -> Result<f64, BackendError> {
        if plan.tier_ops.is_empty() {
            return Ok(0.0);
        }
        if cache.mode() != kvbench_cache_api::CacheMode::Paged {
            return Err(BackendError::Step(
                "tier ops from a contiguous cache: only the paged cache has lower tiers".into(),
            ));
        }
        let tiers = self.tiers.as_mut().ok_or_else(|| {
            BackendError::Step("a tier op, but the run set up no lower tier".into())
        })?;
        let mut onload_s = 0.0;
        for i in late_onload_order(&plan.tier_ops) {
            let op = &plan.tier_ops[i];
            let t0 = Instant::now();
            tiers.perform(op, &mut self.kv)?;
            if op.is_onload() {
                onload_s += t0.elapsed().as_secs_f64();
            }
        }
        Ok(onload_s)
    }

    /// At the first grouped layout of the run: the layer → table map, and the store remade
    /// with a row for every cell of every page (see `grouped.rs`) where the summed store's slots
    /// are too few.
    fn ensure_grouped(
        &mut self,
        plan: &StepPlan,
        cache: &dyn KvCacheManager,
    ) -> Result<(), BackendError> {
        if self.grouped.is_some() {
            return Ok(());
        }
        let seqs = plan.seqs.iter().map(|w| w.seq);
        let Some(SeqLayout::Grouped {
            page_slots, shapes, ..
        }) = seqs
            .chain(plan.swaps.iter().map(|s| s.seq))
            .find_map(|seq| cache.layout(seq))
        else {
            return Ok(());
        };
        let map = GroupedMap::new(&self.model_shape, page_slots, shapes)?;
        let pages = self.cache_slots / u64::from(page_slots.max(1));
        let rows = map
            .slots_for(pages)
            .ok_or_else(|| BackendError::Config(format!("{pages} pages do not fit in memory")))?;
        if rows > self.kv.num_slots() {
            let bytes = (rows as u64).saturating_mul(self.kv.bytes_per_slot() as u64);
            if bytes > MAX_STORE_BYTES {
                return Err(BackendError::Config(format!(
                    "grouped KV storage of {bytes} bytes ({pages} pages of {} slots in every layer) is too large for the cpu backend",
                    map.stride
                )));
            }
            self.kv = KvStore::new(&self.model, rows, &self.storage).map_err(step_err)?;
        }
        self.grouped = Some(map);
        Ok(())
    }

    fn transfer(
        &mut self,
        plan: &StepPlan,
        cache: &dyn KvCacheManager,
    ) -> Result<(), BackendError> {
        for c in &plan.copies {
            let len = u64::from(c.len_tokens);
            let (src, dst, len) = match &self.grouped {
                // A grouped copy is whole pages: every layer's cells of each page.
                Some(map) => {
                    let (src, pages) = map.pages_of(c.src_slot, len)?;
                    let (dst, _) = map.pages_of(c.dst_slot, len)?;
                    (src * map.stride, dst * map.stride, pages * map.stride)
                }
                None => (c.src_slot as usize, c.dst_slot as usize, len as usize),
            };
            self.kv.copy_slots(src, dst, len).map_err(step_err)?;
        }
        for s in &plan.swaps {
            let layout = cache.layout(s.seq).ok_or_else(|| {
                BackendError::Step(format!("swap of sequence {}: no layout", s.seq))
            })?;
            let addr = Addr::from_layout(layout, self.grouped.as_ref())?;
            match s.direction {
                SwapDirection::Out => {
                    let host = self
                        .kv
                        .swap_out(&addr, s.tokens as usize)
                        .map_err(step_err)?;
                    self.host.insert(s.seq, host);
                }
                SwapDirection::In => {
                    let host = self.host.remove(&s.seq).ok_or_else(|| {
                        BackendError::Step(format!(
                            "swap-in of sequence {}: nothing swapped out",
                            s.seq
                        ))
                    })?;
                    self.kv
                        .swap_in(&addr, s.tokens as usize, &host)
                        .map_err(step_err)?;
                }
            }
        }
        Ok(())
    }

    fn compute(
        &mut self,
        plan: &StepPlan,
        cache: &dyn KvCacheManager,
    ) -> Result<Vec<Option<Vec<f32>>>, BackendError> {
        let mut addrs = Vec::with_capacity(plan.seqs.len());
        for w in &plan.seqs {
            let layout = cache.layout(w.seq).ok_or_else(|| {
                BackendError::Step(format!("sequence {} has no cache layout", w.seq))
            })?;
            addrs.push(Addr::from_layout(layout, self.grouped.as_ref())?);
        }
        let mut steps = Vec::with_capacity(plan.seqs.len());
        for (w, addr) in plan.seqs.iter().zip(&addrs) {
            let (start, tokens) = self.seqs.step_tokens(w)?;
            steps.push(StepSeq {
                addr,
                start_pos: start,
                tokens,
                want_logits: w.sample,
            });
        }
        let state_len = self.model.state_len();
        let mut states = Vec::new();
        // Per sequence, the positions inside its chunk where the state is saved (ascending).
        let mut saves: Vec<Vec<(usize, u32)>> = Vec::new();
        let mut resumed = Vec::new();
        if state_len > 0 {
            for (w, s) in plan.seqs.iter().zip(&steps) {
                let cps = cache.state_checkpoints(w.seq);
                let held = self.states.remove(&w.seq);
                let resume = cps.resume.filter(|r| r.tokens == s.start_pos as u64);
                states.push(match (held, resume) {
                    _ if s.start_pos == 0 => vec![0f32; state_len],
                    (Some((pos, st)), _) if pos == s.start_pos => st,
                    (_, Some(r)) => {
                        let st = self.checkpoints.get(&r.page).cloned().ok_or_else(|| {
                            BackendError::Step(format!(
                                "sequence {} resumes at position {} from the recurrent-state checkpoint at page {}, which holds no saved state",
                                w.seq, s.start_pos, r.page
                            ))
                        })?;
                        resumed.push(w.seq);
                        st
                    }
                    (held, None) => {
                        return Err(BackendError::Step(format!(
                            "sequence {} starts at position {} but its recurrent state is at {} and no checkpoint resumes it there: recurrent layers keep no per-token state, so a prefix-cache hit cannot skip their prefill",
                            w.seq,
                            s.start_pos,
                            held.map_or(0, |(p, _)| p)
                        )))
                    }
                });
                let end = s.start_pos + s.tokens.len();
                let mut at: Vec<(usize, u32)> = cps
                    .save
                    .iter()
                    .filter_map(|c| usize::try_from(c.tokens).ok().map(|t| (t, c.page)))
                    .filter(|&(t, _)| t > s.start_pos && t <= end)
                    .collect();
                at.sort_unstable();
                saves.push(at);
            }
        }
        let out = forward_saving(
            (&mut self.kv, &self.model, &mut self.checkpoints),
            &steps,
            &mut states,
            &saves,
        )?;
        for ((w, s), st) in plan.seqs.iter().zip(&steps).zip(states) {
            self.states
                .insert(w.seq, (s.start_pos + s.tokens.len(), st));
        }
        // Every sequence resumed from a checkpoint is checked by the oracle.
        for seq in resumed {
            if let Some(h) = self.seqs.get_mut(seq) {
                h.checked = true;
            }
        }
        Ok(out)
    }
}

/// A step's forward pass, the recurrent state saved where `saves` says: a sequence whose chunk
/// passes a checkpoint is computed up to it, its state copied into `checkpoints`, then on
/// (kernel results depend only on positions, never on how a chunk is cut, so the logits are
/// the same).
fn forward_saving(
    (kv, model, checkpoints): (&mut KvStore, &Transformer, &mut BTreeMap<u32, Vec<f32>>),
    steps: &[StepSeq<'_, Addr<'_>>],
    states: &mut [Vec<f32>],
    saves: &[Vec<(usize, u32)>],
) -> Result<Vec<Option<Vec<f32>>>, BackendError> {
    if saves.iter().all(Vec::is_empty) {
        return kv.forward(model, steps, states).map_err(step_err);
    }
    let mut cursor: Vec<usize> = steps.iter().map(|s| s.start_pos).collect();
    let mut out: Vec<Option<Vec<f32>>> = vec![None; steps.len()];
    let mut first = true;
    loop {
        let mut round = Vec::new();
        let mut which = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            let end = s.start_pos + s.tokens.len();
            if !first && cursor[i] >= end {
                continue;
            }
            let next = saves[i]
                .iter()
                .map(|&(t, _)| t)
                .find(|&t| t > cursor[i])
                .unwrap_or(end);
            round.push(StepSeq {
                addr: s.addr,
                start_pos: cursor[i],
                tokens: &s.tokens[cursor[i] - s.start_pos..next - s.start_pos],
                want_logits: s.want_logits && next == end,
            });
            which.push((i, next, end));
        }
        if round.is_empty() {
            break;
        }
        first = false;
        let mut round_states: Vec<Vec<f32>> = which
            .iter()
            .map(|&(i, _, _)| std::mem::take(&mut states[i]))
            .collect();
        let logits = kv
            .forward(model, &round, &mut round_states)
            .map_err(step_err)?;
        for ((&(i, next, end), st), l) in which.iter().zip(round_states).zip(logits) {
            if let Some(&(_, page)) = saves[i].iter().find(|&&(t, _)| t == next) {
                checkpoints.insert(page, st.clone());
            }
            states[i] = st;
            cursor[i] = next;
            if next == end {
                out[i] = l;
            }
        }
    }
    Ok(out)
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
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
        let checked = is_sampled(seq, self.seqs.registered());
        self.seqs.register(seq, prompt, checked)
    }

    fn fork(&mut self, parent: SeqId, child: SeqId, sample_rank: u32) -> Result<u32, BackendError> {
        // A continuation starts where its parent's state is: copy it.
        if let Some(st) = self.states.get(&parent).cloned() {
            self.states.insert(child, st);
        }
        self.seqs
            .fork(parent, child, sample_rank, |parent_checked, registered| {
                parent_checked || is_sampled(child, registered)
            })
    }

    fn forget(&mut self, seq: SeqId) -> Result<(), BackendError> {
        let st = self.seqs.forget(seq)?;
        self.host.remove(&seq);
        self.states.remove(&seq);
        self.checker.check_forgotten("cpu", seq, &st);
        Ok(())
    }

    fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> Result<(), BackendError> {
        let t0 = Instant::now();
        let onload_s = self.tier_ops(plan, cache)?;
        self.ensure_grouped(plan, cache)?;
        self.transfer(plan, cache)?;
        let logits = self.compute(plan, cache)?;
        let measured_s = t0.elapsed().as_secs_f64();
        self.measured_s += measured_s;
        // Under the model clock the onload wait is the cost model's business (it prices tier
        // transfers on the link); here the bytes only move.
        let onload_wait_s = if self.clock_model.is_none() {
            onload_s
        } else {
            0.0
        };
        let duration_s = match &self.clock_model {
            None => measured_s,
            Some(m) => {
                let paged = cache.mode() == kvbench_cache_api::CacheMode::Paged;
                m.step(&plan.seqs, &plan.copies, &plan.swaps, paged).total_s
            }
        };
        let mut sampled = Vec::new();
        for (w, l) in plan.seqs.iter().zip(logits) {
            if !w.sample {
                continue;
            }
            let logits = l.ok_or_else(|| {
                BackendError::Step(format!("sequence {}: no logits to sample", w.seq))
            })?;
            let token = rank_token(&logits, 0)
                .ok_or_else(|| BackendError::Step("empty vocabulary".into()))?;
            let pos = (w.context_tokens + w.new_tokens) as usize - 1;
            if let Some(st) = self.seqs.get_mut(w.seq) {
                st.sampled(pos, Some(logits), token, usize::MAX);
            }
            sampled.push(Sampled { seq: w.seq, token });
        }
        self.done.push_back(StepOutput {
            duration_s,
            sampled,
            onload_wait_s,
        });
        Ok(())
    }

    fn complete(&mut self) -> Result<StepOutput, BackendError> {
        self.done
            .pop_front()
            .ok_or_else(|| BackendError::Step("complete with no step in flight".into()))
    }

    fn memory(&self) -> MemoryParts {
        MemoryParts {
            weights_bytes: self.model.weights.parameter_count() as u64 * 4,
            workspace_bytes: self.workspace_bytes,
            other_bytes: 0,
            host_tier_bytes: self.tiers.as_ref().map_or(0, Tiers::host_bytes),
            device_used_bytes: None,
        }
    }

    fn measured_step_s(&self) -> Option<f64> {
        Some(self.measured_s)
    }

    fn numerics(&self) -> Option<NumericsReport> {
        Some(self.checker.report(self.seqs.live_checked()))
    }
}
