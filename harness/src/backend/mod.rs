//! The seam between the engine and whatever executes a step: `sim` (a roofline cost model on a
//! virtual clock), `cpu` (real tensor math), `cuda` (the GPU, through the driver API) and
//! `cuda-emu` (the cuda code on an emulated device). What a step asks and returns is plain data
//! in [`crate::seam`], re-exported here.
//!
//! **Architecture invariant:** the engine owns scheduling and the cache manager owns placement;
//! a backend only executes what a [`StepPlan`] says, reading each sequence's layout from the
//! cache manager at submit time. Block tables are never copied into the plan: the hot path of a
//! 20,000-request simulation cannot afford it, and `sim` ignores layouts anyway.
//!
//! Steps are asynchronous: [`Backend::submit`] hands a step over and [`Backend::complete`] returns
//! the oldest in-flight one, so the engine can plan step N+1 while step N runs. The cache
//! managers' `begin_step`/`retire_step` fences bracket each step; the engine calls them. A
//! synchronous backend may do all its work in `submit` and merely return it from `complete`.

pub mod cpu;
pub mod cuda;
mod logit_check;
mod seq_history;
pub mod sim;

use std::path::PathBuf;

use kvbench_cache_api::{KvCacheManager, OnloadMode, ScopeKey, SeqId};
use serde::{Deserialize, Serialize};

use crate::model::ModelShape;
pub use crate::seam::{Sampled, SeqWork, StepOutput, StepPlan, SwapDirection, SwapOp};

/// The backend's share of the memory ledger, in bytes (KV is counted by the cache manager).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemoryParts {
    pub weights_bytes: u64,
    /// Temporary attention/activation buffers.
    pub workspace_bytes: u64,
    /// Runtime allocations that are neither weights, KV nor workspace (e.g. the host swap tier
    /// is *not* counted here: it is host memory).
    pub other_bytes: u64,
    /// Host memory the backend holds as the host KV tier's pool (not device memory; a compute
    /// backend's buffer standing for the disk tier is not counted: it stands for the disk).
    pub host_tier_bytes: u64,
    /// What the device itself says is in use, where a device exists (reconciliation).
    pub device_used_bytes: Option<u64>,
}

/// Numerical agreement of a compute backend with the f64 oracle.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NumericsReport {
    pub checked_steps: u64,
    pub max_rel_err: f64,
    pub tolerance: f64,
    pub ok: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend exists in the design but this build does not carry it.
    #[error("{0} backend not built in this version")]
    NotBuilt(&'static str),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("backend configuration: {0}")]
    Config(String),
    /// A device profile that does not validate: `FILE:LINE:COL: KEY: message`, one per line.
    #[error("{0}")]
    Profile(String),
    /// A step could not be executed (bad plan, unknown sequence, missing layout...).
    #[error("step failed: {0}")]
    Step(String),
}

/// Executes steps. One backend instance serves one cache manager for one run.
pub trait Backend {
    fn name(&self) -> &'static str;
    /// True when the backend computes real tokens (the engine then keeps every emitted token id
    /// per stream and compares paged against contiguous).
    fn computes(&self) -> bool;

    /// A new sequence with its prompt and its prefix-reuse scope (`None`: it shares with no other
    /// request); called before its first step. Continuations inherit their parent's scope.
    fn register(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        scope: Option<&ScopeKey>,
    ) -> Result<(), BackendError>;
    /// `child` continues `parent` after the step that sampled the parent's first token has been
    /// submitted. Continuation k takes the rank-k token at that position (so continuations
    /// diverge even under greedy decoding); the token is returned.
    fn fork(&mut self, parent: SeqId, child: SeqId, sample_rank: u32) -> Result<u32, BackendError>;
    /// The sequence is gone (finished or cancelled). Takes effect after in-flight steps.
    fn forget(&mut self, seq: SeqId) -> Result<(), BackendError>;

    /// Hand a step to the device. Layouts are read from `cache` now.
    fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> Result<(), BackendError>;
    /// The oldest in-flight step's output; an error if none is in flight.
    fn complete(&mut self) -> Result<StepOutput, BackendError>;

