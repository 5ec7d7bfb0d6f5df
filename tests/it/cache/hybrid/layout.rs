//! The hybrid paged manager's layouts (`kvbench::cache::hybrid::HybridLayout`): the
//! `gemma3-27b`, `gpt-oss-120b` and `qwen3-next-80b` presets and their fits against the summed
//! bytes slots computed by hand, per-block FP8 scales in a page, the layouts refused, and the
//! prefix hit rule per table kind.

use crate::support::cache_hybrid as cache_hybrid_support;

use cache_hybrid_support::{full, shape, sliding};
use kvbench::cache::hybrid::{
    compare_fit, prefix_hit_tokens, vllm_layers_per_table, HybridCache, HybridError, HybridLayout,
    TableKind,
};
use kvbench::model::{LayerGroup, ModelShape};

const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// Presets by hand

#[test]
fn gemma3_27b_layout_by_hand() {
    let shape = ModelShape::gemma3_27b();
    let layout = HybridLayout::new(&shape, 16, 16 * GIB, 0).unwrap();
    // 52 sliding and 10 full layers: gcd 2, so 26 + 5 tables of 2 layers, no padding.
    assert_eq!(layout.layers_per_table, 2);
    assert_eq!(layout.tables.len(), 31);
    let sliding = layout
        .tables
        .iter()
        .filter(|t| t.kind == TableKind::Sliding { window: 1024 })
        .count();
    assert_eq!(sliding, 26);
    // A layer's token: 2 (K, V) × 16 heads × 128 × 2 bytes = 8192; a page 2 × 16 × 8192.
    assert_eq!(layout.page_bytes, 262_144);
    assert!(layout.tables.iter().all(|t| t.block_tokens == 16
        && t.tail_bytes_per_page == 0
        && t.bytes_per_token == 16_384));
    assert_eq!(layout.pages, 65_536); // 16 GiB / 256 KiB
                                      // 4096 tokens: 5 full tables × 256 blocks + 26 sliding × 64 blocks (tokens 3072..4096).
    assert_eq!(layout.pages_per_sequence(4096), Some(1280 + 1664));
    assert_eq!(layout.bytes_per_sequence(4096), Some(771_751_936));
    assert_eq!(
        layout.bytes_per_sequence(32_768),
        Some((10_240 + 1664) * 262_144)
    );
    // vLLM's rule for 52 + 10: groups of 10, the sliding ones padded to 60 layers.
    assert_eq!(vllm_layers_per_table(&[52, 10]), Some(10));
    assert_eq!(vllm_layers_per_table(&[12, 13]), Some(13));
    assert_eq!(vllm_layers_per_table(&[18, 18]), Some(18));
}

#[test]
fn gpt_oss_120b_layout_by_hand() {
    let shape = ModelShape::gpt_oss_120b();
    let layout = HybridLayout::new(&shape, 16, 6 * GIB, 0).unwrap();
    assert_eq!(layout.layers_per_table, 18);
    assert_eq!(layout.tables.len(), 2);
    // 2 × 8 heads × 64 × 2 bytes = 2048 a layer's token; a page 18 × 16 × 2048.
    assert_eq!(layout.page_bytes, 589_824);
    assert_eq!(layout.pages, 10_922); // ⌊6 GiB / 576 KiB⌋
                                      // 4096 tokens: 256 full blocks + 8 sliding (window 128).
    assert_eq!(layout.pages_per_sequence(4096), Some(264));
    assert_eq!(layout.bytes_per_sequence(4096), Some(155_713_536));
    assert_eq!(layout.bytes_per_sequence(32_768), Some(2056 * 589_824));
}

