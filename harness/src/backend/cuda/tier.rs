//! The lower KV tiers on the `cuda` backend: the host tier in page-locked host memory, filled
//! and read by asynchronous copies queued on the step's stream, and the disk tier as a plain
//! host buffer standing for the disk (its bytes move for real; its speed is the cost model's).
//!
//! Layout: per layer one pinned buffer of `host_blocks` slots, each one block's K rows then
//! its V rows (`2 × block_size × kv_row` elements, the device's element type); the disk's
//! buffers the same. Ordering: everything the device does goes on the one stream in plan order
//! (offload copies, onload copies, then the step's copies, swaps and compute), so a device
//! block offloaded is read before anything later overwrites it and an onload lands before
//! compute reads it. The host touches tier memory in two places only, and waits first:
//! - reading a host slot (host → disk): the slot's last device → host copy must have landed —
//!   the host waits for the event of the step that queued it ([`Pending`] says which);
//! - writing a host slot (disk → host) or reading a device block into the disk (device →
//!   disk): the host waits for the stream (rare: the manager's disk tier is fed from the host).
//!
//! A disk → device onload is staged through a fresh pinned buffer per layer that the step's
//! in-flight record keeps alive until its event completed.

use kvbench_cache_api::{Tier, TierOp};
use kvbench_cuda::device::{DevLayer, Gpu, PinnedKv};
use kvbench_cuda::{CudaError, KvDtype};

use crate::backend::BackendError;

/// The cuda backend refuses a host tier above this many bytes (page-locked memory is taken
/// from the machine's RAM for the whole run), as the cpu backend does its pools.
pub const MAX_POOL_BYTES: u64 = crate::backend::cpu::MAX_TIER_POOL_BYTES;

/// The disk's stand-in for one layer.
enum DiskBuf {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

/// Who may still be writing a host slot: the step (by id) whose device → host copy into it is
/// queued; `None` once the host knows it landed.
pub(super) type Pending = Option<u64>;

/// What the host must wait for before it touches tier memory.
pub(super) enum Wait {
    /// Everything queued on the stream so far, the step being built included.
    Stream,
    /// The copies of step `id` (in flight, or the one being built).
    Step(u64),
}

pub(super) struct CudaTiers {
    host: Vec<PinnedKv>,
    disk: Vec<DiskBuf>,
    host_blocks: usize,
    disk_blocks: usize,
    block_size: usize,
    /// Elements of one block's K (or V) rows of one layer.
    block_elems: usize,
    host_writer: Vec<Pending>,
    host_bytes: u64,
}

fn tier_err(op: &TierOp, e: impl std::fmt::Display) -> BackendError {
    BackendError::Step(format!(
        "cuda: tier op {}[{}] -> {}[{}]: {e}",
        op.from.tier.name(),
        op.from.slot,
        op.to.tier.name(),
        op.to.slot
    ))
}

fn config_err(e: CudaError) -> BackendError {
    BackendError::Config(format!("cuda: host tier: {e}"))
}

impl CudaTiers {
    pub(super) fn new(
        gpu: &Gpu,
        layers: &[DevLayer],
        dtype: KvDtype,
        host_blocks: u32,
        disk_blocks: u32,
        block_size: u32,
    ) -> Result<CudaTiers, BackendError> {
        let row = layers.first().map_or(0, |l| l.shape.kv_row());
        let block_size = block_size.max(1) as usize;
        let block_elems = block_size
            .checked_mul(row)
            .ok_or_else(|| BackendError::Config("cuda: tier block size overflows".into()))?;
        let slot_bytes = (2 * block_elems * dtype.bytes()) as u64 * layers.len() as u64;
        for (what, n) in [("host", host_blocks), ("disk", disk_blocks)] {
            let bytes = slot_bytes.saturating_mul(u64::from(n));
            if bytes > MAX_POOL_BYTES {
                return Err(BackendError::Config(format!(
                    "{what} tier of {n} blocks ({bytes} bytes) is too large for the cuda backend (at most {MAX_POOL_BYTES} bytes of host memory)"
                )));
            }
        }
        let (hb, db) = (host_blocks as usize, disk_blocks as usize);
        let mut host = Vec::with_capacity(layers.len());
        let mut disk = Vec::with_capacity(layers.len());
        for _ in layers {
            if hb > 0 {
                host.push(
                    gpu.pinned(dtype, 2 * hb * block_elems)
                        .map_err(config_err)?,
                );
            }
            let n = 2 * db * block_elems;
            disk.push(match dtype {
                KvDtype::F32 => DiskBuf::F32(vec![f32::NAN; n]),
                // Two bf16 NaNs, as fresh device KV.
                KvDtype::Bf16 => DiskBuf::Bf16(vec![0x7fc0; n]),
            });
        }
        Ok(CudaTiers {
            host,
            disk,
            host_blocks: hb,
            disk_blocks: db,
            block_size,
            block_elems,
            host_writer: vec![None; hb],
            host_bytes: slot_bytes.saturating_mul(u64::from(host_blocks)),
        })
    }

