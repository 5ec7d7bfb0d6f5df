//! The roofline cost model of one step, with the few terms a measured device needs.
//!
//! A step reads the weights once, reads every scheduled sequence's K/V context (plus the tokens
//! it adds) and writes the new tokens' K/V; it performs `2 × params` FLOPs per new token plus the
//! attention FLOPs. Its time is the larger of bytes ÷ bandwidth and FLOPs ÷ peak, plus a fixed
//! per-step overhead. Copies (copy-on-write, contiguous forks) move bytes at the device copy
//! bandwidth and swaps at the host-link bandwidth; both precede the compute, so they add.
//! Paged attention reads its K/V at `paged_attention_efficiency` of the contiguous bandwidth.
//!
//! Calibration terms (`kvbench calibrate`; each absent from a datasheet profile, and then
//! neutral, so the shipped H200 figures do not move):
//! - `seq_overhead_s`: a fixed cost per scheduled sequence;
//! - `attention_flops_per_s`: attention arithmetic at its own rate, apart from the GEMMs;
//! - `attention_half_tokens` (L½): the attention rate by attended length, `rate × L ÷ (L + L½)`
//!   for a sequence whose last query attends to `L` tokens (its context plus its chunk; a
//!   sliding group's at most its window). Charged as the sequence's FLOPs × `(L + L½) ÷ L` at
//!   the plateau rate ([`StepLoad::attn_work_flops`]), which keeps the time linear in
//!   `1 ÷ attention_flops_per_s`;
//! - `weight_bytes_per_s`, `copy_bytes_per_s`: weights and copies at their own bandwidths;
//! - `combine = "sum"`: memory and compute time add instead of overlapping.
//!
//! With `combine = "sum"` the time is linear in the reciprocal of every rate and in the overheads
//! ([`StepLoad::features`]), which is what the least-squares fit relies on.
//!
//! Mixture of experts: the FLOPs are `2 × active parameters` per new token (the routed experts a
//! token uses, the shared ones, the router), and the weights read are everything but the routed
//! experts plus, in each layer, the routed experts the step's tokens touch — in expectation
//! `E · (1 − (1 − k/E)^B)` of `E` experts for `B` new tokens with `k` active each, under uniform
//! routing ([`crate::model::Moe::expected_touched_experts`]). A decode step of one token reads
//! `k` experts per layer; a large prefill chunk reads nearly all `E`.
//!
//! Tensor parallelism (`tp = N`, Megatron-style): each device holds `1/N` of every weight and of
//! the KV heads, computes `1/N` of the FLOPs, and every layer ends its attention and its MLP with
//! an all-reduce of the step's activations (`new tokens × d_model` elements of the activation
//! dtype, [`super::workspace::activation_dtype_bytes`]: bf16 for an FP8-weight model, which
//! reduces its activations, not its weights).
//! A ring all-reduce of `S` bytes sends `2 · (N − 1)/N · S` bytes from each device, so each
//! costs `nvlink_latency_s + 2 · (N − 1)/N · S ÷ nvlink_bytes_per_s`, twice per layer; it follows
//! the layer's compute and is added, not overlapped. At `tp = 1` there is none. Pipeline and
//! expert parallelism are not modelled. The all-reduce is not one of the calibration fit's
//! [`FEATURES`]: a `tp > 1` grid's fit prices it at the base profile's link and takes it off
//! each measured time first (`calibrate/fit.rs`).

use kvbench_cache_api::{CopyOp, TierOp};

mod attention;
pub use attention::{sliding_pairs, GroupedAttention};

use crate::backend::sim::link::{self, HostLink, TierCost, TierLoad};
use crate::backend::sim::profile::{Combine, DeviceProfile};
use crate::backend::{SeqWork, SwapOp, TierSetup};
use crate::model::ModelShape;

