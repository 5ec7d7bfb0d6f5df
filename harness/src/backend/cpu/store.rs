//! KV storage in the configured element type, and the data movement the engine asks for:
//! copy-on-write copies and swap transfers are performed for real on the stored K/V.
//!
//! In a grouped run the store is indexed by pool page (`grouped.rs`): made at the first grouped
//! layout the backend sees with `cache_slots ÷ page_slots` pages (a bound on the pool's), a page
//! copy is `stride` slots of every layer, and a swap gathers and scatters layer by layer, each
//! layer the positions its table still reads (`readable_from(shape, tokens) .. tokens`).

use kvbench_kernels::{
    bf16, KernelError, KvCache, KvElem, Run, StepSeq, TokenAddressing, Transformer,
};

use kvbench_cache_api::grouped::readable_from;

use super::addr::{Addr, GroupedAddr};
use super::setup::KvStorage;
use super::tier::TierPool;
use kvbench_kernels::PagedTable;

pub(super) enum KvStore {
    F32(KvCache<f32>),
    Bf16(KvCache<bf16>),
}

/// A swapped-out sequence's K/V on the host.
pub(super) enum HostKv {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

fn runs_of(addr: &Addr<'_>, tokens: usize, num_slots: usize) -> Result<Vec<Run>, KernelError> {
    let mut runs = Vec::new();
    addr.runs(tokens, num_slots, &mut runs)?;
    Ok(runs)
}

fn gather<E: KvElem>(
    kv: &KvCache<E>,
    addr: &Addr<'_>,
    tokens: usize,
) -> Result<Vec<E>, KernelError> {
    if let Addr::Grouped(g) = addr {
        return gather_grouped(kv, addr, g, tokens);
    }
    let mut out = Vec::with_capacity(tokens * kv.bytes_per_token() / std::mem::size_of::<E>());
    for r in runs_of(addr, tokens, kv.num_slots)? {
        kv.read_slots(r.first_slot, r.len, &mut out)?;
    }
    Ok(out)
}

fn scatter<E: KvElem>(
    kv: &mut KvCache<E>,
    addr: &Addr<'_>,
    tokens: usize,
    data: &[E],
) -> Result<(), KernelError> {
    if let Addr::Grouped(g) = addr {
        return scatter_grouped(kv, addr, g, tokens, data);
    }
    let mut at = 0;
    for r in runs_of(addr, tokens, kv.num_slots)? {
        at += kv.write_slots(r.first_slot, r.len, &data[at..])?;
    }
    Ok(())
}

/// Per layer with a table, the runs of the positions of a `tokens`-token sequence that table
/// still reads (all of them, or a sliding table's last `window`): what a swap moves.
fn grouped_runs(
    addr: &Addr<'_>,
    g: &GroupedAddr<'_>,
    tokens: usize,
    num_slots: usize,
) -> Result<Vec<(usize, Vec<Run>)>, KernelError> {
    let mut out = Vec::new();
    for (layer, t) in g.map.layer_tables.iter().enumerate() {
        let Some(t) = *t else { continue };
        let shape = g.shapes.get(t).ok_or(KernelError::Shape {
            what: "grouped table",
            expected: g.shapes.len(),
            got: t,
        })?;
        let from = usize::try_from(readable_from(shape, tokens as u64)).unwrap_or(usize::MAX);
        let mut runs = Vec::new();
        addr.runs_layer_from(layer, from, tokens, num_slots, &mut runs)?;
        out.push((layer, runs));
    }
    Ok(out)
}

/// A grouped swap-out: layer by layer, each through its own table.
fn gather_grouped<E: KvElem>(
    kv: &KvCache<E>,
    addr: &Addr<'_>,
    g: &GroupedAddr<'_>,
    tokens: usize,
) -> Result<Vec<E>, KernelError> {
    let mut out = Vec::new();
    for (layer, runs) in grouped_runs(addr, g, tokens, kv.num_slots)? {
        for r in runs {
            kv.read_layer_slots(layer, r.first_slot, r.len, &mut out)?;
        }
    }
    Ok(out)
}

/// A grouped swap-in: what [`gather_grouped`] read, written through the new tables.
fn scatter_grouped<E: KvElem>(
    kv: &mut KvCache<E>,
    addr: &Addr<'_>,
    g: &GroupedAddr<'_>,
    tokens: usize,
    data: &[E],
) -> Result<(), KernelError> {
    let mut at = 0;
    for (layer, runs) in grouped_runs(addr, g, tokens, kv.num_slots)? {
        for r in runs {
            let rest = data.get(at..).unwrap_or(&[]);
            at += kv.write_layer_slots(layer, r.first_slot, r.len, rest)?;
        }
    }
    if at != data.len() {
        return Err(KernelError::Shape {
            what: "grouped swap buffer",
            expected: data.len(),
            got: at,
        });
    }
    Ok(())
}

fn pool_type_err() -> KernelError {
    KernelError::Config("tier pool element type differs from the cache".into())
}

impl KvStore {
    /// An FP8 cache is an f32 one that quantises what it is written (see
    /// `kvbench_kernels::kv_quant`): copies and swaps move its values and scales as they are.
    pub(super) fn new(
        model: &Transformer,
        num_slots: usize,
        storage: &KvStorage,
    ) -> Result<KvStore, KernelError> {
        Ok(match storage {
            KvStorage::F32 => KvStore::F32(model.new_cache(num_slots)),
            KvStorage::Bf16 => KvStore::Bf16(model.new_cache(num_slots)),
            KvStorage::Fp8(q) => KvStore::F32(model.new_cache(num_slots).quantised(q.clone())?),
        })
    }

