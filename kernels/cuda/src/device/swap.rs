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
        let (a, n) = swap_range(layer, first, len)?;
        match (&layer.k, &layer.v, host) {
            (KvBuf::F32(k), KvBuf::F32(v), PinnedKv::F32(h)) => self.d2h(k, v, a, n, h, at),
            (KvBuf::Bf16(k), KvBuf::Bf16(v), PinnedKv::Bf16(h)) => self.d2h(k, v, a, n, h, at),
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
        let (a, n) = swap_range(layer, first, len)?;
        match (&mut layer.k, &mut layer.v, host) {
            (KvBuf::F32(k), KvBuf::F32(v), PinnedKv::F32(h)) => self.h2d(k, v, a, n, h, at),
            (KvBuf::Bf16(k), KvBuf::Bf16(v), PinnedKv::Bf16(h)) => self.h2d(k, v, a, n, h, at),
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
        at: usize,
    ) -> Result<(), CudaError> {
        if h.len() < at + 2 * n {
            return Err(CudaError::Shape("swap buffer too small".into()));
        }
        self.dtoh_async(k, a, h, at, n)?;
        self.dtoh_async(v, a, h, at + n, n)
    }

    fn h2d<T: Elem>(
        &self,
        k: &mut DevBuf<T>,
        v: &mut DevBuf<T>,
        a: usize,
        n: usize,
        h: &HostBuf<T>,
        at: usize,
    ) -> Result<(), CudaError> {
        if h.len() < at + 2 * n {
            return Err(CudaError::Shape("swap buffer too small".into()));
        }
        self.htod_async(h, at, k, a, n)?;
        self.htod_async(h, at + n, v, a, n)
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
