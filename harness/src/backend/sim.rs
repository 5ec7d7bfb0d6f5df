//! The `sim` backend: no tensor math. Each step's duration comes from the roofline
//! [`cost::CostModel`] over the real context lengths of the batch, on the engine's virtual clock,
//! so a simulated hour takes seconds and is fully deterministic.
//!
//! With [`SimBackend::with_shadow`] (what `kvbench run` does unless `--no-shadow`), the
//! [`Shadow`] payload (`crate::shadow`) stands in for K/V: every step writes and reads tags
//! through the cache manager's layouts, so placement bugs are caught at device scale.

pub mod cost;
pub mod link;
pub mod profile;
pub mod workspace;

use std::collections::VecDeque;

use kvbench_cache_api::{CacheMode, KvCacheManager, ScopeKey, SeqId};

use crate::backend::{
    Backend, BackendError, MemoryParts, NumericsReport, RunSetup, Sampled, StepOutput, StepPlan,
    TierSetup,
};
use crate::shadow::{Shadow, ShadowReport};
use cost::CostModel;
use profile::DeviceProfile;

pub struct SimBackend {
    cost: CostModel,
    profile: DeviceProfile,
    vocab: u32,
    memory: MemoryParts,
    in_flight: VecDeque<StepOutput>,
    cache_slots: u64,
    /// The lower tiers' sizes (the shadow keeps tags for their slots) and how their transfers
    /// are priced.
    tiers: TierSetup,
    shadow: Option<Shadow>,
}

impl SimBackend {
    pub fn new(setup: &RunSetup) -> Result<SimBackend, BackendError> {
        let profile = setup.device_profile()?;
        let swap = setup.swap_gbytes_per_s.map(|g| g * 1e9);
        if let Some(s) = swap {
            if !(s.is_finite() && s > 0.0) {
                return Err(BackendError::Config(format!(
                    "scheduler.swap_gbytes_per_s: must be > 0, got {s}"
                )));
            }
        }
        let m = &setup.model;
        if let Some(why) = profile.tp_refusal(m.tp) {
            return Err(BackendError::Config(why));
        }
        // Activation workspace (`workspace.rs`) for the largest step the policy can schedule —
        // `prefill_first` runs a prompt whole, past the chunk budget — as `cuda` sizes its own,
        // unless the scenario states its own reservation.
        let workspace_bytes = setup
            .workspace_bytes
            .unwrap_or_else(|| workspace::bytes(m, setup.max_step_tokens));
        Ok(SimBackend {
            cost: CostModel::new(m, &profile, swap),
            vocab: m.vocab.max(1),
            memory: MemoryParts {
                weights_bytes: m.weight_bytes_per_device(),
                workspace_bytes,
                other_bytes: 0,
                host_tier_bytes: 0,
                device_used_bytes: None,
            },
            profile,
            in_flight: VecDeque::new(),
            cache_slots: setup.cache_slots,
            tiers: setup.tiers,
            shadow: None,
        })
    }

    /// Carry the shadow KV payload (tags per slot, checked on every read).
    pub fn with_shadow(mut self) -> Result<SimBackend, BackendError> {
        let (host, disk) = (self.tiers.host_blocks, self.tiers.disk_blocks);
        self.shadow =
            Some(Shadow::with_tiers(self.cache_slots, host, disk).map_err(BackendError::Config)?);
        Ok(self)
    }

    /// Let the shadow's grouped steps take their shortcuts or not (on by default; see
    /// [`Shadow::set_grouped_shortcuts`]). Without a shadow, nothing.
    pub fn set_shadow_shortcuts(&mut self, on: bool) {
        if let Some(sh) = &mut self.shadow {
            sh.set_grouped_shortcuts(on);
        }
    }

    /// What the shadow payload saw, if it is carried.
    pub fn shadow_report(&self) -> Option<ShadowReport> {
        self.shadow.as_ref().map(Shadow::report)
    }

    pub fn profile(&self) -> &DeviceProfile {
        &self.profile
    }

    /// A deterministic stand-in token: a mix of the sequence id and the position.
    fn fake_token(&self, seq: SeqId, position: u64) -> u32 {
        let mut x =
            seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ position.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        x ^= x >> 29;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 32;
        (x % self.vocab as u64) as u32
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn computes(&self) -> bool {
        false
    }

    fn register(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        scope: Option<&ScopeKey>,
    ) -> Result<(), BackendError> {
        if let Some(sh) = &mut self.shadow {
            sh.register(seq, prompt, scope);
        }
        Ok(())
    }

    fn fork(&mut self, parent: SeqId, child: SeqId, sample_rank: u32) -> Result<u32, BackendError> {
        let token = self.fake_token(child, u64::MAX - sample_rank as u64);
        if let Some(sh) = &mut self.shadow {
            sh.fork(parent, child, token);
        }
        Ok(token)
    }

    fn forget(&mut self, seq: SeqId) -> Result<(), BackendError> {
        if let Some(sh) = &mut self.shadow {
            sh.forget(seq);
        }
        Ok(())
    }

    fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> Result<(), BackendError> {
        let paged = cache.mode() == CacheMode::Paged;
        let cost = self.cost.step(&plan.seqs, &plan.copies, &plan.swaps, paged);
        // Without tier transfers the step costs exactly what it did before tiers existed.
        let (duration_s, onload_wait_s) = if plan.tier_ops.is_empty() {
            (cost.total_s, 0.0)
        } else {
            let t = self
                .cost
                .with_tier_ops(&cost, &plan.tier_ops, &plan.swaps, &self.tiers)
                .map_err(BackendError::Step)?;
            (t.total_s, t.onload_wait_s)
        };
        let sampled = plan
            .seqs
            .iter()
            .filter(|s| s.sample)
            .map(|s| Sampled {
                seq: s.seq,
                token: self.fake_token(s.seq, s.context_tokens as u64 + s.new_tokens as u64),
            })
            .collect::<Vec<_>>();
        if let Some(sh) = &mut self.shadow {
            sh.submit(plan, cache, &sampled);
        }
        self.in_flight.push_back(StepOutput {
            duration_s,
            sampled,
            onload_wait_s,
        });
        Ok(())
    }

    fn complete(&mut self) -> Result<StepOutput, BackendError> {
        let out = self
            .in_flight
            .pop_front()
            .ok_or_else(|| BackendError::Step("complete() with no step in flight".into()))?;
        if let Some(sh) = &mut self.shadow {
            sh.complete();
        }
        Ok(out)
    }

    fn memory(&self) -> MemoryParts {
        self.memory
    }

    fn numerics(&self) -> Option<NumericsReport> {
        None
    }
}
