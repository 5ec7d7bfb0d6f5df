//! The step being planned and the steps in flight.
//!
//! A plan starts with [`Steps::begin`] (budgets full, lists empty, the copies a fork asked for
//! carried in), grows by work items that spend its budgets, and ends in [`Steps::submitted`],
//! which turns it into an [`InFlight`] entry with its index; completion takes the oldest entry.
//! What must happen only after the backend has the plan — a swapped-out stream's release, a
//! parent's forks — waits in lists that only [`Steps::after_submit`] empties.

use std::collections::VecDeque;

use kvbench_cache_api::{CopyOp, StepId, TierOp};

use crate::backend::{SeqWork, StepPlan, SwapOp};

/// A submitted step awaiting completion.
pub(super) struct InFlight {
    pub index: u64,
    pub cache_step: StepId,
    pub planned_ns: u64,
    /// Streams whose sample this step produces, in plan order.
    pub samplers: Vec<u32>,
    /// Forked continuations whose first token this step produces, with that token.
    pub forks: Vec<(u32, u32)>,
    pub batch_seqs: u32,
    pub batch_tokens: u32,
    pub running: u32,
    /// Streams whose onloads the step carries, with their tokens, in op order.
    pub onloads: Vec<(u32, u64)>,
}

pub(super) struct Steps {
    plan: StepPlan,
    /// Streams sampled by the step being planned, in plan order.
    samplers: Vec<u32>,
    /// Parents whose continuations fork once this step is submitted.
    forks_pending: Vec<u32>,
    /// Streams swapped out by this step, released once it is submitted.
    release_after_submit: Vec<u32>,
    /// Copies a fork asked for, performed at the start of the next step, with the child they
    /// serve (dropped if the child is gone by then: its slots may already be someone else's).
    pending_copies: Vec<(u32, CopyOp)>,
    token_budget: u32,
    seq_budget: u32,
    /// A stream was preempted while planning this step.
    preempted: bool,
    /// Steps submitted so far: the index of the step being planned.
    submitted: u64,
    in_flight: VecDeque<InFlight>,
}

impl Steps {
    pub fn new() -> Steps {
        Steps {
            plan: StepPlan::default(),
            samplers: Vec::new(),
            forks_pending: Vec::new(),
            release_after_submit: Vec::new(),
            pending_copies: Vec::new(),
            token_budget: 0,
            seq_budget: 0,
            preempted: false,
            submitted: 0,
            in_flight: VecDeque::new(),
        }
    }

    /// Start planning a step with full budgets; returns the copies forks asked for since the
    /// last plan, for the caller to keep ([`Self::add_copies`]) where their child still lives.
    pub fn begin(&mut self, max_tokens: u32, max_seqs: u32) -> Vec<(u32, CopyOp)> {
        self.plan.clear();
        self.samplers.clear();
        self.forks_pending.clear();
        self.release_after_submit.clear();
        self.token_budget = max_tokens.max(1);
        self.seq_budget = max_seqs.max(1);
        self.preempted = false;
        std::mem::take(&mut self.pending_copies)
    }

    /// The index of the step being planned (steps submitted so far).
    pub fn index(&self) -> u64 {
        self.submitted
    }

    pub fn plan(&self) -> &StepPlan {
        &self.plan
    }

    pub fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    /// Work items so far in the step being planned.
    pub fn seqs(&self) -> usize {
        self.plan.seqs.len()
    }

    pub fn tokens_left(&self) -> u32 {
        self.token_budget
    }

    pub fn seqs_left(&self) -> u32 {
        self.seq_budget
    }

    /// Both budgets have room for one more work item.
    pub fn has_room(&self) -> bool {
        self.token_budget > 0 && self.seq_budget > 0
    }

    pub fn add_copies(&mut self, copies: impl IntoIterator<Item = CopyOp>) {
        self.plan.copies.extend(copies);
    }

    /// Where the cache manager's tier transfers for this step go (drained after planning).
    pub fn tier_ops_mut(&mut self) -> &mut Vec<TierOp> {
        &mut self.plan.tier_ops
    }

    pub fn add_swap(&mut self, op: SwapOp) {
        self.plan.swaps.push(op);
    }

    /// Add one work item, spending a sequence and its new tokens; `sampler` is the stream
    /// whose next token it samples, if it samples.
    pub fn add_work(&mut self, work: SeqWork, sampler: Option<u32>) {
        let tokens = work.new_tokens;
        self.plan.seqs.push(work);
        if let Some(s) = sampler {
            self.samplers.push(s);
        }
        self.token_budget = self.token_budget.saturating_sub(tokens);
        self.seq_budget -= 1;
    }

    /// A fork of `child` asked for `copies`, to perform before the next step.
    pub fn copies_for_next(&mut self, child: u32, copies: Vec<CopyOp>) {
        self.pending_copies
            .extend(copies.into_iter().map(|op| (child, op)));
    }

    pub fn fork_after_submit(&mut self, parent: u32) {
        self.forks_pending.push(parent);
    }

    pub fn release_after_submit(&mut self, s: u32) {
        self.release_after_submit.push(s);
    }

    pub fn note_preempted(&mut self) {
        self.preempted = true;
    }

    pub fn preempted(&self) -> bool {
        self.preempted
    }

    /// The plan went to the backend: the step's index (the next step's is one more).
    pub fn submitted(&mut self) -> u64 {
        let index = self.submitted;
        self.submitted += 1;
        index
    }

    /// What waited for the submit: (streams to release, parents to fork).
    pub fn after_submit(&mut self) -> (Vec<u32>, Vec<u32>) {
        (
            std::mem::take(&mut self.release_after_submit),
            std::mem::take(&mut self.forks_pending),
        )
    }

    /// The submitted step is in flight.
    pub fn push_in_flight(
        &mut self,
        index: u64,
        cache_step: StepId,
        planned_ns: u64,
        running: u32,
        forks: Vec<(u32, u32)>,
    ) {
        self.in_flight.push_back(InFlight {
            index,
            cache_step,
            planned_ns,
            samplers: std::mem::take(&mut self.samplers),
            forks,
            batch_seqs: self.plan.seqs.len() as u32,
            batch_tokens: self.plan.seqs.iter().map(|w| w.new_tokens).sum(),
            running,
            onloads: super::onload::onloads_by_stream(&self.plan.tier_ops),
        });
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn pop_oldest(&mut self) -> Option<InFlight> {
        self.in_flight.pop_front()
    }
}
