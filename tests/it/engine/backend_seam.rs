//! The Backend seam as a compute backend sees it. A fake "computing" backend keeps each
//! sequence's token history (prompt + its own samples) and checks every plan against it: each
//! scheduled sequence is registered and has a layout; a decode writes exactly the last sampled
//! token (context = history − 1); a prefill chunk never runs past the history and samples only
//! at its end; continuations inherit the parent's history with their own first token; every
//! registered sequence is forgotten exactly once. Its tokens depend only on the history, like
//! greedy decoding, so paged and contiguous runs must emit identical streams.

use std::collections::{BTreeMap, VecDeque};

use kvbench::backend::{
    Backend, BackendError, MemoryParts, NumericsReport, Sampled, StepOutput, StepPlan,
    SwapDirection,
};
use kvbench::engine::{self, EngineConfig, RunRecord, StreamStatus};
use kvbench::experiment::compare_tokens;
use kvbench::model::ModelShape;
use kvbench::scenario::{PreemptionMode, Reservation, SchedulerSpec};
use kvbench::workload::{CancelPoint, Request, Workload};
use kvbench_cache_api::{CacheMode, KvCacheManager, ScopeKey, SeqId};

#[derive(Default)]
struct Greedy {
    history: BTreeMap<SeqId, Vec<u32>>,
    forgotten: BTreeMap<SeqId, u32>,
    swapped: BTreeMap<SeqId, u32>,
    in_flight: VecDeque<StepOutput>,
    errors: Vec<String>,
    steps: u64,
}

fn next_token(h: &[u32], rank: u32) -> u32 {
    let mut x = 0xcbf2_9ce4_8422_2325u64 ^ rank as u64;
    for &t in h.iter().rev().take(8) {
        x = (x ^ t as u64).wrapping_mul(0x100_0000_01b3);
    }
    (x % 509) as u32
}

impl Backend for Greedy {
    fn name(&self) -> &'static str {
        "greedy-fake"
    }
    fn computes(&self) -> bool {
        true
    }
    fn register(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        _scope: Option<&ScopeKey>,
    ) -> Result<(), BackendError> {
        if self.history.insert(seq, prompt.to_vec()).is_some() {
            self.errors.push(format!("seq {seq} registered twice"));
        }
        Ok(())
    }
    fn fork(&mut self, parent: SeqId, child: SeqId, rank: u32) -> Result<u32, BackendError> {
        let mut h = self
            .history
            .get(&parent)
            .cloned()
            .ok_or_else(|| BackendError::Step(format!("fork of unknown {parent}")))?;
        // The parent's first sample is the rank-0 token at this position; the child takes rank k.
        h.pop();
        let t = next_token(&h, rank);
        h.push(t);
        self.history.insert(child, h);
        Ok(t)
    }
    fn forget(&mut self, seq: SeqId) -> Result<(), BackendError> {
        *self.forgotten.entry(seq).or_default() += 1;
        Ok(())
    }
    fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> Result<(), BackendError> {
        self.steps += 1;
        for s in &plan.swaps {
            match s.direction {
                SwapDirection::Out => {
                    if cache.layout(s.seq).is_none() {
                        self.errors
                            .push(format!("swap-out of {} without a layout", s.seq));
                    }
                    self.swapped.insert(s.seq, s.tokens);
                }
                SwapDirection::In => {
                    if self.swapped.remove(&s.seq) != Some(s.tokens) {
                        self.errors
                            .push(format!("swap-in of {} does not match its swap-out", s.seq));
                    }
                }
            }
        }
        let mut sampled = Vec::new();
        for w in &plan.seqs {
            let Some(h) = self.history.get_mut(&w.seq) else {
                self.errors
                    .push(format!("step {}: seq {} not registered", self.steps, w.seq));
                continue;
            };
            if self.forgotten.contains_key(&w.seq) {
                self.errors
                    .push(format!("seq {} scheduled after forget", w.seq));
            }
            if cache.layout(w.seq).is_none() {
                self.errors
                    .push(format!("seq {} scheduled without a layout", w.seq));
            }
            let end = (w.context_tokens + w.new_tokens) as usize;
            if end > h.len() {
                self.errors.push(format!(
                    "seq {}: writes up to {end} but history holds {}",
                    w.seq,
                    h.len()
                ));
            }
            if w.sample && end != h.len() {
                self.errors.push(format!(
                    "seq {}: samples at {end} but history holds {}",
                    w.seq,
                    h.len()
                ));
            }
            if w.sample {
                let t = next_token(&h[..end.min(h.len())], 0);
                h.push(t);
                sampled.push(Sampled {
                    seq: w.seq,
                    token: t,
                });
            }
        }
        self.in_flight.push_back(StepOutput {
            duration_s: 1e-3 + plan.seqs.len() as f64 * 1e-5,
            sampled,
            onload_wait_s: 0.0,
        });
        Ok(())
    }
    fn complete(&mut self) -> Result<StepOutput, BackendError> {
        self.in_flight
            .pop_front()
            .ok_or_else(|| BackendError::Step("nothing in flight".into()))
    }
    fn memory(&self) -> MemoryParts {
        MemoryParts::default()
    }
    fn numerics(&self) -> Option<NumericsReport> {
        None
    }
}

