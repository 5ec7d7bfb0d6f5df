//! The model on the device: weights uploaded once, every workspace buffer allocated once
//! ([`WorkspacePlan`]), and one step's forward pass enqueued on the GPU's stream with its
//! logits copied to page-locked host memory (two buffers, so a step's results survive while the
//! next one is enqueued). Nothing here waits for the device except [`DevModel::read_fetched`].

use super::batch::{tiles, PackedAddr, StepBatch};
use super::blas::{Blas, WeightBuf};
use super::sizes::{plan_slices, weight_bytes, WorkspacePlan};
use super::{HostWeights, ModelDims, WeightDtype};
use crate::device::{tile_rows, Addressing, DevLayer, Gpu, Rows, Tiles, Workspace};
use crate::error::CudaError;
use crate::launch::{fixed_partitions, ATTN_MAX_PART_TOKENS};
use crate::runtime::{DevBuf, Elem, Event, HostBuf};

/// Steps that may be in flight at once (the engine's async depth).
pub const RING: usize = 2;

struct LayerW {
    attn_norm: DevBuf<f32>,
    wq: WeightBuf,
    wk: WeightBuf,
    wv: WeightBuf,
    wo: WeightBuf,
    mlp_norm: DevBuf<f32>,
    w_gate: WeightBuf,
    w_up: WeightBuf,
    w_down: WeightBuf,
}

/// Counts device allocations (the ledger's allowance is per allocation).
struct Alloc<'g> {
    gpu: &'g Gpu,
    count: u64,
}

impl Alloc<'_> {
    fn zeros<T: Elem>(&mut self, n: usize) -> Result<DevBuf<T>, CudaError> {
        self.count += 1;
        self.gpu.zeros(n)
    }

    fn norm(&mut self, host: &[f32]) -> Result<DevBuf<f32>, CudaError> {
        self.count += 1;
        self.gpu.upload(host)
    }

    fn matrix(&mut self, host: &[f32], dtype: WeightDtype) -> Result<WeightBuf, CudaError> {
        self.count += 1;
        Ok(match dtype {
            WeightDtype::F32 => WeightBuf::F32(self.gpu.upload(host)?),
            WeightDtype::Bf16 => {
                let bits: Vec<u16> = host
                    .iter()
                    .map(|&x| half::bf16::from_f32(x).to_bits())
                    .collect();
                WeightBuf::Bf16(self.gpu.upload(&bits)?)
            }
        })
    }
}

fn pinned<T: Elem>(gpu: &Gpu, n: usize) -> Result<HostBuf<T>, CudaError> {
    // Read only after a device-to-host copy into it completed (read_fetched).
    gpu.pinned_buf(n)
}

pub struct DevModel {
    pub dims: ModelDims,
    pub dtype: WeightDtype,
    pub plan: WorkspacePlan,
    /// Device allocations made (weights and workspace).
    pub allocations: u64,
    /// Per layer, its sliding window in tokens (0: full attention). A windowed layer reads the
    /// last `window` positions of each row only; the block tables still map every block.
    windows: Vec<usize>,
    blas: Blas,
    embed: DevBuf<f32>,
    layers: Vec<LayerW>,
    final_norm: DevBuf<f32>,
    lm_head: WeightBuf,
    x: DevBuf<f32>,
    h: DevBuf<f32>,
    proj: DevBuf<f32>,
    q: DevBuf<f32>,
    att: DevBuf<f32>,
    k: DevBuf<f32>,
    v: DevBuf<f32>,
    gate: DevBuf<f32>,
    up: DevBuf<f32>,
    last: DevBuf<f32>,
    logits: Vec<DevBuf<f32>>,
    cos: DevBuf<f32>,
    sin: DevBuf<f32>,
    q_chunk: DevBuf<f32>,
    out_chunk: DevBuf<f32>,
    staging: Option<DevBuf<u16>>,
    tokens: DevBuf<i32>,
    row_seq: DevBuf<i32>,
    row_len: DevBuf<i32>,
    chunk_seq: DevBuf<i32>,
    chunk_len: DevBuf<i32>,
    tiles: DevBuf<i32>,
    chunk_tiles: DevBuf<i32>,
    logit_rows: DevBuf<i32>,
    argmax: Vec<DevBuf<i32>>,
    tables: DevBuf<i32>,
    slots: DevBuf<i64>,
    seq_base: DevBuf<i64>,
    pairs: DevBuf<i64>,
    attn_ws: Workspace,
    host_logits: Vec<HostBuf<f32>>,
    host_argmax: Vec<HostBuf<i32>>,
}

