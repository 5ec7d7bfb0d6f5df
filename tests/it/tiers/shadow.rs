//! The shadow payload follows blocks through the lower tiers, with hand-made steps on `sim`: an
//! onloaded block carries exactly the tags that were offloaded (through host, and host → disk),
//! a wrong onload is a wrong tag for its reader, the writer's reuse scope travels with the
//! block, a tier slot overwritten while an onload from it is in flight (in the same step, or by
//! a step submitted before it completed) is seen by the reader, and ops the run cannot carry out
//! are named. Block ids come from a real paged manager's layouts; the tier ops are the ones a
//! tiered manager would emit.

use kvbench::backend::sim::SimBackend;
use kvbench::backend::{Backend, DiskLink, RunSetup, SeqWork, StepPlan, TierSetup};
use kvbench::shadow::ShadowReport;
use kvbench_cache_api::{
    BlockLoc, CacheMode, KvCacheManager, ReuseScope, ScopeKey, SeqId, SeqLayout, StartRequest,
    Tier, TierOp,
};

use crate::support::engine as engine_support;

const BS: u32 = 16;
const SLOTS: u64 = 64 * BS as u64;

fn scope(tenant: u32) -> ScopeKey {
    ScopeKey {
        model: "tiny".into(),
        tokenizer: "tiny".into(),
        reuse: ReuseScope::Tenant(tenant),
    }
}

fn prompt(salt: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| (i * 31 + salt * 97) % 500).collect()
}

fn dev(block: u32) -> BlockLoc {
    BlockLoc {
        tier: Tier::Device,
        slot: block,
    }
}

fn host(slot: u32) -> BlockLoc {
    BlockLoc {
        tier: Tier::Host,
        slot,
    }
}

fn disk(slot: u32) -> BlockLoc {
    BlockLoc {
        tier: Tier::Disk,
        slot,
    }
}

fn op(from: BlockLoc, to: BlockLoc, seq: Option<SeqId>) -> TierOp {
    TierOp {
        from,
        to,
        tokens: BS,
        seq,
    }
}

/// A paged manager (no prefix cache: every start takes fresh blocks, the tier ops say what
/// they hold) and a sim backend carrying the shadow, with the given lower tiers.
struct Rig {
    cache: Box<dyn KvCacheManager>,
    be: SimBackend,
}

impl Rig {
    fn new(mode: CacheMode, host_blocks: u32, disk_blocks: u32) -> Rig {
        let setup = RunSetup {
            tiers: TierSetup {
                host_blocks,
                disk_blocks,
                // A disk tier comes with its link (the cost model refuses disk traffic without).
                disk: (disk_blocks > 0).then_some(DiskLink {
                    read_bytes_per_s: 7e9,
                    write_bytes_per_s: 5e9,
                    latency_s: 80e-6,
                }),
                ..TierSetup::default()
            },
            ..engine_support::bare_sim_setup(SLOTS, BS, 256)
        };
        Rig {
            cache: kvbench::cache::build(&kvbench::cache::CacheSpec::new(mode, SLOTS, BS, false)),
            be: SimBackend::new(&setup)
                .expect("sim")
                .with_shadow()
                .expect("shadow"),
        }
    }

    /// Start `seq` on `tokens` (all of them written by the step that schedules it) and return
    /// its blocks.
    fn start(&mut self, seq: SeqId, tokens: &[u32], scope: &ScopeKey) -> Vec<u32> {
        self.cache
            .start(&StartRequest {
                seq,
                tokens,
                scope: Some(scope),
                reserve_tokens: tokens.len() as u32,
            })
            .expect("start");
        self.cache.fill(seq, tokens.len() as u32).expect("fill");
        self.be
            .register(seq, tokens, Some(scope))
            .expect("register");
        match self.cache.layout(seq) {
            Some(SeqLayout::Paged { blocks, .. }) => blocks.to_vec(),
            _ => Vec::new(),
        }
    }

    fn submit(&mut self, tier_ops: Vec<TierOp>, seqs: Vec<SeqWork>) {
        let plan = StepPlan {
            tier_ops,
            seqs,
            ..StepPlan::default()
        };
        self.be.submit(&plan, &*self.cache).expect("submit");
    }

    fn complete(&mut self) {
        self.be.complete().expect("complete");
    }

    fn step(&mut self, tier_ops: Vec<TierOp>, seqs: Vec<SeqWork>) {
        self.submit(tier_ops, seqs);
        self.complete();
    }

    fn report(&self) -> ShadowReport {
        self.be.shadow_report().expect("shadow")
    }
}

/// `seq` reads positions `0..context` and writes `context..context + new`.
fn work(seq: SeqId, context: u32, new: u32) -> SeqWork {
    SeqWork {
        seq,
        context_tokens: context,
        new_tokens: new,
        sample: false,
    }
}

