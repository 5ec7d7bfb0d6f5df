//! `kvbench plan`: the essay's calculator, in the library so the admission controller and the
//! reports price memory with the same arithmetic the user sees.
//!
//! bytes per token = 2 × layers × KV heads (per device) × head dim × bytes per element. A paged
//! sequence occupies whole blocks, so its waste is the empty slots of its last block; a contiguous
//! one occupies its whole reservation, so its waste is the reservation minus what it uses.

use serde::Serialize;

mod groups;
mod hybrid;
pub use groups::{GroupPlan, GroupTotals};
pub use hybrid::{HybridPlan, HybridTables};

use crate::backend::sim::cost::CostModel;
use crate::backend::sim::link::HostLink;
use crate::backend::sim::profile::DeviceProfile;
use crate::backend::SeqWork;
use crate::model::{ModelShape, Moe};
use crate::scenario::Reservation;
use crate::workload::Percentiles;

/// What one plan is computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanInput {
    pub shape: ModelShape,
    pub block_size: u32,
    pub max_seq_len: u32,
    pub reservation: Reservation,
    pub budget_bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("block size {0} must be a power of two >= 1")]
    BlockSize(u32),
    #[error("a sequence of {tokens} tokens exceeds max_seq_len {max_seq_len}")]
    TooLong { tokens: u32, max_seq_len: u32 },
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("tensor-parallel degree {tp} does not divide {kv_heads} KV heads")]
    TpDoesNotDivide { tp: u32, kv_heads: u32 },
    #[error("{0} overflow 64 bits; the shape or length is not physical")]
    Overflow(&'static str),
    #[error("{0}")]
    Device(String),
    #[error("the layer groups hold {groups} layers, not the model's {layers}")]
    GroupLayers { groups: u64, layers: u32 },
}

/// The plan for one sequence length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub layers: u32,
    pub kv_heads: u32,
    pub kv_heads_per_device: u32,
    pub head_dim: u32,
    pub dtype: String,
    pub bytes_per_element: u64,
    pub tp: u32,
    pub bytes_per_token: u64,
    /// FP8 scale granularity (absent without FP8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_scale: Option<String>,
    /// Per-block scale bytes of one block (in `block_bytes`), and the share of them in
    /// `bytes_per_token` (÷ block size, rounded up).
    #[serde(skip_serializing_if = "is_zero")]
    pub scale_bytes_per_block: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub scale_bytes_per_token: u64,
    /// Per-tensor or per-head scale bytes: fixed, taken off the budget before it is divided.
    #[serde(skip_serializing_if = "is_zero")]
    pub scale_fixed_bytes: u64,
    pub tokens: u32,
    pub sequence_bytes: u64,
    pub block_size: u32,
    pub block_bytes: u64,
    pub blocks: u64,
    pub empty_slots: u64,
    pub tail_waste_bytes: u64,
    /// Bytes the paged cache allocates: whole blocks.
    pub paged_bytes: u64,
    pub max_seq_len: u32,
    pub contiguous_slots: u64,
    pub contiguous_bytes: u64,
    pub contiguous_unused_bytes: u64,
    pub budget_bytes: Option<u64>,
    pub fits_paged: Option<u64>,
    pub fits_contiguous: Option<u64>,
    /// A model with layer groups: each group priced, and what a sequence holds by each group's
    /// own rule (absent for a model of one full group, whose figures are the ones above).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupPlan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_totals: Option<GroupTotals>,
    /// The grouped managers' layout over the budget (`cache.manager = "hybrid"`): absent for a
    /// model of one full group, without a budget, or where it cannot be laid out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<HybridPlan>,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl PlanInput {
    /// Whether every figure can be computed: the shape and sizes are physical and fit 64 bits.
    /// Each `compute` runs it first; `kvbench plan` runs it alone to blame the flag at fault.
    pub fn check(&self) -> Result<(), PlanError> {
        if self.block_size == 0 || !self.block_size.is_power_of_two() {
            return Err(PlanError::BlockSize(self.block_size));
        }
        for (name, v) in [
            ("layers", self.shape.layers),
            ("kv_heads", self.shape.kv_heads),
            ("head_dim", self.shape.head_dim),
            ("tp", self.shape.tp),
            ("max_seq_len", self.max_seq_len),
        ] {
            if v == 0 {
                return Err(PlanError::Zero(name));
            }
        }
        // The same rule scenarios follow (`scenario::check`): a KV head is never split.
        if !self.shape.kv_heads.is_multiple_of(self.shape.tp) {
            return Err(PlanError::TpDoesNotDivide {
                tp: self.shape.tp,
                kv_heads: self.shape.kv_heads,
            });
        }
        self.shape
            .checked_kv_bytes_per_token()
            .ok_or(PlanError::Overflow("bytes per token"))?;
        (self.max_seq_len as u64)
            .checked_mul(self.block_size as u64)
            .and_then(|x| x.checked_mul(self.shape.kv_bytes_per_token()))
            .ok_or(PlanError::Overflow("reservation bytes"))?;
        self.shape
            .kv_scale_fixed_bytes()
            .ok_or(PlanError::Overflow("scale bytes"))?;
        if !groups::layers_match(&self.shape) {
            return Err(PlanError::GroupLayers {
                groups: self
                    .shape
                    .layer_groups
                    .iter()
                    .map(|g| g.layers() as u64)
                    .sum(),
                layers: self.shape.layers,
            });
        }
        self.shape
            .checked_state_bytes_per_sequence()
            .ok_or(PlanError::Overflow("state bytes"))?;
        // A recurrent-only model stores nothing per token: a cache of slots has nothing to hold.
        if self.shape.kv_bytes_per_token() == 0 {
            return Err(PlanError::Zero(
                "KV bytes per token (give one full, sliding or mla layer group)",
            ));
        }
        Ok(())
    }
}

