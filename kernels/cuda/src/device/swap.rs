//! Swaps: a layer's slots to page-locked host memory and back, queued on the stream. A swap-out
//! buffer may be read (or freed) only after an event recorded after the copy completed, and a
//! swap-in source must live until the copy ran.

use super::{DevLayer, Gpu, KvBuf};
use crate::error::CudaError;
use crate::runtime::{DevBuf, Elem, HostBuf};
use crate::source::KvDtype;

/// Host memory a layer's slots are swapped to: page-locked, so copies run at link speed.
/// Layout: K rows of the range, then V rows (as the CPU backend's `read_slots`).
pub enum PinnedKv {
    F32(HostBuf<f32>),
    Bf16(HostBuf<u16>),
}

impl Gpu {
    /// Page-locked host memory for `slots` slots of one layer.
    pub fn pinned_for(&self, layer: &DevLayer, slots: usize) -> Result<PinnedKv, CudaError> {
        self.pinned(layer.k.dtype(), 2 * slots * layer.shape.kv_row())
    }

    /// Page-locked host memory for `elems` elements of `dtype` (a whole sequence's swap).
    pub fn pinned(&self, dtype: KvDtype, elems: usize) -> Result<PinnedKv, CudaError> {
        Ok(match dtype {
            KvDtype::F32 => PinnedKv::F32(self.pinned_buf(elems)?),
            KvDtype::Bf16 => PinnedKv::Bf16(self.pinned_buf(elems)?),
        })
    }

    /// Copies slots `[first, first + len)` of K and V to `host` (swap out).
    pub fn swap_out(
        &self,
        layer: &DevLayer,
        first: usize,
        len: usize,
        host: &mut PinnedKv,
    ) -> Result<(), CudaError> {
        self.swap_out_at(layer, first, len, host, 0)
    }

    /// Like [`swap_out`](Self::swap_out), writing at element `at` of `host`: K rows at
    /// `at ..`, then V rows (so one buffer holds a sequence's runs one after another).
    pub fn swap_out_at(
        &self,
        layer: &DevLayer,
        first: usize,
        len: usize,
        host: &mut PinnedKv,
        at: usize,
    ) -> Result<(), CudaError> {
        let n = len * layer.shape.kv_row();
        self.swap_out_kv(layer, first, len, host, (at, at + n))
    }

    /// Copies slots `[first, first + len)` to `host`: K rows at element `kv_at.0`, V rows at
    /// `kv_at.1`. A sequence held in several runs of slots keeps one layout on the host — all
    /// its K rows in token order, then all its V rows — whatever runs it has on either side.
    pub fn swap_out_kv(
        &self,
        layer: &DevLayer,
        first: usize,
        len: usize,
        host: &mut PinnedKv,
        kv_at: (usize, usize),
    ) -> Result<(), CudaError> {
        let (a, n) = swap_range(layer, first, len)?;
        match (&layer.k, &layer.v, host) {
            (KvBuf::F32(k), KvBuf::F32(v), PinnedKv::F32(h)) => self.d2h(k, v, a, n, h, kv_at),
            (KvBuf::Bf16(k), KvBuf::Bf16(v), PinnedKv::Bf16(h)) => self.d2h(k, v, a, n, h, kv_at),
            _ => Err(CudaError::Shape(
                "swap buffer of another element type".into(),
            )),
        }
    }

    /// Copies what [`swap_out`](Self::swap_out) stored back into slots `[first, first + len)`.
    pub fn swap_in(
        &self,
        layer: &mut DevLayer,
        first: usize,
        len: usize,
        host: &PinnedKv,
    ) -> Result<(), CudaError> {
        self.swap_in_at(layer, first, len, host, 0)
    }

    /// Like [`swap_in`](Self::swap_in), reading at element `at` of `host`.
    pub fn swap_in_at(
        &self,
        layer: &mut DevLayer,
        first: usize,
        len: usize,
        host: &PinnedKv,
        at: usize,
    ) -> Result<(), CudaError> {
        let n = len * layer.shape.kv_row();
        self.swap_in_kv(layer, first, len, host, (at, at + n))
    }

    /// Copies K rows at element `kv_at.0` and V rows at `kv_at.1` of `host` into slots
    /// `[first, first + len)` (the inverse of [`swap_out_kv`](Self::swap_out_kv)).
    pub fn swap_in_kv(
        &self,
        layer: &mut DevLayer,
        first: usize,
        len: usize,
        host: &PinnedKv,
        kv_at: (usize, usize),
    ) -> Result<(), CudaError> {
        let (a, n) = swap_range(layer, first, len)?;
        match (&mut layer.k, &mut layer.v, host) {
            (KvBuf::F32(k), KvBuf::F32(v), PinnedKv::F32(h)) => self.h2d(k, v, a, n, h, kv_at),
            (KvBuf::Bf16(k), KvBuf::Bf16(v), PinnedKv::Bf16(h)) => self.h2d(k, v, a, n, h, kv_at),
            _ => Err(CudaError::Shape(
                "swap buffer of another element type".into(),
            )),
        }
    }

    fn d2h<T: Elem>(
        &self,
        k: &DevBuf<T>,
        v: &DevBuf<T>,
        a: usize,
        n: usize,
        h: &mut HostBuf<T>,
        (k_at, v_at): (usize, usize),
    ) -> Result<(), CudaError> {
        self.dtoh_async(k, a, h, k_at, n)?;
        self.dtoh_async(v, a, h, v_at, n)
    }

    fn h2d<T: Elem>(
        &self,
        k: &mut DevBuf<T>,
        v: &mut DevBuf<T>,
        a: usize,
        n: usize,
        h: &HostBuf<T>,
        (k_at, v_at): (usize, usize),
    ) -> Result<(), CudaError> {
        self.htod_async(h, k_at, k, a, n)?;
        self.htod_async(h, v_at, v, a, n)
    }
}

/// Element range of slots `[first, first + len)`, checked against the layer.
fn swap_range(layer: &DevLayer, first: usize, len: usize) -> Result<(usize, usize), CudaError> {
    match first.checked_add(len) {
        Some(end) if end <= layer.num_slots => {
            let row = layer.shape.kv_row();
            Ok((first * row, len * row))
        }
        _ => Err(CudaError::Shape(format!(
            "swap of slots {first}+{len} past the cache ({} slots)",
            layer.num_slots
        ))),
    }
}
