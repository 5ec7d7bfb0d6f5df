//! Launchers of `model_ops.cu`'s kernels, each checking its buffers' lengths first (the kernels
//! trust their arguments).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::Gpu;
use crate::error::CudaError;

/// Threads per block of the row kernels (a multiple of 32, as `block_sum` needs).
const ROW_THREADS: u32 = 256;
/// Grid of the grid-stride element-wise kernels.
const FLAT_BLOCKS: u32 = 1024;

fn rows_cfg(rows: usize) -> Result<LaunchConfig, CudaError> {
    Ok(LaunchConfig {
        grid_dim: crate::launch::grid(rows, 1, 1, "rows")?,
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn flat_cfg() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (FLAT_BLOCKS, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn need(what: &str, len: usize, n: usize) -> Result<(), CudaError> {
    if len < n {
        return Err(CudaError::Shape(format!(
            "{what}: buffer of {len} elements, launch needs {n}"
        )));
    }
    Ok(())
}

fn int(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Shape(format!("{what} {n} exceeds i32")))
}

impl Gpu {
    /// `x[i] = embed[tokens[i]]` for `rows` rows of `d` (token ids checked on the host).
    pub fn embed_rows(
        &self,
        x: &mut CudaSlice<f32>,
        embed: &CudaSlice<f32>,
        tokens: &CudaSlice<i32>,
        rows: usize,
        d: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        need("embed_rows x", x.len(), rows * d)?;
        need("embed_rows tokens", tokens.len(), rows)?;
        let di = int(d, "d")?;
        let mut b = self.stream.launch_builder(self.kernel("embed_rows")?);
        b.arg(x).arg(embed).arg(tokens).arg(&di);
        // SAFETY: x holds rows x d; every token id < vocab was checked by batch::pack, and
        // embed holds vocab x d (weight plan).
        unsafe { b.launch(rows_cfg(rows)?) }.map_err(CudaError::driver("embed_rows"))?;
        Ok(())
    }

    /// `out[i] = rmsnorm(x[i]) * gain` for `rows` rows of `d`.
    pub fn rms_norm(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        gain: &CudaSlice<f32>,
        rows: usize,
        d: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        need("rms_norm out", out.len(), rows * d)?;
        need("rms_norm x", x.len(), rows * d)?;
        need("rms_norm gain", gain.len(), d)?;
        let di = int(d, "d")?;
        let mut b = self.stream.launch_builder(self.kernel("rms_norm")?);
        b.arg(out).arg(x).arg(gain).arg(&di).arg(&eps);
        // SAFETY: lengths checked above; one block per row.
        unsafe { b.launch(rows_cfg(rows)?) }.map_err(CudaError::driver("rms_norm"))?;
        Ok(())
    }

    /// `out[i] = rmsnorm(x[rows[i]]) * gain` for `n` gathered rows (`x` holds `x_rows`).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_gather(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        gain: &CudaSlice<f32>,
        rows: &CudaSlice<i32>,
        n: usize,
        x_rows: usize,
        d: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        need("rms_norm_gather out", out.len(), n * d)?;
        need("rms_norm_gather x", x.len(), x_rows * d)?;
        need("rms_norm_gather rows", rows.len(), n)?;
        need("rms_norm_gather gain", gain.len(), d)?;
        let di = int(d, "d")?;
        let mut b = self.stream.launch_builder(self.kernel("rms_norm_gather")?);
        b.arg(out).arg(x).arg(gain).arg(rows).arg(&di).arg(&eps);
        // SAFETY: every gathered row index < x_rows was checked by batch::pack.
        unsafe { b.launch(rows_cfg(n)?) }.map_err(CudaError::driver("rms_norm_gather"))?;
        Ok(())
    }

    /// RoPE in place over `rows` rows of `heads × head_dim`, with `[rows, head_dim/2]` tables.
    pub fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
        rows: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        need("rope x", x.len(), rows * heads * head_dim)?;
        need("rope cos", cos.len(), rows * head_dim / 2)?;
        need("rope sin", sin.len(), rows * head_dim / 2)?;
        let (h, hd) = (int(heads, "heads")?, int(head_dim, "head_dim")?);
        let mut b = self.stream.launch_builder(self.kernel("rope")?);
        b.arg(x).arg(cos).arg(sin).arg(&h).arg(&hd);
        // SAFETY: lengths checked above.
        unsafe { b.launch(rows_cfg(rows)?) }.map_err(CudaError::driver("rope"))?;
        Ok(())
    }

    /// `gate = silu(gate) * up` over `n` elements.
    pub fn silu_mul(
        &self,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        need("silu_mul gate", gate.len(), n)?;
        need("silu_mul up", up.len(), n)?;
        let ni = n as i64;
        let mut b = self.stream.launch_builder(self.kernel("silu_mul")?);
        b.arg(gate).arg(up).arg(&ni);
        // SAFETY: both hold n elements.
        unsafe { b.launch(flat_cfg()) }.map_err(CudaError::driver("silu_mul"))?;
        Ok(())
    }

    /// `x += y` over `n` elements.
    pub fn add_in_place(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        need("add x", x.len(), n)?;
        need("add y", y.len(), n)?;
        let ni = n as i64;
        let mut b = self.stream.launch_builder(self.kernel("add_in_place")?);
        b.arg(x).arg(y).arg(&ni);
        // SAFETY: both hold n elements.
        unsafe { b.launch(flat_cfg()) }.map_err(CudaError::driver("add_in_place"))?;
        Ok(())
    }

    /// `out = bf16(x)` over `n` elements.
    pub fn to_bf16(
        &self,
        out: &mut CudaSlice<u16>,
        x: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        need("to_bf16 out", out.len(), n)?;
        need("to_bf16 x", x.len(), n)?;
        let ni = n as i64;
        let mut b = self.stream.launch_builder(self.kernel("to_bf16")?);
        b.arg(out).arg(x).arg(&ni);
        // SAFETY: both hold n elements.
        unsafe { b.launch(flat_cfg()) }.map_err(CudaError::driver("to_bf16"))?;
        Ok(())
    }

    /// `out[r]` = the greedy token of logits row `r`, for `rows` rows of `vocab`.
    pub fn argmax_rows(
        &self,
        out: &mut CudaSlice<i32>,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        need("argmax out", out.len(), rows)?;
        need("argmax logits", logits.len(), rows * vocab)?;
        let v = int(vocab, "vocab")?;
        let mut b = self.stream.launch_builder(self.kernel("argmax_rows")?);
        b.arg(out).arg(logits).arg(&v);
        // SAFETY: lengths checked; blockDim must equal ARGMAX_THREADS (256) in model_ops.cu.
        unsafe { b.launch(rows_cfg(rows)?) }.map_err(CudaError::driver("argmax_rows"))?;
        Ok(())
    }
}