    fn memory(&self) -> MemoryParts;
    /// kvbench's own device allocations now, (allocations, bytes), counted exactly where a
    /// backend has a device: the engine fails a run that ends holding any byte it did not hold
    /// at its start.
    fn owned_device(&self) -> Option<(u64, u64)> {
        None
    }
    /// The device's `cuMemGetInfo` reconciled with kvbench's allocations at the end of a run,
    /// term by term ([`cuda::ledger`]), printed once; `None` without a device.
    fn device_ledger(&mut self) -> Option<Result<cuda::ledger::DeviceLedger, String>> {
        None
    }
    fn numerics(&self) -> Option<NumericsReport>;
    /// Wall seconds spent executing steps so far, on a backend that measures them.
    fn measured_step_s(&self) -> Option<f64> {
        None
    }
}

/// Which backend to run on, as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// `cuda` where a device is found, else `cpu`.
    Auto,
    Cpu,
    Cuda,
    /// The `cuda` backend on an emulated device (host memory, a delayed worker stream, the
    /// kernels built for the host): for testing; its timings are emulated. Never chosen by `auto`.
    CudaEmu,
    Sim,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::CudaEmu => "cuda-emu",
            BackendKind::Sim => "sim",
        }
    }

    /// The concrete backend `auto` stands for on this machine: `cuda` where it works, else
    /// `cpu`, saying on stderr (once) why it fell back ([`cuda::resolve_auto`]). `sim` is only
    /// ever chosen explicitly.
    pub fn resolve(self) -> BackendKind {
        match self {
            BackendKind::Auto => cuda::resolve_auto(),
            k => k,
        }
    }
}

/// What a backend needs to know about the run it serves.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSetup {
    pub model: ModelShape,
    /// Device profile name (`scenarios/devices/<name>.toml`; every shipped file is built in).
    pub device: String,
    /// Folder holding the scenario file, searched for `devices/<name>.toml` first.
    pub scenario_dir: Option<PathBuf>,
    /// Token slots of the cache manager this backend serves (sizes compute backends' KV storage).
    pub cache_slots: u64,
    pub block_size: u32,
    /// Seed of model weights on compute backends.
    pub seed: u64,
    /// The most tokens one step can hold (`engine::policy::max_step_tokens`): what every
    /// backend sizes its per-step workspace for (`cuda` allocates it, `cpu` and `sim` count it).
    pub max_step_tokens: u32,
    /// Host-link bandwidth override for swaps, GB/s.
    pub swap_gbytes_per_s: Option<f64>,
    /// Workspace reservation from the scenario (`memory.workspace`), if stated.
    pub workspace_bytes: Option<u64>,
    /// A device profile given directly (`calibrate --check --profile FILE`); else `device` names it.
    pub profile: Option<sim::profile::DeviceProfile>,
    /// What a measured backend's steps advance the virtual clock by.
    pub clock: Clock,
    /// The lower tiers the cache manager may offload to (all zero: none).
    pub tiers: TierSetup,
}

/// What a backend needs to serve a cache manager's lower tiers: their sizes (compute backends
/// allocate real pools) and how transfers are priced (`sim`, and `--clock model`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TierSetup {
    /// Host-tier slots, each one block of `block_size` tokens (0: no host tier).
    pub host_blocks: u32,
    /// Disk-tier slots (0: no disk tier; needs a host tier).
    pub disk_blocks: u32,
    pub onload: OnloadMode,
    /// The disk's link, where a disk tier exists.
    pub disk: Option<DiskLink>,
}

/// A disk tier's transfer figures (`cache.disk_tier`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DiskLink {
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub latency_s: f64,
}

impl RunSetup {
    /// The device profile this run prices steps with: the one given, else `device` looked up.
    pub fn device_profile(&self) -> Result<sim::profile::DeviceProfile, BackendError> {
        match &self.profile {
            Some(p) => Ok(p.clone()),
            None => sim::profile::DeviceProfile::load(&self.device, self.scenario_dir.as_deref()),
        }
    }
}

/// What the engine's clock advances by on a backend that computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// The measured wall time of each step.
    #[default]
    Measured,
    /// The device profile's cost model of each step: the math is still real and checked, but
    /// scheduling is the same on every machine and under any load.
    Model,
}

/// Construct a backend. `auto` must be resolved first ([`BackendKind::resolve`]).
pub fn create(kind: BackendKind, setup: &RunSetup) -> Result<Box<dyn Backend>, BackendError> {
    match kind.resolve() {
        BackendKind::Sim => Ok(Box::new(sim::SimBackend::new(setup)?)),
        BackendKind::Cpu => Ok(Box::new(cpu::CpuBackend::new(setup)?)),
        BackendKind::Cuda => cuda::create(setup),
        BackendKind::CudaEmu => cuda::create_emulated(setup),
        BackendKind::Auto => Err(BackendError::Config("auto backend was not resolved".into())),
    }
}