    /// Page-locked bytes of the host tier.
    pub(super) fn host_bytes(&self) -> u64 {
        self.host_bytes
    }

    /// Element offsets of a slot's K and V rows in one layer's buffer.
    fn at(&self, slot: usize) -> (usize, usize) {
        let k = 2 * slot * self.block_elems;
        (k, k + self.block_elems)
    }

    fn check(&self, op: &TierOp, tier: Tier, slot: usize) -> Result<(), BackendError> {
        let cap = match tier {
            Tier::Host => self.host_blocks,
            Tier::Disk => self.disk_blocks,
            Tier::Device => return Ok(()),
        };
        if slot < cap {
            Ok(())
        } else {
            Err(tier_err(
                op,
                format!("{} slot {slot} past the pool's {cap} slots", tier.name()),
            ))
        }
    }

    /// Queues (or performs) one op. `step` is the id of the step being built; `wait` blocks
    /// the host until what it names completed; disk → device staging buffers go to `keep`.
    pub(super) fn perform(
        &mut self,
        gpu: &Gpu,
        kv: &mut [DevLayer],
        op: &TierOp,
        step: u64,
        wait: &mut dyn FnMut(Wait) -> Result<(), BackendError>,
        keep: &mut Vec<Vec<PinnedKv>>,
    ) -> Result<(), BackendError> {
        if op.tokens as usize != self.block_size {
            return Err(tier_err(
                op,
                format!(
                    "moves {} tokens; a tier slot holds one block of {}",
                    op.tokens, self.block_size
                ),
            ));
        }
        let (fs, ts) = (op.from.slot as usize, op.to.slot as usize);
        self.check(op, op.from.tier, fs)?;
        self.check(op, op.to.tier, ts)?;
        let bs = self.block_size;
        let e = |err: CudaError| tier_err(op, err);
        match (op.from.tier, op.to.tier) {
            (Tier::Device, Tier::Host) => {
                let first = fs.checked_mul(bs).ok_or_else(|| tier_err(op, "overflow"))?;
                let at = self.at(ts);
                for (layer, host) in kv.iter().zip(&mut self.host) {
                    gpu.swap_out_kv(layer, first, bs, host, at).map_err(e)?;
                }
                self.host_writer[ts] = Some(step);
            }
            (Tier::Host, Tier::Device) => {
                let first = ts.checked_mul(bs).ok_or_else(|| tier_err(op, "overflow"))?;
                let at = self.at(fs);
                for (layer, host) in kv.iter_mut().zip(&self.host) {
                    gpu.swap_in_kv(layer, first, bs, host, at).map_err(e)?;
                }
            }
            (Tier::Host, Tier::Disk) => {
                if let Some(writer) = self.host_writer[fs] {
                    wait(Wait::Step(writer))?;
                    self.host_writer[fs] = None;
                }
                let (src, dst) = (self.at(fs).0, self.at(ts).0);
                let n = 2 * self.block_elems;
                for (host, disk) in self.host.iter().zip(&mut self.disk) {
                    match (host, disk) {
                        (PinnedKv::F32(h), DiskBuf::F32(d)) => {
                            d[dst..dst + n].copy_from_slice(&h.as_slice().map_err(e)?[src..src + n])
                        }
                        (PinnedKv::Bf16(h), DiskBuf::Bf16(d)) => {
                            d[dst..dst + n].copy_from_slice(&h.as_slice().map_err(e)?[src..src + n])
                        }
                        _ => return Err(tier_err(op, "pools of different element types")),
                    }
                }
            }
            (Tier::Disk, Tier::Device) => {
                let first = ts.checked_mul(bs).ok_or_else(|| tier_err(op, "overflow"))?;
                let src = self.at(fs).0;
                let n = 2 * self.block_elems;
                let mut staged = Vec::with_capacity(kv.len());
                for (layer, disk) in kv.iter_mut().zip(&self.disk) {
                    let mut buf = gpu.pinned(layer.k.dtype(), n).map_err(e)?;
                    match (&mut buf, disk) {
                        (PinnedKv::F32(h), DiskBuf::F32(d)) => {
                            h.as_mut_slice().map_err(e)?[..n].copy_from_slice(&d[src..src + n])
                        }
                        (PinnedKv::Bf16(h), DiskBuf::Bf16(d)) => {
                            h.as_mut_slice().map_err(e)?[..n].copy_from_slice(&d[src..src + n])
                        }
                        _ => return Err(tier_err(op, "pools of different element types")),
                    }
                    let queued = gpu.swap_in_kv(layer, first, bs, &buf, (0, self.block_elems));
                    staged.push(buf);
                    if let Err(err) = queued {
                        keep.push(staged);
                        return Err(e(err));
                    }
                }
                keep.push(staged);
            }
            (Tier::Disk, Tier::Host) => {
                // Queued copies may read or write the slot: the host writes it once idle.
                wait(Wait::Stream)?;
                self.host_writer[ts] = None;
                let (src, dst) = (self.at(fs).0, self.at(ts).0);
                let n = 2 * self.block_elems;
                for (host, disk) in self.host.iter_mut().zip(&self.disk) {
                    match (host, disk) {
                        (PinnedKv::F32(h), DiskBuf::F32(d)) => h.as_mut_slice().map_err(e)?
                            [dst..dst + n]
                            .copy_from_slice(&d[src..src + n]),
                        (PinnedKv::Bf16(h), DiskBuf::Bf16(d)) => h.as_mut_slice().map_err(e)?
                            [dst..dst + n]
                            .copy_from_slice(&d[src..src + n]),
                        _ => return Err(tier_err(op, "pools of different element types")),
                    }
                }
            }
            (Tier::Device, Tier::Disk) => {
                let first = fs.checked_mul(bs).ok_or_else(|| tier_err(op, "overflow"))?;
                let n = 2 * self.block_elems;
                let mut staged = Vec::with_capacity(kv.len());
                for layer in kv.iter() {
                    let mut buf = gpu.pinned(layer.k.dtype(), n).map_err(e)?;
                    let queued = gpu.swap_out_kv(layer, first, bs, &mut buf, (0, self.block_elems));
                    staged.push(buf);
                    if let Err(err) = queued {
                        keep.push(staged);
                        return Err(e(err));
                    }
                }
                wait(Wait::Stream)?;
                let dst = self.at(ts).0;
                for (buf, disk) in staged.iter().zip(&mut self.disk) {
                    match (buf, disk) {
                        (PinnedKv::F32(h), DiskBuf::F32(d)) => {
                            d[dst..dst + n].copy_from_slice(&h.as_slice().map_err(e)?[..n])
                        }
                        (PinnedKv::Bf16(h), DiskBuf::Bf16(d)) => {
                            d[dst..dst + n].copy_from_slice(&h.as_slice().map_err(e)?[..n])
                        }
                        _ => return Err(tier_err(op, "pools of different element types")),
                    }
                }
            }
            (a, b) => {
                return Err(tier_err(
                    op,
                    format!("{} to {} is not a tier transfer", a.name(), b.name()),
                ))
            }
        }
        Ok(())
    }
}
