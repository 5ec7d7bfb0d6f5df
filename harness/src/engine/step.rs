//! Building one step: the [`StepOps`] the policies compose (decodes with preemption, prefill
//! chunks; starts live in `start.rs`), and the submit that hands the plan to the backend and
//! fences it in the cache manager.
//!
//! Once the policy planned a step, the cache manager's tier transfers that the plan's starts,
//! fills, appends and forks decided are drained into the plan's `tier_ops`, traced (`offload`,
//! or `onload` on the stream that asked for it) and counted as onloaded bytes on that stream.
//! Which streams a step's onloads served is kept on the in-flight step (`onload.rs`); `core.rs`
//! credits their share of the step's onload wait at completion, before stamping the step's
//! tokens, so the step that emits a first token counts in that stream's TTFT onload part.

use std::time::Instant;

use kvbench_cache_api::{AllocError, ReleaseReason};

use super::core::Engine;
use super::policy::StepOps;
use super::record::{TraceEvent, TraceKind};
use super::streams::{Phase, Stream};
use super::EngineError;
use crate::backend::SeqWork;

enum Append {
    Done,
    /// The stream itself was the preemption victim.
    Preempted,
    /// No room this step (a release is fenced, or a swap-out is on its way); try next step.
    Stalled,
    Failed,
}