fn up<T: Elem>(gpu: &Gpu, host: &[T], dev: &mut DevBuf<T>) -> Result<(), CudaError> {
    if host.len() > dev.len() {
        return Err(CudaError::Shape(format!(
            "step input of {} elements, buffer of {}",
            host.len(),
            dev.len()
        )));
    }
    gpu.htod(host, dev, 0)
}

impl DevModel {
    /// Uploads `weights` (bf16-rounded if `dtype` is bf16) and allocates the workspace for
    /// steps of at most `max_tokens` tokens over a cache of `num_blocks` blocks; then runs
    /// every GEMM shape once so cuBLAS's lazy allocations happen now, not during a run.
    pub fn new(
        gpu: &Gpu,
        dims: ModelDims,
        dtype: WeightDtype,
        weights: &HostWeights<'_>,
        max_tokens: usize,
        num_blocks: usize,
    ) -> Result<DevModel, CudaError> {
        dims.attn_shape().check()?;
        let slices = plan_slices(&dims, weights)?;
        let plan = WorkspacePlan::new(&dims, dtype, max_tokens, num_blocks);
        let mut a = Alloc { gpu, count: 0 };
        let mut it = slices.into_iter();
        let mut next = || {
            it.next()
                .ok_or_else(|| CudaError::Shape("weight plan shorter than the model".into()))
        };
        let embed = a.norm(next()?)?;
        let mut layers = Vec::with_capacity(dims.layers);
        for _ in 0..dims.layers {
            layers.push(LayerW {
                attn_norm: a.norm(next()?)?,
                wq: a.matrix(next()?, dtype)?,
                wk: a.matrix(next()?, dtype)?,
                wv: a.matrix(next()?, dtype)?,
                wo: a.matrix(next()?, dtype)?,
                mlp_norm: a.norm(next()?)?,
                w_gate: a.matrix(next()?, dtype)?,
                w_up: a.matrix(next()?, dtype)?,
                w_down: a.matrix(next()?, dtype)?,
            });
        }
        let final_norm = a.norm(next()?)?;
        let lm_head = a.matrix(next()?, dtype)?;
        let (r, d) = (plan.rows, &dims);
        let lr = plan.logit_rows;
        let half = d.head_dim / 2;
        let cr = plan.chunk_rows();
        let mut attn_ws = Workspace::default();
        attn_ws.reserve(gpu, d.attn_shape(), plan.attn_row_parts)?;
        a.count += 3;
        let mut m = DevModel {
            dims,
            dtype,
            plan,
            allocations: 0,
            windows: vec![0; dims.layers],
            blas: Blas::new(gpu)?,
            embed,
            layers,
            final_norm,
            lm_head,
            x: a.zeros(r * d.d_model)?,
            h: a.zeros(r * d.d_model)?,
            proj: a.zeros(r * d.d_model)?,
            q: a.zeros(r * d.q_dim())?,
            att: a.zeros(r * d.q_dim())?,
            k: a.zeros(r * d.kv_dim())?,
            v: a.zeros(r * d.kv_dim())?,
            gate: a.zeros(r * d.ffn_dim)?,
            up: a.zeros(r * d.ffn_dim)?,
            last: a.zeros(lr * d.d_model)?,
            logits: vec![a.zeros(lr * d.vocab)?, a.zeros(lr * d.vocab)?],
            cos: a.zeros(r * half)?,
            sin: a.zeros(r * half)?,
            q_chunk: a.zeros(cr * d.q_dim())?,
            out_chunk: a.zeros(cr * d.q_dim())?,
            staging: match dtype {
                WeightDtype::F32 => None,
                WeightDtype::Bf16 => Some(a.zeros(plan.bf16_elems())?),
            },
            tokens: a.zeros(r)?,
            row_seq: a.zeros(r)?,
            row_len: a.zeros(r)?,
            chunk_seq: a.zeros(cr)?,
            chunk_len: a.zeros(cr)?,
            tiles: a.zeros(r + 1)?,
            chunk_tiles: a.zeros(cr + 1)?,
            logit_rows: a.zeros(lr)?,
            argmax: vec![a.zeros(lr)?, a.zeros(lr)?],
            tables: a.zeros(plan.table_entries)?,
            slots: a.zeros(r)?,
            seq_base: a.zeros(r)?,
            pairs: a.zeros(2 * super::sizes::COPY_PAIRS_PER_LAUNCH)?,
            attn_ws,
            host_logits: vec![pinned(gpu, lr * d.vocab)?, pinned(gpu, lr * d.vocab)?],
            host_argmax: vec![pinned(gpu, lr)?, pinned(gpu, lr)?],
        };
        m.allocations = a.count;
        m.warm_up(gpu)?;
        Ok(m)
    }

