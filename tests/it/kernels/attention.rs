//! Paged attention (kvbench-kernels) against contiguous attention (kvbench-baselines): the same
//! K/V values placed behind a shuffled block table and in a contiguous region must give
//! bit-identical outputs, both matching a plain f64 reference. Odd lengths, GQA 1/4/8, head
//! dims 64/128, block sizes 8/16/32, NaN-poisoned outputs, fresh non-zero inputs per case.
//! Replay a failure with the printed KVBENCH_SEED.

use crate::support::kernels_common as common;

use common::{nonzero, reference_attention};
use kvbench_baselines::attention::ContiguousRegion;
use kvbench_kernels::{
    attention, write_kv, AttnDims, KernelError, KvCache, PagedTable, QuerySpan, TokenAddressing,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const LENS: [usize; 7] = [1, 15, 16, 17, 54, 97, 513];
const KV_HEADS: usize = 2;

/// One span per test length over the given addressings (paged tables or contiguous regions).
fn spans<A>(addrs: &[A], q_len: impl Fn(usize) -> usize) -> Vec<QuerySpan<'_, A>> {
    addrs
        .iter()
        .zip(LENS)
        .map(|(addr, context_len)| QuerySpan {
            addr,
            context_len,
            q_len: q_len(context_len),
        })
        .collect()
}

fn write_seq<A: TokenAddressing>(
    cache: &mut KvCache<f32>,
    addr: &A,
    k: &[f32],
    v: &[f32],
    len: usize,
) {
    let slots: Vec<i64> = (0..len)
        .map(|p| addr.slot_of(p).expect("mapped") as i64)
        .collect();
    let (n, row) = (cache.num_slots, cache.row_elems());
    write_kv(&mut cache.layers[0], n, row, k, v, &slots).expect("write");
}

