//! The correctness grid behind `kvbench cuda-check`, for a machine with a GPU: every kernel
//! against the f64 [`reference`](crate::reference) — lengths 1, 15, 16, 17, 513, 4097 in one
//! batch with chunked-prefill rows beside the decode rows; shuffled block tables; GQA 1/4/8;
//! head dim 64/128; blocks 8/16/32; f32 and bf16; planned and forced-small partitions (the
//! log-sum-exp merge); outputs poisoned with NaN first; a sliding window of [`CHECK_WINDOW`]
//! tokens with every position before it NaN (and its whole blocks mapped to a NaN block), so a
//! read outside the window poisons the output. KV writes, slot copies and swaps through pinned
//! memory are checked bit for bit.

use crate::device::{Addressing, DevLayer, Gpu, KvBuf, Rows, Workspace};
use crate::error::CudaError;
use crate::launch::{
    check_copy_pairs, check_slots, check_table, copy_pairs, fixed_partitions, plan_partitions,
    window_start, AttnShape, Partitions,
};
use crate::reference::{attention_row, round_to};
use crate::rng::Rng;
use crate::KvDtype;

pub const LENGTHS: [usize; 6] = [1, 15, 16, 17, 513, 4097];
pub const GQA: [usize; 3] = [1, 4, 8];
pub const CHECK_HEAD_DIMS: [usize; 2] = [64, 128];
pub const BLOCK_SIZES: [usize; 3] = [8, 16, 32];
/// Query tokens of each prefill chunk (rows ending at the sequence's last positions).
pub const PREFILL_CHUNK: usize = 16;
/// Largest |gpu − f64 reference| allowed on outputs of magnitude ≤ 1 (K, V, q uniform in
/// [-1, 1)): f32 accumulation over ≤ 4097 tokens; storage rounding is in the reference too, so
/// f32 and bf16 share it.
pub const ATTN_ABS_TOL: f64 = 1e-3;
/// The sliding window of the windowed cases: off every block boundary, shorter than the longest
/// lengths (a window inside one partition of 4097) and longer than the short ones (a no-op).
pub const CHECK_WINDOW: usize = 100;

/// One checked thing.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRow {
    pub kernel: String,
    pub case: String,
    /// Largest |gpu − reference| (0 for bit-exact checks that matched; infinite when an output
    /// stayed NaN or a bit differed).
    pub max_abs_err: f64,
    pub tolerance: f64,
    pub ok: bool,
}

impl CheckRow {
    fn new(kernel: &str, case: String, err: f64, tol: f64) -> CheckRow {
        CheckRow {
            kernel: kernel.into(),
            case,
            max_abs_err: err,
            tolerance: tol,
            ok: err <= tol,
        }
    }
}

/// Logical K/V of every sequence, already rounded to the storage type, and the query rows.
pub struct Logical {
    pub dtype: KvDtype,
    pub shape: AttnShape,
    /// Per sequence `[len, kv_row]`.
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    /// (sequence, attended length) per query row: decode rows, then prefill-chunk rows.
    pub rows: Vec<(usize, usize)>,
    pub q: Vec<f32>,
    pub reference: Vec<f64>,
    /// Sliding window of every row (0: none).
    pub window: usize,
}

impl Logical {
    /// The first position any row of sequence `seq` reads (0 without a window).
    pub fn first_read(&self, seq: usize) -> usize {
        self.rows
            .iter()
            .filter(|r| r.0 == seq)
            .map(|r| window_start(r.1, self.window))
            .min()
            .unwrap_or(0)
    }
}

/// Seeded logical data for one (storage type, shape) and its f64 reference outputs.
pub fn logical(dtype: KvDtype, shape: AttnShape, rng: &mut Rng) -> Logical {
    logical_windowed(dtype, shape, 0, rng)
}

