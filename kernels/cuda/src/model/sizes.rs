//! Sizes, as arithmetic: which weight tensors go to the device and how many bytes each takes,
//! and every workspace buffer the forward pass allocates once, up front (nothing is allocated
//! while a run is in progress, so the device's free memory is flat between steps and the ledger
//! can be reconciled with `cuMemGetInfo`).

use super::{HostWeights, ModelDims, WeightDtype};
use crate::error::CudaError;

/// Rows per GEMM call: every GEMM is issued in tiles of this many rows (padding the last), so
/// each cuBLAS call has one shape whatever the batch (batch invariance, see [`super`]).
pub const ROW_TILE: usize = 64;
/// Logits buffers (two, one per step in flight) are capped at this many bytes each; the rows
/// they hold bound the sequences one step may sample.
pub const LOGITS_CAP_BYTES: usize = 256 << 20;
/// Block-table entries held on the device for one step (`[seqs, widest table]`, i32).
pub const MIN_TABLE_ENTRIES: usize = 1 << 20;
/// Attention partial results held on the device, in (row, partition) pairs; a step that needs
/// more runs its attention in row chunks.
pub const MIN_ATTN_ROW_PARTS: usize = 8192;
/// Slot pairs one copy launch takes; longer copy lists run in several launches.
pub const COPY_PAIRS_PER_LAUNCH: usize = 1 << 16;

/// Rows rounded up to whole GEMM tiles.
pub fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(ROW_TILE).max(1) * ROW_TILE
}

/// One tensor of the upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorPlan {
    pub name: &'static str,
    /// Layer index, `None` for the model-wide tensors.
    pub layer: Option<usize>,
    pub elems: usize,
    /// Stored as the weight dtype (a GEMM operand) rather than f32.
    pub matrix: bool,
}

impl TensorPlan {
    pub fn bytes(&self, dtype: WeightDtype) -> usize {
        self.elems * if self.matrix { dtype.bytes() } else { 4 }
    }
}

/// Every tensor uploaded, in upload order.
pub fn weight_plan(d: &ModelDims) -> Vec<TensorPlan> {
    let t = |name, layer, elems, matrix| TensorPlan {
        name,
        layer,
        elems,
        matrix,
    };
    let (dm, qd, kvd, f) = (d.d_model, d.q_dim(), d.kv_dim(), d.ffn_dim);
    let mut out = vec![t("embed", None, d.vocab * dm, false)];
    for l in 0..d.layers {
        let l = Some(l);
        out.extend([
            t("attn_norm", l, dm, false),
            t("wq", l, dm * qd, true),
            t("wk", l, dm * kvd, true),
            t("wv", l, dm * kvd, true),
            t("wo", l, qd * dm, true),
            t("mlp_norm", l, dm, false),
            t("w_gate", l, dm * f, true),
            t("w_up", l, dm * f, true),
            t("w_down", l, f * dm, true),
        ]);
    }
    out.push(t("final_norm", None, dm, false));
    out.push(t("lm_head", None, dm * d.vocab, true));
    out
}

/// Bytes of all weights on the device.
pub fn weight_bytes(d: &ModelDims, dtype: WeightDtype) -> usize {
    weight_plan(d).iter().map(|t| t.bytes(dtype)).sum()
}

/// The host slices in [`weight_plan`] order, each checked against its planned length.
pub fn plan_slices<'a>(d: &ModelDims, w: &HostWeights<'a>) -> Result<Vec<&'a [f32]>, CudaError> {
    if w.layers.len() != d.layers {
        return Err(CudaError::Shape(format!(
            "weights have {} layers, the model {}",
            w.layers.len(),
            d.layers
        )));
    }
    let mut slices = vec![w.embed];
    for l in &w.layers {
        slices.extend([
            l.attn_norm,
            l.wq,
            l.wk,
            l.wv,
            l.wo,
            l.mlp_norm,
            l.w_gate,
            l.w_up,
            l.w_down,
        ]);
    }
    slices.push(w.final_norm);
    slices.push(w.lm_head);
    for (t, s) in weight_plan(d).iter().zip(&slices) {
        if t.elems != s.len() {
            return Err(CudaError::Shape(format!(
                "weight {}{}: {} elements, expected {}",
                t.name,
                t.layer
                    .map(|l| format!(" of layer {l}"))
                    .unwrap_or_default(),
                s.len(),
                t.elems
            )));
        }
    }
    Ok(slices)
}

