//! Paged-vs-contiguous token comparison on a streaming run: greedy decoding is deterministic,
//! so every stream's tokens agree between the modes over the prefix both emitted. The paged
//! run's token ids are held (only when the backend computes: `sim`'s ids mean nothing and are
//! never held) until the contiguous run's stream of the same (request, rank) resolves; the
//! verdict is [`super::experiment::compare_tokens`]'s over the collected records.

use std::collections::BTreeMap;

use kvbench_cache_api::CacheMode;

use crate::engine::{RunSink, RunStart, StreamRecord};

#[derive(Default)]
pub struct TokenCheck {
    /// The run being fed: (mode, backend computes).
    run: Option<(CacheMode, bool)>,
    /// Paged streams by (request, rank): (stream index, token ids).
    paged: BTreeMap<(u64, u32), (u32, Vec<u32>)>,
    /// The mismatch of the lowest paged stream index, as `compare_tokens` reports the first.
    first: Option<(u32, String)>,
    /// Both runs computed.
    computes_both: bool,
}

impl TokenCheck {
    pub fn mismatch(&self) -> Option<String> {
        if !self.computes_both {
            return None;
        }
        self.first.as_ref().map(|(_, m)| m.clone())
    }
}

impl RunSink for TokenCheck {
    fn begin(&mut self, start: &RunStart) {
        match start.mode {
            CacheMode::Paged => {
                self.paged.clear();
                self.computes_both = start.computes;
            }
            CacheMode::Contiguous => self.computes_both &= start.computes,
        }
        self.run = Some((start.mode, start.computes));
    }

    fn stream_done(&mut self, index: u32, s: &StreamRecord) {
        match self.run {
            Some((CacheMode::Paged, true)) => {
                self.paged
                    .insert((s.request, s.rank), (index, s.token_ids.clone()));
            }
            Some((CacheMode::Contiguous, true)) => {
                let Some((pi, ids)) = self.paged.remove(&(s.request, s.rank)) else {
                    return;
                };
                let n = ids.len().min(s.token_ids.len());
                let Some(i) = (0..n).find(|&i| ids[i] != s.token_ids[i]) else {
                    return;
                };
                if self.first.as_ref().is_none_or(|(fi, _)| pi < *fi) {
                    self.first = Some((
                        pi,
                        format!(
                            "request {} at output token {i}: {} vs {}",
                            s.request_label(),
                            ids[i],
                            s.token_ids[i]
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
}
