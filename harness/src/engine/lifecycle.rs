//! Arrivals, cancellations, token stamping, finishes, preemption and forks: every way a stream
//! enters or leaves the cache, with what the cache manager, the backend and the sink must hear
//! of it. The state changes themselves are [`super::streams::Streams`]' transitions. Each
//! release goes through [`Engine::drop_cache`], so a stream lets go of its blocks exactly once,
//! whatever point of its life it is cancelled at.

use kvbench_cache_api::{AllocError, ReleaseReason};

use super::core::{ms_to_ns, Engine};
use super::record::{StreamRecord, StreamStatus, TokenEvent, TraceKind};
use super::streams::{Phase, Stream};
use super::EngineError;
use crate::backend::{SwapDirection, SwapOp};
use crate::scenario::PreemptionMode;
use crate::workload::CancelPoint;

impl Engine<'_> {
    /// Take in every arrival and fire every cancellation timer due by now.
    pub(super) fn ingest(&mut self) {
        while let Some((t, r)) = self.clock.pop_arrival_due() {
            self.arrive(r, t);
        }
        while let Some(r) = self.clock.pop_cancel_due() {
            self.fire_timer(r);
        }
    }

    /// Make the token ids of recipe request `r` if they are not made yet. A recipe's ids exist
    /// from the request's first start attempt to its resolution, so a queue of waiting requests
    /// (a replay beyond capacity) holds descriptors, not prompts.
    pub(super) fn ensure_prompt(&mut self, r: u32) {
        let req = &self.workload.requests[r as usize];
        if req.prompt.explicit().is_none() && !self.prompts.contains_key(&r) {
            self.prompts.insert(r, req.prompt.tokens().into_owned());
        }
    }

    /// The prompt length of live request `r`, made or not.
    pub(super) fn prompt_len_of(&self, r: u32) -> u32 {
        match self.prompts.get(&r) {
            Some(p) => p.len() as u32,
            None => self.workload.requests[r as usize].prompt.len_tokens(),
        }
    }

    /// The prompt of live request `r` once made ([`Self::ensure_prompt`]) or built when the
    /// previous session turn resolved, else as held in the workload.
    pub(super) fn prompt_of(&self, r: u32) -> &[u32] {
        match self.prompts.get(&r) {
            Some(p) => p,
            None => self.workload.requests[r as usize]
                .prompt
                .explicit()
                .unwrap_or(&[]),
        }
    }

    fn arrive(&mut self, r: u32, t: u64) {
        let req = &self.workload.requests[r as usize];
        // The fields read past the first `&mut self` call (a live run's list is owned here).
        let (tenant, output_tokens, cancel) = (req.tenant, req.output_tokens, req.cancel);
        let prompt_len = self.prompt_len_of(r) as usize;
        let samples = req.samples.max(1);
        let (limit, cancel_at_limit) = match req.cancel {
            Some(CancelPoint::AfterTokens { tokens }) if tokens < req.output_tokens => {
                (tokens, true)
            }
            _ => (req.output_tokens, false),
        };
        let follow_up = req.session.is_some_and(|s| s.turn > 0);
        let intended = if self.workload.closed_loop.is_some() || follow_up {
            t
        } else {
            ms_to_ns(req.arrival_ms)
        };
        let first = self.streams.arrive(
            r,
            (0..samples).map(|rank| {
                let record = StreamRecord {
                    request: req.id,
                    rank,
                    tenant: req.tenant,
                    intended_arrival_ns: intended,
                    arrival_ns: t,
                    admitted_ns: None,
                    finish_ns: t,
                    prompt_tokens: prompt_len as u32,
                    cached_prompt_tokens: 0,
                    status: StreamStatus::Completed,
                    preemptions: 0,
                    recomputed_tokens: 0,
                    swapped_bytes: 0,
                    admission_tier_hits: Default::default(),
                    onload_bytes: 0,
                    onload_wait_ns: 0,
                    ttft_onload_ns: 0,
                    token_ns: Vec::new(),
                    token_ids: Vec::new(),
                };
                Stream::arriving(r, rank, limit, cancel_at_limit, record)
            }),
        );
        self.trace(first, TraceKind::Arrive);
        let total = prompt_len as u64 + output_tokens as u64;
        let reject = if prompt_len == 0 {
            Some("empty prompt".to_string())
        } else if total > self.cfg.max_seq_len as u64 {
            Some(format!(
                "prompt + output = {total} tokens > max_seq_len {}",
                self.cfg.max_seq_len
            ))
        } else {
            let need = self.slots_needed(prompt_len as u32, output_tokens);
            let have = self.cache.accounting().total_slots;
            (need > have).then(|| format!("needs {need} slots, the cache holds {have}"))
        };
        if let Some(reason) = reject {
            self.streams.reject(r, samples);
            self.trace(first, TraceKind::Reject { reason });
            self.request_resolved(r);
            return;
        }
        match cancel {
            Some(CancelPoint::Queued { after_ms }) | Some(CancelPoint::AfterDelay { after_ms }) => {
                self.clock
                    .arm_cancel(r, t.saturating_add(ms_to_ns(after_ms)));
            }
            _ => {}
        }
        if limit == 0 {
            for s in first..first + samples {
                self.finish_stream(s, StreamStatus::Cancelled);
            }
            return;
        }
        self.streams.enqueue(first, tenant);
    }

    /// Slots one stream of `prompt + output` tokens needs at most in this cache mode.
    fn slots_needed(&self, prompt: u32, output: u32) -> u64 {
        let reserve = super::reservation_tokens(self.cfg, prompt, output);
        self.cache
            .sequence_slots(u64::from(prompt) + u64::from(output), reserve)
    }

    fn fire_timer(&mut self, r: u32) {
        let Some(first) = self.streams.first_of(r) else {
            return;
        };
        let req = &self.workload.requests[r as usize];
        let samples = req.samples.max(1);
        let head = &self.streams[first as usize];
        let due = match req.cancel {
            Some(CancelPoint::Queued { .. }) => {
                head.phase() == Phase::Waiting && !head.first_admission_done
            }
            Some(CancelPoint::AfterDelay { .. }) => true,
            _ => false,
        };
        if !due {
            return;
        }
        for s in first..first + samples {
            if !self.streams[s as usize].is_done() {
                self.finish_stream(s, StreamStatus::Cancelled);
            }
        }
    }

    /// The client of request `r` went away: every stream of it not done yet is cancelled,
    /// wherever it is, through the one release path (blocks a step in flight may still read
    /// wait for its fence). A request not arrived, or resolved already, is left alone.
    pub(super) fn cancel_request(&mut self, r: u32) {
        let Some(first) = self.streams.first_of(r) else {
            return;
        };
        let samples = self.workload.requests[r as usize].samples.max(1);
        for s in first..first + samples {
            if !self.streams[s as usize].is_done() {
                self.finish_stream(s, StreamStatus::Cancelled);
            }
        }
    }

    /// A step produced `token` for stream `s` at `t_ns`.
    pub(super) fn stamp(&mut self, s: u32, token: u32, t_ns: u64) {
        let st = &mut self.streams[s as usize];
        if st.is_done() {
            return; // cancelled while the step was in flight: the client is gone
        }
        st.record.token_ns.push(t_ns);
        st.record.token_ids.push(token);
        let emitted = st.record.token_ns.len() as u32;
        let done = (emitted >= st.limit).then_some(if st.cancel_at_limit {
            StreamStatus::Cancelled
        } else {
            StreamStatus::Completed
        });
        let (request, rank) = (st.record.request, st.record.rank);
        self.rec.token(&TokenEvent {
            t_ns,
            stream: s,
            request,
            rank,
            index: emitted - 1,
            token,
        });
        if let Some(status) = done {
            self.finish_stream(s, status);
        }
    }

    /// The stream is done (completed, or cancelled at whatever point it was): release what it
    /// holds, tell the backend, and resolve its request when it was the last stream.
    pub(super) fn finish_stream(&mut self, s: u32, status: StreamStatus) {
        let reason = match status {
            StreamStatus::Completed => ReleaseReason::Finish,
            _ => ReleaseReason::Cancel,
        };
        let st = &self.streams[s as usize];
        let during = match st.phase() {
            Phase::Waiting if st.restart() => "preempted",
            Phase::Waiting => "queued",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
            Phase::Swapped => "swapped",
            Phase::Pending | Phase::Done => "pending",
        };
        self.drop_cache(s, reason);
        let r = self.streams[s as usize].request;
        let Some(done) = self.streams.finish(s, status, self.clock.now_ns()) else {
            return;
        };
        if done.registered {
            let backend = &mut *self.backend;
            let forgotten = self.rec.hook(|| backend.forget(Stream::seq(s)));
            if let Err(e) = forgotten {
                self.fail(format!("backend forget of stream {s}: {e}"));
            }
        }
        let kind = if status == StreamStatus::Completed {
            TraceKind::Finish
        } else {
            TraceKind::Cancel { during }
        };
        self.trace(s, kind);
        if done.request_resolved {
            self.request_resolved(r);
        }
    }

    /// Every stream of request `r` is done: issue what follows it, then hand its streams'
    /// records to the sink and drop their state (nothing reads a resolved request's streams
    /// but the done checks, which a released id answers).
    fn request_resolved(&mut self, r: u32) {
        self.streams.resolved();
        self.clock.disarm_cancel(r);
        if self.workload.requests[r as usize].session.is_some() {
            self.session_follow_up(r);
        }
        self.prompts.remove(&r);
        if let Some(cl) = self.workload.closed_loop {
            if (self.next_closed_loop as usize) < self.workload.requests.len() {
                let t = self.clock.now_ns().saturating_add(ms_to_ns(cl.think_ms));
                self.clock.schedule_arrival(t, self.next_closed_loop);
                self.next_closed_loop += 1;
            }
        }
        let first = self.streams.first_of(r).unwrap_or(u32::MAX);
        let samples = self.workload.requests[r as usize].samples.max(1);
        for s in first..first.saturating_add(samples) {
            if let Some(rec) = self.streams.release(s) {
                self.rec.stream_done(s, &rec);
            }
        }
    }

    /// Turn `r` of a session resolved: issue the next turn `think_ms` after now (its last
    /// token) with the whole conversation as its prompt, or end the session when this turn did
    /// not complete (cancelled or rejected): its remaining turns are never issued.
    fn session_follow_up(&mut self, r: u32) {
        let Some(turn) = self.workload.requests[r as usize].session else {
            return;
        };
        let previous = self.prompts.remove(&r);
        let Some(next) = turn.next.map(|n| n as u32) else {
            return;
        };
        let first = self.streams.first_of(r).unwrap_or(u32::MAX) as usize;
        let head = &self.streams[first].record;
        if head.status != StreamStatus::Completed {
            let mut at = Some(next);
            while let Some(n) = at {
                self.streams.resolved();
                at = self.workload.requests[n as usize]
                    .session
                    .and_then(|s| s.next)
                    .map(|n| n as u32);
            }
            return;
        }
        let req = &self.workload.requests[r as usize];
        let nreq = &self.workload.requests[next as usize];
        let before = match previous {
            Some(p) => std::borrow::Cow::Owned(p),
            None => req.prompt.tokens(),
        };
        let new = nreq.prompt.tokens();
        let mut prompt = Vec::with_capacity(before.len() + head.token_ids.len() + new.len());
        prompt.extend_from_slice(&before);
        prompt.extend_from_slice(&head.token_ids);
        prompt.extend_from_slice(&new);
        let room = (self.cfg.max_seq_len as usize).saturating_sub(nreq.output_tokens as usize);
        if turn.truncate_front && prompt.len() > room {
            prompt.drain(..prompt.len() - room);
        }
        let think_ns = ms_to_ns(nreq.session.map_or(0.0, |s| s.think_ms));
        self.prompts.insert(next, prompt);
        self.clock
            .schedule_arrival(self.clock.now_ns() + think_ns, next);
    }

    /// Release the stream's cache if it holds any (deferred by the manager past in-flight steps).
    pub(super) fn drop_cache(&mut self, s: u32, why: ReleaseReason) {
        if !self.streams.drop_cached(s) {
            return;
        }
        if let Err(e) = self.cache.release(Stream::seq(s), why) {
            self.fail(format!("release of stream {s}: {e}"));
        }
    }

    /// Bytes a swap of stream `s` at `tokens` tokens moves: what the cache manager's tables hold
    /// of them (every layer's bytes a token for the summed managers, so `tokens ×
    /// kv_bytes_per_token` as before), in the run's slot bytes.
    pub(super) fn swap_bytes(&self, s: u32, tokens: u32) -> u64 {
        self.cache
            .swap_slots(Stream::seq(s), tokens)
            .saturating_mul(self.cfg.slot_bytes)
    }

    /// Preempt `v` (already removed from `running`): swap it out in this step, or release it
    /// for recompute. Swap applies to decoding streams; a stream mid-prefill is recomputed.
    pub(super) fn preempt(&mut self, v: u32) {
        self.steps.note_preempted();
        let swap = self.cfg.scheduler.preemption == PreemptionMode::Swap
            && self.streams[v as usize].phase() == Phase::Decode;
        self.streams[v as usize].record.preemptions += 1;
        self.trace(v, TraceKind::Preempt { swap });
        if swap {
            let tokens = self.streams[v as usize].in_cache;
            let bytes = self.swap_bytes(v, tokens);
            self.steps.add_swap(SwapOp {
                seq: Stream::seq(v),
                direction: SwapDirection::Out,
                tokens,
                bytes: Some(bytes),
            });
            self.streams[v as usize].record.swapped_bytes += bytes;
            self.streams.swap_out(v, tokens);
            self.steps.release_after_submit(v);
            self.trace(v, TraceKind::SwapOut { bytes, tokens });
        } else {
            self.drop_cache(v, ReleaseReason::Preempt);
            self.streams.requeue(v);
        }
    }

    /// After the step that sampled `parent`'s first token was submitted: fork its continuations.
    pub(super) fn fork_children(
        &mut self,
        parent: u32,
        forks: &mut Vec<(u32, u32)>,
    ) -> Result<(), EngineError> {
        let p = &self.streams[parent as usize];
        let r = p.request as usize;
        let first = self.streams.first_of(r as u32).unwrap_or(u32::MAX);
        let samples = self.workload.requests[r].samples.max(1);
        let (in_cache, admitted, cached_prompt, tier_hits) = (
            p.in_cache,
            p.record.admitted_ns,
            p.record.cached_prompt_tokens,
            p.record.admission_tier_hits,
        );
        self.streams[parent as usize].forked_children = true;
        for rank in 1..samples {
            let c = first + rank;
            if self.streams[c as usize].is_done() {
                continue;
            }
            let backend = &mut *self.backend;
            let token = self
                .rec
                .hook(|| backend.fork(Stream::seq(parent), Stream::seq(c), rank))?;
            forks.push((c, token));
            self.streams.registered(c);
            let st = &mut self.streams[c as usize];
            st.generated = 1;
            st.first_admission_done = true;
            st.record.admitted_ns = admitted;
            st.record.cached_prompt_tokens = cached_prompt;
            st.record.admission_tier_hits = tier_hits;
            match self.cache.fork(Stream::seq(parent), Stream::seq(c)) {
                Ok(copies) => {
                    self.steps.copies_for_next(c, copies);
                    let st = &mut self.streams[c as usize];
                    st.in_cache = in_cache;
                    st.target = in_cache;
                    self.streams.start_running(c, Phase::Decode);
                }
                Err(AllocError::NoSpace { .. }) => {
                    // No room to copy (contiguous): the continuation waits and recomputes.
                    self.streams.requeue(c);
                }
                Err(e) => self.fail(format!("fork of stream {parent} into {c}: {e}")),
            }
        }
        Ok(())
    }
}