/// The model-shape constants the cost model needs, precomputed once per run.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    kv_bytes_per_token: f64,
    /// Sliding or recurrent layer groups: what attention reads per group; `None` when every
    /// layer reads every token (the one-group arithmetic below, unchanged).
    grouped: Option<GroupedAttention>,
    weight_bytes: f64,
    /// Mixture of experts: what a step's weight read depends on its token count through.
    experts: Option<ExpertReads>,
    /// Tensor parallelism's all-reduces; `None` at `tp = 1`.
    all_reduce: Option<AllReduce>,
    /// Dense FLOPs per new token (2 × parameters on this device).
    dense_flops_per_token: f64,
    /// Attention FLOPs per (query token × context token): QKᵀ and PV, 2 FLOPs per MAC each.
    attn_flops_per_pair: f64,
    /// The attention kernel's half-saturation length (profile `attention_half_tokens`); 0 = one
    /// rate at every length.
    attn_half_tokens: f64,
    bandwidth: f64,
    paged_bandwidth: f64,
    weight_bandwidth: f64,
    copy_bandwidth: f64,
    peak_flops: f64,
    attn_flops: f64,
    /// What swaps and tier transfers cross (`link.rs`).
    host_link: HostLink,
    overhead_s: f64,
    seq_overhead_s: f64,
    combine: Combine,
}

/// The weights an MoE step reads: those every step reads, plus each touched routed expert's.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ExpertReads {
    moe: crate::model::Moe,
    /// Every weight but the routed experts', on one device.
    always_bytes: f64,
    /// One routed expert's weights in one layer, on one device.
    expert_bytes: f64,
    layers: f64,
}

impl ExpertReads {
    fn bytes(&self, new_tokens: u64) -> f64 {
        self.always_bytes
            + self.layers * self.moe.expected_touched_experts(new_tokens) * self.expert_bytes
    }
}

/// Tensor parallelism's all-reduces (module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
struct AllReduce {
    /// All-reduces per step: two per layer.
    per_step: u64,
    /// Bytes each device sends per new token per all-reduce: `2 · (N − 1)/N · d_model · bytes`.
    sent_bytes_per_token: f64,
    bandwidth: f64,
    latency_s: f64,
}

/// What one step moves and computes, independent of the device.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepLoad {
    pub seqs: u64,
    pub weight_bytes: f64,
    pub kv_write_bytes: f64,
    pub kv_read_bytes: f64,
    pub dense_flops: f64,
    pub attn_flops: f64,
    /// The attention FLOPs as the plateau rate sees them: each sequence's FLOPs × `(L + L½) ÷
    /// L` (module doc), so `attn_work_flops ÷ attention_flops_per_s` is the attention's time.
    /// Equal to `attn_flops` on a profile without `attention_half_tokens`.
    pub attn_work_flops: f64,
    /// Bytes read plus bytes written by copies.
    pub copy_bytes: f64,
    pub swap_bytes: f64,
    /// Tensor parallelism: the step's all-reduces, and the bytes each device sends in them.
    pub all_reduces: u64,
    pub all_reduce_bytes: f64,
}

/// The columns of the linear model (`combine = "sum"`), in [`FEATURES`] order: the step time is
/// their dot product with the constants' reciprocals and overheads.
pub const FEATURES: [&str; 10] = [
    "step",
    "seqs",
    "weight_bytes",
    "kv_write_bytes",
    "kv_read_bytes_contiguous",
    "kv_read_bytes_paged",
    "dense_flops",
    "attn_flops",
    "copy_bytes",
    "swap_bytes",
];

impl StepLoad {
    pub fn is_empty(&self) -> bool {
        self.seqs == 0 && self.copy_bytes == 0.0 && self.swap_bytes == 0.0
    }