impl Plan {
    pub fn compute(input: &PlanInput, tokens: u32) -> Result<Plan, PlanError> {
        input.check()?;
        if tokens == 0 {
            return Err(PlanError::Zero("tokens"));
        }
        if tokens > input.max_seq_len {
            return Err(PlanError::TooLong {
                tokens,
                max_seq_len: input.max_seq_len,
            });
        }
        let s = &input.shape;
        let bpt = s.kv_bytes_per_token();
        let b = input.block_size as u64;
        let blocks = (tokens as u64).div_ceil(b);
        let empty_slots = blocks * b - tokens as u64;
        let contiguous_slots = match input.reservation {
            Reservation::MaxSeqLen => input.max_seq_len as u64,
            Reservation::PromptPlusOutput => tokens as u64,
        };
        let paged_bytes = blocks * b * bpt;
        let contiguous_bytes = contiguous_slots * bpt;
        let fixed = s.kv_scale_fixed_bytes().unwrap_or(0);
        let left = input.budget_bytes.map(|x| x.saturating_sub(fixed));
        let (groups, group_totals) = if s.layer_groups.is_empty() {
            (Vec::new(), None)
        } else {
            let (g, t) = groups::price(s, tokens as u64, contiguous_slots, left)
                .ok_or(PlanError::Overflow("layer group bytes"))?;
            (g, Some(t))
        };
        let hybrid = match left {
            Some(left) if !s.layer_groups.is_empty() => {
                hybrid::plan(s, input.block_size, left, tokens as u64)
            }
            _ => None,
        };
        Ok(Plan {
            layers: s.layers,
            kv_heads: s.kv_heads,
            kv_heads_per_device: s.kv_heads_per_device(),
            head_dim: s.head_dim,
            dtype: s.kv_dtype.name().to_string(),
            bytes_per_element: s.kv_dtype.bytes(),
            tp: s.tp,
            bytes_per_token: bpt,
            kv_scale: s.kv_scale_granularity().map(|g| g.name().to_string()),
            scale_bytes_per_block: s.kv_scale_bytes_per_block().unwrap_or(0),
            scale_bytes_per_token: s.kv_scale_bytes_per_token().unwrap_or(0),
            scale_fixed_bytes: fixed,
            tokens,
            sequence_bytes: tokens as u64 * bpt,
            block_size: input.block_size,
            block_bytes: b * bpt,
            blocks,
            empty_slots,
            tail_waste_bytes: empty_slots * bpt,
            paged_bytes,
            max_seq_len: input.max_seq_len,
            contiguous_slots,
            contiguous_bytes,
            contiguous_unused_bytes: contiguous_bytes - tokens as u64 * bpt,
            budget_bytes: input.budget_bytes,
            fits_paged: left.map(|x| x / paged_bytes),
            fits_contiguous: left.map(|x| x / contiguous_bytes),
            groups,
            group_totals,
            hybrid,
        })
    }
}

/// The plan over a distribution of sequence lengths (a scenario's generated workload).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DistributionPlan {
    pub sequences: usize,
    pub tokens: Percentiles,
    pub bytes_per_token: u64,
    pub block_size: u32,
    pub mean_blocks: f64,
    pub mean_empty_slots: f64,
    /// Share of paged allocation that is tail waste.
    pub paged_waste_share: f64,
    /// Share of contiguous reservations that holds no token.
    pub contiguous_waste_share: f64,
    pub mean_paged_bytes: f64,
    pub mean_contiguous_bytes: f64,
    pub budget_bytes: Option<u64>,
    /// Sequences of mean size that fit in the budget, each way.
    pub fits_paged: Option<u64>,
    pub fits_contiguous: Option<u64>,
}