#[test]
fn preset_fits_against_the_summed_bytes_slots_by_hand() {
    // gemma3-27b on one H100 (16 GiB of KV, as scenarios/gemma3-27b-h100.toml).
    let g4 = compare_fit(&ModelShape::gemma3_27b(), 16, 16 * GIB, 4096).unwrap();
    // Summed: 62 × 8192 = 507,904 bytes a token; 33,825 slots, 2114 blocks, 256 a sequence.
    assert_eq!(g4.summed_bytes_per_sequence, 2_080_374_784);
    assert_eq!(g4.summed_sequences, 8);
    assert_eq!(g4.hybrid_bytes_per_sequence, 771_751_936);
    assert_eq!(g4.hybrid_sequences, 22);
    // vLLM: 1 full table of 10 layers × 256 blocks + 6 sliding of 10 × 64, pages of 1.25 MiB.
    assert_eq!(g4.vllm_bytes_per_sequence, Some(640 * 1_310_720));
    assert_eq!(g4.vllm_sequences, Some(20));
    let g32 = compare_fit(&ModelShape::gemma3_27b(), 16, 16 * GIB, 32_768).unwrap();
    assert_eq!(g32.summed_bytes_per_sequence, 16_642_998_272);
    assert_eq!(g32.summed_sequences, 1);
    assert_eq!(g32.hybrid_bytes_per_sequence, 3_120_562_176);
    assert_eq!(g32.hybrid_sequences, 5);
    assert_eq!(g32.vllm_bytes_per_sequence, Some(2432 * 1_310_720));
    assert_eq!(g32.vllm_sequences, Some(5));

    // gpt-oss-120b on one H200 (6 GiB of KV, as scenarios/gpt-oss-120b-h200.toml).
    let o4 = compare_fit(&ModelShape::gpt_oss_120b(), 16, 6 * GIB, 4096).unwrap();
    // Summed: 36 × 2048 = 73,728 bytes a token; 87,381 slots, 5461 blocks.
    assert_eq!(o4.summed_bytes_per_sequence, 301_989_888);
    assert_eq!(o4.summed_sequences, 21);
    assert_eq!(o4.hybrid_bytes_per_sequence, 155_713_536);
    assert_eq!(o4.hybrid_sequences, 41);
    assert_eq!(
        o4.vllm_bytes_per_sequence,
        Some(155_713_536),
        "18 + 18: no padding either way"
    );
    let o32 = compare_fit(&ModelShape::gpt_oss_120b(), 16, 6 * GIB, 32_768).unwrap();
    assert_eq!(o32.summed_bytes_per_sequence, 2_415_919_104);
    assert_eq!(o32.summed_sequences, 2);
    assert_eq!(o32.hybrid_bytes_per_sequence, 1_212_678_144);
    assert_eq!(o32.hybrid_sequences, 5);
    assert_eq!(o32.vllm_sequences, Some(5));
}

#[test]
fn recurrent_state_comes_out_of_the_pool_on_demand() {
    let shape = ModelShape::qwen3_next_80b();
    // 36 layers × 1,097,728 bytes of state a sequence; 12 full layers of 2 × 2 × 256 × 2 bytes.
    let state = 36 * 1_097_728u64;
    let page = 12 * 16 * 2048u64;
    let layout = HybridLayout::new(&shape, 16, 4 * GIB, 10).unwrap();
    assert_eq!(layout.state_bytes_per_sequence, state);
    assert_eq!(layout.tables.len(), 1);
    assert_eq!(layout.page_bytes, page);
    // ⌈39,518,208 ÷ 393,216⌉ = 101 pages (100.5 of state, the last page half used).
    assert_eq!(layout.state_pages_per_sequence, 101);
    assert_eq!(state.div_ceil(page), 101);
    // The paged pool is the whole budget; the contiguous baseline's is less its 10 states.
    assert_eq!(layout.pages as u64, 4 * GIB / page);
    assert_eq!(layout.state_sequences, Some(10));
    assert_eq!(
        layout.contiguous_pages as u64,
        (4 * GIB - 10 * state) / page
    );
    let pages = layout.pages;
    let mut cache = HybridCache::new(layout);
    // 10,922 pages hold 108 states of 101 pages (10,908), no 109th.
    let fit = u64::from(pages) / 101;
    assert_eq!(fit, 108);
    for s in 0..fit {
        cache.start(s).unwrap();
    }
    assert_eq!(cache.state_bytes_held(), fit * state);
    assert_eq!(cache.used_pages() as u64, fit * 101);
    assert!(matches!(
        cache.start(fit),
        Err(HybridError::OutOfPages { needed: 101, .. })
    ));
    assert!(matches!(
        cache.fork(0, fit),
        Err(HybridError::OutOfPages { needed: 101, .. })
    ));
    cache.release(3).unwrap();
    assert_eq!(cache.fork(0, fit), Ok(()));
    let copies = cache.take_copies();
    assert_eq!(copies.len(), 101, "a fork copies every state page");
    assert!(cache.check_invariants().is_empty());
}