    /// The step's quantities as the linear model's columns ([`FEATURES`]).
    pub fn features(&self, paged: bool) -> [f64; 10] {
        let (contiguous, paged_read) = if paged {
            (0.0, self.kv_read_bytes)
        } else {
            (self.kv_read_bytes, 0.0)
        };
        [
            if self.is_empty() { 0.0 } else { 1.0 },
            self.seqs as f64,
            self.weight_bytes,
            self.kv_write_bytes,
            contiguous,
            paged_read,
            self.dense_flops,
            self.attn_work_flops,
            self.copy_bytes,
            self.swap_bytes,
        ]
    }
}

/// Totals of one step, kept for tests and traces.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepCost {
    pub bytes_moved: f64,
    pub flops: f64,
    pub memory_s: f64,
    pub compute_s: f64,
    pub copy_s: f64,
    pub swap_s: f64,
    pub all_reduce_s: f64,
    pub total_s: f64,
}

impl CostModel {
    pub fn new(model: &ModelShape, device: &DeviceProfile, swap_bytes_per_s: Option<f64>) -> Self {
        let tp = model.tp.max(1) as f64;
        let q_per_device = (model.q_heads as f64 / tp).ceil();
        let bandwidth = device.hbm_effective_bytes_per_s;
        let weight_bytes = model.weight_bytes_per_device() as f64;
        let experts = model.moe.map(|moe| {
            let routed = model.routed_expert_weight_bytes_per_device() as f64;
            // Dense layers of an MoE model (DeepSeek-V3's first three) hold no experts.
            let per = moe.experts.max(1) as f64 * model.moe_layers().max(1) as f64;
            ExpertReads {
                moe,
                always_bytes: weight_bytes - routed,
                expert_bytes: routed / per,
                layers: model.moe_layers() as f64,
            }
        });
        let all_reduce = (model.tp > 1).then(|| {
            let n = model.tp as f64;
            AllReduce {
                per_step: 2 * model.layers as u64,
                sent_bytes_per_token: 2.0 * (n - 1.0) / n
                    * model.d_model as f64
                    * super::workspace::activation_dtype_bytes(model) as f64,
                // A profile without the link is refused before a run (`tp_refusal`); here it
                // would cost nothing.
                bandwidth: device.nvlink_bytes_per_s.unwrap_or(f64::INFINITY),
                latency_s: device.nvlink_latency_s.unwrap_or(0.0),
            }
        });
        // Full-attention FLOPs per pair over every layer; with layer groups, each group's own
        // (an MLA layer attends in the absorbed form over its latent, a recurrent one not at all).
        let attn_flops_per_pair = if model.layer_groups.is_empty() {
            4.0 * model.layers as f64 * q_per_device * model.head_dim as f64
        } else {
            model
                .layer_groups
                .iter()
                .map(|g| g.layers() as f64 * g.attn_flops_per_pair_per_layer(q_per_device))
                .sum()
        };
        CostModel {
            kv_bytes_per_token: model.kv_bytes_per_token() as f64,
            grouped: GroupedAttention::of(model, q_per_device),
            weight_bytes,
            experts,
            all_reduce,
            dense_flops_per_token: 2.0 * model.active_parameter_count() as f64 / tp,
            attn_flops_per_pair,
            attn_half_tokens: device.attention_half_tokens.unwrap_or(0.0),
            bandwidth,
            paged_bandwidth: bandwidth * device.paged_attention_efficiency,
            weight_bandwidth: device.weight_bytes_per_s.unwrap_or(bandwidth),
            copy_bandwidth: device.copy_bytes_per_s.unwrap_or(bandwidth),
            peak_flops: device.peak_flops_per_s,
            attn_flops: device
                .attention_flops_per_s
                .unwrap_or(device.peak_flops_per_s),
            host_link: HostLink::of(device, swap_bytes_per_s),
            overhead_s: device.step_overhead_s,
            seq_overhead_s: device.seq_overhead_s,
            combine: device.combine,
        }
    }