/// Stream 1 writes a 48-token prompt, whose first two blocks go to host slots 0 and 1 (block 1
/// then on to disk slot 2 when there is a disk); stream 2, the same prompt under the same scope,
/// starts on fresh blocks. Returns the rig, stream 1's and stream 2's blocks.
fn offloaded(disk_blocks: u32) -> (Rig, Vec<u32>, Vec<u32>) {
    let mut r = Rig::new(CacheMode::Paged, 4, disk_blocks);
    let p = prompt(1, 3 * BS);
    let a = r.start(1, &p, &scope(0));
    r.step(Vec::new(), vec![work(1, 0, 3 * BS)]);
    let mut ops = vec![op(dev(a[0]), host(0), None), op(dev(a[1]), host(1), None)];
    if disk_blocks > 0 {
        ops.push(op(host(1), disk(2), None));
    }
    r.step(ops, Vec::new());
    let b = r.start(2, &p, &scope(0));
    (r, a, b)
}

#[test]
fn an_onloaded_block_carries_what_was_offloaded_through_host_and_disk() {
    for disk_blocks in [0, 3] {
        let (mut r, _, b) = offloaded(disk_blocks);
        let second = if disk_blocks > 0 { disk(2) } else { host(1) };
        let before = r.report().checked_slots;
        r.step(
            vec![
                op(host(0), dev(b[0]), Some(2)),
                op(second, dev(b[1]), Some(2)),
            ],
            vec![work(2, 2 * BS, BS)],
        );
        let sh = r.report();
        assert_eq!(sh.violations, 0, "{:?}", sh.messages);
        assert_eq!(sh.onloads, 2);
        assert_eq!(sh.offloads, 2 + u64::from(disk_blocks > 0));
        assert!(
            sh.checked_slots >= before + u64::from(2 * BS),
            "the onloaded positions were read and compared: {sh:?}"
        );
    }
}

#[test]
fn a_wrong_onload_is_a_wrong_tag_for_its_reader() {
    // Host slots swapped: block 0 receives the prompt's positions 16..32.
    let (mut r, _, b) = offloaded(0);
    r.step(
        vec![
            op(host(1), dev(b[0]), Some(2)),
            op(host(0), dev(b[1]), Some(2)),
        ],
        vec![work(2, 2 * BS, BS)],
    );
    let sh = r.report();
    assert_eq!(sh.violations, u64::from(2 * BS), "{:?}", sh.messages);
    assert!(
        sh.messages[0].starts_with("step 2: stream 2 read position 0 at slot ")
            && sh.messages[0].ends_with("but it holds stream 1's position 16"),
        "{:?}",
        sh.messages
    );
    // A slot nothing was offloaded to.
    let (mut r, _, b) = offloaded(0);
    r.step(
        vec![
            op(host(3), dev(b[0]), Some(2)),
            op(host(1), dev(b[1]), Some(2)),
        ],
        vec![work(2, 2 * BS, BS)],
    );
    let sh = r.report();
    assert_eq!(sh.violations, u64::from(BS), "{:?}", sh.messages);
    assert!(
        sh.messages[0].ends_with("the slot was never written"),
        "{:?}",
        sh.messages
    );
}

#[test]
fn the_writers_reuse_scope_travels_with_the_block() {
    // Same tokens, another tenant: the onloaded tags are the first tenant's.
    let mut r = Rig::new(CacheMode::Paged, 4, 0);
    let p = prompt(1, 2 * BS);
    let a = r.start(1, &p, &scope(0));
    r.step(Vec::new(), vec![work(1, 0, 2 * BS)]);
    r.step(vec![op(dev(a[0]), host(0), None)], Vec::new());
    let b = r.start(2, &p, &scope(1));
    r.step(vec![op(host(0), dev(b[0]), Some(2))], vec![work(2, BS, BS)]);
    let sh = r.report();
    assert_eq!(sh.violations, u64::from(BS), "{:?}", sh.messages);
    assert!(
        sh.messages[0].contains("reuse scope tenant:0, the reader's scope is tenant:1")
            && sh.messages[0].contains("tokens match"),
        "{:?}",
        sh.messages
    );
}

/// Stream 3 writes a different prompt; its first block is what a reused host slot receives.
fn other_block(r: &mut Rig) -> u32 {
    let c = r.start(3, &prompt(2, BS), &scope(0));
    r.step(Vec::new(), vec![work(3, 0, BS)]);
    c[0]
}

#[test]
fn a_tier_slot_reused_in_the_step_of_its_onload_is_seen() {
    let (mut r, _, b) = offloaded(0);
    let c = other_block(&mut r);
    // The offload comes after the onload in the step's order: a device running the onload
    // late (overlapping compute) would copy stream 3's block.
    r.step(
        vec![
            op(host(0), dev(b[0]), Some(2)),
            op(host(1), dev(b[1]), Some(2)),
            op(dev(c), host(0), None),
        ],
        vec![work(2, 2 * BS, BS)],
    );
    let sh = r.report();
    assert_eq!(sh.violations, u64::from(BS), "{:?}", sh.messages);
    assert!(
        sh.messages[0].contains("stream 2 read position 0")
            && sh.messages[0].contains("it holds stream 3's"),
        "{:?}",
        sh.messages
    );
}