impl Engine<'_> {
    /// Plan a step by policy and submit it. False when there was nothing to run.
    pub(super) fn plan_and_submit(&mut self) -> Result<bool, EngineError> {
        let t0 = Instant::now();
        let sched = &self.cfg.scheduler;
        let copies = self
            .steps
            .begin(sched.max_tokens_per_step, sched.max_seqs_per_step);
        for (child, op) in copies {
            let st = &self.streams[child as usize];
            if st.cached() && !st.is_done() {
                self.steps.add_copies([op]);
            }
        }
        self.streams.forget_reserve();
        let running_at_plan = self.streams.running().len() as u32;
        if let Some(mut policy) = self.policy.take() {
            policy.build(self);
            self.policy = Some(policy);
        }
        self.streams.tidy_running();
        let running_now = self.streams.running().len() as u32;
        let running = running_at_plan.max(running_now);
        self.rec.running(running_now);
        // The tier transfers this plan's starts, fills, appends and forks decided belong to it.
        self.cache.drain_tier_ops(self.steps.tier_ops_mut());
        self.record_tier_ops();
        if self.steps.is_empty() {
            self.rec.host(t0);
            return Ok(false);
        }
        self.rec.host(t0);
        self.backend.submit(self.steps.plan(), &*self.cache)?;
        let t1 = Instant::now();
        let cache_step = self.cache.begin_step();
        let index = self.steps.submitted();
        let (releases, parents) = self.steps.after_submit();
        for v in releases {
            self.drop_cache(v, ReleaseReason::Preempt);
        }
        let mut forks = Vec::new();
        for parent in parents {
            self.fork_children(parent, &mut forks)?;
        }
        self.rec.submitted(self.steps.seqs() as u64);
        self.steps
            .push_in_flight(index, cache_step, self.clock.now_ns(), running, forks);
        let every = self.cfg.invariant_check_every as u64;
        if every > 0 && index.is_multiple_of(every) {
            if let Err(msg) = self.cache.check_invariants() {
                self.fail(format!("invariant violated: {msg}"));
            }
            if let Some(msg) = self.keyed_tokens_disagree() {
                self.fail(format!("invariant violated: {msg}"));
            }
            let a = self.cache.accounting();
            if !a.is_conserved() {
                self.fail(format!("slot accounting not conserved: {a:?}"));
            }
        }
        self.rec.host(t1);
        Ok(true)
    }

    /// The first stream whose cache keys its blocks by tokens other than those it holds (its
    /// prompt, then the tokens it sampled), if any: the manager must never be told a token the
    /// stream has not sampled yet, or one from another position. The manager lends its tokens
    /// and the engine compares them in place: this runs on every checked step, over every
    /// running stream. A prompt the engine has not made yet is drawn here without being kept
    /// (a check changes nothing).
    fn keyed_tokens_disagree(&self) -> Option<String> {
        for &s in self.streams.running() {
            if !self.streams[s as usize].cached() {
                continue;
            }
            let Some(keyed) = self.cache.keyed_tokens(Stream::seq(s)) else {
                continue;
            };
            let request = self.streams[s as usize].request;
            let drawn;
            let prompt = match self.prompt_of(request) {
                [] => {
                    drawn = self.workload.requests[request as usize].prompt.tokens();
                    &drawn[..]
                }
                made => made,
            };
            let sampled = &self.streams[s as usize].record.token_ids;
            let held = prompt.iter().chain(sampled);
            if let Some((pos, (k, h))) = keyed
                .iter()
                .zip(held)
                .enumerate()
                .find(|(_, (k, h))| k != h)
            {
                return Some(format!(
                    "stream {s}: the cache keys position {pos} as token {k}, but the stream holds \
                     {h} there"
                ));
            }
            if keyed.len() > prompt.len() + sampled.len() {
                return Some(format!(
                    "stream {s}: the cache keys {} tokens, but the stream holds {}",
                    keyed.len(),
                    prompt.len() + sampled.len()
                ));
            }
        }
        None
    }

    /// The step being planned carries tier ops: trace each (onloads on their stream) and count
    /// onloaded bytes on the stream that asked for them.
    fn record_tier_ops(&mut self) {
        let ops = &self.steps.plan().tier_ops;
        if ops.is_empty() {
            return;
        }
        let (step, t_ns, kvb) = (
            self.steps.index(),
            self.clock.now_ns(),
            self.cfg.kv_bytes_per_token,
        );
        for i in 0..self.steps.plan().tier_ops.len() {
            let op = self.steps.plan().tier_ops[i];
            let stream = match op.seq.map(u32::try_from) {
                Some(Ok(s)) if op.is_onload() && !self.streams[s as usize].is_done() => Some(s),
                _ => None,
            };
            let Some(s) = stream else {
                let kind = if op.is_onload() {
                    TraceKind::Onload { step, op }
                } else {
                    TraceKind::Offload { step, op }
                };
                self.rec.event(&TraceEvent {
                    t_ns,
                    stream: TraceEvent::NO_STREAM,
                    request: u64::MAX,
                    rank: 0,
                    kind,
                });
                continue;
            };
            let bytes = u64::from(op.tokens).saturating_mul(kvb);
            let rec = &mut self.streams[s as usize].record;
            rec.onload_bytes = rec.onload_bytes.saturating_add(bytes);
            self.trace(s, TraceKind::Onload { step, op });
        }
    }

    fn try_append(&mut self, s: u32) -> Append {
        let seq = Stream::seq(s);
        // The position this append maps holds the stream's newest sampled token: known once the
        // step that sampled it retired. With `async_steps` that step may still be in flight, and
        // the newest *stamped* token is then the one before: passing it would key the block
        // under a token it does not hold, and a prefix hit would read another stream's K/V.
        let st = &self.streams[s as usize];
        let token = (st.record.token_ids.len() == st.generated as usize)
            .then(|| st.record.token_ids.last().copied())
            .flatten();
        for attempt in 0..2 {
            let appended = match token {
                Some(t) => self.cache.append_token(seq, t),
                None => self.cache.append(seq),
            };
            match appended {
                Ok(copies) => {
                    self.steps.add_copies(copies);
                    let cur = self.steps.index();
                    let st = &mut self.streams[s as usize];
                    let work = SeqWork {
                        seq,
                        context_tokens: st.in_cache,
                        new_tokens: 1,
                        sample: true,
                    };
                    st.in_cache += 1;
                    st.generated += 1;
                    st.scheduled_step = cur;
                    self.steps.add_work(work, Some(s));
                    return Append::Done;
                }
                Err(AllocError::NoSpace { .. }) if attempt == 0 => {
                    let victim = self.streams.pop_victim(s, self.steps.index());
                    self.preempt(victim);
                    if victim == s {
                        return Append::Preempted;
                    }
                    if self.streams[victim as usize].phase() == Phase::Swapped {
                        return Append::Stalled;
                    }
                }
                Err(AllocError::NoSpace { .. }) => return Append::Stalled,
                Err(e) => {
                    self.fail(format!("append to stream {s}: {e}"));
                    return Append::Failed;
                }
            }
        }
        Append::Stalled
    }

    pub(super) fn prefill_chunk(&mut self, s: u32, chunked: bool) -> u32 {
        let st = &self.streams[s as usize];
        let remaining = st.target.saturating_sub(st.in_cache);
        let tokens_left = self.steps.tokens_left();
        if remaining == 0 || self.steps.seqs_left() == 0 {
            return 0;
        }
        let n = if chunked {
            remaining.min(tokens_left)
        } else if remaining <= tokens_left || self.steps.seqs() == 0 {
            remaining
        } else {
            0
        };
        if n == 0 {
            return 0;
        }
        if let Err(e) = self.cache.fill(Stream::seq(s), n) {
            self.fail(format!("fill of stream {s}: {e}"));
            return 0;
        }
        let cur = self.steps.index();
        let samples = self.workload.requests[st.request as usize].samples;
        let st = &mut self.streams[s as usize];
        let context = st.in_cache;
        let sample = context + n == st.target;
        let work = SeqWork {
            seq: Stream::seq(s),
            context_tokens: context,
            new_tokens: n,
            sample,
        };
        st.in_cache += n;
        st.scheduled_step = cur;
        let mut fork = false;
        if sample {
            st.generated += 1;
            fork = st.rank == 0 && samples > 1 && !st.forked_children;
            self.streams.prefilled(s);
        }
        self.steps.add_work(work, sample.then_some(s));
        if fork {
            self.steps.fork_after_submit(s);
        }
        self.trace(s, TraceKind::PrefillChunk { tokens: n, context });
        n
    }
}

