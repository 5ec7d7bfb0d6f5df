//! Building one step: the [`StepOps`] the policies compose (decodes with preemption, prefill
//! chunks; starts live in `start.rs`), and the submit that hands the plan to the backend and
//! fences it in the cache manager.

use std::time::Instant;

use kvbench_cache_api::{AllocError, ReleaseReason};

use super::core::{Engine, InFlight};
use super::policy::StepOps;
use super::record::TraceKind;
use super::state::{Phase, Stream};
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
    /// Plan a step and submit it. False when there was nothing to run.
    pub(super) fn plan_and_submit(&mut self) -> Result<bool, EngineError> {
        let t0 = Instant::now();
        self.plan.clear();
        self.samplers.clear();
        self.forks_pending.clear();
        self.release_after_submit.clear();
        for (child, op) in std::mem::take(&mut self.pending_copies) {
            let st = &self.streams[child as usize];
            if st.cached && !st.is_done() {
                self.plan.copies.push(op);
            }
        }
        self.token_budget = self.cfg.scheduler.max_tokens_per_step.max(1);
        self.seq_budget = self.cfg.scheduler.max_seqs_per_step.max(1);
        self.preempted_flag = false;
        self.decode_reserve = None;
        let running_at_plan = self.running.len() as u32;
        if let Some(mut policy) = self.policy.take() {
            policy.build(self);
            self.policy = Some(policy);
        }
        if self.running_dirty {
            let streams = &self.streams;
            self.running
                .retain(|&s| streams[s as usize].cached && !streams[s as usize].is_done());
            self.running_dirty = false;
        }
        let running = running_at_plan.max(self.running.len() as u32);
        self.peak_running = self.peak_running.max(self.running.len() as u32);
        if self.plan.is_empty() {
            self.host_s += t0.elapsed().as_secs_f64();
            return Ok(false);
        }
        self.host_s += t0.elapsed().as_secs_f64();
        self.backend.submit(&self.plan, &*self.cache)?;
        let t1 = Instant::now();
        let cache_step = self.cache.begin_step();
        let index = self.steps_submitted;
        self.steps_submitted += 1;
        for v in std::mem::take(&mut self.release_after_submit) {
            self.drop_cache(v, ReleaseReason::Preempt);
        }
        let mut forks = Vec::new();
        for parent in std::mem::take(&mut self.forks_pending) {
            self.fork_children(parent, &mut forks)?;
        }
        self.seq_steps += self.plan.seqs.len() as u64;
        self.in_flight.push_back(InFlight {
            index,
            cache_step,
            planned_ns: self.now_ns,
            samplers: std::mem::take(&mut self.samplers),
            forks,
            batch_seqs: self.plan.seqs.len() as u32,
            batch_tokens: self.plan.seqs.iter().map(|w| w.new_tokens).sum(),
            running,
        });
        let every = self.cfg.invariant_check_every as u64;
        if every > 0 && index.is_multiple_of(every) {
            if let Err(msg) = self.cache.check_invariants() {
                self.fail(format!("invariant violated: {msg}"));
            }
            let a = self.cache.accounting();
            if !a.is_conserved() {
                self.fail(format!("slot accounting not conserved: {a:?}"));
            }
        }
        self.host_s += t1.elapsed().as_secs_f64();
        Ok(true)
    }

    pub(super) fn step_index(&self) -> u64 {
        self.steps_submitted
    }

    fn try_append(&mut self, s: u32) -> Append {
        let seq = Stream::seq(s);
        // The position this append maps holds the stream's newest sampled token.
        let token = self.streams[s as usize].record.token_ids.last().copied();
        for attempt in 0..2 {
            let appended = match token {
                Some(t) => self.cache.append_token(seq, t),
                None => self.cache.append(seq),
            };
            match appended {
                Ok(copies) => {
                    self.plan.copies.extend(copies);
                    let cur = self.step_index();
                    let st = &mut self.streams[s as usize];
                    self.plan.seqs.push(SeqWork {
                        seq,
                        context_tokens: st.in_cache,
                        new_tokens: 1,
                        sample: true,
                    });
                    st.in_cache += 1;
                    st.generated += 1;
                    st.scheduled_step = cur;
                    self.samplers.push(s);
                    self.token_budget -= 1;
                    self.seq_budget -= 1;
                    return Append::Done;
                }
                Err(AllocError::NoSpace { .. }) if attempt == 0 => {
                    let victim = self.pop_victim(s);
                    self.preempt(victim);
                    if victim == s {
                        return Append::Preempted;
                    }
                    if self.streams[victim as usize].phase == Phase::Swapped {
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

    /// Remove and return the newest-admitted running stream that is not finishing and not
    /// scheduled in this step; `s` itself when there is none.
    fn pop_victim(&mut self, s: u32) -> u32 {
        let cur = self.step_index();
        let mut j = self.running.len();
        while j > 0 {
            j -= 1;
            let v = self.running[j];
            let st = &self.streams[v as usize];
            let eligible = st.cached
                && !st.is_done()
                && st.phase != Phase::Swapped
                && st.generated < st.limit
                && (st.scheduled_step != cur || v == s);
            if eligible {
                self.running.remove(j);
                return v;
            }
        }
        if let Some(j) = self.running.iter().position(|&v| v == s) {
            self.running.remove(j);
        }
        s
    }
    pub(super) fn prefill_chunk(&mut self, s: u32, chunked: bool) -> u32 {
        let st = &self.streams[s as usize];
        let remaining = st.target.saturating_sub(st.in_cache);
        if remaining == 0 || self.seq_budget == 0 {
            return 0;
        }
        let n = if chunked {
            remaining.min(self.token_budget)
        } else if remaining <= self.token_budget || self.plan.seqs.is_empty() {
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
        let cur = self.step_index();
        let samples = self.workload.requests[st.request as usize].samples;
        let st = &mut self.streams[s as usize];
        let context = st.in_cache;
        let sample = context + n == st.target;
        self.plan.seqs.push(SeqWork {
            seq: Stream::seq(s),
            context_tokens: context,
            new_tokens: n,
            sample,
        });
        st.in_cache += n;
        st.scheduled_step = cur;
        if sample {
            st.generated += 1;
            st.phase = Phase::Decode;
            self.samplers.push(s);
            if st.rank == 0 && samples > 1 && !st.forked_children {
                self.forks_pending.push(s);
            }
        }
        self.token_budget = self.token_budget.saturating_sub(n);
        self.seq_budget -= 1;
        self.trace(s, TraceKind::PrefillChunk { tokens: n, context });
        n
    }
}

impl StepOps for Engine<'_> {
    fn schedule_decodes(&mut self) -> u32 {
        let cur = self.step_index();
        let mut n = 0;
        let mut i = 0;
        while i < self.running.len() {
            if self.violation.is_some() {
                break;
            }
            let s = self.running[i];
            let st = &self.streams[s as usize];
            if st.phase != Phase::Decode
                || !st.cached
                || st.generated >= st.limit
                || st.scheduled_step == cur
            {
                i += 1;
                continue;
            }
            if self.token_budget == 0 || self.seq_budget == 0 {
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
        let cur = self.step_index();
        let mut total = 0;
        let mut i = 0;
        while i < self.running.len() && self.token_budget > 0 && self.seq_budget > 0 {
            let s = self.running[i];
            let st = &self.streams[s as usize];
            if st.phase == Phase::Prefill && st.cached && st.scheduled_step != cur {
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
        self.running.iter().any(|&s| {
            let st = &self.streams[s as usize];
            st.cached && st.phase == Phase::Prefill
        }) || !self.waiting.is_empty()
    }

    fn preempted(&self) -> bool {
        self.preempted_flag
    }
}