    /// What a step moves and computes on this model shape.
    pub fn load(&self, seqs: &[SeqWork], copies: &[CopyOp], swaps: &[SwapOp]) -> StepLoad {
        let mut kv_read_tokens = 0u64;
        let mut new_tokens = 0u64;
        let mut attn_pairs = 0f64;
        // Pairs weighted by the kernel's shortfall at each sequence's attended length.
        let mut work_pairs = 0f64;
        let half = self.attn_half_tokens;
        for s in seqs {
            let ctx = s.context_tokens as u64;
            let new = s.new_tokens as u64;
            kv_read_tokens += ctx + new;
            new_tokens += new;
            // Causal: query i of the chunk sees the context plus i+1 chunk tokens.
            let pairs = (new * ctx) as f64 + (new * (new + 1) / 2) as f64;
            attn_pairs += pairs;
            if half > 0.0 && new > 0 {
                work_pairs += pairs * attention::shortfall((ctx + new) as f64, half);
            }
        }
        // Sliding and recurrent groups read by their own rule, sequence by sequence.
        let grouped = self.grouped.as_ref().map(|g| {
            seqs.iter()
                .fold(attention::AttentionLoad::default(), |acc, s| {
                    let one = g.seq(s.context_tokens as u64, s.new_tokens as u64, half);
                    attention::AttentionLoad {
                        read_bytes: acc.read_bytes + one.read_bytes,
                        state_write_bytes: acc.state_write_bytes + one.state_write_bytes,
                        flops: acc.flops + one.flops,
                        work_flops: acc.work_flops + one.work_flops,
                    }
                })
        });
        let attn_flops = match &grouped {
            None => attn_pairs * self.attn_flops_per_pair,
            Some(g) => g.flops,
        };
        // Without a half-saturation length the work is the FLOPs themselves, bit for bit.
        let attn_work_flops = match &grouped {
            _ if half <= 0.0 => attn_flops,
            None => work_pairs * self.attn_flops_per_pair,
            Some(g) => g.work_flops,
        };
        let copied_tokens: u64 = copies.iter().map(|c| c.len_tokens as u64).sum();
        let swapped_tokens: u64 = swaps
            .iter()
            .filter(|s| s.bytes.is_none())
            .map(|s| s.tokens as u64)
            .sum();
        let priced_bytes: u64 = swaps.iter().filter_map(|s| s.bytes).sum();
        let has_seqs = !seqs.is_empty();
        StepLoad {
            seqs: seqs.len() as u64,
            weight_bytes: match (has_seqs, &self.experts) {
                (false, _) => 0.0,
                (true, None) => self.weight_bytes,
                (true, Some(e)) => e.bytes(new_tokens),
            },
            kv_write_bytes: match &grouped {
                None => new_tokens as f64 * self.kv_bytes_per_token,
                Some(g) => new_tokens as f64 * self.kv_bytes_per_token + g.state_write_bytes,
            },
            kv_read_bytes: match &grouped {
                None => kv_read_tokens as f64 * self.kv_bytes_per_token,
                Some(g) => g.read_bytes,
            },
            dense_flops: new_tokens as f64 * self.dense_flops_per_token,
            attn_flops,
            attn_work_flops,
            // The measured copy bandwidth counts bytes read plus bytes written.
            copy_bytes: 2.0 * copied_tokens as f64 * self.kv_bytes_per_token,
            swap_bytes: swapped_tokens as f64 * self.kv_bytes_per_token + priced_bytes as f64,
            all_reduces: match &self.all_reduce {
                Some(a) if new_tokens > 0 => a.per_step,
                _ => 0,
            },
            all_reduce_bytes: self.all_reduce.map_or(0.0, |a| {
                a.per_step as f64 * new_tokens as f64 * a.sent_bytes_per_token
            }),
        }
    }

    pub fn step(
        &self,
        seqs: &[SeqWork],
        copies: &[CopyOp],
        swaps: &[SwapOp],
        paged: bool,
    ) -> StepCost {
        self.time(&self.load(seqs, copies, swaps), paged)
    }