impl DistributionPlan {
    /// `lengths`: final length (prompt + output) of every sequence, each continuation counted.
    pub fn compute(input: &PlanInput, lengths: &[u32]) -> Result<DistributionPlan, PlanError> {
        input.check()?;
        if lengths.is_empty() {
            return Err(PlanError::Zero("sequences"));
        }
        let bpt = input.shape.kv_bytes_per_token();
        let b = input.block_size as u64;
        let n = lengths.len() as f64;
        let (mut blocks, mut empty, mut used, mut reserved) = (0u64, 0u64, 0u64, 0u64);
        for &t in lengths {
            let t = t.min(input.max_seq_len) as u64;
            let k = t.div_ceil(b);
            blocks += k;
            empty += k * b - t;
            used += t;
            reserved += match input.reservation {
                Reservation::MaxSeqLen => input.max_seq_len as u64,
                Reservation::PromptPlusOutput => t,
            };
        }
        // In f64: the sums over millions of sequences may pass 64 bits once multiplied.
        let mean_paged_bytes = blocks as f64 * b as f64 * bpt as f64 / n;
        let mean_contiguous_bytes = reserved as f64 * bpt as f64 / n;
        let fits = |per: f64| {
            input.budget_bytes.map(|x| {
                if per > 0.0 {
                    (x as f64 / per).floor() as u64
                } else {
                    0
                }
            })
        };
        Ok(DistributionPlan {
            sequences: lengths.len(),
            tokens: Percentiles::of(lengths),
            bytes_per_token: bpt,
            block_size: input.block_size,
            mean_blocks: blocks as f64 / n,
            mean_empty_slots: empty as f64 / n,
            paged_waste_share: empty as f64 / (blocks as f64 * b as f64),
            contiguous_waste_share: (reserved - used) as f64 / reserved as f64,
            mean_paged_bytes,
            mean_contiguous_bytes,
            budget_bytes: input.budget_bytes,
            fits_paged: fits(mean_paged_bytes),
            fits_contiguous: fits(mean_contiguous_bytes),
        })
    }
}

/// What a shape's weights hold and what one token computes with: a mixture of experts holds
/// every expert (the memory budget pays for them) and computes with its active ones.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightsPlan {
    pub parameters: u64,
    pub active_parameters: u64,
    pub tp: u32,
    /// Every weight, on one device (`parameters × bytes ÷ tp`).
    pub weight_bytes_per_device: u64,
    /// The weights one token computes with, on one device (`active_parameters × bytes ÷ tp`).
    pub active_weight_bytes_per_device: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
}

impl WeightsPlan {
    pub fn of(shape: &ModelShape) -> Result<WeightsPlan, PlanError> {
        let tp = shape.tp.max(1) as u64;
        let bytes = shape.weight_dtype.bytes();
        let parameters = shape
            .checked_parameter_count()
            .ok_or(PlanError::Overflow("parameters"))?;
        let active_parameters = shape
            .checked_active_parameter_count()
            .ok_or(PlanError::Overflow("parameters"))?;
        let per_device = |p: u64| {
            p.checked_mul(bytes)
                .map(|b| b / tp)
                .ok_or(PlanError::Overflow("weight bytes"))
        };
        Ok(WeightsPlan {
            parameters,
            active_parameters,
            tp: shape.tp,
            weight_bytes_per_device: per_device(parameters)?,
            active_weight_bytes_per_device: per_device(active_parameters)?,
            moe: shape.moe,
        })
    }
}

/// A host-memory tier for cached KV blocks, priced: how much it holds, and whether bringing a
/// prefix back over the host link beats recomputing it.
///
/// Onloading `P` tokens costs `host_link_latency_s + P × bytes per token ÷ host_link_bytes_per_s`,
/// what `sim` charges a blocking step's onloads from the host tier (`HostLink::transfer_s`).
/// Recomputing them costs what the `sim` cost model charges for one prefill step of the
/// `prefix_tokens`-token prefix with no context on the paged cache (weights, K/V, FLOPs,
/// all-reduces at `tp > 1`, the step overhead); its tokens per second are the device's prefill
/// rate, and a prefix of `P` tokens recomputes in `P ÷ rate`. Onloading is no slower from the
/// break-even length `latency ÷ (1/rate − bytes per token ÷ link)` on, and never when a token
/// crosses the link slower than it recomputes. At `tp > 1` each device onloads its own share
/// (its KV heads) over its own link at the same time; `capacity_bytes` is per device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierPlan {
    pub device: String,
    pub capacity_bytes: u64,
    pub bytes_per_token: u64,
    pub tokens_held: u64,
    pub block_size: u32,
    pub blocks_held: u64,
    pub prefix_tokens: u32,
    pub prefix_bytes: u64,
    pub host_link_bytes_per_s: f64,
    pub host_link_latency_s: f64,
    pub onload_s: f64,
    pub recompute_s: f64,
    pub prefill_tokens_per_s: f64,
    /// Shortest prefix onloading is no slower for; `None`: recomputing is faster at any length.
    pub break_even_tokens: Option<u64>,
}

