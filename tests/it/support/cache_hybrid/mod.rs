//! What the hybrid paged manager's tests share: the layer-group mixes and a cache built on one
//! (here), the operation strings and the plain reference model they are checked against
//! (`model.rs`).
#![allow(dead_code)]

pub mod model;

use kvbench::cache::hybrid::{HybridCache, HybridLayout};
use kvbench::model::LayerGroup;

pub use crate::support::groups::{full, mix as shape, sliding, Mix};

pub fn mixes() -> Vec<Mix> {
    vec![
        Mix {
            // Gemma-like: five sliding layers to one full, a window that is not whole blocks.
            name: "5 sliding : 1 full",
            shape: shape(vec![sliding(5, 10), full(1)]),
            block_size: 4,
            pages: 90,
        },
        Mix {
            name: "full + recurrent",
            shape: shape(vec![
                full(2),
                LayerGroup::Recurrent {
                    layers: 2,
                    state_bytes: 1000,
                },
            ]),
            block_size: 4,
            // 256-byte pages, a 2000-byte state: 8 pages a sequence before any token.
            pages: 60,
        },
        Mix {
            // 32 bytes a token a full layer, 18 an MLA layer: 7-token MLA blocks, 4-byte tails.
            name: "full + mla",
            shape: shape(vec![
                full(2),
                LayerGroup::Mla {
                    layers: 2,
                    latent_dim: 7,
                    rope_dim: 2,
                    q_lora_rank: 0,
                },
            ]),
            block_size: 4,
            pages: 40,
        },
        Mix {
            // gpt-oss-like: alternating sliding and full, a window of two blocks, block size 1 too.
            name: "1 sliding : 1 full, block 1",
            shape: shape(vec![sliding(2, 3), full(2)]),
            block_size: 1,
            pages: 60,
        },
    ]
}

pub fn build(mix: &Mix) -> HybridCache {
    let probe = HybridLayout::new(&mix.shape, mix.block_size, 1 << 30, 0).unwrap();
    let budget = probe.page_bytes * mix.pages;
    let layout = HybridLayout::new(&mix.shape, mix.block_size, budget, 0).unwrap();
    assert_eq!(layout.pages as u64, mix.pages, "{}", mix.name);
    HybridCache::new(layout)
}
