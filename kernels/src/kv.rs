//! KV storage and the writes into it.
//!
//! **Layout.** Per layer, K and V are each `[num_slots, kv_heads, head_dim]` (NHD), row-major.
//! A slot is one token position: for a paged cache slot = block × block_size + offset, so block
//! `b` is rows `b*block_size .. (b+1)*block_size`; the contiguous arena uses the same per-slot
//! layout, so one slot index addresses the same bytes whichever manager handed it out.
//! Fresh storage is NaN: reading a slot nobody wrote poisons the output instead of passing.
//!
//! **Layers may differ.** [`KvCache::with_rows`] gives each layer its own (K, V) elements per
//! slot: an MLA layer keeps its latent and RoPE part as its K row and no V, and no FP8 scales
//! (its values are quantised from the token alone). Copies, swaps and tier slots work per layer
//! (`rows_of`, `elems_per_slot`), so they move an MLA row like any other. Every layer's storage
//! is a [`KvBuf`]: aligned, so a slot sits the same way against cache lines and
//! pages whichever manager handed it out.

use std::ops::Range;

use crate::elem::KvElem;
use crate::error::{check_len, KernelError};
use crate::kv_buf::KvBuf;
use crate::kv_quant::KvQuant;

/// `n` copies of `fill`, starting on a cache line, and on a 2 MiB huge page advised for
/// transparent huge pages once the buffer spans two (see [`KvBuf`]). A slot row is a few KiB, so
/// with 4 KiB pages every token read is a TLB miss, and a paged layout (blocks scattered) also
/// loses page-table locality; 2 MiB pages remove both.
pub fn kv_buffer<E: KvElem>(n: usize, fill: E) -> KvBuf<E> {
    KvBuf::filled(n, fill)
}

/// K and V of one layer.
#[derive(Debug)]
pub struct LayerKv<E> {
    pub k: KvBuf<E>,
    pub v: KvBuf<E>,
}

// By hand: a derive would ask `E: Clone`, and [`KvBuf`] copies only `Copy` elements.
impl<E: Copy> Clone for LayerKv<E> {
    fn clone(&self) -> Self {
        LayerKv {
            k: self.k.clone(),
            v: self.v.clone(),
        }
    }
}

/// The whole cache: every layer, same slot count.
#[derive(Debug)]
pub struct KvCache<E> {
    pub layers: Vec<LayerKv<E>>,
    pub num_slots: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// FP8 quantisation of every value written (`None`: stored as `E`).
    pub quant: Option<KvQuant>,
    /// FP8 scales per layer, `[k, v]`, one per slot per KV head (empty unless quantised; see
    /// [`crate::kv_quant`]).
    pub scales: Vec<[Vec<f32>; 2]>,
}

impl<E: Copy> Clone for KvCache<E> {
    fn clone(&self) -> Self {
        KvCache {
            layers: self.layers.clone(),
            num_slots: self.num_slots,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            quant: self.quant.clone(),
            scales: self.scales.clone(),
        }
    }
}

impl<E: KvElem> KvCache<E> {
    pub fn new(layers: usize, num_slots: usize, kv_heads: usize, head_dim: usize) -> Self {
        let n = num_slots * kv_heads * head_dim;
        let nan = E::from_f32(f32::NAN);
        let layers = (0..layers)
            .map(|_| LayerKv {
                k: kv_buffer(n, nan),
                v: kv_buffer(n, nan),
            })
            .collect();
        KvCache {
            layers,
            num_slots,
            kv_heads,
            head_dim,
            quant: None,
            scales: Vec::new(),
        }
    }

    /// A cache whose layers differ: `rows[l]` is layer `l`'s (K, V) elements per slot. A layer
    /// of `kv_heads × head_dim` is an attention layer; an MLA layer keeps its latent and RoPE
    /// part as its K row and no V (`(latent + rope, 0)`).
    pub fn with_rows(
        rows: &[(usize, usize)],
        num_slots: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let nan = E::from_f32(f32::NAN);
        let layers = rows
            .iter()
            .map(|&(k, v)| LayerKv {
                k: kv_buffer(num_slots * k, nan),
                v: kv_buffer(num_slots * v, nan),
            })
            .collect();
        KvCache {
            layers,
            num_slots,
            kv_heads,
            head_dim,
            quant: None,
            scales: Vec::new(),
        }
    }

    /// Quantises every value written from now on (f32 storage only: it holds the dequantised
    /// values exactly). Attention layers keep one scale per slot per KV head for K and for V; an
    /// MLA layer none (its scales are per token, from the token's own values, so the dequantised
    /// values are all a copy has to move).
    pub fn quantised(mut self, quant: KvQuant) -> Result<Self, KernelError> {
        if E::NAME != "f32" {
            return Err(KernelError::Config(format!(
                "an FP8 cache keeps its dequantised values in f32, not {}",
                E::NAME
            )));
        }
        let n = self.num_slots * self.kv_heads;
        let row = self.row_elems();
        self.scales = (0..self.layers.len())
            .map(|i| {
                if self.rows_of(i) == (row, row) {
                    [vec![f32::NAN; n], vec![f32::NAN; n]]
                } else {
                    Default::default()
                }
            })
            .collect();
        self.quant = Some(quant);
        Ok(self)
    }

