//! The GPU correctness grid's host side, checked without a GPU: the shuffled block tables and
//! contiguous bases it builds, read through the CPU attention kernels, reproduce its f64
//! reference. So on a GPU a failed grid row points at the CUDA kernel, not at the grid.

use kvbench_baselines::attention::ContiguousRegion;
use kvbench_cuda::check::{contiguous_bases, logical, paged_tables, storage, BLOCK_SIZES, LENGTHS};
use kvbench_cuda::launch::AttnShape;
use kvbench_cuda::rng::Rng;
use kvbench_cuda::KvDtype;
use kvbench_kernels::{attention, AttnDims, LayerKv, PagedTable, QuerySpan, TokenAddressing};

fn seed() -> u64 {
    let s = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    eprintln!("seed {s} (replay: KVBENCH_SEED={s})");
    s
}

fn cpu_err<A: TokenAddressing>(
    lg: &kvbench_cuda::check::Logical,
    k: Vec<f32>,
    v: Vec<f32>,
    num_slots: usize,
    addrs: &[A],
) -> f64 {
    let s = lg.shape;
    let dims = AttnDims {
        q_heads: s.q_heads,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
    };
    let layer = LayerKv {
        k: k.into(),
        v: v.into(),
    };
    // One span per query row: its last token is the query, its length the row's.
    let spans: Vec<QuerySpan<'_, A>> = lg
        .rows
        .iter()
        .map(|&(seq, len)| QuerySpan {
            addr: &addrs[seq],
            context_len: len,
            q_len: 1,
        })
        .collect();
    let mut out = vec![f32::NAN; lg.q.len()];
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    attention(&layer, num_slots, dims, &spans, &lg.q, &mut out, scale).expect("cpu attention");
    out.iter()
        .zip(&lg.reference)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(
            0.0,
            |m: f64, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
        )
}

#[test]
fn grid_layouts_read_back_through_the_cpu_kernels_match_the_reference() {
    let mut rng = Rng::new(seed());
    for dtype in KvDtype::ALL {
        let shape = AttnShape {
            q_heads: 8,
            kv_heads: 2,
            head_dim: 64,
        };
        let lg = logical(dtype, shape, &mut rng);
        assert_eq!(
            lg.rows.len(),
            LENGTHS.len() + 3 * 16,
            "decode rows + 3 prefill chunks"
        );

        let (bases, n) = contiguous_bases();
        let (k, v) = storage(&lg, n, |s, p| bases[s] as usize + p);
        let regions: Vec<ContiguousRegion> = bases
            .iter()
            .zip(LENGTHS)
            .map(|(&b, l)| ContiguousRegion {
                base_slot: b as usize,
                capacity_tokens: l,
            })
            .collect();
        let e = cpu_err(&lg, k, v, n, &regions);
        assert!(e < 1e-4, "{} contiguous: {e}", dtype.name());

        for bs in BLOCK_SIZES {
            let pt = paged_tables(bs, &mut rng).expect("tables");
            let (k, v) = storage(&lg, pt.num_slots, |s, p| pt.slot(s, p));
            let tables: Vec<PagedTable<'_>> = pt
                .tables
                .iter()
                .map(|t| PagedTable {
                    block_size: bs,
                    blocks: t,
                })
                .collect();
            let e = cpu_err(&lg, k, v, pt.num_slots, &tables);
            assert!(e < 1e-4, "{} paged bs{bs}: {e}", dtype.name());
            // The flat device table says the same as the per-sequence ones.
            for (s, t) in pt.tables.iter().enumerate() {
                for (i, &b) in t.iter().enumerate() {
                    assert_eq!(pt.flat[s * pt.max_blocks + i], b as i32);
                }
            }
        }
    }
}

#[test]
fn a_wrong_table_is_caught_by_the_same_comparison() {
    // The comparison above can fail: reading one sequence through another's table does.
    let mut rng = Rng::new(seed());
    let shape = AttnShape {
        q_heads: 4,
        kv_heads: 2,
        head_dim: 64,
    };
    let lg = logical(KvDtype::F32, shape, &mut rng);
    let pt = paged_tables(16, &mut rng).expect("tables");
    let (k, v) = storage(&lg, pt.num_slots, |s, p| pt.slot(s, p));
    // The 513-token sequence reads its first block from the 4097-token one. (Swapping two of
    // its own blocks would go unnoticed: attention without positions is order-blind inside
    // the attended prefix, so the grid relies on rows ending at many positions instead.)
    let mut wrong = pt.tables.clone();
    wrong[4][0] = pt.tables[5][0];
    let tables: Vec<PagedTable<'_>> = wrong
        .iter()
        .map(|t| PagedTable {
            block_size: 16,
            blocks: t,
        })
        .collect();
    let e = cpu_err(&lg, k, v, pt.num_slots, &tables);
    assert!(e > 1e-2, "swapped tables went unnoticed: {e}");
}