    pub(super) fn copy_slots(
        &mut self,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<(), KernelError> {
        match self {
            KvStore::F32(c) => c.copy_slots(src, dst, len),
            KvStore::Bf16(c) => c.copy_slots(src, dst, len),
        }
    }

    /// Reads the first `tokens` positions of a sequence (swap out).
    pub(super) fn swap_out(&self, addr: &Addr<'_>, tokens: usize) -> Result<HostKv, KernelError> {
        Ok(match self {
            KvStore::F32(c) => HostKv::F32(gather(c, addr, tokens)?),
            KvStore::Bf16(c) => HostKv::Bf16(gather(c, addr, tokens)?),
        })
    }

    /// Writes a swapped-out sequence back into its new layout (swap in).
    pub(super) fn swap_in(
        &mut self,
        addr: &Addr<'_>,
        tokens: usize,
        host: &HostKv,
    ) -> Result<(), KernelError> {
        match (self, host) {
            (KvStore::F32(c), HostKv::F32(d)) => scatter(c, addr, tokens, d),
            (KvStore::Bf16(c), HostKv::Bf16(d)) => scatter(c, addr, tokens, d),
            _ => Err(KernelError::Config(
                "swap buffer element type differs from the cache".into(),
            )),
        }
    }

    /// Slots every layer's arrays hold.
    pub(super) fn num_slots(&self) -> usize {
        match self {
            KvStore::F32(c) => c.num_slots,
            KvStore::Bf16(c) => c.num_slots,
        }
    }

    /// Host bytes one slot takes across every layer.
    pub(super) fn bytes_per_slot(&self) -> usize {
        let elem = match self {
            KvStore::F32(_) => std::mem::size_of::<f32>(),
            KvStore::Bf16(_) => std::mem::size_of::<bf16>(),
        };
        self.elems_per_slot() * elem
    }

    /// Elements one slot holds across every layer (K, V and scales; an MLA layer its latent
    /// row alone).
    pub(super) fn elems_per_slot(&self) -> usize {
        match self {
            KvStore::F32(c) => c.elems_per_slot(),
            KvStore::Bf16(c) => c.elems_per_slot(),
        }
    }

    /// Reads device block `block` (every layer's K, V and scales) into slot `slot` of `pool`,
    /// through the same address translation as the compute.
    pub(super) fn offload_block(
        &self,
        block: u32,
        block_size: usize,
        pool: &mut TierPool,
        slot: usize,
    ) -> Result<(), KernelError> {
        fn go<E: KvElem>(
            kv: &KvCache<E>,
            addr: &Addr<'_>,
            bs: usize,
            dst: &mut [E],
        ) -> Result<(), KernelError> {
            let data = gather(kv, addr, bs)?;
            if data.len() != dst.len() {
                return Err(KernelError::Shape {
                    what: "tier slot",
                    expected: dst.len(),
                    got: data.len(),
                });
            }
            dst.copy_from_slice(&data);
            Ok(())
        }
        let blocks = [block];
        let addr = Addr::Paged(PagedTable {
            block_size,
            blocks: &blocks,
        });
        match (self, pool) {
            (KvStore::F32(c), TierPool::F32(p)) => go(c, &addr, block_size, p.slot_mut(slot)?),
            (KvStore::Bf16(c), TierPool::Bf16(p)) => go(c, &addr, block_size, p.slot_mut(slot)?),
            _ => Err(pool_type_err()),
        }
    }

    /// Writes slot `slot` of `pool` into device block `block` (onload).
    pub(super) fn onload_block(
        &mut self,
        pool: &TierPool,
        slot: usize,
        block: u32,
        block_size: usize,
    ) -> Result<(), KernelError> {
        let blocks = [block];
        let addr = Addr::Paged(PagedTable {
            block_size,
            blocks: &blocks,
        });
        match (self, pool) {
            (KvStore::F32(c), TierPool::F32(p)) => scatter(c, &addr, block_size, p.slot(slot)?),
            (KvStore::Bf16(c), TierPool::Bf16(p)) => scatter(c, &addr, block_size, p.slot(slot)?),
            _ => Err(pool_type_err()),
        }
    }

    pub(super) fn forward(
        &mut self,
        model: &Transformer,
        seqs: &[StepSeq<'_, Addr<'_>>],
        states: &mut [Vec<f32>],
    ) -> Result<Vec<Option<Vec<f32>>>, KernelError> {
        match self {
            KvStore::F32(c) => model.forward_with_states(c, seqs, states),
            KvStore::Bf16(c) => model.forward_with_states(c, seqs, states),
        }
    }
}
