//! GEMMs through cuBLAS (loaded at run time by cudarc): row-major `C[rows, m] = A[rows, k] ·
//! W[k, m]` with A and C f32, W f32 (32F compute, no TF32) or bf16 (A rounded to bf16 first,
//! f32 accumulation and output), issued in tiles of [`ROW_TILE`] rows so every call has one
//! shape (batch invariance: a row's result cannot depend on the rest of the batch).

use std::ffi::c_void;

use cudarc::cublas::{result as cublas, sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use super::sizes::{padded_rows, ROW_TILE};
use crate::device::Gpu;
use crate::error::CudaError;
use crate::libs::{guarded, CudaLib};

/// A weight matrix on the device, row-major `[k, m]`.
pub enum WeightBuf {
    F32(CudaSlice<f32>),
    /// bf16 bits.
    Bf16(CudaSlice<u16>),
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

fn blas_err(call: &'static str) -> impl FnOnce(cublas::CublasError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

fn c_int(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Shape(format!("GEMM {what} {n} exceeds int")))
}

/// A cuBLAS handle on the GPU's stream.
pub struct Blas {
    handle: CudaBlas,
}

impl Blas {
    pub fn new(gpu: &Gpu) -> Result<Blas, CudaError> {
        let handle = guarded(CudaLib::Cublas, || CudaBlas::new(gpu.stream.clone()))?
            .map_err(blas_err("cublasCreate"))?;
        Ok(Blas { handle })
    }

    /// `c[..rows] = a[..rows] · w` in tiles of [`ROW_TILE`] rows; `a` and `c` must hold whole
    /// tiles (`padded_rows(rows)`), `staging` (bf16 weights only) `padded_rows(rows) × k`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        gpu: &Gpu,
        a: &CudaSlice<f32>,
        staging: Option<&mut CudaSlice<u16>>,
        w: &WeightBuf,
        c: &mut CudaSlice<f32>,
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
        let (mi, ki, ti) = (c_int(m, "m")?, c_int(k, "k")?, c_int(ROW_TILE, "tile")?);
        let stream = &gpu.stream;
        let h = *self.handle.handle();
        let tiles = padded / ROW_TILE;
        match w {
            WeightBuf::F32(wb) => {
                let (wp, _w) = wb.device_ptr(stream);
                let (ap, _a) = a.device_ptr(stream);
                let (cp, _c) = c.device_ptr_mut(stream);
                // SAFETY: a, w and c hold padded x k, k x m and padded x m f32 (checked
                // above) and their guards live past the calls.
                unsafe {
                    gemm_tiles(
                        h,
                        (mi, ti, ki),
                        wp,
                        ap,
                        cp,
                        (blas_sys::cudaDataType::CUDA_R_32F, 4),
                        (tiles, k, m),
                        "cublasGemmEx f32",
                    )
                }?;
            }
            WeightBuf::Bf16(wb) => {
                let staging = staging
                    .ok_or_else(|| CudaError::Shape("bf16 GEMM without a staging buffer".into()))?;
                if staging.len() < padded * k {
                    return Err(CudaError::Shape("bf16 staging buffer too small".into()));
                }
                gpu.to_bf16(staging, a, padded * k)?;
                let (wp, _w) = wb.device_ptr(stream);
                let (sp, _s) = staging.device_ptr(stream);
                let (cp, _c) = c.device_ptr_mut(stream);
                // SAFETY: as above, with a's rows as bf16 in `staging` (padded x k).
                unsafe {
                    gemm_tiles(
                        h,
                        (mi, ti, ki),
                        wp,
                        sp,
                        cp,
                        (blas_sys::cudaDataType::CUDA_R_16BF, 2),
                        (tiles, k, m),
                        "cublasGemmEx bf16",
                    )
                }?;
            }
        }
        Ok(())
    }
}

/// One `cublasGemmEx` per tile of [`ROW_TILE`] rows: tile t multiplies rows
/// `t·ROW_TILE..(t+1)·ROW_TILE` of A (at `ap`, elements of `ab.0`, `ab.1` bytes each) by W (at
/// `wp`, same type) into the same rows of C (at `cp`, f32), 32F compute.
///
/// # Safety
/// `wp`, `ap` and `cp` are live device buffers of at least k × m, tiles·ROW_TILE × k and
/// tiles·ROW_TILE × m elements, and stay live until the stream has run the calls.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_tiles(
    h: blas_sys::cublasHandle_t,
    (mi, ti, ki): (i32, i32, i32),
    wp: u64,
    ap: u64,
    cp: u64,
    ab: (blas_sys::cudaDataType, u64),
    (tiles, k, m): (usize, usize, usize),
    call: &'static str,
) -> Result<(), CudaError> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (dtype, a_elem_bytes) = ab;
    for t in 0..tiles {
        let r0 = (t * ROW_TILE) as u64;
        // SAFETY: by the caller's contract; tile t reads rows r0..r0+ROW_TILE of A and writes
        // those of C.
        unsafe {
            cublas::gemm_ex(
                h,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                mi,
                ti,
                ki,
                &alpha as *const f32 as *const c_void,
                wp as *const c_void,
                dtype,
                mi,
                (ap + r0 * k as u64 * a_elem_bytes) as *const c_void,
                dtype,
                ki,
                &beta as *const f32 as *const c_void,
                (cp + r0 * m as u64 * 4) as *mut c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                mi,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err(call))?;
    }
    Ok(())
}
