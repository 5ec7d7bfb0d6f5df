//! Attention launches: where rows find their tokens (paged tables or contiguous bases), how
//! rows group into query tiles, the partition scratch, and the attention + log-sum-exp merge
//! kernels.

use super::{i32_of, DevLayer, Gpu};
use crate::error::CudaError;
use crate::launch::{log2_block_size, window_arg, AttnShape, Partitions, ATTN_THREADS};
use crate::runtime::{Arg, DevBuf};
use crate::source::attn_kernel_name;

/// Where rows find their tokens.
pub enum Addressing<'a> {
    /// `block_tables` is `[num_seqs, max_blocks]`.
    Paged {
        block_tables: &'a DevBuf<i32>,
        max_blocks: usize,
        block_size: usize,
    },
    /// Sequence `s` holds positions at slots `seq_base[s] ..`.
    Contiguous { seq_base: &'a DevBuf<i64> },
}

/// The query rows of one attention launch: row `r` attends positions `[lo, row_len[r])` of
/// sequence `row_seq[r]`, `lo` = [`window_start`](crate::launch::window_start)`(row_len[r],
/// window)`: 0 without a window (`window` 0), the last `window` positions of a sliding layer.
/// Positions before `lo` are never read, so the addressing need not map them.
pub struct Rows<'a> {
    pub row_seq: &'a DevBuf<i32>,
    pub row_len: &'a DevBuf<i32>,
    pub rows: usize,
    pub max_len: usize,
    pub window: usize,
}

/// Query-head rows one attention block computes (`ATTN_QROWS` in attention.cu): a query tile
/// is `ATTN_QROWS / group` rows, each K/V token read once per tile.
pub const ATTN_QROWS: usize = 32;

/// Query rows per tile for a group size (query heads per KV head).
pub fn tile_rows(group: usize) -> usize {
    (ATTN_QROWS / group.max(1)).max(1)
}

/// Query tiles of a launch: tile `t` is rows `row0[t] .. row0[t + 1]` (`count + 1` entries),
/// each at most [`tile_rows`] consecutive rows of one sequence (`model::batch::tiles`).
pub struct Tiles<'a> {
    pub row0: &'a DevBuf<i32>,
    pub count: usize,
}

/// Partition scratch for the log-sum-exp merge, grown on demand.
#[derive(Default)]
pub struct Workspace {
    part_out: Option<DevBuf<f32>>,
    part_max: Option<DevBuf<f32>>,
    part_sum: Option<DevBuf<f32>>,
}

impl Workspace {
    /// Allocates the partition scratch for `row_parts` (row, partition) pairs of `shape` now,
    /// so that no launch within that bound allocates (the device's free memory stays flat).
    pub fn reserve(
        &mut self,
        gpu: &Gpu,
        shape: AttnShape,
        row_parts: usize,
    ) -> Result<(), CudaError> {
        let m = row_parts * shape.q_heads;
        grow(gpu, &mut self.part_out, m * shape.head_dim)?;
        grow(gpu, &mut self.part_max, m)?;
        grow(gpu, &mut self.part_sum, m)
    }

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        [&self.part_out, &self.part_max, &self.part_sum]
            .iter()
            .map(|s| s.as_ref().map_or(0, |s| s.len() * 4))
            .sum()
    }
}