    /// The time of a step with `load`. Every rate is bounded by the profile's validation, so the
    /// result is finite; a non-finite one (impossible from a validated profile) saturates.
    pub fn time(&self, load: &StepLoad, paged: bool) -> StepCost {
        let kv_bw = if paged {
            self.paged_bandwidth
        } else {
            self.bandwidth
        };
        let memory_s = load.weight_bytes / self.weight_bandwidth
            + load.kv_write_bytes / self.bandwidth
            + load.kv_read_bytes / kv_bw;
        let compute_s = load.dense_flops / self.peak_flops + load.attn_work_flops / self.attn_flops;
        let copy_s = load.copy_bytes / self.copy_bandwidth;
        let swap_s = load.swap_bytes / self.host_link.bytes_per_s;
        let overhead = if load.is_empty() {
            0.0
        } else {
            self.overhead_s + load.seqs as f64 * self.seq_overhead_s
        };
        let core_s = match self.combine {
            Combine::Max => memory_s.max(compute_s),
            Combine::Sum => memory_s + compute_s,
        };
        let all_reduce_s = match &self.all_reduce {
            Some(a) if load.all_reduces > 0 => {
                load.all_reduces as f64 * a.latency_s + load.all_reduce_bytes / a.bandwidth
            }
            _ => 0.0,
        };
        // At tp = 1 `all_reduce_s` is +0.0, which leaves the sum's bits as they were.
        let total_s = core_s + copy_s + swap_s + all_reduce_s + overhead;
        StepCost {
            bytes_moved: load.weight_bytes + load.kv_read_bytes + load.kv_write_bytes,
            flops: load.dense_flops + load.attn_flops,
            memory_s,
            compute_s,
            copy_s,
            swap_s,
            all_reduce_s,
            total_s: if total_s.is_finite() {
                total_s
            } else {
                f64::MAX
            },
        }
    }

    /// The linear model's coefficients ([`FEATURES`] order) under `combine = "sum"`.
    pub fn coefficients(&self) -> [f64; 10] {
        [
            self.overhead_s,
            self.seq_overhead_s,
            1.0 / self.weight_bandwidth,
            1.0 / self.bandwidth,
            1.0 / self.bandwidth,
            1.0 / self.paged_bandwidth,
            1.0 / self.peak_flops,
            1.0 / self.attn_flops,
            1.0 / self.copy_bandwidth,
            1.0 / self.host_link.bytes_per_s,
        ]
    }

    /// The host link swaps and tier transfers cross.
    pub fn host_link(&self) -> HostLink {
        self.host_link
    }

    pub fn kv_bytes_per_token(&self) -> f64 {
        self.kv_bytes_per_token
    }

