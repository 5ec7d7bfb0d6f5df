//! GEMMs through cuBLAS (loaded at run time by cudarc): row-major `C[rows, m] = A[rows, k] ·
//! W[k, m]` with A and C f32, W f32 (32F compute, no TF32) or bf16 (A rounded to bf16 first,
//! f32 accumulation and output), issued in tiles of [`ROW_TILE`] rows so every call has one
//! shape (batch invariance: a row's result cannot depend on the rest of the batch).

use super::sizes::{padded_rows, ROW_TILE};
use crate::device::Gpu;
use crate::error::CudaError;
use crate::runtime::{DevBuf, GemmArgs, GemmIn};

/// A weight matrix on the device, row-major `[k, m]`.
pub enum WeightBuf {
    F32(DevBuf<f32>),
    /// bf16 bits.
    Bf16(DevBuf<u16>),
}

impl WeightBuf {
    pub fn len(&self) -> usize {
        match self {
            WeightBuf::F32(s) => s.len(),
            WeightBuf::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A cuBLAS handle on the GPU's stream.
pub struct Blas {
    _private: (),
}

impl Blas {
    pub fn new(gpu: &Gpu) -> Result<Blas, CudaError> {
        gpu.init_blas()?;
        Ok(Blas { _private: () })
    }

    /// `c[..rows] = a[..rows] · w` in tiles of [`ROW_TILE`] rows; `a` and `c` must hold whole
    /// tiles (`padded_rows(rows)`), `staging` (bf16 weights only) `padded_rows(rows) × k`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        gpu: &Gpu,
        a: &DevBuf<f32>,
        staging: Option<&mut DevBuf<u16>>,
        w: &WeightBuf,
        c: &mut DevBuf<f32>,
        rows: usize,
        k: usize,
        m: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        let padded = padded_rows(rows);
        if a.len() < padded * k || c.len() < padded * m || w.len() != k * m {
            return Err(CudaError::Shape(format!(
                "GEMM [{rows}x{k}]·[{k}x{m}]: buffers of {}, {} and {} elements",
                a.len(),
                w.len(),
                c.len()
            )));
        }
        let tiles = padded / ROW_TILE;
        match w {
            WeightBuf::F32(wb) => {
                gemm_tiles(gpu, GemmIn::F32(wb), GemmIn::F32(a), c, (tiles, k, m))
            }
            WeightBuf::Bf16(wb) => {
                let staging = staging
                    .ok_or_else(|| CudaError::Shape("bf16 GEMM without a staging buffer".into()))?;
                if staging.len() < padded * k {
                    return Err(CudaError::Shape("bf16 staging buffer too small".into()));
                }
                gpu.to_bf16(staging, a, padded * k)?;
                gemm_tiles(
                    gpu,
                    GemmIn::Bf16(wb),
                    GemmIn::Bf16(staging),
                    c,
                    (tiles, k, m),
                )
            }
        }
    }
}

/// One `cublasGemmEx` per tile of [`ROW_TILE`] rows. Row-major `C[rows, m] = A[rows, k] ·
/// W[k, m]` is column-major `Cᵀ = Wᵀ · Aᵀ`: cuBLAS's A is W (`m × k`, ld m), its B is the
/// tile's rows of A (`k × ROW_TILE`, ld k), its C the tile's rows of C (ld m), 32F compute.
fn gemm_tiles(
    gpu: &Gpu,
    w: GemmIn<'_>,
    a: GemmIn<'_>,
    c: &mut DevBuf<f32>,
    (tiles, k, m): (usize, usize, usize),
) -> Result<(), CudaError> {
    for t in 0..tiles {
        let r0 = t * ROW_TILE;
        gpu.gemm_ex(GemmArgs {
            trans_a: false,
            trans_b: false,
            m,
            n: ROW_TILE,
            k,
            alpha: 1.0,
            beta: 0.0,
            a: w,
            a_off: 0,
            lda: m,
            b: a,
            b_off: r0 * k,
            ldb: k,
            c: &mut *c,
            c_off: r0 * m,
            ldc: m,
        })?;
    }
    Ok(())
}
