//! What a backend holds in this process's memory, estimated from the set-up before the backend
//! is built, and added to the scenario's own estimate ([`crate::scenario::HostNeed`]): a run
//! that would not fit is refused naming the key that costs most and the figure, instead of
//! aborting on a failed allocation part-way through building the backend.
//!
//! The scenario's check at load cannot know the backend (`--backend` is a flag): a scenario
//! whose device is `h100` runs its KV pool in host memory on `cpu`, and `cuda-emu` holds
//! every device allocation (weights, KV, workspace) in host memory too. The figures follow the
//! backends' own allocations: `cpu` keeps f32 weights and the oracle's f64 copy, and FP8 KV as
//! dequantised f32 (4 bytes where the budget prices 1); `cuda` keeps the seeded f32 model on
//! the host for its reference (and the f64 oracle at small shapes); `cuda-emu` adds the
//! device's copy of the weights, the KV pool and the workspace; both lower tiers are host
//! memory on every computing backend.

use crate::backend::BackendKind;
use crate::model::ModelShape;
use crate::scenario::{host_available_bytes, HostNeed, Scenario};
use crate::units::format_bytes;

/// Bytes one backend holds in this process, by what its scenario key sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resident {
    /// Host copies of the weights (the model, the reference, an emulated device's copy).
    pub weights_bytes: u64,
    /// The KV store as held (`memory.kv_budget`).
    pub kv_bytes: u64,
    pub host_tier_bytes: u64,
    pub disk_tier_bytes: u64,
    /// One step's activation buffers.
    pub workspace_bytes: u64,
}

impl Resident {
    pub fn total_bytes(&self) -> u64 {
        self.weights_bytes
            .saturating_add(self.kv_bytes)
            .saturating_add(self.host_tier_bytes)
            .saturating_add(self.disk_tier_bytes)
            .saturating_add(self.workspace_bytes)
    }
}

/// Parameters at or below which `cpu` and `cuda` check against the f64 oracle (8 bytes per
/// parameter); above it, against the f32 model they already hold.
const ORACLE_MAX_PARAMETERS: u64 = crate::backend::cpu::MAX_PARAMETERS;

/// KV bytes per token as `kind` holds them: an FP8 store on `cpu` keeps dequantised f32 values
/// and f32 scales, at most 4 times the priced bytes.
fn held_kv_bytes_per_token(kind: BackendKind, model: &ModelShape) -> u64 {
    let priced = model.kv_bytes_per_token();
    if kind == BackendKind::Cpu && model.kv_dtype.is_fp8() {
        priced.saturating_mul(4)
    } else {
        priced
    }
}

/// One step's activation buffers in f32 (the cpu backend's own figure, which `cuda-emu`'s
/// device workspace is below).
fn workspace_bytes(model: &ModelShape, max_step_tokens: u32) -> u64 {
    let q = u64::from(model.q_heads) * u64::from(model.head_dim);
    let kv = u64::from(model.kv_heads) * u64::from(model.head_dim);
    let per_token = 3 * u64::from(model.d_model)
        + 2 * q
        + 2 * kv
        + 2 * u64::from(model.ffn_dim)
        + u64::from(model.vocab);
    per_token
        .saturating_mul(4)
        .saturating_mul(u64::from(max_step_tokens.max(1)))
}

/// What `kind` holds in host memory for a run of `kv_slots` token slots and tiers of
/// `host_blocks` and `disk_blocks` blocks of `block_size` tokens. Saturating.
pub fn resident(
    kind: BackendKind,
    model: &ModelShape,
    kv_slots: u64,
    block_size: u32,
    (host_blocks, disk_blocks): (u64, u64),
    max_step_tokens: u32,
) -> Resident {
    let params = model.parameter_count();
    let oracle = if params <= ORACLE_MAX_PARAMETERS {
        params.saturating_mul(8)
    } else {
        0
    };
    let per_token = held_kv_bytes_per_token(kind, model);
    let block = per_token.saturating_mul(u64::from(block_size.max(1)));
    let tiers = |r: Resident| Resident {
        host_tier_bytes: block.saturating_mul(host_blocks),
        disk_tier_bytes: block.saturating_mul(disk_blocks),
        ..r
    };
    match kind {
        BackendKind::Sim | BackendKind::Auto => Resident::default(),
        BackendKind::Cpu => tiers(Resident {
            weights_bytes: params.saturating_mul(4).saturating_add(oracle),
            kv_bytes: kv_slots.saturating_mul(per_token),
            workspace_bytes: workspace_bytes(model, max_step_tokens),
            ..Resident::default()
        }),
        BackendKind::Cuda => tiers(Resident {
            weights_bytes: params.saturating_mul(4).saturating_add(oracle),
            ..Resident::default()
        }),
        BackendKind::CudaEmu => tiers(Resident {
            weights_bytes: params
                .saturating_mul(4)
                .saturating_add(oracle)
                .saturating_add(params.saturating_mul(model.weight_dtype.bytes())),
            kv_bytes: kv_slots.saturating_mul(per_token),
            workspace_bytes: workspace_bytes(model, max_step_tokens),
            ..Resident::default()
        }),
    }
}

