//! The seeded step driver: starts, chunked prefills, decodes, forks, cancellations, swaps and
//! preemptions through the sim backend, two steps in flight as the engine keeps them.

use std::collections::{BTreeMap, VecDeque};

use kvbench::backend::sim::SimBackend;
use kvbench::backend::{Backend, RunSetup, SeqWork, StepPlan, SwapDirection, SwapOp};
use kvbench::shadow::ShadowReport;
use kvbench_cache_api::{
    AllocError, CacheMode, CopyOp, KvCacheManager, ReleaseReason, SeqId, StartRequest, StepId,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::CHUNK_TOKENS;

#[derive(Debug)]
pub struct Stream {
    pub prompt_tokens: u32,
    /// Positions written by completed or in-flight steps.
    pub written: u32,
    pub target_tokens: u32,
    pub busy: bool,
}

/// What a run did, for the assertions and the failure messages.
#[derive(Debug, Default)]
pub struct Tally {
    pub steps: u64,
    pub starts: u64,
    pub forks: u64,
    pub cancels: u64,
    pub preempted: u64,
    pub swaps: u64,
    pub finished: u64,
    pub invariant_errors: Vec<String>,
}

pub struct Driver {
    pub cache: Box<dyn KvCacheManager>,
    pub be: SimBackend,
    pub rng: ChaCha8Rng,
    pub streams: BTreeMap<SeqId, Stream>,
    /// Steps in flight: the manager's fence and the streams each wrote (`seq`, new tokens).
    pub in_flight: VecDeque<(StepId, Vec<(SeqId, u32)>)>,
    /// Streams swapped out (their pages released), oldest first.
    pub swapped: VecDeque<(SeqId, Stream)>,
    /// Swap a stream out once in this many steps, and one back in (0: never).
    pub swap_every: u32,
    /// Copies a fork asked for, carried by the next step.
    pub copies: Vec<CopyOp>,
    pub next_seq: SeqId,
    /// Release a stream right after submitting its step, once in this many steps (0: never).
    pub cancel_every: u32,
    pub tally: Tally,
}

impl Driver {
    pub fn new(cache: Box<dyn KvCacheManager>, seed: u64, cancel_every: u32) -> Driver {
        let slots = cache.accounting().total_slots;
        let paged = cache.mode() == CacheMode::Paged;
        let setup = RunSetup {
            seed,
            ..crate::support::engine::bare_sim_setup(slots, cache.block_size(), CHUNK_TOKENS)
        };
        Driver {
            cache,
            be: SimBackend::new(&setup)
                .expect("sim")
                .with_shadow()
                .expect("shadow"),
            rng: ChaCha8Rng::seed_from_u64(seed),
            streams: BTreeMap::new(),
            in_flight: VecDeque::new(),
            copies: Vec::new(),
            swapped: VecDeque::new(),
            // The grouped contiguous baseline's rings take at most the largest step a step, so
            // a swap-in (a start filled whole) is the paged manager's alone.
            swap_every: if paged { 6 } else { 0 },
            next_seq: 1,
            cancel_every,
            tally: Tally::default(),
        }
    }

    pub fn start_some(&mut self) {
        for _ in 0..self.rng.gen_range(0..3) {
            let prompt_tokens = self.rng.gen_range(1..40u32);
            let target_tokens = prompt_tokens + self.rng.gen_range(1..40u32);
            let salt = self.rng.gen_range(0..1000u32);
            let tokens: Vec<u32> = (0..prompt_tokens).map(|i| (i * 31 + salt) % 500).collect();
            let seq = self.next_seq;
            let req = StartRequest {
                seq,
                tokens: &tokens,
                scope: None,
                reserve_tokens: target_tokens,
            };
            if !self.cache.probe_start(&req).fits {
                return;
            }
            let started = self.cache.start(&req).expect("a start that fits");
            self.next_seq += 1;
            self.be.register(seq, &tokens, None).expect("register");
            self.streams.insert(
                seq,
                Stream {
                    prompt_tokens,
                    written: started.cached_tokens,
                    target_tokens,
                    busy: false,
                },
            );
            self.tally.starts += 1;
        }
    }

    /// Plan, submit and follow up one step; false when nothing could be scheduled.
    pub fn submit(&mut self) -> bool {
        let mut plan = StepPlan {
            copies: std::mem::take(&mut self.copies),
            ..StepPlan::default()
        };
        let mut wrote = Vec::new();
        let swapped_out = self.swap_out(&mut plan);
        self.swap_in(&mut plan, &mut wrote);
        let ids: Vec<SeqId> = self.streams.keys().copied().collect();
        for seq in ids {
            let s = &self.streams[&seq];
            if s.busy || s.written >= s.target_tokens {
                continue;
            }
            let (context, prompt) = (s.written, s.prompt_tokens);
            let new = if context < prompt {
                let n = (prompt - context).min(self.rng.gen_range(1..=CHUNK_TOKENS));
                self.cache.fill(seq, n).expect("fill");
                n
            } else {
                match self.cache.append(seq) {
                    Ok(c) => plan.copies.extend(c),
                    // No room for the block (the paged manager admits on the prompt alone): the
                    // stream is preempted, as the engine's recompute preemption does.
                    Err(AllocError::NoSpace { .. }) => {
                        self.drop_stream(seq, ReleaseReason::Preempt);
                        self.tally.preempted += 1;
                        continue;
                    }
                    Err(e) => panic!("append of {seq}: {e:?}"),
                }
                1
            };
            plan.seqs.push(SeqWork {
                seq,
                context_tokens: context,
                new_tokens: new,
                sample: context + new >= prompt,
            });
            wrote.push((seq, new));
        }
        if plan.is_empty() {
            return false;
        }
        self.be.submit(&plan, &*self.cache).expect("submit");
        let fence = self.cache.begin_step();
        if let Some(seq) = swapped_out {
            // Its pages go once the swap-out has read them: fenced on this step.
            self.cache
                .release(seq, ReleaseReason::Preempt)
                .expect("release");
        }
        self.tally.steps += 1;
        for &(seq, new) in &wrote {
            if let Some(s) = self.streams.get_mut(&seq) {
                s.busy = true;
                s.written += new;
            }
        }
        self.fork_some(&wrote);
        if self.cancel_every > 0
            && self
                .tally
                .steps
                .is_multiple_of(u64::from(self.cancel_every))
        {
            // Released while its step still reads its pages, as a cancelled request is.
            if let Some(&(seq, _)) = wrote.iter().find(|(q, _)| self.streams.contains_key(q)) {
                self.drop_stream(seq, ReleaseReason::Cancel);
                self.tally.cancels += 1;
            }
        }
        self.in_flight.push_back((fence, wrote));
        if self.tally.steps.is_multiple_of(16) {
            if let Err(e) = self.cache.check_invariants() {
                self.tally.invariant_errors.push(e);
            }
        }
        true
    }

    /// Once in `swap_every` steps, swap out the first idle decoding stream: its tags go to the
    /// host and its pages are released after the step is submitted.
    pub fn swap_out(&mut self, plan: &mut StepPlan) -> Option<SeqId> {
        if self.swap_every == 0 || self.tally.steps % u64::from(self.swap_every) != 1 {
            return None;
        }
        let seq = self
            .streams
            .iter()
            .find(|(_, s)| !s.busy && s.written > s.prompt_tokens && s.written < s.target_tokens)
            .map(|(&seq, _)| seq)?;
        let s = self.streams.remove(&seq)?;
        plan.swaps.push(SwapOp {
            seq,
            direction: SwapDirection::Out,
            tokens: s.written,
            bytes: None,
        });
        self.swapped.push_back((seq, s));
        self.tally.swaps += 1;
        Some(seq)
    }

    /// Once in `swap_every` steps, bring the oldest swapped stream back if it fits: a fresh
    /// start and fill of its tokens, then the swap-in writes its tags; it decodes from the next
    /// step on.
    pub fn swap_in(&mut self, plan: &mut StepPlan, wrote: &mut Vec<(SeqId, u32)>) {
        if self.swap_every == 0 || !self.tally.steps.is_multiple_of(u64::from(self.swap_every)) {
            return;
        }
        let Some(&(seq, ref s)) = self.swapped.front() else {
            return;
        };
        let tokens = vec![0u32; s.written as usize];
        let req = StartRequest {
            seq,
            tokens: &tokens,
            scope: None,
            reserve_tokens: s.target_tokens,
        };
        if !self.cache.probe_start(&req).fits || self.cache.start(&req).is_err() {
            return;
        }
        let mut filled = 0;
        while filled < s.written {
            let n = (s.written - filled).min(CHUNK_TOKENS);
            self.cache
                .fill(seq, n)
                .expect("fill of a swapped-in stream");
            filled += n;
        }
        plan.swaps.push(SwapOp {
            seq,
            direction: SwapDirection::In,
            tokens: s.written,
            bytes: None,
        });
        if let Some((seq, mut s)) = self.swapped.pop_front() {
            // Not scheduled in the step that swaps it in.
            s.busy = true;
            self.streams.insert(seq, s);
            wrote.push((seq, 0));
        }
    }

    /// Streams that just sampled their first token may fork; the copies go with the next step.
    pub fn fork_some(&mut self, wrote: &[(SeqId, u32)]) {
        for &(parent, _) in wrote {
            let Some(p) = self.streams.get(&parent) else {
                continue;
            };
            if p.written != p.prompt_tokens || !self.rng.gen_bool(0.3) {
                continue;
            }
            let child = self.next_seq;
            let Ok(copies) = self.cache.fork(parent, child) else {
                continue;
            };
            self.next_seq += 1;
            self.copies.extend(copies);
            self.be.fork(parent, child, 0).expect("fork");
            let (prompt_tokens, target_tokens) = (p.prompt_tokens, p.target_tokens);
            self.streams.insert(
                child,
                Stream {
                    prompt_tokens,
                    written: prompt_tokens,
                    target_tokens,
                    busy: false,
                },
            );
            self.tally.forks += 1;
        }
    }

    pub fn drop_stream(&mut self, seq: SeqId, why: ReleaseReason) {
        self.streams.remove(&seq);
        self.cache.release(seq, why).expect("release");
        self.be.forget(seq).expect("forget");
    }

    pub fn complete(&mut self) {
        let Some((fence, wrote)) = self.in_flight.pop_front() else {
            return;
        };
        self.be.complete().expect("complete");
        self.cache.retire_step(fence);
        for (seq, _) in wrote {
            let Some(s) = self.streams.get_mut(&seq) else {
                continue;
            };
            s.busy = false;
            if s.written >= s.target_tokens {
                self.drop_stream(seq, ReleaseReason::Finish);
                self.tally.finished += 1;
            }
        }
    }

    /// `steps` steps, two in flight, then drain and release everything.
    pub fn run(&mut self, steps: u32) -> ShadowReport {
        for _ in 0..steps {
            self.start_some();
            let submitted = self.submit();
            if self.in_flight.len() >= 2 || !submitted {
                self.complete();
            }
        }
        while !self.in_flight.is_empty() {
            self.complete();
        }
        let ids: Vec<SeqId> = self.streams.keys().copied().collect();
        for seq in ids {
            self.drop_stream(seq, ReleaseReason::Finish);
        }
        for (seq, _) in std::mem::take(&mut self.swapped) {
            self.be.forget(seq).expect("forget");
        }
        self.be.shadow_report().expect("shadow carried")
    }
}