/// Per-block FP8 scales in the page: a full layer of 2 KV heads of 4 stores 16 bytes a token
/// and 2 × 2 f32 scales (16 bytes) a block; a sliding layer of 1 head 8 bytes and 8 bytes of
/// scales. The page is the larger block of 4 tokens, 4 × 16 + 16 = 80 bytes; the sliding table
/// fits ⌊(80 − 8) / 8⌋ = 9 tokens a page.
#[test]
fn per_block_fp8_scales_are_counted_in_each_page() {
    use kvbench::model::{Dtype, KvScale};
    let mut m = shape(vec![
        full(1),
        LayerGroup::Sliding {
            layers: 1,
            window: 20,
            kv_heads: 1,
            head_dim: 4,
        },
    ]);
    m.kv_dtype = Dtype::Fp8E4m3;
    m.kv_scale = Some((KvScale::PerBlock, 4));
    let layout = HybridLayout::new(&m, 4, 800, 0).unwrap();
    assert_eq!(layout.page_bytes, 80);
    assert_eq!(layout.pages, 10);
    let (f, s) = (&layout.tables[0], &layout.tables[1]);
    assert_eq!(
        (
            f.block_tokens,
            f.bytes_per_token,
            f.scale_bytes_per_block,
            f.tail_bytes_per_page
        ),
        (4, 16, 16, 0)
    );
    assert_eq!(
        (
            s.block_tokens,
            s.bytes_per_token,
            s.scale_bytes_per_block,
            s.tail_bytes_per_page
        ),
        (9, 8, 8, 0)
    );
    // The summed layout: 16 + 8 bytes a token, and (16 + 8) bytes of scales a 4-token block.
    assert_eq!(m.kv_bytes_per_token(), 16 + 8 + 6);
}

#[test]
fn layouts_refuse_what_they_cannot_lay_out() {
    use kvbench::cache::hybrid::LayoutError;
    let tiny = shape(vec![full(1)]);
    assert_eq!(
        HybridLayout::new(&tiny, 0, GIB, 0),
        Err(LayoutError::ZeroBlockSize)
    );
    assert!(matches!(
        HybridLayout::new(&tiny, 16, 10, 0),
        Err(LayoutError::BudgetTooSmall { .. })
    ));
    let only_state = shape(vec![LayerGroup::Recurrent {
        layers: 2,
        state_bytes: 64,
    }]);
    assert!(matches!(
        HybridLayout::new(&only_state, 16, GIB, 1),
        Err(LayoutError::NothingPaged(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Prefix hits per table kind

#[test]
fn prefix_hits_follow_each_table_kind() {
    // One sliding (window 8) and one full table, blocks of 4.
    let layout = HybridLayout::new(&shape(vec![sliding(1, 8), full(1)]), 4, GIB, 0).unwrap();
    assert_eq!(layout.tables[0].kind, TableKind::Sliding { window: 8 });
    let sliding_cached = |set: &'static [u64]| {
        move |t: usize, b: u64| if t == 0 { set.contains(&b) } else { b <= 8 }
    };
    // A 40-token prompt: at most 36 tokens (whole blocks, one token left to compute). At 36 the
    // window is tokens 28..36, blocks 7 and 8.
    assert_eq!(prefix_hit_tokens(&layout, 40, sliding_cached(&[7, 8])), 36);
    // Only blocks 2 and 3 cached: the longest hit whose window they cover is 16 (tokens 8..16).
    assert_eq!(prefix_hit_tokens(&layout, 40, sliding_cached(&[2, 3])), 16);
    assert_eq!(prefix_hit_tokens(&layout, 40, sliding_cached(&[])), 0);
    // The full table caps it: its blocks 0..3 only (12 tokens), window 4..12 = blocks 1, 2.
    let full_short = |t: usize, b: u64| if t == 0 { b == 1 || b == 2 } else { b < 3 };
    assert_eq!(prefix_hit_tokens(&layout, 40, full_short), 12);
    // Recurrent state has no checkpoints: never a hit.
    let hybrid = HybridLayout::new(
        &shape(vec![
            full(1),
            LayerGroup::Recurrent {
                layers: 1,
                state_bytes: 64,
            },
        ]),
        4,
        GIB,
        1,
    )
    .unwrap();
    assert_eq!(prefix_hit_tokens(&hybrid, 40, |_, _| true), 0);
}
