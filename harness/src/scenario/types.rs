//! The scenario file's schema: what one experiment states. Plain serde data; parsing with
//! file/line errors, `--set` overrides and feasibility checks live beside it in this module.
//!
//! Every table denies unknown keys, so a typo is an error rather than a silently ignored knob.

use serde::{Deserialize, Serialize};

use super::model_spec::ModelSpec;
use super::trace_spec::{SessionsSpec, TraceSpec};
use crate::model::{Dtype, ModelShape, Moe};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Seed of the workload generator (and of model weights on compute backends).
    #[serde(default)]
    pub seed: u64,
    /// Device profile for the `sim` backend (a file in `scenarios/devices/`), e.g. "h200".
    #[serde(default = "default_device")]
    pub device: String,
    pub model: ModelSpec,
    pub memory: MemorySpec,
    pub cache: CacheSpec,
    pub traffic: TrafficSpec,
    #[serde(default)]
    pub scheduler: SchedulerSpec,
    #[serde(default)]
    pub slo: SloSpec,
    /// The file this scenario was loaded from: relative paths inside it (empirical CSVs, traces)
    /// resolve against its folder. Not part of the file format.
    #[serde(skip)]
    pub source: Option<std::path::PathBuf>,
}

fn default_device() -> String {
    "h200".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySpec {
    /// KV budget: a byte size with units ("8 GiB", "512 MiB", "1000000") or a share of the device
    /// memory left after weights ("90%").
    pub kv_budget: String,
    /// Temporary attention/activation workspace reserved per device (byte size with units).
    #[serde(default)]
    pub workspace: Option<String>,
}

/// How the contiguous baseline sizes each sequence's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Reservation {
    /// Every sequence reserves `max_seq_len` slots (FasterTransformer/Orca style).
    #[default]
    MaxSeqLen,
    /// Prompt + max new tokens (TGI style).
    PromptPlusOutput,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BlockSizes {
    One(u32),
    Sweep(Vec<u32>),
}

impl BlockSizes {
    pub fn as_slice(&self) -> &[u32] {
        match self {
            BlockSizes::One(b) => std::slice::from_ref(b),
            BlockSizes::Sweep(v) => v,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSpec {
    /// Tokens per block (or a list, for sweeps). The run uses the first.
    #[serde(default = "default_block_size")]
    pub block_size: BlockSizes,
    #[serde(default)]
    pub contiguous_reservation: Reservation,
    pub max_seq_len: u32,
    /// Where the paged manager puts a sequence's next block: `lifo` (the default) or `extents`
    /// (a sequence's blocks ascend within 64-block extents; same block counts, same waste).
    /// Left out of a rendered scenario when default, so existing scenarios render as before.
    #[serde(default, skip_serializing_if = "is_lifo")]
    pub placement: crate::cache::Placement,
    /// Which cached prefix block the paged manager evicts first when it needs a fresh one:
    /// `lru` (the default), `lfu` or `priority` (keep shared and shallow blocks). Contiguous has
    /// no prefix cache. Left out of a rendered scenario when default, like `placement`.
    #[serde(default, skip_serializing_if = "is_lru")]
    pub eviction: crate::cache::EvictionPolicy,
    /// Whether a start may evict the cached pages of a block a running sequence still holds in
    /// another table (the hybrid manager's *protected* blocks, a shared prompt's sliding pages
    /// behind the window): `always` (the default) or `to_grow` (only a running sequence's
    /// growth may; a start waits). Hybrid runs only. Left out of a rendered scenario when
    /// default, like `placement`.
    #[serde(default, skip_serializing_if = "is_always")]
    pub evict_protected: crate::cache::hybrid::EvictProtected,
    /// A recurrent model's state checkpoints under the hybrid manager: the state is kept every
    /// this many blocks (0: never, so no prefix hit), priced as the state's pages of the pool,
    /// and a prefix hit resumes from the deepest one it reaches. Absent:
    /// [`crate::cache::hybrid::DEFAULT_CHECKPOINT_EVERY_BLOCKS`]. Left out of a rendered
    /// scenario when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every_blocks: Option<u32>,
    /// A host-memory tier below the device's prefix cache (absent: none). Paged runs only; the
    /// contiguous baseline stays the simple server without tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_tier: Option<HostTierSpec>,
    /// A disk tier below the host tier (needs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_tier: Option<DiskTierSpec>,
    /// Which cache managers run: `auto` (the default), `hybrid` or `summed`
    /// (`scenario/manager.rs`). Left out of a rendered scenario when default, like `placement`.
    #[serde(default, skip_serializing_if = "super::manager::is_auto")]
    pub manager: super::manager::ManagerChoice,
}

/// `[cache.host_tier]`: blocks the device evicts are offloaded here; a prefix hit here is
/// onloaded into fresh device blocks over the device profile's host link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostTierSpec {
    /// A byte size with units ("64 GiB"), or a list of them for comparisons (the run uses the
    /// first; `suite`, `sweep` and `compare` show each).
    pub capacity: Capacities,
    #[serde(default)]
    pub offload: kvbench_cache_api::OffloadMode,
    #[serde(default)]
    pub onload: kvbench_cache_api::OnloadMode,
    /// Which offloaded block the tier drops (or passes to the disk tier) first.
    #[serde(default)]
    pub eviction: crate::cache::EvictionPolicy,
}

/// `[cache.disk_tier]`: blocks the host tier evicts go here; a hit here is read back over the
/// disk's link and then the host link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskTierSpec {
    pub capacity: String,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub latency_us: f64,
    #[serde(default)]
    pub eviction: crate::cache::EvictionPolicy,
}

/// One capacity or several (for comparisons), each a byte size with units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Capacities {
    One(String),
    Sweep(Vec<String>),
}

impl Capacities {
    pub fn as_slice(&self) -> &[String] {
        match self {
            Capacities::One(c) => std::slice::from_ref(c),
            Capacities::Sweep(v) => v,
        }
    }
}

fn is_lifo(p: &crate::cache::Placement) -> bool {
    *p == crate::cache::Placement::Lifo
}

fn is_always(p: &crate::cache::hybrid::EvictProtected) -> bool {
    *p == crate::cache::hybrid::EvictProtected::Always
}

fn is_lru(p: &crate::cache::EvictionPolicy) -> bool {
    *p == crate::cache::EvictionPolicy::Lru
}

fn default_block_size() -> BlockSizes {
    BlockSizes::One(16)
}

/// A length distribution, clamped to `[min, max]` after drawing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "dist",
    rename_all = "snake_case",
    try_from = "super::tagged::RawLength"
)]
pub enum LengthDist {
    Fixed {
        value: u32,
    },
    Uniform {
        min: u32,
        max: u32,
    },
    Normal {
        mean: f64,
        std: f64,
        #[serde(default)]
        min: Option<u32>,
        #[serde(default)]
        max: Option<u32>,
    },
    Lognormal {
        median: f64,
        sigma: f64,
        #[serde(default)]
        min: Option<u32>,
        #[serde(default)]
        max: Option<u32>,
    },
    /// Zipf over 1..=n with exponent s, scaled by `scale` tokens.
    Zipf {
        n: u64,
        s: f64,
        #[serde(default)]
        scale: f64,
        #[serde(default)]
        min: Option<u32>,
        #[serde(default)]
        max: Option<u32>,
    },
    /// Draw uniformly from a column of a CSV of lengths (path relative to the scenario file).
    Empirical {
        csv: String,
        column: String,
        #[serde(default)]
        min: Option<u32>,
        #[serde(default)]
        max: Option<u32>,
    },
}