/// [`logical`] with every row attending its last `window` positions (0: all).
pub fn logical_windowed(dtype: KvDtype, shape: AttnShape, window: usize, rng: &mut Rng) -> Logical {
    let row = shape.kv_row();
    let mut gen = |n: usize| -> Vec<f32> { (0..n).map(|_| round_to(dtype, rng.unit())).collect() };
    let k: Vec<Vec<f32>> = LENGTHS.iter().map(|&l| gen(l * row)).collect();
    let v: Vec<Vec<f32>> = LENGTHS.iter().map(|&l| gen(l * row)).collect();
    let mut rows: Vec<(usize, usize)> = LENGTHS.iter().copied().enumerate().collect();
    for (s, &len) in LENGTHS.iter().enumerate() {
        if len > PREFILL_CHUNK {
            rows.extend((0..PREFILL_CHUNK).map(|i| (s, len - PREFILL_CHUNK + i + 1)));
        }
    }
    let q: Vec<f32> = (0..rows.len() * shape.q_row())
        .map(|_| rng.unit())
        .collect();
    let scale = 1.0 / (shape.head_dim as f64).sqrt();
    let mut reference = Vec::with_capacity(q.len());
    for (r, &(s, len)) in rows.iter().enumerate() {
        let qr = &q[r * shape.q_row()..(r + 1) * shape.q_row()];
        let lo = window_start(len, window);
        reference.extend(attention_row(
            qr,
            &k[s][lo * row..],
            &v[s][lo * row..],
            len - lo,
            shape.q_heads,
            shape.kv_heads,
            shape.head_dim,
            scale,
        ));
    }
    Logical {
        dtype,
        shape,
        k,
        v,
        rows,
        q,
        reference,
        window,
    }
}

/// Host storage (NaN everywhere) with `place(seq, pos) -> slot` filled from `lg`, from each
/// sequence's first read position on (a windowed case leaves what lies before it NaN).
pub fn storage(
    lg: &Logical,
    num_slots: usize,
    place: impl Fn(usize, usize) -> usize,
) -> (Vec<f32>, Vec<f32>) {
    let row = lg.shape.kv_row();
    let mut k = vec![f32::NAN; num_slots * row];
    let mut v = vec![f32::NAN; num_slots * row];
    for (s, &len) in LENGTHS.iter().enumerate() {
        for p in lg.first_read(s)..len {
            let slot = place(s, p);
            k[slot * row..(slot + 1) * row].copy_from_slice(&lg.k[s][p * row..(p + 1) * row]);
            v[slot * row..(slot + 1) * row].copy_from_slice(&lg.v[s][p * row..(p + 1) * row]);
        }
    }
    (k, v)
}

fn bf16_bits(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&f| half::bf16::from_f32(f).to_bits())
        .collect()
}

fn upload_layer(
    gpu: &Gpu,
    lg: &Logical,
    k: &[f32],
    v: &[f32],
    num_slots: usize,
) -> Result<DevLayer, CudaError> {
    let (k, v) = match lg.dtype {
        KvDtype::F32 => (KvBuf::F32(gpu.upload(k)?), KvBuf::F32(gpu.upload(v)?)),
        KvDtype::Bf16 => (
            KvBuf::Bf16(gpu.upload(&bf16_bits(k))?),
            KvBuf::Bf16(gpu.upload(&bf16_bits(v))?),
        ),
    };
    Ok(DevLayer {
        k,
        v,
        num_slots,
        shape: lg.shape,
    })
}

