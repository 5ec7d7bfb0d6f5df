//! Starting sequences: admission of waiting ones (new or preempted for recompute) and swap-ins,
//! both gated by the admission controller on the pool's capacity.

use kvbench_cache_api::{AllocError, ReuseScope, ScopeKey, StartRequest};

use super::admission::{Capacity, Verdict};
use super::core::Engine;
use super::record::TraceKind;
use super::streams::{Phase, Stream};
use crate::backend::{SwapDirection, SwapOp};
use crate::scenario::PrefixScope;

impl Engine<'_> {
    pub(super) fn capacity(&mut self) -> Capacity {
        let cache = &*self.cache;
        let reserve = self
            .streams
            .decode_reserve(|v| cache.append_cost(Stream::seq(v)));
        let idle = self.streams.none_cached() && self.steps.in_flight() == 0;
        Capacity::from_accounting(&self.cache.accounting(), reserve, idle)
    }

    /// The tokens a (re)start holds: the prompt, then every token generated so far. None while a
    /// generated token is still in flight (a restart waits for it).
    pub(super) fn start_tokens(&mut self, s: u32, upto: Option<u32>) -> Option<Vec<u32>> {
        self.ensure_prompt(self.streams[s as usize].request);
        let st = &self.streams[s as usize];
        let prompt = self.prompt_of(st.request);
        if st.record.token_ids.len() < st.generated as usize {
            return None;
        }
        let mut t = Vec::with_capacity(prompt.len() + st.record.token_ids.len());
        t.extend_from_slice(prompt);
        t.extend_from_slice(&st.record.token_ids);
        if let Some(n) = upto {
            t.truncate(n as usize);
        }
        Some(t)
    }

    pub(super) fn scope_key(&self, tenant: u32) -> Option<ScopeKey> {
        if !self.cfg.scheduler.prefix_cache {
            return None;
        }
        let reuse = match self.cfg.scheduler.prefix_scope {
            PrefixScope::Tenant => ReuseScope::Tenant(tenant),
            PrefixScope::Global => ReuseScope::Global,
            PrefixScope::None => return None,
        };
        Some(ScopeKey {
            model: self.cfg.model_name.clone(),
            tokenizer: super::TOKENIZER_ID.into(),
            reuse,
        })
    }

    /// Schedule a prefill chunk of `s`. Returns tokens scheduled.
    pub(super) fn swap_in_streams(&mut self) -> u32 {
        let mut n = 0;
        while let Some(s) = self.streams.next_swapped() {
            let st = &self.streams[s as usize];
            if st.cached() || self.steps.seqs_left() == 0 {
                break; // its swap-out release happens after this step's submit
            }
            let (in_cache, request) = (st.in_cache_at_swap(), st.request);
            let Some(tokens) = self.start_tokens(s, Some(in_cache)) else {
                break;
            };
            let req = &self.workload.requests[request as usize];
            let prompt_len = self.prompt_len_of(request);
            let reserve = super::reservation_tokens(self.cfg, prompt_len, req.output_tokens);
            let start = StartRequest {
                seq: Stream::seq(s),
                tokens: &tokens,
                scope: None,
                reserve_tokens: reserve,
            };
            let probe = self.cache.probe_start(&start);
            let cap = self.capacity();
            if self.admission.decide(&probe, &cap) != Verdict::Admit {
                break;
            }
            if let Err(e) = self
                .cache
                .start(&start)
                .and_then(|_| self.cache.restore(Stream::seq(s), tokens.len() as u32))
            {
                self.fail(format!("swap-in of stream {s}: {e}"));
                break;
            }
            self.streams.take_swapped();
            let swapped = tokens.len() as u32;
            let bytes = self.swap_bytes(s, swapped);
            self.steps.add_swap(SwapOp {
                seq: Stream::seq(s),
                direction: SwapDirection::In,
                tokens: swapped,
                bytes: Some(bytes),
            });
            let st = &mut self.streams[s as usize];
            st.record.swapped_bytes += bytes;
            st.in_cache = tokens.len() as u32;
            self.streams.start_running(s, Phase::Decode);
            self.trace(
                s,
                TraceKind::SwapIn {
                    bytes,
                    tokens: swapped,
                },
            );
            self.trace(s, TraceKind::Resume);
            n += 1;
        }
        n
    }

    pub(super) fn admit_next(&mut self, chunked: bool) -> bool {
        if !self.steps.has_room() || self.rec.failed() {
            return false;
        }
        let Some(s) = self.streams.next_waiting() else {
            return false;
        };
        let Some(tokens) = self.start_tokens(s, None) else {
            return false;
        };
        let st = &self.streams[s as usize];
        let req = &self.workload.requests[st.request as usize];
        let scope = self.scope_key(req.tenant);
        let prompt_len = self.prompt_len_of(st.request);
        let reserve = super::reservation_tokens(self.cfg, prompt_len, req.output_tokens);
        let start = StartRequest {
            seq: Stream::seq(s),
            tokens: &tokens,
            scope: scope.as_ref(),
            reserve_tokens: reserve,
        };
        let probe = self.cache.probe_start(&start);
        let cap = self.capacity();
        if self.admission.decide(&probe, &cap) != Verdict::Admit {
            return false;
        }
        let started = match self.cache.start(&start) {
            Ok(started) => started,
            Err(AllocError::NoSpace { .. }) => return false,
            Err(e) => {
                self.fail(format!("start of stream {s}: {e}"));
                return false;
            }
        };
        self.streams.take_waiting(s);
        if !self.streams[s as usize].registered() {
            let backend = &mut *self.backend;
            let registered = self
                .rec
                .hook(|| backend.register(Stream::seq(s), &tokens, scope.as_ref()));
            if let Err(e) = registered {
                self.fail(format!("backend register of stream {s}: {e}"));
                return false;
            }
            self.streams.registered(s);
        }
        let now = self.clock.now_ns();
        let cached = started.cached_tokens;
        let st = &mut self.streams[s as usize];
        let first = !st.first_admission_done;
        st.first_admission_done = true;
        st.in_cache = cached;
        st.target = tokens.len() as u32;
        if first {
            st.record.admitted_ns = Some(now);
            st.record.cached_prompt_tokens = cached;
            st.record.admission_tier_hits = started.tier_hits;
        } else {
            st.record.recomputed_tokens += (tokens.len() as u32 - cached) as u64;
        }
        let (request, rank) = (st.request, st.rank);
        self.streams.start_running(s, Phase::Prefill);
        let queued_cancel = matches!(
            self.workload.requests[request as usize].cancel,
            Some(crate::workload::CancelPoint::Queued { .. })
        );
        if first && rank == 0 && queued_cancel {
            // Admitted: a cancellation "while queued" can no longer fire.
            self.clock.disarm_cancel(request);
        }
        self.trace(
            s,
            if first {
                TraceKind::Admit
            } else {
                TraceKind::Resume
            },
        );
        if !started.hits.is_empty() {
            let mut publishers: Vec<u64> = started.hits.iter().map(|h| h.publisher).collect();
            publishers.sort_unstable();
            publishers.dedup();
            let scope = match started.hits[0].scope.reuse {
                ReuseScope::Tenant(t) => format!("tenant:{t}"),
                ReuseScope::Global => "global".into(),
                ReuseScope::None => "none".into(),
            };
            self.trace(
                s,
                TraceKind::PrefixHit {
                    tokens: cached,
                    blocks: started.hits.len() as u32,
                    scope,
                    publishers,
                },
            );
        }
        self.prefill_chunk(s, chunked);
        true
    }
}
