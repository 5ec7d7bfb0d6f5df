//! `kvbench plan`: the essay's calculator, in the library so the admission controller and the
//! reports price memory with the same arithmetic the user sees.
//!
//! bytes per token = 2 × layers × KV heads (per device) × head dim × bytes per element. A paged
//! sequence occupies whole blocks, so its waste is the empty slots of its last block; a contiguous
//! one occupies its whole reservation, so its waste is the reservation minus what it uses.

use serde::Serialize;

use crate::model::ModelShape;
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
}

impl PlanInput {
    fn check(&self) -> Result<(), PlanError> {
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
        Ok(Plan {
            layers: s.layers,
            kv_heads: s.kv_heads,
            kv_heads_per_device: s.kv_heads_per_device(),
            head_dim: s.head_dim,
            dtype: s.kv_dtype.name().to_string(),
            bytes_per_element: s.kv_dtype.bytes(),
            tp: s.tp,
            bytes_per_token: bpt,
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
            fits_paged: input.budget_bytes.map(|x| x / paged_bytes),
            fits_contiguous: input.budget_bytes.map(|x| x / contiguous_bytes),
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
