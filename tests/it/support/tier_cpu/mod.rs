//! A hand-driven run of a compute backend with lower tiers: the paged manager (no tiers, no
//! prefix cache) hands out layouts, and the test writes the step plans' tier ops itself, so a
//! block's K/V leaves the device, its device block is overwritten by another sequence, and it
//! comes back from the host or disk tier into the next sequence with the same prompt. The
//! backend's oracle check then says whether the bytes that came back were the right ones.
#![allow(dead_code)]

use kvbench::backend::{
    Backend, Clock, NumericsReport, RunSetup, SeqWork, StepOutput, StepPlan, TierSetup,
};
use kvbench::model::{Dtype, ModelShape};
use kvbench_cache_api::{
    BlockLoc, CacheMode, KvCacheManager, ReleaseReason, SeqLayout, StartRequest, Tier, TierOp,
};

pub const BLOCK: u32 = 16;
/// Two full blocks and a partial one: the full ones travel through the tiers.
pub const PROMPT_TOKENS: u32 = 40;
pub const HOST_BLOCKS: u32 = 4;
pub const DISK_BLOCKS: u32 = 2;
pub const CACHE_SLOTS: u64 = 16 * BLOCK as u64;

pub fn shape(kv: Dtype) -> ModelShape {
    ModelShape {
        kv_dtype: kv,
        ..ModelShape::tiny()
    }
}

pub fn setup(kv: Dtype) -> RunSetup {
    RunSetup {
        model: shape(kv),
        device: "cpu".into(),
        scenario_dir: None,
        cache_slots: CACHE_SLOTS,
        block_size: BLOCK,
        seed: 7,
        max_step_tokens: 256,
        swap_gbytes_per_s: None,
        workspace_bytes: None,
        profile: None,
        clock: Clock::Measured,
        tiers: TierSetup {
            host_blocks: HOST_BLOCKS,
            disk_blocks: DISK_BLOCKS,
            ..TierSetup::default()
        },
    }
}

/// How the onloads of the returning prompt are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Onload {
    /// Each block from the slot it was offloaded to.
    Correct,
    /// No onload: the device blocks keep the other sequence's K/V.
    Omitted,
    /// Both blocks from the first block's slot: the second gets another block's K/V. (Two
    /// blocks of one sequence swapped would not do: K carries its position's rotation, and
    /// attention over a set of (K, V) pairs does not depend on their order.)
    Duplicated,
}

/// Where the returning blocks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Host,
    /// Host, then moved to disk (one move in a step submitted while the offload's step is still
    /// in flight, one in the offload's own step); the host slots are overwritten before the
    /// onload, so only the disk copy holds the prompt's K/V.
    Disk,
}

pub struct Rig<'a> {
    pub backend: &'a mut dyn Backend,
    pub cache: Box<dyn KvCacheManager>,
    in_flight: Vec<u64>,
}

fn op(from: (Tier, u32), to: (Tier, u32), seq: Option<u64>) -> TierOp {
    TierOp {
        from: BlockLoc {
            tier: from.0,
            slot: from.1,
        },
        to: BlockLoc {
            tier: to.0,
            slot: to.1,
        },
        tokens: BLOCK,
        seq,
    }
}

pub fn prompt(salt: u32) -> Vec<u32> {
    (0..PROMPT_TOKENS)
        .map(|i| (i * 7 + salt * 131 + 3) % 512)
        .collect()
}

impl<'a> Rig<'a> {
    pub fn new(backend: &'a mut dyn Backend) -> Rig<'a> {
        Rig {
            backend,
            cache: kvbench::cache::build(&kvbench::cache::CacheSpec::new(
                CacheMode::Paged,
                CACHE_SLOTS,
                BLOCK,
                false,
            )),
            in_flight: Vec::new(),
        }
    }

    /// Submits, then opens the step's fence with the manager (the engine's order).
    pub fn submit(&mut self, plan: &StepPlan) {
        self.backend
            .submit(plan, self.cache.as_ref())
            .expect("step submitted");
        let id = self.cache.begin_step();
        self.in_flight.push(id);
    }

    /// Completes every step in flight, oldest first.
    pub fn drain(&mut self) -> Vec<StepOutput> {
        let mut out = Vec::new();
        for id in std::mem::take(&mut self.in_flight) {
            out.push(self.backend.complete().expect("step completes"));
            self.cache.retire_step(id);
        }
        out
    }

    pub fn step(&mut self, plan: &StepPlan) -> StepOutput {
        self.submit(plan);
        self.drain().pop().expect("one step")
    }

    pub fn blocks(&self, seq: u64) -> Vec<u32> {
        match self.cache.layout(seq) {
            Some(SeqLayout::Paged { blocks, .. }) => blocks.to_vec(),
            other => panic!("sequence {seq}: not a paged layout: {other:?}"),
        }
    }

    /// Registers and starts `seq` on `prompt`, all of it allocated and filled.
    pub fn start(&mut self, seq: u64, prompt: &[u32]) -> Vec<u32> {
        self.backend.register(seq, prompt, None).expect("register");
        self.cache
            .start(&StartRequest {
                seq,
                tokens: prompt,
                scope: None,
                reserve_tokens: prompt.len() as u32 + 4,
            })
            .expect("start");
        self.cache.fill(seq, prompt.len() as u32).expect("fill");
        self.blocks(seq)
    }

    pub fn finish(&mut self, seq: u64) {
        self.cache
            .release(seq, ReleaseReason::Finish)
            .expect("release");
        self.backend.forget(seq).expect("forget");
    }

    fn prefill(&mut self, seq: u64, context: u32, tier_ops: Vec<TierOp>) -> StepOutput {
        self.step(&StepPlan {
            tier_ops,
            seqs: vec![SeqWork {
                seq,
                context_tokens: context,
                new_tokens: PROMPT_TOKENS - context,
                sample: true,
            }],
            ..StepPlan::default()
        })
    }
}

/// What one scenario did.
pub struct Outcome {
    pub numerics: NumericsReport,
    /// Onload ops the returning sequence's step carried.
    pub onloads: usize,
    pub onload_wait_s: f64,
}

impl Outcome {
    /// What a correct onload gives on every compute backend: both blocks onloaded, the oracle
    /// passed on every checked step (at least the three of the scenario), and the onloads took
    /// measurable time. `label` names the case in a failure.
    pub fn assert_onloaded(&self, label: &str) {
        assert_eq!(self.onloads, 2, "{label}");
        assert!(
            self.numerics.ok && self.numerics.checked_steps >= 3,
            "{label}: {:?}",
            self.numerics
        );
        assert!(self.onload_wait_s > 0.0, "{label}: no onload wait measured");
    }

