//! What the shadow saw in one run, as `summary.json` carries it (`runs[].shadow`): the counts a
//! reader needs to know what was vouched for, and the first violations in order.

use serde::Serialize;

/// Violation messages kept (all are counted).
const MAX_MESSAGES: usize = 16;

/// What the shadow saw in one run (`summary.json` `runs[].shadow`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ShadowReport {
    /// Context positions the steps read (Σ context + new tokens over scheduled sequences, plus
    /// swap-outs): what the shadow vouches for.
    pub read_slots: u64,
    /// Tags compared with the reader's expectation: positions a stream reads that it did not
    /// write through its current layout (prefix hits, forks, changed or invalidated table
    /// entries, swapped-in data, slots overwritten while a step read them). A stream's own
    /// writes are checked as they are made and kept valid by the reverse index.
    pub checked_slots: u64,
    /// Tags written (steps, copies, swap-ins).
    pub written_slots: u64,
    pub violations: u64,
    /// The first violations, in order.
    pub messages: Vec<String>,
    /// Memory the shadow allocated (tag and reverse index pages, the writers' table), bytes.
    pub allocated_bytes: u64,
    /// Tier transfers into a lower tier (offloads, moves to disk) the shadow carried out; absent
    /// from `summary.json` when there were none.
    #[serde(skip_serializing_if = "is_zero")]
    pub offloads: u64,
    /// Tier transfers into the device (onloads) the shadow carried out, each then read by the
    /// per-reader checks; absent when there were none.
    #[serde(skip_serializing_if = "is_zero")]
    pub onloads: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ShadowReport {
    pub(super) fn violation(&mut self, msg: String) {
        self.violations += 1;
        if self.messages.len() < MAX_MESSAGES {
            self.messages.push(msg);
        }
    }
}
