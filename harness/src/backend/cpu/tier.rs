//! The lower KV tiers on the cpu backend: real pools of blocks in host memory, separate from
//! the device store, and the transfers the cache manager orders between them.
//!
//! A pool slot holds one block exactly as the store keeps it — every layer's K rows, V rows
//! and (FP8) the per-slot scales of `block_size` slots, in the element type of the store (f32,
//! bf16; an FP8 store keeps dequantised f32 values and f32 scales, and so does its pool) — so
//! an offload followed by an onload restores the block bit for bit. The disk tier is a second
//! pool of the same kind in host memory that *stands for* the disk: the bytes move for real,
//! the disk's speed is the cost model's business, not this backend's.

use kvbench_cache_api::{BlockLoc, Tier, TierOp};
use kvbench_kernels::{bf16, KernelError, KvElem};

use super::store::KvStore;
use crate::backend::BackendError;

/// The cpu backend refuses lower-tier pools above this many bytes each (as it refuses KV
/// storage above 16 GiB): they are real allocations on the machine running the benchmark.
pub const MAX_POOL_BYTES: u64 = 16 << 30;

/// One tier's slots, `slot_elems` elements each, NaN until written (an onload from a slot
/// nobody offloaded into poisons the logits instead of passing).
pub(super) struct Pool<E> {
    data: Vec<E>,
    slot_elems: usize,
    slots: usize,
}

impl<E: KvElem> Pool<E> {
    fn new(slots: usize, slot_elems: usize) -> Result<Pool<E>, BackendError> {
        let n = slots.checked_mul(slot_elems).ok_or_else(|| {
            BackendError::Config(format!(
                "{slots} tier slots of {slot_elems} elements overflow"
            ))
        })?;
        // Fallible: a pool the host cannot give is refused, not an abort.
        let mut data = Vec::new();
        data.try_reserve_exact(n).map_err(|_| {
            BackendError::Config(format!(
                "{slots} tier slots of {} bytes: the host cannot allocate the pool",
                slot_elems.saturating_mul(std::mem::size_of::<E>())
            ))
        })?;
        data.resize(n, E::from_f32(f32::NAN));
        Ok(Pool {
            data,
            slot_elems,
            slots,
        })
    }

    pub(super) fn slot(&self, i: usize) -> Result<&[E], KernelError> {
        self.check(i)?;
        Ok(&self.data[i * self.slot_elems..(i + 1) * self.slot_elems])
    }

    pub(super) fn slot_mut(&mut self, i: usize) -> Result<&mut [E], KernelError> {
        self.check(i)?;
        Ok(&mut self.data[i * self.slot_elems..(i + 1) * self.slot_elems])
    }

    fn check(&self, i: usize) -> Result<(), KernelError> {
        if i < self.slots {
            Ok(())
        } else {
            Err(KernelError::Config(format!(
                "tier slot {i} past the pool's {} slots",
                self.slots
            )))
        }
    }

    fn bytes(&self) -> u64 {
        (self.data.len() * std::mem::size_of::<E>()) as u64
    }
}

/// A pool in the store's element type.
pub(super) enum TierPool {
    F32(Pool<f32>),
    Bf16(Pool<bf16>),
}

impl TierPool {
    fn bytes(&self) -> u64 {
        match self {
            TierPool::F32(p) => p.bytes(),
            TierPool::Bf16(p) => p.bytes(),
        }
    }

    /// Copies slot `from` of `self` into slot `to` of `dst` (host → disk).
    fn copy_to(&self, from: usize, dst: &mut TierPool, to: usize) -> Result<(), KernelError> {
        match (self, dst) {
            (TierPool::F32(a), TierPool::F32(b)) => b.slot_mut(to)?.copy_from_slice(a.slot(from)?),
            (TierPool::Bf16(a), TierPool::Bf16(b)) => {
                b.slot_mut(to)?.copy_from_slice(a.slot(from)?)
            }
            _ => {
                return Err(KernelError::Config(
                    "tier pools of different element types".into(),
                ))
            }
        }
        Ok(())
    }
}

/// The host tier and the disk tier (either may have no slots).
pub(super) struct Tiers {
    host: TierPool,
    disk: TierPool,
    block_size: u32,
}

fn tier_err(op: &TierOp, e: impl std::fmt::Display) -> BackendError {
    BackendError::Step(format!(
        "tier op {}[{}] -> {}[{}]: {e}",
        op.from.tier.name(),
        op.from.slot,
        op.to.tier.name(),
        op.to.slot
    ))
}

impl Tiers {
    pub(super) fn new(
        store: &KvStore,
        host_blocks: u32,
        disk_blocks: u32,
        block_size: u32,
    ) -> Result<Tiers, BackendError> {
        let slot_bytes = store.block_bytes(block_size as usize);
        for (what, n) in [("host", host_blocks), ("disk", disk_blocks)] {
            let bytes = slot_bytes.saturating_mul(u64::from(n));
            if bytes > MAX_POOL_BYTES {
                return Err(BackendError::Config(format!(
                    "{what} tier of {n} blocks ({bytes} bytes) is too large for the cpu backend (at most {MAX_POOL_BYTES} bytes)"
                )));
            }
        }
        Ok(Tiers {
            host: store.new_pool(host_blocks as usize, block_size as usize)?,
            disk: store.new_pool(disk_blocks as usize, block_size as usize)?,
            block_size,
        })
    }