/// Every workspace buffer, in elements, for steps of at most `max_tokens` new tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkspacePlan {
    /// Token rows the activation buffers hold (`max_tokens` in whole GEMM tiles).
    pub rows: usize,
    /// Rows each logits buffer holds (sampled sequences per step).
    pub logit_rows: usize,
    pub table_entries: usize,
    pub attn_row_parts: usize,
    pub dims: ModelDims,
    pub dtype: WeightDtype,
}

impl WorkspacePlan {
    pub fn new(d: &ModelDims, dtype: WeightDtype, max_tokens: usize, num_blocks: usize) -> Self {
        let rows = padded_rows(max_tokens.max(1));
        let by_cap = (LOGITS_CAP_BYTES / (d.vocab.max(1) * 4)) / ROW_TILE * ROW_TILE;
        let logit_rows = rows.min(by_cap.max(ROW_TILE));
        WorkspacePlan {
            rows,
            logit_rows,
            table_entries: MIN_TABLE_ENTRIES.max(2 * num_blocks),
            attn_row_parts: MIN_ATTN_ROW_PARTS.max(2 * rows),
            dims: *d,
            dtype,
        }
    }

    /// f32 elements of the activation buffers: x, h, proj `[rows, d]`; q, att `[rows, q_dim]`;
    /// k, v `[rows, kv_dim]`; gate, up `[rows, ffn]`; last `[logit_rows, d]`; two logits
    /// buffers; the rope tables `[rows, head_dim/2]` twice; attention chunk q/out.
    pub fn f32_elems(&self) -> usize {
        let d = &self.dims;
        let r = self.rows;
        let act = r * (3 * d.d_model + 2 * d.q_dim() + 2 * d.kv_dim() + 2 * d.ffn_dim);
        let logits = 2 * self.logit_rows * d.vocab + self.logit_rows * d.d_model;
        let rope = 2 * r * (d.head_dim / 2);
        act + logits + rope + self.attn_scratch_f32()
    }

    /// Attention partials: `part_out` `[row_parts, q_heads, head_dim]`, max and sum
    /// `[row_parts, q_heads]`, and the chunk copies of q and out.
    pub fn attn_scratch_f32(&self) -> usize {
        let d = &self.dims;
        self.attn_row_parts * d.q_heads * (d.head_dim + 2) + 2 * self.chunk_rows() * d.q_dim()
    }

    /// Rows of one attention chunk (when a step's rows x partitions exceed the scratch).
    pub fn chunk_rows(&self) -> usize {
        self.rows.min(self.attn_row_parts)
    }

    /// bf16 staging of GEMM inputs (`[rows, max(d, q_dim, ffn)]`), bf16 weights only.
    pub fn bf16_elems(&self) -> usize {
        match self.dtype {
            WeightDtype::F32 => 0,
            WeightDtype::Bf16 => {
                let d = &self.dims;
                self.rows * d.d_model.max(d.q_dim()).max(d.ffn_dim)
            }
        }
    }

    /// i32 and i64 step inputs: tokens, rows' sequences and lengths, logits rows, two argmax
    /// outputs, block tables, query tiles of the step and of a chunk (i32); slots, copy pairs,
    /// sequence bases (i64).
    pub fn index_bytes(&self) -> usize {
        let i32s = 3 * self.rows
            + 3 * self.logit_rows
            + self.table_entries
            + self.chunk_rows() * 2
            + (self.rows + 1)
            + (self.chunk_rows() + 1);
        let i64s = self.rows + 2 * COPY_PAIRS_PER_LAUNCH + self.rows;
        i32s * 4 + i64s * 8
    }

