//! Launchers of `model_ops.cu`'s kernels, each checking its buffers' lengths first (the kernels
//! trust their arguments).

use crate::runtime::{Arg, DevBuf};

use crate::device::Gpu;
use crate::error::CudaError;

/// Threads per block of the row kernels (a multiple of 32, as `block_sum` needs).
const ROW_THREADS: u32 = 256;
/// Most blocks of the grid-stride element-wise kernels.
const FLAT_BLOCKS: u32 = 1024;
/// Threads per block of the element-wise kernels.
const FLAT_THREADS: u32 = 256;

/// Blocks for `n` elements: one thread each up to [`FLAT_BLOCKS`] blocks (grid-stride beyond),
/// so a small step does not start a thousand idle blocks.
pub(crate) fn flat_grid(n: usize) -> (u32, u32, u32) {
    let blocks = n
        .div_ceil(FLAT_THREADS as usize)
        .clamp(1, FLAT_BLOCKS as usize);
    (blocks as u32, 1, 1)
}

/// One block of [`ROW_THREADS`] per row.
fn rows_grid(rows: usize) -> Result<(u32, u32, u32), CudaError> {
    crate::launch::grid(rows, 1, 1, "rows")
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
        x: &mut DevBuf<f32>,
        embed: &DevBuf<f32>,
        tokens: &DevBuf<i32>,
        rows: usize,
        d: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        need("embed_rows x", x.len(), rows * d)?;
        need("embed_rows tokens", tokens.len(), rows)?;
        let di = int(d, "d")?;
        // x holds rows x d; every token id < vocab was checked by batch::pack, and
        // embed holds vocab x d (weight plan).
        self.launch(
            "embed_rows",
            rows_grid(rows)?,
            (ROW_THREADS, 1, 1),
            0,
            &[Arg::Buf(x), Arg::Buf(embed), Arg::Buf(tokens), Arg::I32(di)],
        )
    }

    /// `out[i] = rmsnorm(x[i]) * gain` for `rows` rows of `d`.
    pub fn rms_norm(
        &self,
        out: &mut DevBuf<f32>,
        x: &DevBuf<f32>,
        gain: &DevBuf<f32>,
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
        // lengths checked above; one block per row.
        self.launch(
            "rms_norm",
            rows_grid(rows)?,
            (ROW_THREADS, 1, 1),
            0,
            &[
                Arg::Buf(out),
                Arg::Buf(x),
                Arg::Buf(gain),
                Arg::I32(di),
                Arg::F32(eps),
            ],
        )
    }

    /// `out[i] = rmsnorm(x[rows[i]]) * gain` for `n` gathered rows (`x` holds `x_rows`).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_gather(
        &self,
        out: &mut DevBuf<f32>,
        x: &DevBuf<f32>,
        gain: &DevBuf<f32>,
        rows: &DevBuf<i32>,
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
        // every gathered row index < x_rows was checked by batch::pack.
        self.launch(
            "rms_norm_gather",
            rows_grid(n)?,
            (ROW_THREADS, 1, 1),
            0,
            &[
                Arg::Buf(out),
                Arg::Buf(x),
                Arg::Buf(gain),
                Arg::Buf(rows),
                Arg::I32(di),
                Arg::F32(eps),
            ],
        )
    }

    /// RoPE in place over `rows` rows of `heads × head_dim`, with `[rows, head_dim/2]` tables.
    pub fn rope(
        &self,
        x: &mut DevBuf<f32>,
        cos: &DevBuf<f32>,
        sin: &DevBuf<f32>,
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
        // lengths checked above.
        self.launch(
            "rope",
            rows_grid(rows)?,
            (ROW_THREADS, 1, 1),
            0,
            &[
                Arg::Buf(x),
                Arg::Buf(cos),
                Arg::Buf(sin),
                Arg::I32(h),
                Arg::I32(hd),
            ],
        )
    }

    /// `gate = silu(gate) * up` over `n` elements.
    pub fn silu_mul(
        &self,
        gate: &mut DevBuf<f32>,
        up: &DevBuf<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        need("silu_mul gate", gate.len(), n)?;
        need("silu_mul up", up.len(), n)?;
        let ni = n as i64;
        // both hold n elements.
        self.launch(
            "silu_mul",
            flat_grid(n),
            (FLAT_THREADS, 1, 1),
            0,
            &[Arg::Buf(gate), Arg::Buf(up), Arg::I64(ni)],
        )
    }

    /// `x += y` over `n` elements.
    pub fn add_in_place(
        &self,
        x: &mut DevBuf<f32>,
        y: &DevBuf<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        need("add x", x.len(), n)?;
        need("add y", y.len(), n)?;
        let ni = n as i64;
        // both hold n elements.
        self.launch(
            "add_in_place",
            flat_grid(n),
            (FLAT_THREADS, 1, 1),
            0,
            &[Arg::Buf(x), Arg::Buf(y), Arg::I64(ni)],
        )
    }

    /// `out = bf16(x)` over `n` elements.
    pub fn to_bf16(
        &self,
        out: &mut DevBuf<u16>,
        x: &DevBuf<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        need("to_bf16 out", out.len(), n)?;
        need("to_bf16 x", x.len(), n)?;
        let ni = n as i64;
        // both hold n elements.
        self.launch(
            "to_bf16",
            flat_grid(n),
            (FLAT_THREADS, 1, 1),
            0,
            &[Arg::Buf(out), Arg::Buf(x), Arg::I64(ni)],
        )
    }

    /// `out[r]` = the greedy token of logits row `r`, for `rows` rows of `vocab`.
    pub fn argmax_rows(
        &self,
        out: &mut DevBuf<i32>,
        logits: &DevBuf<f32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        need("argmax out", out.len(), rows)?;
        need("argmax logits", logits.len(), rows * vocab)?;
        let v = int(vocab, "vocab")?;
        // lengths checked; blockDim must equal ARGMAX_THREADS (256) in model_ops.cu.
        self.launch(
            "argmax_rows",
            rows_grid(rows)?,
            (ROW_THREADS, 1, 1),
            0,
            &[Arg::Buf(out), Arg::Buf(logits), Arg::I32(v)],
        )
    }
}