/// Runs one attention launch with poisoned output and returns its error against the reference.
fn attn_err(
    gpu: &Gpu,
    lg: &Logical,
    layer: &DevLayer,
    addr: &Addressing<'_>,
    parts: Partitions,
    ws: &mut Workspace,
) -> Result<f64, CudaError> {
    let row_seq: Vec<i32> = lg.rows.iter().map(|r| r.0 as i32).collect();
    let row_len: Vec<i32> = lg.rows.iter().map(|r| r.1 as i32).collect();
    let (row_seq, row_len) = (gpu.upload(&row_seq)?, gpu.upload(&row_len)?);
    let max_len = lg.rows.iter().map(|r| r.1).max().unwrap_or(0);
    let rows = Rows {
        row_seq: &row_seq,
        row_len: &row_len,
        rows: lg.rows.len(),
        max_len,
        window: lg.window,
    };
    let q = gpu.upload(&lg.q)?;
    let mut out = gpu.zeros::<f32>(lg.q.len())?;
    gpu.fill_words(&mut out, lg.q.len(), 0x7fc0_0000)?;
    let scale = 1.0 / (lg.shape.head_dim as f32).sqrt();
    gpu.attention(layer, addr, &rows, &q, &mut out, parts, ws, scale)?;
    let got = gpu.download(&out)?;
    Ok(max_err(&got, &lg.reference))
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).fold(0f64, |m, (&g, &w)| {
        let e = (g as f64 - w).abs();
        if e.is_nan() {
            f64::INFINITY
        } else {
            m.max(e)
        }
    })
}

/// Contiguous placement: sequences one after another with a 5-slot NaN gap between them.
/// Returns the base slots and the slot count.
pub fn contiguous_bases() -> (Vec<i64>, usize) {
    let mut bases = Vec::new();
    let mut next = 0usize;
    for &len in &LENGTHS {
        bases.push(next as i64);
        next += len + 5;
    }
    (bases, next)
}

/// Shuffled block tables for the grid's sequences (3 spare blocks, never mapped).
pub struct PagedTables {
    pub block_size: usize,
    /// Per sequence, its physical blocks in logical order.
    pub tables: Vec<Vec<u32>>,
    /// `[sequences, max_blocks]`, row-major, for the device.
    pub flat: Vec<i32>,
    pub max_blocks: usize,
    pub num_slots: usize,
}

