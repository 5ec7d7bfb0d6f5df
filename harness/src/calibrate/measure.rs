//! Measuring a grid point on a real backend.
//!
//! [`StepSource`] is the seam: anything that can time a [`Point`] on a cache mode. The one
//! implementation, [`BackendSource`], drives any [`Backend`] that `backend::create` builds
//! (`cpu` today; `cuda` plugs in by being built there) through the same `submit`/`complete` calls
//! the engine makes, over layouts from a real cache manager, and takes the step time the backend
//! reports — the figure the engine's clock would advance by.
//!
//! Paged contexts are grown block by block in turn across the batch, so a sequence's blocks are
//! scattered in the pool as they are in a real run rather than laid end to end.

use kvbench_cache_api::{CacheMode, KvCacheManager, ReleaseReason, SeqId, StartRequest};

use super::grid::Point;
use crate::backend::{
    self, Backend, BackendError, BackendKind, Clock, RunSetup, SeqWork, StepPlan, SwapDirection,
    SwapOp,
};
use crate::model::ModelShape;

/// Something that can time steps of a grid.
pub trait StepSource {
    /// The backend's name (`cpu`, `cuda`).
    fn backend(&self) -> &'static str;
    /// What runs the steps, as the machine names it.
    fn device(&self) -> String;
    /// The wall time of one execution of `point`'s step, seconds.
    fn time(&mut self, point: &Point) -> Result<f64, BackendError>;
}

/// One cache manager and backend per cache mode, reused by every point.
struct Bench {
    cache: Box<dyn KvCacheManager>,
    backend: Box<dyn Backend>,
}

/// Times steps on a backend built by [`backend::create`].
pub struct BackendSource {
    kind: BackendKind,
    model: ModelShape,
    block_size: u32,
    seed: u64,
    max_tokens_per_step: u32,
    slots: u64,
    next_seq: u64,
    benches: Vec<(CacheMode, Bench)>,
}

impl BackendSource {
    /// `slots` must hold the largest point (see [`Point::slots`]); `max_tokens_per_step` is the
    /// scenario's, which sizes the backend's workspace as in a run.
    pub fn new(
        kind: BackendKind,
        model: ModelShape,
        block_size: u32,
        seed: u64,
        max_tokens_per_step: u32,
        slots: u64,
    ) -> Self {
        BackendSource {
            kind: kind.resolve(),
            model,
            block_size: block_size.max(1),
            seed,
            max_tokens_per_step,
            slots,
            next_seq: 0,
            benches: Vec::new(),
        }
    }

    fn setup(&self) -> RunSetup {
        RunSetup {
            model: self.model.clone(),
            device: self.kind.name().into(),
            scenario_dir: None,
            cache_slots: self.slots,
            block_size: self.block_size,
            seed: self.seed,
            max_step_tokens: self.max_tokens_per_step,
            swap_gbytes_per_s: None,
            workspace_bytes: None,
            profile: None,
            clock: Clock::Measured,
            tiers: Default::default(),
        }
    }

    fn bench(&mut self, mode: CacheMode) -> Result<usize, BackendError> {
        if let Some(i) = self.benches.iter().position(|(m, _)| *m == mode) {
            return Ok(i);
        }
        let bench = Bench {
            cache: crate::cache::build(&crate::cache::CacheSpec::new(
                mode,
                self.slots,
                self.block_size,
                false,
            )),
            backend: backend::create(self.kind, &self.setup())?,
        };
        self.benches.push((mode, bench));
        Ok(self.benches.len() - 1)
    }

    /// Deterministic token ids (their values do not change the work).
    fn tokens(&self, seq: u64, n: u32) -> Vec<u32> {
        let vocab = u64::from(self.model.vocab.max(1));
        (0..u64::from(n))
            .map(|i| ((seq.wrapping_mul(7919) + i * 104_729) % vocab) as u32)
            .collect()
    }

    /// Starts the point's sequences, grown to `context + new` tokens each; returns the plan and
    /// the sequences to release afterwards.
    fn place(&mut self, point: &Point, b: usize) -> Result<(StepPlan, Vec<SeqId>), BackendError> {
        let alloc = |e: kvbench_cache_api::AllocError| BackendError::Step(e.to_string());
        let mut work = point.seq_work();
        if work.is_empty() && (point.swap_out_tokens > 0 || point.swap_in_tokens > 0) {
            // A swap moves an existing sequence's K/V.
            work.push(SeqWork {
                seq: 0,
                context_tokens: point.swap_out_tokens.max(point.swap_in_tokens),
                new_tokens: 0,
                sample: false,
            });
        }
        let mut targets = Vec::new();
        for w in &work {
            let seq = self.next_seq;
            self.next_seq += 1;
            let total = (w.context_tokens + w.new_tokens).max(1);
            let history = self.tokens(seq, total);
            let first = total.min(self.block_size);
            let bench = &mut self.benches[b].1;
            bench.backend.register(seq, &history, None)?;
            let req = StartRequest {
                seq,
                tokens: &history[..first as usize],
                scope: None,
                reserve_tokens: total,
            };
            bench.cache.start(&req).map_err(alloc)?;
            bench.cache.fill(seq, first).map_err(alloc)?;
            targets.push((seq, total, *w));
        }
        let cache = &mut self.benches[b].1.cache;
        // Grow every sequence one block at a time, in turn, so paged blocks interleave.
        loop {
            let mut grew = false;
            for &(seq, total, _) in &targets {
                let have = cache.seq_tokens(seq).unwrap_or(total);
                for _ in have..total.min(have + self.block_size) {
                    cache.append(seq).map_err(alloc)?;
                    grew = true;
                }
            }
            if !grew {
                break;
            }
        }
        let mut plan = StepPlan::default();
        for &(seq, _, w) in &targets {
            if w.new_tokens > 0 {
                plan.seqs.push(SeqWork { seq, ..w });
            }
        }
        plan.copies = point.copies(self.block_size);
        if let Some(&(seq, _, _)) = targets.first() {
            plan.swaps = point
                .swaps()
                .into_iter()
                .map(|s| SwapOp { seq, ..s })
                .collect();
        }
        Ok((plan, targets.iter().map(|t| t.0).collect()))
    }
}

impl StepSource for BackendSource {
    fn backend(&self) -> &'static str {
        self.kind.name()
    }

    fn device(&self) -> String {
        crate::results::env::cpu_model().unwrap_or_else(|| "unknown CPU".into())
    }

    fn time(&mut self, point: &Point) -> Result<f64, BackendError> {
        let b = self.bench(point.cache)?;
        let (plan, seqs) = self.place(point, b)?;
        let bench = &mut self.benches[b].1;
        if point.swap_in_tokens > 0 {
            // A swap-in needs the sequence's K/V on the host first: swap it out, untimed.
            let mut out = plan.clone();
            for s in &mut out.swaps {
                s.direction = SwapDirection::Out;
            }
            bench.backend.submit(&out, bench.cache.as_ref())?;
            bench.backend.complete()?;
        }
        bench.backend.submit(&plan, bench.cache.as_ref())?;
        let t = bench.backend.complete()?.duration_s;
        // Nothing is in flight, so the slots are free again at once. The backend keeps the
        // sequences (no `forget`): no oracle check is wanted on contexts never computed.
        for seq in seqs {
            bench
                .cache
                .release(seq, ReleaseReason::Finish)
                .map_err(|e| BackendError::Step(e.to_string()))?;
        }
        Ok(t)
    }
}
