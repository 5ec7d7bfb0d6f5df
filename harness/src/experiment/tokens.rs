//! Paged-vs-contiguous token comparison on a streaming run: greedy decoding is deterministic,
//! so every stream's tokens agree between the modes over the prefix both emitted. The paged
//! run's token ids are held (only when the backend computes: `sim`'s ids mean nothing and are
//! never held) until the contiguous run's stream of the same (request, rank) resolves; the
//! verdict is [`super::compare_tokens`]'s over the collected records.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{RunRecord, StreamStatus};

    fn start(mode: CacheMode, computes: bool) -> RunStart {
        RunStart {
            mode,
            block_size: 1,
            total_slots: 10,
            slot_bytes: 1,
            memory: Default::default(),
            computes,
            tier_capacity_blocks: [0; 2],
        }
    }

    fn stream(request: u64, rank: u32, ids: &[u32]) -> StreamRecord {
        StreamRecord {
            request,
            rank,
            tenant: 0,
            intended_arrival_ns: 0,
            arrival_ns: 0,
            admitted_ns: None,
            finish_ns: 0,
            prompt_tokens: 1,
            cached_prompt_tokens: 0,
            status: StreamStatus::Completed,
            preemptions: 0,
            recomputed_tokens: 0,
            swapped_bytes: 0,
            admission_tier_hits: Default::default(),
            onload_bytes: 0,
            onload_wait_ns: 0,
            ttft_onload_ns: 0,
            token_ns: vec![0; ids.len()],
            token_ids: ids.to_vec(),
        }
    }

    fn check(
        paged: &[StreamRecord],
        contiguous: &[(u32, StreamRecord)],
        computes: bool,
    ) -> Option<String> {
        let mut t = TokenCheck::default();
        t.begin(&start(CacheMode::Paged, computes));
        for (i, s) in paged.iter().enumerate() {
            t.stream_done(i as u32, s);
        }
        t.begin(&start(CacheMode::Contiguous, computes));
        for (i, s) in contiguous {
            t.stream_done(*i, s);
        }
        t.mismatch()
    }

    #[test]
    fn agrees_with_compare_tokens_whatever_order_the_contiguous_streams_resolve_in() {
        let paged = vec![
            stream(0, 0, &[1, 2, 3]),
            stream(1, 0, &[4, 5]),
            stream(1, 1, &[4, 6, 7]),
            stream(2, 0, &[9]),
        ];
        // Request 1.1 and 2 differ; 0 is cut shorter (a cancellation), which is no mismatch.
        let contiguous = vec![
            (3, stream(2, 0, &[8])),
            (0, stream(0, 0, &[1, 2])),
            (2, stream(1, 1, &[4, 6, 0])),
            (1, stream(1, 0, &[4, 5])),
        ];
        let got = check(&paged, &contiguous, true);
        let mut a = crate::metrics::tests_support::empty_record();
        a.streams = paged.clone();
        let mut b: RunRecord = a.clone();
        let mut sorted = contiguous.clone();
        sorted.sort_by_key(|(i, _)| *i);
        b.streams = sorted.into_iter().map(|(_, s)| s).collect();
        let want = crate::experiment::compare_tokens(&a, &b);
        assert_eq!(got, want);
        assert_eq!(
            got.as_deref(),
            Some("request 1.1 at output token 2: 7 vs 0")
        );
        // Equal streams: no mismatch; a backend that does not compute is never compared.
        let same: Vec<(u32, StreamRecord)> = paged
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, s)| (i as u32, s))
            .collect();
        assert_eq!(check(&paged, &same, true), None);
        assert_eq!(check(&paged, &contiguous, false), None);
    }
}