    /// Sets each layer's sliding window (0: full attention), one entry per layer: the model's
    /// sliding layers then attend `(p − window, p]` as `kvbench-kernels`' sliding layers do.
    pub fn set_windows(&mut self, windows: &[usize]) -> Result<(), CudaError> {
        if windows.len() != self.dims.layers {
            return Err(CudaError::Shape(format!(
                "{} layer windows for a model of {} layers",
                windows.len(),
                self.dims.layers
            )));
        }
        for &w in windows {
            crate::launch::window_arg(w)?;
        }
        self.windows = windows.to_vec();
        Ok(())
    }

    /// Each layer's sliding window (0: full attention).
    pub fn windows(&self) -> &[usize] {
        &self.windows
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        weight_bytes(&self.dims, self.dtype) as u64
    }

    /// Bytes of workspace on the device.
    pub fn workspace_bytes(&self) -> u64 {
        self.plan.bytes() as u64
    }

    /// One tile through every GEMM shape, then a sync.
    fn warm_up(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        let d = self.dims;
        let s = self;
        if let Some(l) = s.layers.first() {
            s.blas.gemm(
                gpu,
                &s.h,
                s.staging.as_mut(),
                &l.wq,
                &mut s.q,
                1,
                d.d_model,
                d.q_dim(),
            )?;
            s.blas.gemm(
                gpu,
                &s.h,
                s.staging.as_mut(),
                &l.wk,
                &mut s.k,
                1,
                d.d_model,
                d.kv_dim(),
            )?;
            s.blas.gemm(
                gpu,
                &s.att,
                s.staging.as_mut(),
                &l.wo,
                &mut s.proj,
                1,
                d.q_dim(),
                d.d_model,
            )?;
            s.blas.gemm(
                gpu,
                &s.h,
                s.staging.as_mut(),
                &l.w_gate,
                &mut s.gate,
                1,
                d.d_model,
                d.ffn_dim,
            )?;
            s.blas.gemm(
                gpu,
                &s.gate,
                s.staging.as_mut(),
                &l.w_down,
                &mut s.proj,
                1,
                d.ffn_dim,
                d.d_model,
            )?;
        }
        s.blas.gemm(
            gpu,
            &s.last,
            s.staging.as_mut(),
            &s.lm_head,
            &mut s.logits[0],
            1,
            d.d_model,
            d.vocab,
        )?;
        gpu.sync()
    }

    /// Performs `launches` (from [`super::batch::copy_launches`]) on every layer, in order.
    pub fn copy(
        &mut self,
        gpu: &Gpu,
        kv: &mut [DevLayer],
        launches: &[Vec<i64>],
    ) -> Result<(), CudaError> {
        for pairs in launches {
            up(gpu, pairs, &mut self.pairs)?;
            for layer in kv.iter_mut() {
                gpu.copy_slots(layer, &self.pairs, pairs.len() / 2)?;
            }
        }
        Ok(())
    }

