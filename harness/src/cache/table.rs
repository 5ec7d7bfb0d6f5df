//! Per-sequence block tables of the paged cache, the faults a test can arm, and the plan of a
//! `start`: plain data, importing no other piece of the manager but the prefix keys.

use std::hash::Hasher;
use std::sync::Arc;

use kvbench_cache_api::Pages;

use super::prefix::{PrefixKey, ScopeInfo};
use super::tier::PlannedHit;

#[derive(Debug, Clone)]
pub(crate) struct Seq {
    pub blocks: Pages,
    /// Token positions mapped (prompt + appended).
    pub len_tokens: u32,
    /// Token positions written.
    pub filled_tokens: u32,
    /// Prompt token ids, kept only when the prefix cache may publish them.
    pub prompt: Arc<[u32]>,
    /// Ids of the tokens appended after the prompt (`append_token`), kept likewise: generated
    /// blocks are published as prompt blocks are.
    pub generated: Vec<u32>,
    pub scope: Option<Arc<ScopeInfo>>,
    /// Leading full blocks whose prefix key is known (hit or published) and the last such key.
    pub keyed_blocks: u32,
    pub last_key: Option<PrefixKey>,
    /// With the bad-block-table fault: the corrupted table `layout` hands out.
    pub bad_layout: Option<Pages>,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Faults {
    pub skip_cow: bool,
    /// Appends that wrote a shared partially filled block in place (skip-cow fired).
    pub skipped_copies: u64,
    pub leak: bool,
    pub leaked_once: bool,
    pub bad_block_table: bool,
}

/// Sequence ids are engine-chosen integers, not attacker input: a multiplicative hash is enough
/// and several times cheaper than SipHash on the append path. Never iterated for output (reports
/// sort the ids first).
#[derive(Debug, Default)]
pub(crate) struct SeqIdHasher(u64);

impl Hasher for SeqIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ (n >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The plan for a `start`, computed without side effects.
pub(super) struct StartPlan {
    pub scope: Option<Arc<ScopeInfo>>,
    /// Leading full blocks found, in chain order: on the device, or in a lower tier (those
    /// need a fresh device block each, counted in `new_blocks`, and an onload).
    pub hits: Vec<PlannedHit>,
    /// Whether the chain ended on a block found in no tier (rather than at the prompt's end).
    pub missed: bool,
    pub new_blocks: u32,
    pub available_blocks: u32,
    pub total_blocks_needed: u32,
}