/// A delay distribution in milliseconds (cancellation delays, think times).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "dist",
    rename_all = "snake_case",
    try_from = "super::tagged::RawDelay"
)]
pub enum DelayDist {
    Fixed { ms: f64 },
    Uniform { min_ms: f64, max_ms: f64 },
    Exponential { mean_ms: f64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    try_from = "super::tagged::RawArrival"
)]
pub enum ArrivalSpec {
    /// Open loop, exponential gaps.
    Poisson { rate_per_s: f64 },
    /// Open loop, gamma-distributed gaps with mean 1/rate; shape 1 is Poisson, < 1 is burstier.
    Gamma { rate_per_s: f64, shape: f64 },
    /// Open loop, constant gaps.
    Constant { rate_per_s: f64 },
    /// Everything at t = 0 (an offline batch).
    Burst,
    /// N clients, each sends its next request `think_ms` after its previous one finished.
    ClosedLoop {
        clients: u32,
        #[serde(default)]
        think_ms: f64,
    },
    /// Replay arrivals and lengths from a trace file (`workload/trace/`). `traffic.requests`
    /// caps the rows replayed, `traffic.duration_s` the replayed time after `start_s`.
    Trace(TraceSpec),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficSpec {
    /// Number of requests (or use `duration_s`).
    pub requests: Option<u32>,
    /// Generate arrivals until this much time has passed (open loop only).
    pub duration_s: Option<f64>,
    pub arrival: ArrivalSpec,
    /// Required unless the arrivals are a trace (which gives its own lengths).
    #[serde(default)]
    pub prompt_tokens: Option<LengthDist>,
    #[serde(default)]
    pub output_tokens: Option<LengthDist>,
    #[serde(default)]
    pub shared_prefix: Option<SharedPrefixSpec>,
    #[serde(default)]
    pub parallel_sampling: Option<ParallelSamplingSpec>,
    #[serde(default)]
    pub cancellation: Option<CancellationSpec>,
    #[serde(default)]
    pub tenants: Option<TenantsSpec>,
    #[serde(default)]
    pub sessions: Option<SessionsSpec>,
}

/// `groups` distinct prefixes of `prefix_tokens` each (system prompts); `share` of requests start
/// with one of them (chosen uniformly), followed by their own prompt tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedPrefixSpec {
    pub groups: u32,
    pub prefix_tokens: u32,
    pub share: f64,
}