impl TierPlan {
    pub fn compute(
        input: &PlanInput,
        profile: &DeviceProfile,
        capacity_bytes: u64,
        prefix_tokens: u32,
    ) -> Result<TierPlan, PlanError> {
        Self::compute_over(
            input,
            profile,
            HostLink::of(profile, None),
            capacity_bytes,
            prefix_tokens,
        )
    }

    /// [`TierPlan::compute`] over `host_link` (a scenario's `scheduler.swap_gbytes_per_s`
    /// restates the profile's bandwidth, as it does for `sim`).
    pub fn compute_over(
        input: &PlanInput,
        profile: &DeviceProfile,
        host_link: HostLink,
        capacity_bytes: u64,
        prefix_tokens: u32,
    ) -> Result<TierPlan, PlanError> {
        input.check()?;
        if prefix_tokens == 0 {
            return Err(PlanError::Zero("prefix tokens"));
        }
        if let Some(why) = profile.tp_refusal(input.shape.tp) {
            return Err(PlanError::Device(why));
        }
        let bpt = input.shape.kv_bytes_per_token();
        let block_bytes = bpt
            .checked_mul(input.block_size as u64)
            .ok_or(PlanError::Overflow("block bytes"))?;
        let prefix_bytes = bpt
            .checked_mul(prefix_tokens as u64)
            .ok_or(PlanError::Overflow("prefix bytes"))?;
        // The one pricing of the host link `sim` charges onloads with (`backend/sim/link.rs`).
        let (link, latency) = (host_link.bytes_per_s, host_link.latency_s);
        let onload_s = host_link.transfer_s(prefix_bytes as f64);
        let cost = CostModel::new(&input.shape, profile, None);
        let prefill = SeqWork {
            seq: 0,
            context_tokens: 0,
            new_tokens: prefix_tokens,
            sample: true,
        };
        let recompute_s = cost.step(&[prefill], &[], &[], true).total_s;
        let rate = prefix_tokens as f64 / recompute_s;
        let saved_per_token = 1.0 / rate - bpt as f64 / link;
        let break_even_tokens =
            (saved_per_token > 0.0).then(|| ((latency / saved_per_token).ceil() as u64).max(1));
        Ok(TierPlan {
            device: profile.name.clone(),
            capacity_bytes,
            bytes_per_token: bpt,
            tokens_held: capacity_bytes / bpt,
            block_size: input.block_size,
            blocks_held: capacity_bytes / block_bytes,
            prefix_tokens,
            prefix_bytes,
            host_link_bytes_per_s: link,
            host_link_latency_s: latency,
            onload_s,
            recompute_s,
            prefill_tokens_per_s: rate,
            break_even_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn essay(budget: Option<u64>) -> PlanInput {
        PlanInput {
            shape: ModelShape::llama3_8b(),
            block_size: 16,
            max_seq_len: 4096,
            reservation: Reservation::MaxSeqLen,
            budget_bytes: budget,
        }
    }

    #[test]
    fn essay_figures() {
        let p = Plan::compute(&essay(None), 4096).expect("valid input");
        assert_eq!(p.bytes_per_token, 131_072);
        assert_eq!(p.sequence_bytes, 536_870_912);
        let p = Plan::compute(&essay(None), 33).expect("valid input");
        assert_eq!(
            (p.blocks, p.empty_slots, p.tail_waste_bytes),
            (3, 15, 1_966_080)
        );
    }

    #[test]
    fn fits_each_way() {
        let p = Plan::compute(&essay(Some(80 << 30)), 33).expect("valid input");
        assert_eq!(p.fits_contiguous, Some(160));
        assert_eq!(p.fits_paged, Some((80 << 30) / (48 * 131_072)));
    }

    #[test]
    fn refuses_bad_block_size() {
        let mut i = essay(None);
        i.block_size = 12;
        assert_eq!(Plan::compute(&i, 33), Err(PlanError::BlockSize(12)));
    }
}