    /// Bytes of the host tier's pool (the disk's stand-in is not host-tier memory).
    pub(super) fn host_bytes(&self) -> u64 {
        self.host.bytes()
    }

    fn pool(&self, tier: Tier) -> Option<&TierPool> {
        match tier {
            Tier::Host => Some(&self.host),
            Tier::Disk => Some(&self.disk),
            Tier::Device => None,
        }
    }

    /// Performs one op on real bytes: device → lower tier (offload), lower → lower (host →
    /// disk), lower tier → device (onload). A block's every layer, K, V and scales move.
    pub(super) fn perform(&mut self, op: &TierOp, store: &mut KvStore) -> Result<(), BackendError> {
        if op.tokens != self.block_size {
            return Err(tier_err(
                op,
                format!(
                    "moves {} tokens; a tier slot holds one block of {}",
                    op.tokens, self.block_size
                ),
            ));
        }
        let bs = self.block_size as usize;
        let BlockLoc { tier: ft, slot: fs } = op.from;
        let BlockLoc { tier: tt, slot: ts } = op.to;
        let (fs, ts) = (fs as usize, ts as usize);
        let r = match (ft, tt) {
            (Tier::Device, Tier::Device) => {
                return Err(tier_err(op, "device to device is a copy, not a tier op"))
            }
            (Tier::Device, lower) => {
                let pool = match lower {
                    Tier::Host => &mut self.host,
                    _ => &mut self.disk,
                };
                store.offload_block(op.from.slot, bs, pool, ts)
            }
            (lower, Tier::Device) => {
                let pool = self
                    .pool(lower)
                    .ok_or_else(|| tier_err(op, "no such tier"))?;
                store.onload_block(pool, fs, op.to.slot, bs)
            }
            (Tier::Host, Tier::Disk) => self.host.copy_to(fs, &mut self.disk, ts),
            (Tier::Disk, Tier::Host) => self.disk.copy_to(fs, &mut self.host, ts),
            (a, b) => {
                return Err(tier_err(
                    op,
                    format!("{} to {} is not a transfer", a.name(), b.name()),
                ))
            }
        };
        r.map_err(|e| tier_err(op, e))
    }
}

/// The order a step's tier ops run in: the manager's order, except that each onload runs as
/// late as that order allows — just before the first later op that reads or writes its device
/// block, else at the end of the step's tier ops.
///
/// Why: an onload may run asynchronously, overlapping whatever else the step moves (that is why
/// the manager pins its source slot until the step retired), so a backend that ran it at once
/// would hide a manager that hands the source slot out again in the same step (planted fault
/// `stale-onload`): the offload overwriting the slot would land after the onload read it. Run
/// late, the onload reads the overwritten bytes and the oracle sees wrong logits. For a correct
/// manager nothing changes: a pinned slot is never written, and an op on the onload's device
/// block waits for it.
pub fn late_onload_order(ops: &[TierOp]) -> Vec<usize> {
    let mut order = Vec::with_capacity(ops.len());
    let mut deferred: Vec<usize> = Vec::new();
    let device_block = |l: &BlockLoc| (l.tier == Tier::Device).then_some(l.slot);
    for (i, op) in ops.iter().enumerate() {
        let touches = [device_block(&op.from), device_block(&op.to)];
        let conflict = deferred.iter().any(|&d| {
            let b = ops[d].to.slot;
            touches.contains(&Some(b))
        });
        if conflict {
            order.append(&mut deferred);
        }
        if op.is_onload() {
            deferred.push(i);
        } else {
            order.push(i);
        }
    }
    order.append(&mut deferred);
    order
}

impl KvStore {
    /// Elements of one pool slot: what `read_slots` yields for one block.
    fn block_elems(&self, block_size: usize) -> usize {
        block_size * self.elems_per_slot()
    }

    /// Bytes of one pool slot.
    pub(super) fn block_bytes(&self, block_size: usize) -> u64 {
        let elem = match self {
            KvStore::F32(_) => std::mem::size_of::<f32>(),
            KvStore::Bf16(_) => std::mem::size_of::<bf16>(),
        };
        (self.block_elems(block_size) as u64).saturating_mul(elem as u64)
    }

    fn new_pool(&self, slots: usize, block_size: usize) -> Result<TierPool, BackendError> {
        let n = self.block_elems(block_size);
        Ok(match self {
            KvStore::F32(_) => TierPool::F32(Pool::new(slots, n)?),
            KvStore::Bf16(_) => TierPool::Bf16(Pool::new(slots, n)?),
        })
    }
}