impl PagedTables {
    pub fn slot(&self, seq: usize, pos: usize) -> usize {
        self.tables[seq][pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// The device tables with every block wholly before `first_read(seq)` mapped to a spare
    /// block (never written: NaN), as blocks released behind a sliding window may hold anything.
    pub fn flat_from(&self, first_read: impl Fn(usize) -> usize) -> Vec<i32> {
        let used: std::collections::BTreeSet<u32> = self.tables.iter().flatten().copied().collect();
        let spare = (0..(self.num_slots / self.block_size) as u32)
            .find(|b| !used.contains(b))
            .unwrap_or(0) as i32;
        let mut flat = self.flat.clone();
        for s in 0..self.tables.len() {
            for b in 0..first_read(s) / self.block_size {
                flat[s * self.max_blocks + b] = spare;
            }
        }
        flat
    }
}

pub fn paged_tables(bs: usize, rng: &mut Rng) -> Result<PagedTables, CudaError> {
    let need: Vec<usize> = LENGTHS.iter().map(|l| l.div_ceil(bs)).collect();
    let total_blocks = need.iter().sum::<usize>() + 3;
    let mut perm: Vec<u32> = (0..total_blocks as u32).collect();
    rng.shuffle(&mut perm);
    let max_blocks = *need.iter().max().unwrap_or(&1);
    let mut flat = vec![0i32; LENGTHS.len() * max_blocks];
    let mut tables: Vec<Vec<u32>> = Vec::new();
    let mut at = 0;
    for (s, &n) in need.iter().enumerate() {
        let t = perm[at..at + n].to_vec();
        at += n;
        for (i, &b) in t.iter().enumerate() {
            flat[s * max_blocks + i] = b as i32;
        }
        check_table(&t, LENGTHS[s], bs, total_blocks * bs)?;
        tables.push(t);
    }
    Ok(PagedTables {
        block_size: bs,
        tables,
        flat,
        max_blocks,
        num_slots: total_blocks * bs,
    })
}

/// Which part of the grid to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridSize {
    /// Everything listed in the module doc.
    Full,
    /// bf16, GQA 4, head dim 128, block 16, every length (for runs under compute-sanitizer).
    Quick,
}

/// Attention over the grid.
pub fn attention_grid(gpu: &Gpu, seed: u64, size: GridSize) -> Result<Vec<CheckRow>, CudaError> {
    let quick = size == GridSize::Quick;
    let dtypes: &[KvDtype] = if quick {
        &[KvDtype::Bf16]
    } else {
        &KvDtype::ALL
    };
    let groups: &[usize] = if quick { &[4] } else { &GQA };
    let dims: &[usize] = if quick { &[128] } else { &CHECK_HEAD_DIMS };
    let block_sizes: &[usize] = if quick { &[16] } else { &BLOCK_SIZES };
    let mut out = Vec::new();
    let mut rng = Rng::new(seed);
    let mut ws = Workspace::default();
    for &dtype in dtypes {
        for &g in groups {
            for &d in dims {
                let shape = AttnShape {
                    q_heads: 2 * g,
                    kv_heads: 2,
                    head_dim: d,
                };
                let lg = logical(dtype, shape, &mut rng);
                let max_len = *LENGTHS.iter().max().unwrap_or(&1);
                let planned =
                    plan_partitions(lg.rows.len(), shape.kv_heads, max_len, gpu.info.sm_count);
                let forced = fixed_partitions(max_len, 64);
                let name = format!("{} g{g} d{d}", dtype.name());
                let (bases, next) = contiguous_bases();
                let (k, v) = storage(&lg, next, |s, p| bases[s] as usize + p);
                let layer = upload_layer(gpu, &lg, &k, &v, next)?;
                let base_dev = gpu.upload(&bases)?;
                let addr = Addressing::Contiguous {
                    seq_base: &base_dev,
                };
                for (label, parts) in [("planned", planned), ("parts64", forced)] {
                    let e = attn_err(gpu, &lg, &layer, &addr, parts, &mut ws)?;
                    out.push(CheckRow::new(
                        "attn_contig",
                        format!("{name} {label} ({} parts)", parts.parts),
                        e,
                        ATTN_ABS_TOL,
                    ));
                }
                drop(layer);
                for &bs in block_sizes {
                    let pt = paged_tables(bs, &mut rng)?;
                    let (tables, max_blocks, num_slots) = (&pt.flat, pt.max_blocks, pt.num_slots);
                    let (k, v) = storage(&lg, num_slots, |s, p| pt.slot(s, p));
                    let layer = upload_layer(gpu, &lg, &k, &v, num_slots)?;
                    let tables_dev = gpu.upload(tables)?;
                    let addr = Addressing::Paged {
                        block_tables: &tables_dev,
                        max_blocks,
                        block_size: bs,
                    };
                    for (label, parts) in [("planned", planned), ("parts64", forced)] {
                        let e = attn_err(gpu, &lg, &layer, &addr, parts, &mut ws)?;
                        out.push(CheckRow::new(
                            "attn_paged",
                            format!("{name} bs{bs} {label} ({} parts)", parts.parts),
                            e,
                            ATTN_ABS_TOL,
                        ));
                    }
                }
            }
        }
    }
    // A sliding window, on the grid's first group size and head dim of each storage type.
    let (g, d) = (groups[0], dims[dims.len() - 1]);
    for &dtype in dtypes {
        let shape = AttnShape {
            q_heads: 2 * g,
            kv_heads: 2,
            head_dim: d,
        };
        let lg = logical_windowed(dtype, shape, CHECK_WINDOW, &mut rng);
        let max_len = *LENGTHS.iter().max().unwrap_or(&1);
        let planned = plan_partitions(lg.rows.len(), shape.kv_heads, max_len, gpu.info.sm_count);
        let forced = fixed_partitions(max_len, 64);
        let name = format!("{} g{g} d{d} window {CHECK_WINDOW}", dtype.name());
        let (bases, next) = contiguous_bases();
        let (k, v) = storage(&lg, next, |s, p| bases[s] as usize + p);
        let layer = upload_layer(gpu, &lg, &k, &v, next)?;
        let base_dev = gpu.upload(&bases)?;
        let addr = Addressing::Contiguous {
            seq_base: &base_dev,
        };
        for (label, parts) in [("planned", planned), ("parts64", forced)] {
            let e = attn_err(gpu, &lg, &layer, &addr, parts, &mut ws)?;
            out.push(CheckRow::new(
                "attn_contig",
                format!("{name} {label} ({} parts)", parts.parts),
                e,
                ATTN_ABS_TOL,
            ));
        }
        drop(layer);
        let bs = block_sizes[0];
        let pt = paged_tables(bs, &mut rng)?;
        let (k, v) = storage(&lg, pt.num_slots, |s, p| pt.slot(s, p));
        let layer = upload_layer(gpu, &lg, &k, &v, pt.num_slots)?;
        let tables_dev = gpu.upload(&pt.flat_from(|s| lg.first_read(s)))?;
        let addr = Addressing::Paged {
            block_tables: &tables_dev,
            max_blocks: pt.max_blocks,
            block_size: bs,
        };
        for (label, parts) in [("planned", planned), ("parts64", forced)] {
            let e = attn_err(gpu, &lg, &layer, &addr, parts, &mut ws)?;
            out.push(CheckRow::new(
                "attn_paged",
                format!("{name} bs{bs} {label} ({} parts)", parts.parts),
                e,
                ATTN_ABS_TOL,
            ));
        }
    }
    Ok(out)
}

fn bits_of(buf: &KvBuf, gpu: &Gpu) -> Result<Vec<u32>, CudaError> {
    Ok(match buf {
        KvBuf::F32(s) => gpu.download(s)?.into_iter().map(f32::to_bits).collect(),
        KvBuf::Bf16(s) => gpu.download(s)?.into_iter().map(u32::from).collect(),
    })
}

fn host_bits(dtype: KvDtype, x: f32) -> u32 {
    match dtype {
        KvDtype::F32 => x.to_bits(),
        KvDtype::Bf16 => half::bf16::from_f32(x).to_bits() as u32,
    }
}

/// Count of elements whose bits differ (reported as an infinite error when non-zero).
fn mismatch(a: &[u32], b: &[u32]) -> f64 {
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len());
    if n == 0 {
        0.0
    } else {
        f64::INFINITY
    }
}