/// `share` of requests ask for `n` continuations of one prompt (they fork after prefill).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelSamplingSpec {
    pub n: u32,
    pub share: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelWhen {
    /// While still queued (cancelled `delay` after arrival if not yet admitted; else never).
    Queued,
    /// A delay after arrival, wherever the request is by then.
    AfterDelay,
    /// After the request has produced `after_tokens` output tokens.
    AfterTokens,
    /// Each cancelled request picks one of the above uniformly.
    Mixed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancellationSpec {
    pub share: f64,
    pub when: CancelWhen,
    #[serde(default)]
    pub delay: Option<DelayDist>,
    #[serde(default)]
    pub after_tokens: Option<LengthDist>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantsSpec {
    pub count: u32,
    /// Traffic share per tenant (defaults to equal shares); must sum to 1.
    #[serde(default)]
    pub shares: Option<Vec<f64>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PolicyName {
    /// Running decodes first, then prompt chunks under the token budget (Sarathi / vLLM v1).
    #[default]
    DecodeFirst,
    /// New prompts whole before decodes (Orca / vLLM v0).
    PrefillFirst,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PreemptionMode {
    #[default]
    Recompute,
    Swap,
}

/// Who may share prefix-cache blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PrefixScope {
    /// Each tenant is its own reuse scope (the default: cross-tenant reuse leaks through TTFT).
    #[default]
    Tenant,
    /// All tenants share one scope; only when the scenario says so.
    Global,
    /// No prefix reuse.
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerSpec {
    pub policy: PolicyName,
    /// Tokens (prefill + decode) one step may process.
    pub max_tokens_per_step: u32,
    pub max_seqs_per_step: u32,
    pub preemption: PreemptionMode,
    /// Host-link bandwidth for swap, GB/s (defaults to the device profile's).
    pub swap_gbytes_per_s: Option<f64>,
    pub prefix_cache: bool,
    pub prefix_scope: PrefixScope,
    /// Share round-robin across tenants when choosing whom to admit.
    pub tenant_fairness: bool,
    /// Free blocks the admission controller keeps back (as a share of the pool).
    pub watermark: f64,
    /// Schedule step N+1 while step N is in flight (exercises deferred release).
    pub async_steps: bool,
}

impl Default for SchedulerSpec {
    fn default() -> Self {
        SchedulerSpec {
            policy: PolicyName::DecodeFirst,
            max_tokens_per_step: 2048,
            max_seqs_per_step: 256,
            preemption: PreemptionMode::Recompute,
            swap_gbytes_per_s: None,
            prefix_cache: true,
            prefix_scope: PrefixScope::Tenant,
            tenant_fairness: false,
            watermark: 0.01,
            async_steps: false,
        }
    }
}

/// The latency target that throughput is reported at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloSpec {
    pub ttft_p99_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    /// Share of requests that must meet every per-request target (e.g. 0.9).
    pub attainment: f64,
}

impl Default for SloSpec {
    fn default() -> Self {
        SloSpec {
            ttft_p99_ms: None,
            itl_p99_ms: None,
            attainment: 0.9,
        }
    }
}

impl Scenario {
    /// The model shape after applying the preset and explicit field overrides.
    /// `None` when neither a known preset nor all fields are given (validation reports which).
    pub fn model_shape(&self) -> Option<ModelShape> {
        let m = &self.model;
        let base = match &m.preset {
            Some(p) => ModelShape::preset(p)?,
            None => ModelShape {
                name: m.name.clone()?,
                layers: m.layers?,
                q_heads: m.q_heads?,
                kv_heads: m.kv_heads?,
                head_dim: m.head_dim?,
                d_model: m.d_model?,
                ffn_dim: m.ffn_dim?,
                vocab: m.vocab?,
                weight_dtype: m.weight_dtype.unwrap_or(Dtype::Bf16),
                kv_dtype: m.kv_dtype.unwrap_or(Dtype::Bf16),
                tp: m.tp.unwrap_or(1),
                moe: None,
                kv_scale: None,
                layer_groups: Vec::new(),
                dense_layers: 0,
            },
        };
        let ffn_dim = m.ffn_dim.unwrap_or(base.ffn_dim);
        // A key the file gives overrides the preset's; a dense base made MoE by the file takes
        // what it leaves out as 0 (experts, active experts: refused by the check, naming the
        // key), `ffn_dim` (expert width) and 0 (shared experts).
        let moe = if m.gives_moe() || base.moe.is_some() {
            let b = base.moe;
            Some(Moe {
                experts: m.experts.or(b.map(|b| b.experts)).unwrap_or(0),
                active_experts: m
                    .active_experts
                    .or(b.map(|b| b.active_experts))
                    .unwrap_or(0),
                expert_ffn_dim: m
                    .expert_ffn_dim
                    .or(b.map(|b| b.expert_ffn_dim))
                    .unwrap_or(ffn_dim),
                shared_experts: m
                    .shared_experts
                    .or(b.map(|b| b.shared_experts))
                    .unwrap_or(0),
            })
        } else {
            None
        };
        let kv_heads = m.kv_heads.unwrap_or(base.kv_heads);
        let head_dim = m.head_dim.unwrap_or(base.head_dim);
        // The file's groups replace the preset's; a preset's groups keep their own heads.
        let layer_groups = match &m.layer_groups {
            Some(specs) => specs.iter().map(|g| g.group(kv_heads, head_dim)).collect(),
            None => base.layer_groups.clone(),
        };
        Some(ModelShape {
            name: m.name.clone().unwrap_or(base.name),
            layers: m.layers.unwrap_or(base.layers),
            q_heads: m.q_heads.unwrap_or(base.q_heads),
            kv_heads,
            head_dim,
            d_model: m.d_model.unwrap_or(base.d_model),
            ffn_dim,
            vocab: m.vocab.unwrap_or(base.vocab),
            weight_dtype: m.weight_dtype.unwrap_or(base.weight_dtype),
            kv_dtype: m.kv_dtype.unwrap_or(base.kv_dtype),
            tp: m.tp.unwrap_or(base.tp),
            moe,
            kv_scale: m
                .kv_scale
                .or(base.kv_scale.map(|(g, _)| g))
                .map(|g| (g, self.block_size())),
            layer_groups,
            dense_layers: m.dense_layers.unwrap_or(base.dense_layers),
        })
    }

    pub fn block_size(&self) -> u32 {
        self.cache.block_size.as_slice()[0]
    }
}