    /// Enqueues the forward pass of `b` (packed for these layers' `num_slots`), writing every
    /// new token's K/V and leaving the wanted rows' logits and greedy tokens in buffer `ring`.
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        kv: &mut [DevLayer],
        b: &StepBatch,
        ring: usize,
    ) -> Result<(), CudaError> {
        let d = self.dims;
        let s = self;
        let n = b.rows();
        let nl = b.logit_rows.len();
        if ring >= RING || kv.len() != d.layers {
            return Err(CudaError::Shape(
                "forward: bad ring slot or layer count".into(),
            ));
        }
        if n > s.plan.rows {
            return Err(CudaError::Shape(format!(
                "step of {n} tokens; the workspace holds {} (max_tokens_per_step)",
                s.plan.rows
            )));
        }
        if nl > s.plan.logit_rows {
            return Err(CudaError::Shape(format!(
                "step samples {nl} sequences; the logits buffers hold {}",
                s.plan.logit_rows
            )));
        }
        if n == 0 {
            return Ok(());
        }
        up(gpu, &b.tokens, &mut s.tokens)?;
        up(gpu, &b.slots, &mut s.slots)?;
        up(gpu, &b.cos, &mut s.cos)?;
        up(gpu, &b.sin, &mut s.sin)?;
        up(gpu, &b.row_seq, &mut s.row_seq)?;
        up(gpu, &b.row_len, &mut s.row_len)?;
        up(gpu, &b.logit_rows, &mut s.logit_rows)?;
        // Query tiles: a prefill chunk's rows share each K/V read; a row's output does not
        // depend on its tile, so the tiling may differ between steps and runs.
        let tq = tile_rows(d.attn_shape().group());
        let step_tiles = tiles(&b.row_seq, &b.row_len, tq);
        up(gpu, &step_tiles, &mut s.tiles)?;
        match &b.addr {
            PackedAddr::Paged { tables, .. } => {
                if tables.len() > s.plan.table_entries {
                    return Err(CudaError::Shape(format!(
                        "block tables of {} entries; the device buffer holds {}",
                        tables.len(),
                        s.plan.table_entries
                    )));
                }
                up(gpu, tables, &mut s.tables)?
            }
            PackedAddr::Contiguous { seq_base } => up(gpu, seq_base, &mut s.seq_base)?,
        }
        let (dm, qd, kvd, f) = (d.d_model, d.q_dim(), d.kv_dim(), d.ffn_dim);
        let eps = d.norm_eps;
        let scale = 1.0 / (d.head_dim as f32).sqrt();
        gpu.embed_rows(&mut s.x, &s.embed, &s.tokens, n, dm)?;
        // Partitions of a fixed size, not planned from the batch: a row's attention then
        // depends on its own length only (batch invariance), whatever else the step holds.
        let parts = fixed_partitions(b.max_len, ATTN_MAX_PART_TOKENS);
        for (l, layer) in kv.iter_mut().enumerate() {
            let lw = &s.layers[l];
            let window = s.windows.get(l).copied().unwrap_or(0);
            let st = &mut s.staging;
            gpu.rms_norm(&mut s.h, &s.x, &lw.attn_norm, n, dm, eps)?;
            s.blas
                .gemm(gpu, &s.h, st.as_mut(), &lw.wq, &mut s.q, n, dm, qd)?;
            s.blas
                .gemm(gpu, &s.h, st.as_mut(), &lw.wk, &mut s.k, n, dm, kvd)?;
            s.blas
                .gemm(gpu, &s.h, st.as_mut(), &lw.wv, &mut s.v, n, dm, kvd)?;
            gpu.rope(&mut s.q, &s.cos, &s.sin, n, d.q_heads, d.head_dim)?;
            gpu.rope(&mut s.k, &s.cos, &s.sin, n, d.kv_heads, d.head_dim)?;
            gpu.write_kv(layer, &s.k, &s.v, &s.slots, n)?;
            let addr = match &b.addr {
                PackedAddr::Paged {
                    max_blocks,
                    block_size,
                    ..
                } => Addressing::Paged {
                    block_tables: &s.tables,
                    max_blocks: *max_blocks,
                    block_size: *block_size,
                },
                PackedAddr::Contiguous { .. } => Addressing::Contiguous {
                    seq_base: &s.seq_base,
                },
            };
            if n * parts.parts as usize <= s.plan.attn_row_parts {
                let rows = Rows {
                    row_seq: &s.row_seq,
                    row_len: &s.row_len,
                    rows: n,
                    max_len: b.max_len,
                    window,
                };
                let t = Tiles {
                    row0: &s.tiles,
                    count: step_tiles.len() - 1,
                };
                gpu.attention_tiled(
                    layer,
                    &addr,
                    &rows,
                    Some(&t),
                    &s.q,
                    &mut s.att,
                    parts,
                    &mut s.attn_ws,
                    scale,
                )?;
            } else {
                // Rows in chunks whose partials fit the scratch: q rows copied in, out rows
                // copied back (stream order keeps the reuse of the chunk buffers safe).
                let per =
                    (s.plan.attn_row_parts / parts.parts as usize).clamp(1, s.plan.chunk_rows());
                let mut r0 = 0;
                while r0 < n {
                    let r1 = (r0 + per).min(n);
                    let m = r1 - r0;
                    up(gpu, &b.row_seq[r0..r1], &mut s.chunk_seq)?;
                    up(gpu, &b.row_len[r0..r1], &mut s.chunk_len)?;
                    let ct = tiles(&b.row_seq[r0..r1], &b.row_len[r0..r1], tq);
                    up(gpu, &ct, &mut s.chunk_tiles)?;
                    let max_len = b.row_len[r0..r1].iter().copied().max().unwrap_or(1) as usize;
                    gpu.dtod(&s.q, r0 * qd, &mut s.q_chunk, 0, m * qd)?;
                    let rows = Rows {
                        row_seq: &s.chunk_seq,
                        row_len: &s.chunk_len,
                        rows: m,
                        max_len,
                        window,
                    };
                    let p = fixed_partitions(max_len, parts.part_tokens);
                    let t = Tiles {
                        row0: &s.chunk_tiles,
                        count: ct.len() - 1,
                    };
                    gpu.attention_tiled(
                        layer,
                        &addr,
                        &rows,
                        Some(&t),
                        &s.q_chunk,
                        &mut s.out_chunk,
                        p,
                        &mut s.attn_ws,
                        scale,
                    )?;
                    gpu.dtod(&s.out_chunk, 0, &mut s.att, r0 * qd, m * qd)?;
                    r0 = r1;
                }
            }
            s.blas
                .gemm(gpu, &s.att, st.as_mut(), &lw.wo, &mut s.proj, n, qd, dm)?;
            gpu.add_in_place(&mut s.x, &s.proj, n * dm)?;
            gpu.rms_norm(&mut s.h, &s.x, &lw.mlp_norm, n, dm, eps)?;
            s.blas
                .gemm(gpu, &s.h, st.as_mut(), &lw.w_gate, &mut s.gate, n, dm, f)?;
            s.blas
                .gemm(gpu, &s.h, st.as_mut(), &lw.w_up, &mut s.up, n, dm, f)?;
            gpu.silu_mul(&mut s.gate, &s.up, n * f)?;
            s.blas
                .gemm(gpu, &s.gate, st.as_mut(), &lw.w_down, &mut s.proj, n, f, dm)?;
            gpu.add_in_place(&mut s.x, &s.proj, n * dm)?;
        }
        if nl > 0 {
            gpu.rms_norm_gather(
                &mut s.last,
                &s.x,
                &s.final_norm,
                &s.logit_rows,
                nl,
                n,
                dm,
                eps,
            )?;
            let logits = &mut s.logits[ring];
            s.blas.gemm(
                gpu,
                &s.last,
                s.staging.as_mut(),
                &s.lm_head,
                logits,
                nl,
                dm,
                d.vocab,
            )?;
            gpu.argmax_rows(&mut s.argmax[ring], logits, nl, d.vocab)?;
        }
        Ok(())
    }

    /// Enqueues the copy of buffer `ring`'s first `rows` logits rows and tokens to host memory.
    pub fn enqueue_fetch(&mut self, gpu: &Gpu, ring: usize, rows: usize) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        let v = self.dims.vocab;
        if ring >= RING || rows > self.plan.logit_rows {
            return Err(CudaError::Shape("fetch: bad ring slot or row count".into()));
        }
        // Only what is read is copied: rows x vocab, not the whole logit_rows x vocab buffer
        // (at 8B: 512 x 128,256 x 4 B per step).
        gpu.dtoh_async(
            &self.logits[ring],
            0,
            &mut self.host_logits[ring],
            0,
            rows * v,
        )?;
        gpu.dtoh_async(&self.argmax[ring], 0, &mut self.host_argmax[ring], 0, rows)
    }

    /// Ends a step enqueued by [`forward`](Self::forward): queues the fetch of its first
    /// `rows` logits rows and greedy tokens, then records `end` after them, so that waiting on
    /// `end` is all [`read_fetched`](Self::read_fetched) needs (the pinned buffers carry no
    /// event of their own).
    pub fn finish_step(
        &mut self,
        gpu: &Gpu,
        ring: usize,
        rows: usize,
        end: &Event,
    ) -> Result<(), CudaError> {
        self.enqueue_fetch(gpu, ring, rows)?;
        gpu.record(end)
    }

    /// Buffer `ring`'s logits on the device (tests write known values into it).
    pub fn logits_buffer(&mut self, ring: usize) -> Option<&mut DevBuf<f32>> {
        self.logits.get_mut(ring)
    }

    /// Buffer `ring`'s fetched rows, once the caller waited on the step's end event (see
    /// [`finish_step`](Self::finish_step)): returns its first `rows` logits rows (`[rows,
    /// vocab]`, borrowed: the caller copies only the rows it keeps) and greedy tokens.
    pub fn read_fetched(&self, ring: usize, rows: usize) -> Result<(&[f32], &[i32]), CudaError> {
        if rows == 0 {
            return Ok((&[], &[]));
        }
        let v = self.dims.vocab;
        if ring >= RING || rows > self.plan.logit_rows {
            return Err(CudaError::Shape("read: bad ring slot or row count".into()));
        }
        let l = self.host_logits[ring].as_slice()?;
        let t = self.host_argmax[ring].as_slice()?;
        Ok((&l[..rows * v], &t[..rows]))
    }
}