    /// What a wrong onload (omitted, or from the wrong slot) gives: the oracle fails.
    pub fn assert_caught(&self, label: &str) {
        assert!(
            !self.numerics.ok,
            "{label}: not caught: {:?}",
            self.numerics
        );
    }
}

/// Prompt A is computed and its two full blocks offloaded; A finishes, another prompt is
/// computed into the same device blocks (asserted); A's prompt comes back as a new sequence
/// whose two blocks are onloaded (as `onload` says) and only its last 8 tokens computed.
pub fn run(backend: &mut dyn Backend, from: From, onload: Onload) -> Outcome {
    let mut rig = Rig::new(backend);
    let a = prompt(1);
    let blocks_a = rig.start(1, &a);
    rig.prefill(1, 0, Vec::new());
    let host = |s| (Tier::Host, s);
    let dev = |b| (Tier::Device, b);
    rig.step(&StepPlan {
        tier_ops: vec![
            op(dev(blocks_a[0]), host(0), None),
            op(dev(blocks_a[1]), host(1), None),
        ],
        ..StepPlan::default()
    });
    if from == From::Disk {
        // Slot 0 moves in a step submitted while the offload's step is in flight; slot 1 is
        // offloaded again and moved in one step.
        rig.submit(&StepPlan {
            tier_ops: vec![op(dev(blocks_a[1]), host(1), None)],
            ..StepPlan::default()
        });
        rig.submit(&StepPlan {
            tier_ops: vec![
                op(host(0), (Tier::Disk, 0), None),
                op(dev(blocks_a[1]), host(1), None),
                op(host(1), (Tier::Disk, 1), None),
            ],
            ..StepPlan::default()
        });
        rig.drain();
    }
    rig.finish(1);

    let filler = prompt(2);
    let blocks_f = rig.start(2, &filler);
    rig.prefill(2, 0, Vec::new());
    if from == From::Disk {
        rig.step(&StepPlan {
            tier_ops: vec![
                op(dev(blocks_f[0]), host(0), None),
                op(dev(blocks_f[1]), host(1), None),
            ],
            ..StepPlan::default()
        });
    }
    rig.finish(2);

    let blocks_b = rig.start(3, &a);
    assert!(
        blocks_f.contains(&blocks_b[0]) && blocks_f.contains(&blocks_b[1]),
        "the returning prompt's blocks {blocks_b:?} were not overwritten by the filler's {blocks_f:?}: the test would prove nothing"
    );
    let tier = match from {
        From::Host => Tier::Host,
        From::Disk => Tier::Disk,
    };
    let ops = match onload {
        Onload::Correct => vec![
            op((tier, 0), dev(blocks_b[0]), Some(3)),
            op((tier, 1), dev(blocks_b[1]), Some(3)),
        ],
        Onload::Omitted => Vec::new(),
        Onload::Duplicated => vec![
            op((tier, 0), dev(blocks_b[0]), Some(3)),
            op((tier, 0), dev(blocks_b[1]), Some(3)),
        ],
    };
    let onloads = ops.iter().filter(|o| o.is_onload()).count();
    let out = rig.prefill(3, 2 * BLOCK, ops);
    rig.finish(3);
    rig.cache.assert_quiescent().expect("quiescent");
    Outcome {
        numerics: rig
            .backend
            .numerics()
            .expect("a compute backend checks numerics"),
        onloads,
        onload_wait_s: out.onload_wait_s,
    }
}
pub mod driver;