    /// A step's duration with its tier transfers (`link.rs`'s model) around `base`, its cost
    /// without them. Tier transfers are not one of the fit's [`FEATURES`]: calibration steps
    /// carry none. An op the run's tiers cannot perform is an error.
    pub fn with_tier_ops(
        &self,
        base: &StepCost,
        ops: &[TierOp],
        swaps: &[SwapOp],
        tiers: &TierSetup,
    ) -> Result<TierCost, String> {
        let load = TierLoad::of(ops, self.kv_bytes_per_token, tiers.disk.as_ref())?;
        Ok(link::price(
            &load,
            base.total_s,
            swaps,
            self.kv_bytes_per_token,
            &self.host_link,
            tiers.disk.as_ref(),
            tiers.onload,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> DeviceProfile {
        DeviceProfile::load("h200", None).expect("h200")
    }

    fn decode(seq: u64, ctx: u32) -> SeqWork {
        SeqWork {
            seq,
            context_tokens: ctx,
            new_tokens: 1,
            sample: true,
        }
    }

    #[test]
    fn decode_is_memory_bound_and_matches_the_facts_example() {
        // FACTS: 64 sequences × 2,048 tokens at 32/8/128/bf16 = 16 GiB of K/V → ~4.0 ms at 4.3 TB/s.
        let m = CostModel::new(&ModelShape::llama3_8b(), &h200(), None);
        let seqs: Vec<_> = (0..64).map(|i| decode(i, 2047)).collect();
        let c = m.step(&seqs, &[], &[], false);
        assert!(c.memory_s > c.compute_s, "{c:?}");
        let kv_s: f64 = (64.0 * 2048.0 * 131_072.0) / 4.3e12;
        assert!((kv_s - 0.004).abs() < 0.0002, "{kv_s}");
        let weights_s = ModelShape::llama3_8b().weight_bytes_per_device() as f64 / 4.3e12;
        let expect = kv_s + weights_s + 64.0 * 131_072.0 / 4.3e12 + 40e-6;
        assert!(
            (c.total_s - expect).abs() / expect < 1e-3,
            "{} vs {expect}",
            c.total_s
        );
    }

    #[test]
    fn long_prefill_is_compute_bound() {
        let m = CostModel::new(&ModelShape::llama3_8b(), &h200(), None);
        let c = m.step(
            &[SeqWork {
                seq: 0,
                context_tokens: 0,
                new_tokens: 2048,
                sample: true,
            }],
            &[],
            &[],
            false,
        );
        assert!(c.compute_s > c.memory_s, "{c:?}");
        // 2 × 8e9 × 2048 ≈ 33 TFLOP → ~41 ms at 790 TFLOP/s.
        assert!(c.total_s > 0.035 && c.total_s < 0.06, "{c:?}");
    }

    #[test]
    fn paged_reads_cost_more_and_copies_and_swaps_add() {
        let m = CostModel::new(&ModelShape::llama3_8b(), &h200(), Some(25e9));
        let seqs: Vec<_> = (0..32).map(|i| decode(i, 1000)).collect();
        let contiguous = m.step(&seqs, &[], &[], false);
        let paged = m.step(&seqs, &[], &[], true);
        assert!(paged.total_s > contiguous.total_s);
        let copy = [CopyOp {
            src_slot: 0,
            dst_slot: 16,
            len_tokens: 16,
        }];
        let swap = [SwapOp {
            seq: 1,
            direction: crate::backend::SwapDirection::Out,
            tokens: 1000,
            bytes: None,
        }];
        let with = m.step(&seqs, &copy, &swap, true);
        let expect_swap = 1000.0 * 131_072.0 / 25e9;
        assert!((with.swap_s - expect_swap).abs() < 1e-12);
        assert!((with.total_s - paged.total_s - with.copy_s - with.swap_s).abs() < 1e-12);
    }

    #[test]
    fn sum_mode_is_the_dot_product_of_features_and_coefficients() {
        let mut p = h200();
        p.combine = Combine::Sum;
        p.seq_overhead_s = 3e-6;
        p.attention_flops_per_s = Some(100e12);
        p.copy_bytes_per_s = Some(1e12);
        p.weight_bytes_per_s = Some(2e12);
        let m = CostModel::new(&ModelShape::llama3_8b(), &p, None);
        let mut seqs: Vec<_> = (0..8).map(|i| decode(i, 500)).collect();
        seqs.push(SeqWork {
            seq: 9,
            context_tokens: 64,
            new_tokens: 128,
            sample: true,
        });
        let copy = [CopyOp {
            src_slot: 0,
            dst_slot: 16,
            len_tokens: 7,
        }];
        for paged in [false, true] {
            let load = m.load(&seqs, &copy, &[]);
            let dot: f64 = load
                .features(paged)
                .iter()
                .zip(m.coefficients())
                .map(|(f, c)| f * c)
                .sum();
            let t = m.time(&load, paged).total_s;
            assert!((dot - t).abs() < 1e-12 * t, "{dot} vs {t}");
        }
    }

    #[test]
    fn an_empty_step_costs_nothing() {
        let m = CostModel::new(&ModelShape::tiny(), &h200(), None);
        assert_eq!(m.step(&[], &[], &[], true).total_s, 0.0);
    }
}
