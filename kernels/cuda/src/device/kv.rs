//! KV storage on the device: one layer's K and V, allocated NaN-filled, written by slot mapping,
//! and copied slot to slot (copy-on-write).

use super::{i32_of, u32_of, Gpu};
use crate::error::CudaError;
use crate::launch::AttnShape;
use crate::runtime::{Arg, DevBuf, KernelBuf};
use crate::source::{kv_write_kernel_name, KvDtype};

/// K and V of one layer on the device, `[num_slots, kv_heads, head_dim]` each.
pub enum KvBuf {
    F32(DevBuf<f32>),
    /// bf16 bits.
    Bf16(DevBuf<u16>),
}

impl KvBuf {
    pub fn dtype(&self) -> KvDtype {
        match self {
            KvBuf::F32(_) => KvDtype::F32,
            KvBuf::Bf16(_) => KvDtype::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(s) => s.len(),
            KvBuf::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer as a kernel argument.
    pub fn arg(&self) -> &dyn KernelBuf {
        match self {
            KvBuf::F32(s) => s,
            KvBuf::Bf16(s) => s,
        }
    }
}

pub struct DevLayer {
    pub k: KvBuf,
    pub v: KvBuf,
    pub num_slots: usize,
    pub shape: AttnShape,
}

impl DevLayer {
    /// K and V as kernel arguments, refused when their element types differ.
    pub(crate) fn kv_args(&self) -> Result<(Arg<'_>, Arg<'_>), CudaError> {
        if self.k.dtype() != self.v.dtype() {
            return Err(CudaError::Shape("K and V of different types".into()));
        }
        Ok((Arg::Buf(self.k.arg()), Arg::Buf(self.v.arg())))
    }
}

impl Gpu {
    /// A layer of `num_slots` slots, every byte NaN (a slot nobody wrote poisons what reads it).
    pub fn new_layer(
        &self,
        dtype: KvDtype,
        num_slots: usize,
        shape: AttnShape,
    ) -> Result<DevLayer, CudaError> {
        shape.check()?;
        let n = num_slots * shape.kv_row();
        let mut layer = match dtype {
            KvDtype::F32 => DevLayer {
                k: KvBuf::F32(self.zeros(n)?),
                v: KvBuf::F32(self.zeros(n)?),
                num_slots,
                shape,
            },
            KvDtype::Bf16 => DevLayer {
                k: KvBuf::Bf16(self.zeros(n)?),
                v: KvBuf::Bf16(self.zeros(n)?),
                num_slots,
                shape,
            },
        };
        let nan_word = 0x7fc0_7fc0u32; // two bf16 NaNs, or one f32 NaN
        let words = n * dtype.bytes() / 4;
        for buf in [&mut layer.k, &mut layer.v] {
            match buf {
                KvBuf::F32(s) => self.fill_words(s, words, nan_word)?,
                KvBuf::Bf16(s) => self.fill_words(s, words, nan_word)?,
            }
        }
        Ok(layer)
    }

    /// Writes `n` tokens' K/V (`[n, kv_row]` f32 each) into `slots` (negative = skip).
    pub fn write_kv(
        &self,
        layer: &mut DevLayer,
        k_new: &DevBuf<f32>,
        v_new: &DevBuf<f32>,
        slots: &DevBuf<i64>,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let row = layer.shape.kv_row();
        if k_new.len() < n * row || v_new.len() < n * row || slots.len() < n {
            return Err(CudaError::Shape(
                "write_kv: input shorter than n rows".into(),
            ));
        }
        let name = kv_write_kernel_name(layer.k.dtype());
        let row_i = i32_of(row, "row")?;
        let (k, v) = layer.kv_args()?;
        // The caller checked every slot against num_slots (launch::check_slots).
        self.launch(
            name,
            (u32_of(n, "tokens")?, 1, 1),
            (128, 1, 1),
            0,
            &[
                k,
                v,
                Arg::Buf(k_new),
                Arg::Buf(v_new),
                Arg::Buf(slots),
                Arg::I32(row_i),
            ],
        )
    }

    /// Copies slot rows `pairs[2i] -> pairs[2i+1]` of K and V (checked by
    /// [`crate::launch::check_copy_pairs`]).
    pub fn copy_slots(
        &self,
        layer: &mut DevLayer,
        pairs: &DevBuf<i64>,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let row_words = i32_of(layer.shape.kv_row() * layer.k.dtype().bytes() / 4, "row")?;
        let (k, v) = layer.kv_args()?;
        // Pairs checked against num_slots and for overlaps on the host.
        self.launch(
            "copy_slots",
            (u32_of(n, "copies")?, 1, 1),
            (128, 1, 1),
            0,
            &[k, v, Arg::Buf(pairs), Arg::I32(row_words)],
        )
    }
}