    /// Every workspace byte on the device.
    pub fn bytes(&self) -> usize {
        self.f32_elems() * 4 + self.bf16_elems() * 2 + self.index_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> ModelDims {
        ModelDims {
            layers: 2,
            q_heads: 8,
            kv_heads: 2,
            head_dim: 32,
            d_model: 256,
            ffn_dim: 512,
            vocab: 512,
            norm_eps: 1e-5,
        }
    }

    fn llama8b() -> ModelDims {
        ModelDims {
            layers: 32,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            d_model: 4096,
            ffn_dim: 14336,
            vocab: 128256,
            norm_eps: 1e-5,
        }
    }

    #[test]
    fn weight_bytes_match_the_parameter_count() {
        let d = tiny();
        // 512x256 embed + 2 x (2x256 norms + 256x256 + 2x256x64 + 256x256 + 3x256x512)
        // + 256 final norm + 256x512 lm head.
        let per_layer = 2 * 256 + 256 * 256 + 2 * 256 * 64 + 256 * 256 + 3 * 256 * 512;
        let params = 512 * 256 + 2 * per_layer + 256 + 256 * 512;
        assert_eq!(weight_bytes(&d, WeightDtype::F32), params * 4);
        // bf16 halves the matrices only: embed and norms stay f32.
        let f32_part = 512 * 256 + 2 * 2 * 256 + 256;
        assert_eq!(
            weight_bytes(&d, WeightDtype::Bf16),
            f32_part * 4 + (params - f32_part) * 2
        );
        let plan = weight_plan(&d);
        assert_eq!(plan.len(), 1 + 9 * 2 + 2);
        assert_eq!(plan.iter().map(|t| t.elems).sum::<usize>(), params);
        // Llama-3-8B in bf16: ~8.03e9 parameters, the 2 GiB f32 embedding included.
        let b = weight_bytes(&llama8b(), WeightDtype::Bf16) as f64;
        assert!((16.5e9..18.0e9).contains(&b), "{b}");
    }

    #[test]
    fn slices_are_checked_against_the_plan() {
        let d = tiny();
        let plan = weight_plan(&d);
        let data: Vec<Vec<f32>> = plan.iter().map(|t| vec![0.0; t.elems]).collect();
        let layer = |l: usize| {
            let b = 1 + 9 * l;
            HostLayer {
                attn_norm: &data[b],
                wq: &data[b + 1],
                wk: &data[b + 2],
                wv: &data[b + 3],
                wo: &data[b + 4],
                mlp_norm: &data[b + 5],
                w_gate: &data[b + 6],
                w_up: &data[b + 7],
                w_down: &data[b + 8],
            }
        };
        let mut w = HostWeights {
            embed: &data[0],
            layers: (0..2).map(layer).collect(),
            final_norm: &data[19],
            lm_head: &data[20],
        };
        let s = plan_slices(&d, &w).expect("matches");
        assert_eq!(s.len(), plan.len());
        w.layers[1].wk = &data[1];
        let e = plan_slices(&d, &w)
            .expect_err("wk of layer 1 is too short")
            .to_string();
        assert!(e.contains("wk of layer 1"), "{e}");
        w.layers.pop();
        assert!(plan_slices(&d, &w).is_err());
    }

    use super::super::HostLayer;

    #[test]
    fn workspace_rows_are_whole_tiles_and_logits_are_capped() {
        assert_eq!(padded_rows(1), 64);
        assert_eq!(padded_rows(64), 64);
        assert_eq!(padded_rows(65), 128);
        assert_eq!(padded_rows(0), 64);
        let w = WorkspacePlan::new(&tiny(), WeightDtype::F32, 300, 100);
        assert_eq!(w.rows, 320);
        assert_eq!(w.logit_rows, 320, "tiny vocab: every row can sample");
        assert_eq!(w.bf16_elems(), 0);
        let big = WorkspacePlan::new(&llama8b(), WeightDtype::Bf16, 2048, 50_000);
        // 256 MiB / (128256 x 4 B) = 523 rows -> 512 (whole tiles).
        assert_eq!(big.logit_rows, 512);
        assert_eq!(big.table_entries, MIN_TABLE_ENTRIES);
        assert_eq!(big.bf16_elems(), 2048 * 14336);
        let gib = big.bytes() as f64 / (1u64 << 30) as f64;
        assert!((1.0..4.0).contains(&gib), "{gib} GiB");
        // The sum is the parts.
        assert_eq!(
            big.bytes(),
            big.f32_elems() * 4 + big.bf16_elems() * 2 + big.index_bytes()
        );
    }
}