fn workload() -> Workload {
    let requests = (0..24u64)
        .map(|id| Request {
            id,
            tenant: (id % 2) as u32,
            arrival_ms: (id / 3) as f64 * 2.0,
            prompt: (0..(40 + (id as u32 * 17) % 90))
                .map(|i| (i * 31 + id as u32) % 500)
                .collect(),
            prefix_group: None,
            output_tokens: 20 + (id as u32 * 7) % 40,
            samples: if id % 5 == 0 { 3 } else { 1 },
            cancel: match id % 6 {
                1 => Some(CancelPoint::AfterDelay {
                    after_ms: 3.0 + id as f64,
                }),
                3 => Some(CancelPoint::AfterTokens { tokens: 5 }),
                _ => None,
            },
            session: None,
        })
        .collect();
    Workload {
        requests,
        closed_loop: None,
        workload_hash: "seam".into(),
        trace: None,
    }
}

fn run(mode: CacheMode, scheduler: SchedulerSpec, slots: u64) -> (RunRecord, Greedy) {
    let cfg = EngineConfig {
        mode,
        block_size: 8,
        kv_bytes_per_token: ModelShape::tiny().kv_bytes_per_token(),
        slot_bytes: ModelShape::tiny().kv_bytes_per_token(),
        max_seq_len: 512,
        reservation: Reservation::PromptPlusOutput,
        scheduler,
        model_name: "tiny".into(),
        trace_tokens: true,
        invariant_check_every: 1,
        fault: None,
    };
    let mut cache = kvbench::cache::build(&kvbench::cache::CacheSpec::new(mode, slots, 8, true));
    let mut b = Greedy::default();
    let r = engine::run(&cfg, &workload(), cache.as_mut(), &mut b).expect("run");
    assert_eq!(r.end.violation, None, "{mode:?} {:?}", cfg.scheduler);
    assert!(r.end.reclamation.ok, "{}", r.end.reclamation.detail);
    (r, b)
}

#[test]
fn plans_respect_the_backend_protocol_and_greedy_streams_agree_across_modes() {
    for async_steps in [false, true] {
        for preemption in [PreemptionMode::Recompute, PreemptionMode::Swap] {
            let s = SchedulerSpec {
                async_steps,
                preemption,
                max_tokens_per_step: 96,
                max_seqs_per_step: 32,
                ..SchedulerSpec::default()
            };
            let (paged, pb) = run(CacheMode::Paged, s.clone(), 1200);
            let (contiguous, cb) = run(CacheMode::Contiguous, s, 1200);
            for (name, b, r) in [("paged", &pb, &paged), ("contiguous", &cb, &contiguous)] {
                assert!(
                    b.errors.is_empty(),
                    "{name} async={async_steps} {preemption:?}: {:?}",
                    &b.errors[..b.errors.len().min(5)]
                );
                assert!(
                    b.forgotten.values().all(|&n| n == 1),
                    "{name}: forget exactly once"
                );
                assert_eq!(
                    b.forgotten.len(),
                    b.history.len(),
                    "{name}: every registered sequence is forgotten"
                );
                assert!(r
                    .streams
                    .iter()
                    .any(|s| s.status == StreamStatus::Cancelled));
            }
            assert!(
                paged.streams.iter().map(|s| s.preemptions).sum::<u32>() > 0,
                "the pool is tight enough to preempt"
            );
            assert_eq!(
                compare_tokens(&paged, &contiguous),
                None,
                "async={async_steps} {preemption:?}"
            );
            // The comparison can fail: corrupt one token and it must say so.
            let mut bad = contiguous.clone();
            let s = bad
                .streams
                .iter_mut()
                .find(|s| s.token_ids.len() > 3)
                .expect("a stream with tokens");
            s.token_ids[2] ^= 1;
            assert!(compare_tokens(&paged, &bad).is_some());
        }
    }
}