    /// Layer `i`'s (K, V) elements per slot.
    pub fn rows_of(&self, i: usize) -> (usize, usize) {
        let n = self.num_slots.max(1);
        self.layers
            .get(i)
            .map_or((0, 0), |l| (l.k.len() / n, l.v.len() / n))
    }

    /// Scales layer `i` holds per slot, for K and for V (0 when not quantised).
    fn scale_row_of(&self, i: usize) -> usize {
        let n = self.num_slots.max(1);
        self.scales.get(i).map_or(0, |s| s[0].len() / n)
    }

    /// Elements one slot holds across every layer: K, V and scales (what
    /// [`read_slots`](Self::read_slots) yields per slot).
    pub fn elems_per_slot(&self) -> usize {
        (0..self.layers.len())
            .map(|i| {
                let (k, v) = self.rows_of(i);
                k + v + 2 * self.scale_row_of(i)
            })
            .sum()
    }

    /// Elements per slot per layer per K or V.
    pub fn row_elems(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes of K and V for one token across all layers.
    pub fn bytes_per_token(&self) -> usize {
        let elems: usize = (0..self.layers.len())
            .map(|i| {
                let (k, v) = self.rows_of(i);
                k + v
            })
            .sum();
        elems * std::mem::size_of::<E>()
    }

    fn check_range(&self, slot: usize, len: usize) -> Result<(), KernelError> {
        match slot.checked_add(len) {
            Some(end) if end <= self.num_slots => Ok(()),
            _ => Err(KernelError::SlotOutOfRange {
                slot: slot as u64,
                len_tokens: len as u64,
                num_slots: self.num_slots as u64,
            }),
        }
    }

    /// Copies `len` slots from `src` to `dst` in every layer (copy-on-write, contiguous fork).
    /// Overlapping ranges behave like `memmove`.
    pub fn copy_slots(&mut self, src: usize, dst: usize, len: usize) -> Result<(), KernelError> {
        self.check_range(src, len)?;
        self.check_range(dst, len)?;
        let n = self.num_slots.max(1);
        for layer in &mut self.layers {
            for buf in [&mut layer.k, &mut layer.v] {
                let row = buf.len() / n;
                buf.copy_within(src * row..(src + len) * row, dst * row);
            }
        }
        for s in self.scales.iter_mut().flatten() {
            let sr = s.len() / n;
            s.copy_within(src * sr..(src + len) * sr, dst * sr);
        }
        Ok(())
    }

    /// Reads `len` slots of every layer into a host buffer (swap out). Layout of the buffer:
    /// per layer, K rows then V rows, then (quantised caches, whose `E` is f32) K and V scales.
    pub fn read_slots(
        &self,
        first: usize,
        len: usize,
        out: &mut Vec<E>,
    ) -> Result<(), KernelError> {
        self.check_range(first, len)?;
        for i in 0..self.layers.len() {
            self.read_layer_slots(i, first, len, out)?;
        }
        Ok(())
    }

    /// [`read_slots`](Self::read_slots) of layer `layer` alone: its K rows, V rows and scales.
    /// A grouped cache addresses each layer through its own table, so a swap gathers layer by
    /// layer.
    pub fn read_layer_slots(
        &self,
        layer: usize,
        first: usize,
        len: usize,
        out: &mut Vec<E>,
    ) -> Result<(), KernelError> {
        self.check_range(first, len)?;
        let l = self.layers.get(layer).ok_or(KernelError::Shape {
            what: "layer index",
            expected: self.layers.len(),
            got: layer,
        })?;
        let scales = self.scales.get(layer);
        let rows = self.rows_of(layer);
        walk_layer_slots(
            first,
            len,
            rows,
            self.scale_row_of(layer),
            |part, cache, _| match (part, scales) {
                (SwapPart::Rows(0), _) => out.extend_from_slice(&l.k[cache]),
                (SwapPart::Rows(_), _) => out.extend_from_slice(&l.v[cache]),
                (SwapPart::Scales(i), Some(s)) => {
                    out.extend(s[i][cache].iter().map(|&x| E::from_f32(x)));
                }
                (SwapPart::Scales(_), None) => {}
            },
        );
        Ok(())
    }

    /// Elements one slot of layer `layer` holds: K, V and scales.
    pub fn layer_elems_per_slot(&self, layer: usize) -> usize {
        let (k, v) = self.rows_of(layer);
        k + v + 2 * self.scale_row_of(layer)
    }

    /// Writes back what [`read_layer_slots`](Self::read_layer_slots) produced for `len` slots
    /// of layer `layer`, returning how many elements of `data` were consumed.
    pub fn write_layer_slots(
        &mut self,
        layer: usize,
        first: usize,
        len: usize,
        data: &[E],
    ) -> Result<usize, KernelError> {
        self.check_range(first, len)?;
        let need = len * self.layer_elems_per_slot(layer);
        if data.len() < need || layer >= self.layers.len() {
            return Err(KernelError::Shape {
                what: "swap buffer of one layer",
                expected: need,
                got: data.len(),
            });
        }
        let (rows, scale_row) = (self.rows_of(layer), self.scale_row_of(layer));
        let l = &mut self.layers[layer];
        let mut scales = self.scales.get_mut(layer);
        Ok(walk_layer_slots(
            first,
            len,
            rows,
            scale_row,
            |part, cache, buf| match part {
                SwapPart::Rows(0) => l.k[cache].copy_from_slice(&data[buf]),
                SwapPart::Rows(_) => l.v[cache].copy_from_slice(&data[buf]),
                SwapPart::Scales(i) => {
                    if let Some(s) = scales.as_deref_mut() {
                        for (d, x) in s[i][cache].iter_mut().zip(&data[buf]) {
                            *d = x.to_f32();
                        }
                    }
                }
            },
        ))
    }

    /// Writes back what [`read_slots`](Self::read_slots) produced for `len` slots (swap in),
    /// returning how many elements of `data` were consumed.
    pub fn write_slots(
        &mut self,
        first: usize,
        len: usize,
        data: &[E],
    ) -> Result<usize, KernelError> {
        self.check_range(first, len)?;
        let need = len * self.elems_per_slot();
        if data.len() < need {
            return Err(KernelError::Shape {
                what: "swap buffer",
                expected: need,
                got: data.len(),
            });
        }
        let mut at = 0;
        for layer in 0..self.layers.len() {
            at += self.write_layer_slots(layer, first, len, &data[at..])?;
        }
        Ok(at)
    }
}

/// One part of a layer's slots in a swap buffer: K (0) or V (1) rows, or their scales.
#[derive(Clone, Copy)]
enum SwapPart {
    Rows(usize),
    Scales(usize),
}

/// Walks `len` slots from `first` of a layer whose slot holds `rows` (K, V) elements and
/// `scale_row` scales of each, in the order a swap buffer holds them — K rows, V rows, then K and
/// V scales where the cache has them — handing `visit` each part's range in the layer's buffer
/// and in the swap buffer; returns the elements the swap buffer holds. Gather and scatter both
/// walk it, so the layout they must agree on is written once; generic over the closure, it
/// compiles to the loop each wrote by hand.
fn walk_layer_slots(
    first: usize,
    len: usize,
    (rk, rv): (usize, usize),
    scale_row: usize,
    mut visit: impl FnMut(SwapPart, Range<usize>, Range<usize>),
) -> usize {
    let mut at = 0;
    let scales = if scale_row == 0 { 0 } else { 2 };
    let parts = [(SwapPart::Rows(0), rk), (SwapPart::Rows(1), rv)]
        .into_iter()
        .chain((0..scales).map(|i| (SwapPart::Scales(i), scale_row)));
    for (part, row) in parts {
        visit(part, first * row..(first + len) * row, at..at + len * row);
        at += len * row;
    }
    at
}

/// Writes new tokens' K and V (`[n, kv_heads*head_dim]` each) into the slots named by
/// `slot_mapping`; a negative slot is padding and skipped. Every slot is checked before any
/// write, so an error leaves the cache unchanged.
pub fn write_kv<E: KvElem>(
    layer: &mut LayerKv<E>,
    num_slots: usize,
    row_elems: usize,
    k_new: &[f32],
    v_new: &[f32],
    slot_mapping: &[i64],
) -> Result<(), KernelError> {
    let n = slot_mapping.len();
    check_len("k rows", n * row_elems, k_new.len())?;
    check_len("v rows", n * row_elems, v_new.len())?;
    check_len("k cache", num_slots * row_elems, layer.k.len())?;
    check_len("v cache", num_slots * row_elems, layer.v.len())?;
    if let Some(&bad) = slot_mapping.iter().find(|&&s| s >= num_slots as i64) {
        return Err(KernelError::SlotOutOfRange {
            slot: bad as u64,
            len_tokens: 1,
            num_slots: num_slots as u64,
        });
    }
    for (i, &slot) in slot_mapping.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let dst = slot as usize * row_elems;
        let src = i * row_elems;
        for (d, s) in layer.k[dst..dst + row_elems]
            .iter_mut()
            .zip(&k_new[src..src + row_elems])
        {
            *d = E::from_f32(*s);
        }
        for (d, s) in layer.v[dst..dst + row_elems]
            .iter_mut()
            .zip(&v_new[src..src + row_elems])
        {
            *d = E::from_f32(*s);
        }
    }
    Ok(())
}