#[test]
fn a_tier_slot_reused_while_its_onload_is_in_flight_is_seen_and_after_is_not() {
    for complete_first in [true, false] {
        let (mut r, _, b) = offloaded(0);
        let c = other_block(&mut r);
        r.submit(
            vec![
                op(host(0), dev(b[0]), Some(2)),
                op(host(1), dev(b[1]), Some(2)),
            ],
            vec![work(2, 2 * BS, BS)],
        );
        if complete_first {
            r.complete();
        }
        // The next step offloads into host slot 0: legal once the onload's step completed.
        r.submit(vec![op(dev(c), host(0), None)], Vec::new());
        r.complete();
        if !complete_first {
            r.complete();
        }
        let sh = r.report();
        if complete_first {
            assert_eq!(sh.violations, 0, "{:?}", sh.messages);
        } else {
            // Once as a read of the onloaded block, once as a slot overwritten under the
            // in-flight reader.
            assert_eq!(sh.violations, u64::from(2 * BS), "{:?}", sh.messages);
            assert!(
                sh.messages[0].contains("stream 2 read position 0")
                    && sh.messages[0].contains("it holds stream 3's"),
                "{:?}",
                sh.messages
            );
        }
    }
}

#[test]
fn ops_the_run_cannot_carry_out_are_named() {
    // Two ops the cost model cannot price stop the step before the shadow sees it: a move to a
    // disk the run has none of, and a move inside one tier.
    for bad in [op(host(0), disk(0), None), {
        let (_, a, b) = offloaded(0);
        op(dev(a[2]), dev(b[2]), None)
    }] {
        let (mut r, _, _) = offloaded(0);
        let plan = StepPlan {
            tier_ops: vec![bad],
            ..StepPlan::default()
        };
        let err =
            r.be.submit(&plan, &*r.cache)
                .expect_err("refused")
                .to_string();
        assert!(err.contains("tier op"), "{err}");
    }
    // The ones it can price but the run cannot carry out are the shadow's violations.
    let (mut r, a, b) = offloaded(0);
    r.step(
        vec![
            op(dev(a[2]), host(4), None),
            TierOp {
                tokens: BS + 1,
                ..op(host(0), dev(b[0]), Some(2))
            },
            op(dev(64), host(0), None),
        ],
        Vec::new(),
    );
    let sh = r.report();
    assert_eq!(sh.violations, 3, "{:?}", sh.messages);
    assert_eq!(
        (sh.offloads, sh.onloads),
        (2, 0),
        "refused ops are not carried out"
    );
    let m = &sh.messages;
    assert!(
        m[0].starts_with("step 2: offload of 16 tokens device block ")
            && m[0].ends_with("→ host slot 4: the host tier has 4 blocks"),
        "{m:?}"
    );
    assert!(m[1].ends_with("a block holds 16 tokens"), "{m:?}");
    assert!(m[2].ends_with("the device has 64 blocks"), "{m:?}");

    let mut r = Rig::new(CacheMode::Contiguous, 4, 0);
    r.step(vec![op(dev(0), host(0), None)], Vec::new());
    let sh = r.report();
    assert_eq!(sh.violations, 1);
    assert!(
        sh.messages[0].ends_with("lower tiers hold paged blocks, this run is contiguous"),
        "{:?}",
        sh.messages
    );
}

#[test]
fn a_run_without_tier_ops_reports_as_before() {
    // No tier fields in summary.json (the committed reference results stay byte-identical),
    // and no tier pages allocated: only the page table of the configured host tier.
    let mut tiered = Rig::new(CacheMode::Paged, 4, 0);
    let mut plain = Rig::new(CacheMode::Paged, 0, 0);
    for r in [&mut tiered, &mut plain] {
        let p = prompt(1, 2 * BS);
        r.start(1, &p, &scope(0));
        r.step(Vec::new(), vec![work(1, 0, 2 * BS)]);
    }
    let (t, p) = (tiered.report(), plain.report());
    let json = serde_json::to_string(&t).expect("json");
    assert!(
        !json.contains("offloads") && !json.contains("onloads"),
        "{json}"
    );
    // One page-table entry: a page's address, or none.
    let page_table = std::mem::size_of::<Option<std::ptr::NonNull<u8>>>() as u64;
    assert_eq!(t.allocated_bytes, p.allocated_bytes + page_table);
    assert_eq!(
        (t.read_slots, t.written_slots, t.checked_slots),
        (p.read_slots, p.written_slots, p.checked_slots)
    );
}
