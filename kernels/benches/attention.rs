//! criterion benches for the decode-attention kernel, paged (shuffled block table) and
//! contiguous (one run per sequence, as `kvbench-baselines` builds it) over the same bytes, plus
//! the KV write by slot mapping. `kvbench kernel-bench` covers the full grid with a bandwidth
//! ceiling; these track regressions of the same code.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvbench_kernels::{
    attention, write_kv, AttnDims, KernelError, KvCache, PagedTable, QuerySpan, Run,
    TokenAddressing,
};

/// The contiguous address translation (mirrors `kvbench_baselines::attention::ContiguousRegion`,
/// which this crate cannot depend on).
struct Contiguous(usize);

impl TokenAddressing for Contiguous {
    fn mapped_tokens(&self) -> usize {
        usize::MAX
    }
    fn slot_of(&self, pos: usize) -> Result<usize, KernelError> {
        Ok(self.0 + pos)
    }
    fn runs(&self, len: usize, num_slots: usize, out: &mut Vec<Run>) -> Result<(), KernelError> {
        if self.0 + len > num_slots {
            return Err(KernelError::SlotOutOfRange {
                slot: self.0 as u64,
                len_tokens: len as u64,
                num_slots: num_slots as u64,
            });
        }
        out.push(Run {
            first_slot: self.0,
            len,
        });
        Ok(())
    }
}

/// A fixed pseudo-random permutation (LCG), so block placement is scattered but reproducible.
fn shuffled(n: usize) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..n).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (x >> 33) as usize % (i + 1));
    }
    v
}

fn decode(c: &mut Criterion) {
    let dims = AttnDims {
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
    };
    let mut g = c.benchmark_group("decode_attention");
    g.sample_size(10);
    for &(batch, ctx) in &[(8usize, 1024usize), (1, 8192)] {
        let slots = batch * ctx;
        let mut cache = KvCache::<f32>::new(1, slots, dims.kv_heads, dims.head_dim);
        for (i, x) in cache.layers[0].k.iter_mut().enumerate() {
            *x = ((i % 97) as f32 - 48.0) / 97.0;
        }
        for (i, x) in cache.layers[0].v.iter_mut().enumerate() {
            *x = ((i % 89) as f32 - 44.0) / 89.0;
        }
        let q: Vec<f32> = (0..batch * dims.q_row())
            .map(|i| ((i % 31) as f32 - 15.0) / 31.0)
            .collect();
        let mut out = vec![0f32; q.len()];
        g.throughput(Throughput::Bytes((slots * dims.kv_row() * 2 * 4) as u64));
        let bs = 16;
        let perm = shuffled(slots / bs);
        let nb = ctx / bs;
        let tables: Vec<PagedTable<'_>> = (0..batch)
            .map(|i| PagedTable {
                block_size: bs,
                blocks: &perm[i * nb..(i + 1) * nb],
            })
            .collect();
        let spans: Vec<_> = tables
            .iter()
            .map(|t| QuerySpan {
                addr: t,
                context_len: ctx,
                q_len: 1,
            })
            .collect();
        let id = format!("b{batch}_ctx{ctx}");
        g.bench_function(BenchmarkId::new("paged_bs16", &id), |b| {
            b.iter(|| {
                attention(&cache.layers[0], slots, dims, &spans, &q, &mut out, 0.088)
                    .expect("paged")
            })
        });
        let regions: Vec<Contiguous> = (0..batch).map(|i| Contiguous(i * ctx)).collect();
        let spans: Vec<_> = regions
            .iter()
            .map(|r| QuerySpan {
                addr: r,
                context_len: ctx,
                q_len: 1,
            })
            .collect();
        g.bench_function(BenchmarkId::new("contiguous", &id), |b| {
            b.iter(|| {
                attention(&cache.layers[0], slots, dims, &spans, &q, &mut out, 0.088)
                    .expect("contiguous")
            })
        });
    }
    g.finish();
}

fn kv_write(c: &mut Criterion) {
    let (kvh, hd, n) = (8usize, 128usize, 256usize);
    let mut cache = KvCache::<f32>::new(1, 4096, kvh, hd);
    let row = kvh * hd;
    let k: Vec<f32> = (0..n * row).map(|i| (i % 13) as f32).collect();
    let slots: Vec<i64> = shuffled(4096)
        .into_iter()
        .take(n)
        .map(|s| if s % 9 == 0 { -1 } else { s as i64 })
        .collect();
    let mut g = c.benchmark_group("kv_write");
    g.throughput(Throughput::Bytes((n * row * 2 * 4) as u64));
    g.bench_function("slot_mapping_256_tokens", |b| {
        b.iter(|| write_kv(&mut cache.layers[0], 4096, row, &k, &k, &slots).expect("write"))
    });
    g.finish();
}

criterion_group!(benches, decode, kv_write);
criterion_main!(benches);
