//! What `checker::shadow_grouped` runs: the layout mixes and the grouped managers built over
//! them, a test double that releases sliding blocks early (`early_release.rs`) and the seeded
//! step driver through the sim backend (`driver.rs`).
#![allow(dead_code)]

pub mod driver;
pub mod early_release;

use kvbench::cache::hybrid::{HybridKv, HybridLayout};
use kvbench::model::{LayerGroup, ModelShape};
use kvbench_baselines::manager::GroupedContiguous;
use kvbench_cache_api::KvCacheManager;

/// The largest prefill chunk the driver schedules (the contiguous rings are sized for it).
pub const CHUNK_TOKENS: u32 = 8;
pub const STEPS: u32 = 400;

// ---------------------------------------------------------------------------------------------
// Layouts and managers

pub use crate::support::groups::{full, shape};

/// One layout mix: its layer groups, block size, pages and reserved recurrent states.
pub struct Mix {
    pub shape: ModelShape,
    pub block_size: u32,
    pub pages: u64,
    pub states: u32,
}

pub fn mixes() -> Vec<Mix> {
    vec![
        Mix {
            // A window of 10 over 4-token blocks: not whole blocks, so reads start mid-block.
            shape: shape(
                "full+sliding",
                vec![
                    LayerGroup::Sliding {
                        layers: 2,
                        window: 10,
                        kv_heads: 2,
                        head_dim: 4,
                    },
                    full(2),
                ],
            ),
            block_size: 4,
            pages: 160,
            states: 0,
        },
        Mix {
            shape: shape(
                "full+recurrent",
                vec![
                    full(2),
                    LayerGroup::Recurrent {
                        layers: 2,
                        state_bytes: 1000,
                    },
                ],
            ),
            block_size: 4,
            pages: 90,
            // Enough states that the pool, not the states, limits the streams: a wrong table
            // then lands on a page another stream writes.
            states: 16,
        },
        Mix {
            // 32 bytes a token a full layer, 18 an MLA layer: 7-token MLA blocks in 4-slot pages.
            shape: shape(
                "full+mla",
                vec![
                    full(2),
                    LayerGroup::Mla {
                        layers: 2,
                        latent_dim: 7,
                        rope_dim: 2,
                        q_lora_rank: 0,
                    },
                ],
            ),
            block_size: 4,
            pages: 120,
            states: 0,
        },
    ]
}

pub fn layout(mix: &Mix) -> HybridLayout {
    let probe = HybridLayout::new(&mix.shape, mix.block_size, 1 << 30, 0).expect("layout");
    let budget = probe.page_bytes * mix.pages + probe.state_bytes_per_sequence * mix.states as u64;
    let l = HybridLayout::new(&mix.shape, mix.block_size, budget, mix.states).expect("layout");
    assert_eq!(
        u64::from(l.contiguous_pages),
        mix.pages,
        "{}",
        mix.shape.name
    );
    l
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Hybrid,
    Contiguous,
}

pub const MANAGERS: [Which; 2] = [Which::Hybrid, Which::Contiguous];

pub fn manager(which: Which, mix: &Mix) -> Box<dyn KvCacheManager> {
    match which {
        Which::Hybrid => Box::new(HybridKv::new(layout(mix))),
        Which::Contiguous => Box::new(GroupedContiguous::new(
            layout(mix).grouped_pool(),
            CHUNK_TOKENS,
        )),
    }
}