impl StepOps for Engine<'_> {
    fn schedule_decodes(&mut self) -> u32 {
        let cur = self.steps.index();
        let mut n = 0;
        let mut i = 0;
        while i < self.streams.running().len() {
            if self.rec.failed() {
                break;
            }
            let s = self.streams.running()[i];
            let st = &self.streams[s as usize];
            if st.phase() != Phase::Decode
                || !st.cached()
                || st.generated >= st.limit
                || st.scheduled_step == cur
            {
                i += 1;
                continue;
            }
            if !self.steps.has_room() {
                break;
            }
            match self.try_append(s) {
                Append::Done => {
                    n += 1;
                    i += 1;
                }
                Append::Stalled => i += 1,
                Append::Preempted => {}
                Append::Failed => break,
            }
        }
        n
    }

    fn schedule_prefills(&mut self, chunked: bool) -> u32 {
        let cur = self.steps.index();
        let mut total = 0;
        let mut i = 0;
        while i < self.streams.running().len() && self.steps.has_room() {
            let s = self.streams.running()[i];
            let st = &self.streams[s as usize];
            if st.phase() == Phase::Prefill && st.cached() && st.scheduled_step != cur {
                total += self.prefill_chunk(s, chunked);
            }
            i += 1;
        }
        total
    }
    fn swap_in(&mut self) -> u32 {
        self.swap_in_streams()
    }

    fn admit(&mut self, chunked: bool) -> bool {
        self.admit_next(chunked)
    }

    fn has_prefill_work(&self) -> bool {
        self.streams.running().iter().any(|&s| {
            let st = &self.streams[s as usize];
            st.cached() && st.phase() == Phase::Prefill
        }) || self.streams.has_waiting()
    }

    fn preempted(&self) -> bool {
        self.steps.preempted()
    }
}