/// The engine's share of a run (request list, stream states, block and tier-slot metadata),
/// from the scenario's estimate without the KV it prices for a `cpu` device: the backend's
/// figure replaces it. A trace replay's lengths are unknown before it is read: its share is
/// the replay's own to bound (tier slot records grow with use).
fn engine_bytes(scenario: &Scenario, model: &ModelShape) -> u64 {
    match scenario.host_need(model) {
        Some(need) => HostNeed {
            host_kv_bytes: 0,
            host_tier_bytes: 0,
            ..need
        }
        .bytes(),
        None => 0,
    }
}

/// What `kind` holds for `scenario`'s run of `kv_slots` slots ([`resident`] at the scenario's
/// block size and tiers).
pub fn scenario_resident(
    scenario: &Scenario,
    kind: BackendKind,
    model: &ModelShape,
    kv_slots: u64,
    max_step_tokens: u32,
) -> Resident {
    resident(
        kind,
        model,
        kv_slots,
        scenario.block_size(),
        scenario.tier_slots(model),
        max_step_tokens,
    )
}

/// Refuses a run on `kind` whose engine state and backend together would not fit in the memory
/// this process can still get: the message names the key that costs most, each part and the
/// figure available.
pub fn check(
    scenario: &Scenario,
    kind: BackendKind,
    model: &ModelShape,
    kv_slots: u64,
    max_step_tokens: u32,
) -> Result<(), crate::scenario::Diagnostic> {
    let r = scenario_resident(scenario, kind, model, kv_slots, max_step_tokens);
    if r.total_bytes() == 0 {
        // `sim`: the scenario's own check at load is the whole estimate.
        return Ok(());
    }
    let Some((available, source)) = host_available_bytes() else {
        return Ok(());
    };
    let engine = engine_bytes(scenario, model);
    let total = r.total_bytes().saturating_add(engine);
    if total <= available {
        return Ok(());
    }
    let traffic_key = if scenario.traffic.requests.is_some() {
        "traffic.requests"
    } else {
        "traffic.duration_s"
    };
    let parts = [
        ("model", r.weights_bytes, "weights"),
        ("memory.kv_budget", r.kv_bytes, "KV"),
        ("cache.host_tier.capacity", r.host_tier_bytes, "host tier"),
        ("cache.disk_tier.capacity", r.disk_tier_bytes, "disk tier"),
        (
            "scheduler.max_tokens_per_step",
            r.workspace_bytes,
            "workspace",
        ),
        (traffic_key, engine, "requests and cache metadata"),
    ];
    let (key, _, _) =
        parts
            .iter()
            .max_by_key(|p| p.1)
            .copied()
            .unwrap_or(("memory.kv_budget", 0, ""));
    let listed: Vec<String> = parts
        .iter()
        .filter(|p| p.1 > 0)
        .map(|p| format!("{} {}", p.2, format_bytes(p.1)))
        .collect();
    let message = format!(
        "on --backend {} this run needs about {} of host memory ({}), and {} is available \
         ({source})",
        kind.name(),
        format_bytes(total),
        listed.join(", "),
        format_bytes(available)
    );
    Err(crate::scenario::locate_in_source(
        scenario.source.as_deref(),
        key,
        message,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An 8B model on `cuda-emu` holds its f32 host model and the device's bf16 copy (no f64
    /// oracle above the cpu's parameter cap); a 64 GiB KV budget is 64 GiB of host memory.
    #[test]
    fn cuda_emu_holds_device_memory_on_the_host() {
        let m = ModelShape::llama3_8b();
        let params = m.parameter_count();
        let slots = (64u64 << 30) / m.kv_bytes_per_token();
        let r = resident(BackendKind::CudaEmu, &m, slots, 16, (0, 0), 1);
        assert_eq!(
            r.weights_bytes,
            params * 4 + params * m.weight_dtype.bytes()
        );
        assert_eq!(r.kv_bytes, slots * m.kv_bytes_per_token());
        assert!(r.total_bytes() > 64 << 30);
        assert_eq!(
            resident(BackendKind::Sim, &m, slots, 16, (4, 4), 1),
            Resident::default()
        );
    }

    /// FP8 KV on `cpu` is held as f32: 4 times the priced bytes, in the store and both pools.
    #[test]
    fn cpu_fp8_pools_are_held_as_f32_and_the_disk_pool_counts() {
        let mut m = ModelShape::tiny();
        m.kv_dtype = crate::model::Dtype::Fp8E4m3;
        let priced = m.kv_bytes_per_token();
        let r = resident(BackendKind::Cpu, &m, 100, 16, (3, 5), 1);
        assert_eq!(r.kv_bytes, 100 * priced * 4);
        assert_eq!(r.host_tier_bytes, 3 * 16 * priced * 4);
        assert_eq!(r.disk_tier_bytes, 5 * 16 * priced * 4);
    }
}