/// KV write by slot mapping, slot copies and swaps: exact, per storage type.
pub fn data_movement(gpu: &Gpu, seed: u64) -> Result<Vec<CheckRow>, CudaError> {
    let mut out = Vec::new();
    let mut rng = Rng::new(seed ^ 0x5eed);
    let shape = AttnShape {
        q_heads: 8,
        kv_heads: 2,
        head_dim: 128,
    };
    let row = shape.kv_row();
    let (bs, blocks) = (16usize, 12usize);
    let num_slots = bs * blocks;
    for dtype in KvDtype::ALL {
        let nan = match dtype {
            KvDtype::F32 => 0x7fc0_7fc0u32, // the NaN new_layer fills with
            KvDtype::Bf16 => 0x7fc0,
        };
        // KV write: 40 tokens to shuffled slots, two of them padding (-1).
        let mut slots: Vec<i64> = (0..num_slots as i64).collect();
        rng.shuffle(&mut slots);
        slots.truncate(40);
        slots[7] = -1;
        slots[23] = -1;
        check_slots(&slots, num_slots)?;
        let kn: Vec<f32> = (0..40 * row).map(|_| rng.unit() * 3.0).collect();
        let vn: Vec<f32> = (0..40 * row).map(|_| rng.unit() * 3.0).collect();
        let mut layer = gpu.new_layer(dtype, num_slots, shape)?;
        gpu.write_kv(
            &mut layer,
            &gpu.upload(&kn)?,
            &gpu.upload(&vn)?,
            &gpu.upload(&slots)?,
            40,
        )?;
        let mut want_k = vec![nan; num_slots * row];
        let mut want_v = vec![nan; num_slots * row];
        for (i, &s) in slots.iter().enumerate() {
            if s < 0 {
                continue;
            }
            let s = s as usize;
            for e in 0..row {
                want_k[s * row + e] = host_bits(dtype, kn[i * row + e]);
                want_v[s * row + e] = host_bits(dtype, vn[i * row + e]);
            }
        }
        let (got_k, got_v) = (bits_of(&layer.k, gpu)?, bits_of(&layer.v, gpu)?);
        let e = mismatch(&got_k, &want_k).max(mismatch(&got_v, &want_v));
        out.push(CheckRow::new(
            "kv_write",
            format!("{} 40 tokens, 2 padding, shuffled slots", dtype.name()),
            e,
            0.0,
        ));

        // Copy-on-write: blocks 1 and 4 (one partial) to fresh blocks 9 and 10.
        let ops = [(bs, 9 * bs, bs), (4 * bs, 10 * bs, 5)];
        let pairs = copy_pairs(&ops);
        check_copy_pairs(&pairs, num_slots)?;
        let flat: Vec<i64> = pairs.iter().flat_map(|&(s, d)| [s, d]).collect();
        gpu.copy_slots(&mut layer, &gpu.upload(&flat)?, pairs.len())?;
        for (s, d) in &pairs {
            let (s, d) = (*s as usize, *d as usize);
            want_k.copy_within(s * row..(s + 1) * row, d * row);
            want_v.copy_within(s * row..(s + 1) * row, d * row);
        }
        let (got_k, got_v) = (bits_of(&layer.k, gpu)?, bits_of(&layer.v, gpu)?);
        let e = mismatch(&got_k, &want_k).max(mismatch(&got_v, &want_v));
        out.push(CheckRow::new(
            "copy_slots",
            format!("{} a full and a partial block", dtype.name()),
            e,
            0.0,
        ));

        // Swap out slots [16, 80) to pinned memory, poison the cache, swap back in.
        let (first, len) = (bs, 4 * bs);
        let mut host = gpu.pinned_for(&layer, len)?;
        gpu.swap_out(&layer, first, len, &mut host)?;
        gpu.sync()?;
        let words = num_slots * row * dtype.bytes() / 4;
        match (&mut layer.k, &mut layer.v) {
            (KvBuf::F32(k), KvBuf::F32(v)) => {
                gpu.fill_words(k, words, 0xffff_ffff)?;
                gpu.fill_words(v, words, 0xffff_ffff)?;
            }
            (KvBuf::Bf16(k), KvBuf::Bf16(v)) => {
                gpu.fill_words(k, words, 0xffff_ffff)?;
                gpu.fill_words(v, words, 0xffff_ffff)?;
            }
            _ => return Err(CudaError::Shape("mixed K/V types".into())),
        }
        gpu.swap_in(&mut layer, first, len, &host)?;
        gpu.sync()?;
        let (got_k, got_v) = (bits_of(&layer.k, gpu)?, bits_of(&layer.v, gpu)?);
        let r = first * row..(first + len) * row;
        let e = mismatch(&got_k[r.clone()], &want_k[r.clone()])
            .max(mismatch(&got_v[r.clone()], &want_v[r]));
        out.push(CheckRow::new(
            "swap",
            format!("{} 64 slots out to pinned memory and back", dtype.name()),
            e,
            0.0,
        ));
    }
    Ok(out)
}

/// The whole grid.
pub fn run(gpu: &Gpu, seed: u64, size: GridSize) -> Result<Vec<CheckRow>, CudaError> {
    let mut rows = data_movement(gpu, seed)?;
    rows.extend(attention_grid(gpu, seed, size)?);
    Ok(rows)
}
