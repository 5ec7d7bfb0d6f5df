//! A CSV session's link chain: which earlier row a new row's prompt continues from.
//!
//! A session row's prompt is its previous row's first `min(len, prev_len)` tokens, then its own
//! fresh ids. Linking each row to its previous row made a turn's ids a walk over every earlier
//! turn (quadratic in the session). Here a row links to the nearest earlier row that still adds
//! ids below that prefix: a monotone stack of (where each row's own ids start, the row), starts
//! strictly increasing, from which a new row pops the rows whose own ids all lie at or past its
//! prefix (no later row reads them through the chain). Each row is pushed and popped once, and a
//! chain holds only rows that add ids: making a turn's ids walks one link per run of ids.

use std::sync::Arc;

use crate::workload::{Continuation, Recipe};

/// One CSV session's rows a later row may continue (see `replay_kept`).
pub(super) struct SessionChain {
    /// (position where the row's own ids start, the row); the first entry is the session's
    /// first row (own ids from 0), starts strictly increase.
    stack: Vec<(u32, Arc<Recipe>)>,
    prev_key: u64,
    pub(super) prev_len_tokens: u32,
}

impl SessionChain {
    pub(super) fn new(first: Arc<Recipe>) -> SessionChain {
        SessionChain {
            prev_key: first.key,
            prev_len_tokens: first.len_tokens,
            stack: vec![(0, first)],
        }
    }

    /// The link of a row continuing the previous one with its first `upto` tokens: the
    /// nearest row whose first `upto` tokens are the previous row's (rows whose own ids start
    /// at or past `upto` give none of them, and no later row of the session reads them through
    /// its chain: they are popped).
    ///
    /// `key`: the new row's request id (`None`: its previous row is more than `u32::MAX`
    /// requests back).
    pub(super) fn link(&mut self, upto: u32, key: u64) -> Option<Continuation> {
        let prev_back = u32::try_from(key.checked_sub(self.prev_key)?).ok()?;
        while self.stack.len() > 1 && self.stack.last().is_some_and(|(s, _)| *s >= upto) {
            self.stack.pop();
        }
        let from = Arc::clone(&self.stack.last()?.1);
        Some(Continuation {
            from,
            prev_back,
            prev_len_tokens: self.prev_len_tokens,
        })
    }

    /// The row just made (linked by `link(own_from)`) is the session's latest.
    pub(super) fn push(&mut self, own_from: u32, row: Arc<Recipe>) {
        self.prev_key = row.key;
        self.prev_len_tokens = row.len_tokens;
        self.stack.push((own_from, row));
    }
}
