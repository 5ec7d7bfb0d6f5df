//! What the hybrid trait manager's tests share: the layer-group mixes, the operations of a
//! string, the reference model (`model.rs`) and the checker that runs a string through the
//! trait and the model side by side (`checker.rs`).
#![allow(dead_code)]

pub mod checker;
pub mod model;

use kvbench::cache::hybrid::{HybridKv, HybridLayout};
use kvbench::model::LayerGroup;
use kvbench_cache_api::{AllocError, KvCacheManager, StartRequest};

// ---------------------------------------------------------------------------------------------
// Group mixes

pub use crate::support::groups::{full, mix as shape, sliding, Mix};

pub fn mixes() -> Vec<Mix> {
    vec![
        Mix {
            name: "2 sliding : 1 full",
            shape: shape(vec![sliding(2, 10), full(1)]),
            block_size: 4,
            pages: 48,
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
            pages: 56,
        },
        Mix {
            // 32 bytes a token a full layer, 18 an MLA layer: 7-token MLA blocks.
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
            name: "sliding only",
            shape: shape(vec![sliding(2, 6)]),
            block_size: 4,
            pages: 24,
        },
    ]
}

pub fn build(mix: &Mix) -> HybridKv {
    let probe = HybridLayout::new(&mix.shape, mix.block_size, 1 << 30, 0).unwrap();
    let layout =
        HybridLayout::new(&mix.shape, mix.block_size, probe.page_bytes * mix.pages, 0).unwrap();
    assert_eq!(layout.pages as u64, mix.pages, "{}", mix.name);
    HybridKv::new(layout)
}

#[derive(Debug, Clone, Copy)]
pub enum Op {
    Start {
        len: u8,
    },
    /// `n` below 20: at most what is left to fill; 20 and above: `n` as is (may overrun).
    Fill {
        pick: u8,
        n: u8,
    },
    Append {
        pick: u8,
    },
    Fork {
        pick: u8,
    },
    Release {
        pick: u8,
    },
    Begin,
    Retire {
        pick: u8,
    },
}

pub fn start(kv: &mut HybridKv, seq: u64, len: u32) -> Result<(), AllocError> {
    let tokens: Vec<u32> = (0..len).collect();
    kv.start(&StartRequest {
        seq,
        tokens: &tokens,
        scope: None,
        reserve_tokens: len,
    })
    .map(|_| ())
}