#[test]
fn paged_and_contiguous_agree_bit_for_bit_and_match_the_reference() {
    let seed = common::seed("paged_vs_contiguous");
    let mut case = 0u64;
    for bs in [8usize, 16, 32] {
        for gqa in [1usize, 4, 8] {
            for hd in [64usize, 128] {
                case += 1;
                let mut r =
                    ChaCha8Rng::seed_from_u64(seed ^ case.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let row = KV_HEADS * hd;
                let q_heads = KV_HEADS * gqa;
                let dims = AttnDims {
                    q_heads,
                    kv_heads: KV_HEADS,
                    head_dim: hd,
                };
                // Paged cache: shuffled blocks. Contiguous cache: back-to-back regions.
                let blocks: usize = LENS.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 2;
                let mut perm: Vec<u32> = (0..blocks as u32).collect();
                perm.shuffle(&mut r);
                let mut paged = KvCache::<f32>::new(1, blocks * bs, KV_HEADS, hd);
                let total: usize = LENS.iter().sum::<usize>() + 7;
                let mut contig = KvCache::<f32>::new(1, total, KV_HEADS, hd);
                let (mut tables, mut regions, mut kvs) = (Vec::new(), Vec::new(), Vec::new());
                let (mut next_block, mut next_slot) = (0, 3);
                for len in LENS {
                    let nb = len.div_ceil(bs);
                    tables.push(perm[next_block..next_block + nb].to_vec());
                    next_block += nb;
                    regions.push(ContiguousRegion {
                        base_slot: next_slot,
                        capacity_tokens: len,
                    });
                    next_slot += len;
                    kvs.push((nonzero(&mut r, len * row), nonzero(&mut r, len * row)));
                }
                for (i, len) in LENS.into_iter().enumerate() {
                    let pt = PagedTable {
                        block_size: bs,
                        blocks: &tables[i],
                    };
                    write_seq(&mut paged, &pt, &kvs[i].0, &kvs[i].1, len);
                    write_seq(&mut contig, &regions[i], &kvs[i].0, &kvs[i].1, len);
                }
                let pts: Vec<PagedTable<'_>> = tables
                    .iter()
                    .map(|t| PagedTable {
                        block_size: bs,
                        blocks: t,
                    })
                    .collect();
                // Decode for the odd cases, a prefill chunk for the even ones.
                let q_len = |len: usize| {
                    if case % 2 == 1 {
                        1
                    } else {
                        (len / 2).clamp(1, 40)
                    }
                };
                let pspans = spans(&pts, q_len);
                let cspans = spans(&regions, q_len);
                let nq: usize = pspans.iter().map(|s| s.q_len).sum();
                let q = nonzero(&mut r, nq * dims.q_row());
                let scale = 1.0 / (hd as f32).sqrt();
                let mut out_p = vec![f32::NAN; q.len()];
                let mut out_c = vec![f32::NAN; q.len()];
                attention(
                    &paged.layers[0],
                    paged.num_slots,
                    dims,
                    &pspans,
                    &q,
                    &mut out_p,
                    scale,
                )
                .expect("paged");
                attention(
                    &contig.layers[0],
                    contig.num_slots,
                    dims,
                    &cspans,
                    &q,
                    &mut out_c,
                    scale,
                )
                .expect("contiguous");
                assert!(
                    out_p.iter().all(|x| x.is_finite()),
                    "case {case}: unwritten output"
                );
                assert_eq!(
                    out_p, out_c,
                    "case {case} (block {bs}, gqa {gqa}, hd {hd}): layouts disagree"
                );
                let mut at = 0;
                for (i, len) in LENS.into_iter().enumerate() {
                    for j in 0..q_len(len) {
                        let ctx = len - q_len(len) + j + 1;
                        let qr = &q[at * dims.q_row()..(at + 1) * dims.q_row()];
                        let want = reference_attention(
                            qr, &kvs[i].0, &kvs[i].1, ctx, q_heads, KV_HEADS, hd,
                        );
                        let got = &out_p[at * dims.q_row()..(at + 1) * dims.q_row()];
                        let num: f64 = got
                            .iter()
                            .zip(&want)
                            .map(|(a, b)| (*a as f64 - b).powi(2))
                            .sum();
                        let den: f64 = want.iter().map(|b| b * b).sum();
                        let err = (num / den).sqrt();
                        assert!(
                            err <= 1e-5,
                            "case {case}: len {len} query {j}: rel err {err:.2e}"
                        );
                        at += 1;
                    }
                }
            }
        }
    }
}

#[test]
fn bad_addresses_are_errors_and_change_nothing() {
    let mut cache = KvCache::<f32>::new(1, 32, KV_HEADS, 8);
    let row = cache.row_elems();
    let before = cache.layers[0]
        .k
        .iter()
        .map(|x| x.to_bits())
        .collect::<Vec<_>>();
    let k = vec![0.5f32; 2 * row];
    // One slot in range, one past the end: nothing may be written.
    let err = write_kv(&mut cache.layers[0], 32, row, &k, &k, &[3, 32]);
    assert!(
        matches!(err, Err(KernelError::SlotOutOfRange { slot: 32, .. })),
        "{err:?}"
    );
    assert_eq!(
        before,
        cache.layers[0]
            .k
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    );
    // A block table pointing past the cache, and a region past the cache.
    let dims = AttnDims {
        q_heads: 2,
        kv_heads: KV_HEADS,
        head_dim: 8,
    };
    let q = vec![0.3f32; dims.q_row()];
    let mut out = vec![f32::NAN; q.len()];
    let t = PagedTable {
        block_size: 16,
        blocks: &[1, 2],
    };
    let s = [QuerySpan {
        addr: &t,
        context_len: 20,
        q_len: 1,
    }];
    assert!(matches!(
        attention(&cache.layers[0], 32, dims, &s, &q, &mut out, 1.0),
        Err(KernelError::SlotOutOfRange { slot: 32, .. })
    ));
    let c = ContiguousRegion {
        base_slot: 30,
        capacity_tokens: 8,
    };
    let s = [QuerySpan {
        addr: &c,
        context_len: 5,
        q_len: 1,
    }];
    assert!(attention(&cache.layers[0], 32, dims, &s, &q, &mut out, 1.0).is_err());
    assert!(
        out.iter().all(|x| x.is_nan()),
        "a refused call wrote output"
    );
}

#[test]
fn copies_and_swaps_move_every_layer_exactly() {
    let mut r = ChaCha8Rng::seed_from_u64(common::seed("kv_write"));
    let mut cache = KvCache::<f32>::new(3, 64, KV_HEADS, 8);
    for l in &mut cache.layers {
        l.k = nonzero(&mut r, l.k.len()).into();
        l.v = nonzero(&mut r, l.v.len()).into();
    }
    let orig = cache.clone();
    cache.copy_slots(5, 40, 7).expect("copy");
    let row = cache.row_elems();
    for (l, o) in cache.layers.iter().zip(&orig.layers) {
        assert_eq!(l.k[40 * row..47 * row], o.k[5 * row..12 * row]);
        assert_eq!(l.v[40 * row..47 * row], o.v[5 * row..12 * row]);
        assert_eq!(l.k[..40 * row], o.k[..40 * row], "copy touched other slots");
    }
    let mut host = Vec::new();
    cache.read_slots(40, 7, &mut host).expect("swap out");
    let mut fresh = KvCache::<f32>::new(3, 64, KV_HEADS, 8);
    assert_eq!(fresh.write_slots(10, 7, &host), Ok(host.len()));
    for (l, o) in fresh.layers.iter().zip(&orig.layers) {
        assert_eq!(l.k[10 * row..17 * row], o.k[5 * row..12 * row]);
        assert_eq!(l.v[10 * row..17 * row], o.v[5 * row..12 * row]);
    }
    assert!(cache.copy_slots(60, 0, 5).is_err());
    assert!(fresh.write_slots(10, 7, &host[1..]).is_err());
}