impl Gpu {
    /// Attention for `rows`, one block per row (and KV head and partition); `q` and `out` are
    /// `[rows, q_heads, head_dim]` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        layer: &DevLayer,
        addr: &Addressing<'_>,
        rows: &Rows<'_>,
        q: &DevBuf<f32>,
        out: &mut DevBuf<f32>,
        parts: Partitions,
        ws: &mut Workspace,
        scale: f32,
    ) -> Result<(), CudaError> {
        self.attention_tiled(layer, addr, rows, None, q, out, parts, ws, scale)
    }

    /// Attention for `rows` in query tiles (`None`: one row per tile). A row's output does not
    /// depend on the tiles: tiling changes only how often each K/V byte is read.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_tiled(
        &self,
        layer: &DevLayer,
        addr: &Addressing<'_>,
        rows: &Rows<'_>,
        tiles: Option<&Tiles<'_>>,
        q: &DevBuf<f32>,
        out: &mut DevBuf<f32>,
        parts: Partitions,
        ws: &mut Workspace,
        scale: f32,
    ) -> Result<(), CudaError> {
        let shape = layer.shape;
        shape.check()?;
        if rows.rows == 0 {
            return Ok(());
        }
        let q_elems = rows.rows * shape.q_row();
        if q.len() < q_elems || out.len() < q_elems {
            return Err(CudaError::Shape(
                "attention: q/out shorter than rows".into(),
            ));
        }
        if (parts.part_tokens as usize) * (parts.parts as usize) < rows.max_len {
            return Err(CudaError::Shape(
                "attention: partitions do not cover max_len".into(),
            ));
        }
        let (paged, tables, max_blocks, log2_bs, base) = match addr {
            Addressing::Paged {
                block_tables,
                max_blocks,
                block_size,
            } => (
                true,
                *block_tables,
                i32_of(*max_blocks, "max_blocks")?,
                log2_block_size(*block_size)? as i32,
                &self.dummy_i64,
            ),
            Addressing::Contiguous { seq_base } => (false, &self.dummy_i32, 0, 0, *seq_base),
        };
        let (tile_buf, ntiles, tiled) = match tiles {
            Some(t) => {
                if t.count == 0 || t.count > rows.rows || t.row0.len() <= t.count {
                    return Err(CudaError::Shape(format!(
                        "attention: {} tiles for {} rows ({} tile entries)",
                        t.count,
                        rows.rows,
                        t.row0.len()
                    )));
                }
                (t.row0, t.count, 1)
            }
            None => (&self.dummy_i32, rows.rows, 0),
        };
        let name = attn_kernel_name(paged, layer.k.dtype(), shape.head_dim, shape.group());
        let split = parts.parts > 1;
        if split {
            let n = q_elems * parts.parts as usize;
            let m = rows.rows * shape.q_heads * parts.parts as usize;
            grow(self, &mut ws.part_out, n)?;
            grow(self, &mut ws.part_max, m)?;
            grow(self, &mut ws.part_sum, m)?;
        }
        let kv_heads = i32_of(shape.kv_heads, "kv_heads")?;
        let part_tokens = parts.part_tokens as i32;
        let window = window_arg(rows.window)?;
        {
            let (po, pm, ps) = if split {
                (
                    ws.part_out.as_ref().unwrap_or(&self.dummy_f32),
                    ws.part_max.as_ref().unwrap_or(&self.dummy_f32),
                    ws.part_sum.as_ref().unwrap_or(&self.dummy_f32),
                )
            } else {
                (&self.dummy_f32, &self.dummy_f32, &self.dummy_f32)
            };
            let (k, v) = layer.kv_args()?;
            let grid = crate::launch::grid(
                shape.kv_heads,
                ntiles,
                parts.parts as usize,
                "kv_heads, query tiles, partitions",
            )?;
            // The caller checked tables/bases/lengths against the layer on the host, and the
            // tiles against the rows (`model::batch::tiles`); buffers hold rows x heads x
            // partitions as the kernel indexes them.
            self.launch(
                &name,
                grid,
                (ATTN_THREADS, 1, 1),
                0,
                &[
                    Arg::Buf(&*out),
                    Arg::Buf(po),
                    Arg::Buf(pm),
                    Arg::Buf(ps),
                    Arg::Buf(q),
                    k,
                    v,
                    Arg::Buf(rows.row_seq),
                    Arg::Buf(rows.row_len),
                    Arg::Buf(tables),
                    Arg::I32(max_blocks),
                    Arg::I32(log2_bs),
                    Arg::Buf(base),
                    Arg::I32(kv_heads),
                    Arg::I32(part_tokens),
                    Arg::F32(scale),
                    Arg::Buf(tile_buf),
                    Arg::I32(tiled),
                    Arg::I32(window),
                ],
            )?;
        }
        if split {
            let nparts = parts.parts as i32;
            let d = i32_of(shape.head_dim, "head_dim")?;
            let grid = crate::launch::grid(shape.q_heads, rows.rows, 1, "q_heads, rows, 1")?;
            // The partial buffers were sized for rows x q_heads x parts above.
            self.launch(
                "attn_merge",
                grid,
                (shape.head_dim as u32, 1, 1),
                0,
                &[
                    Arg::Buf(&*out),
                    Arg::Buf(ws.part_out.as_ref().unwrap_or(&self.dummy_f32)),
                    Arg::Buf(ws.part_max.as_ref().unwrap_or(&self.dummy_f32)),
                    Arg::Buf(ws.part_sum.as_ref().unwrap_or(&self.dummy_f32)),
                    Arg::Buf(rows.row_len),
                    Arg::I32(nparts),
                    Arg::I32(part_tokens),
                    Arg::I32(d),
                    Arg::I32(window),
                ],
            )?;
        }
        Ok(())
    }
}

fn grow(gpu: &Gpu, slot: &mut Option<DevBuf<f32>>, n: usize) -> Result<(), CudaError> {
    if slot.as_ref().is_none_or(|s| s.len() < n) {
        *slot = Some(gpu.zeros(n)?);
    }
    Ok(())
}
