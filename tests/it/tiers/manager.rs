//! Random operation sequences against the paged manager with lower tiers, checked against a
//! model of what every lower-tier slot physically holds.
//!
//! The driver behaves like the engine: it plans (start, fill, append, release, flush), drains the
//! tier ops after every call (all ops drained before a `begin_step` belong to that step, in
//! order), begins steps and retires them out of order. The model executes each op in drained
//! order: an offload writes into its slot the key the device block was published under just
//! before the call that evicted it, a disk move copies the host slot's content. Checked:
//! - every onload's source holds, when the op runs, exactly the key the started sequence's
//!   device block is published under, and that key's tokens are the prompt's tokens there;
//! - no op writes a slot an onload reads while the onload's step has not retired (an onload may
//!   run asynchronously until then);
//! - every slot the manager says holds a key holds it in the model;
//! - the per-tier counters match the ops (offloads, onloads) and balance
//!   (`used = offloaded − evicted`), `check_invariants` after every call (a key in at most one
//!   slot per tier, slot accounting), and nothing pinned or leaked at quiescence;
//! - with `stale-onload` armed, those checks fail on some seed.
//!
//! `KVBENCH_SEED` replays one seed; `KVBENCH_TIER_SEEDS` widens the sweep.

use crate::support;

use std::collections::{BTreeMap, HashMap};

use kvbench::cache::{EvictionPolicy, PagedCache, PagedConfig, Placement, TierConfig};
use kvbench_cache_api::{
    BlockLoc, Fault, KvCacheManager, OffloadMode, ReleaseReason, ReuseScope, ScopeKey,
    StartRequest, StepId, Tier, TierOp,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

type Key = [u8; 32];

struct Live {
    tokens: Vec<u32>,
    filled: u32,
    len: u32,
}

struct Run {
    seed: u64,
    c: PagedCache,
    bs: u32,
    device_blocks: u32,
    rng: ChaCha8Rng,
    scopes: Vec<ScopeKey>,
    live: BTreeMap<u64, Live>,
    next_seq: u64,
    next_token: u32,
    in_flight: Vec<StepId>,
    /// What each lower-tier slot holds, as the ops executed so far wrote it.
    content: HashMap<BlockLoc, Key>,
    /// Onloads not known finished: their source, and their step (`None`: the batch being
    /// planned, not begun yet).
    reading: Vec<(BlockLoc, Option<StepId>)>,
    /// The tokens each key was published for.
    key_tokens: HashMap<Key, Vec<u32>>,
    /// Ops seen, per kind: (to host, to disk, host→device, disk→device).
    counted: [u64; 4],
    ops_seen: u64,
    onloads_seen: u64,
    /// Starts refused (no space) and admitted.
    starts: [u64; 2],
}

fn seeds() -> Vec<u64> {
    support::seeds("KVBENCH_TIER_SEEDS", 200, 0x71e5_0000)
}

impl Run {
    fn new(seed: u64, fault: Option<Fault>) -> Run {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bs = rng.gen_range(1..=4u32);
        let device_blocks = rng.gen_range(6..=12u32);
        let policy = |r: &mut ChaCha8Rng| EvictionPolicy::ALL[r.gen_range(0..3)];
        let tiers = TierConfig {
            host_blocks: rng.gen_range(1..=6),
            disk_blocks: if rng.gen_bool(0.5) {
                rng.gen_range(1..=6)
            } else {
                0
            },
            offload: if rng.gen_bool(0.5) {
                OffloadMode::OnEvict
            } else {
                OffloadMode::WriteThrough
            },
            host_eviction: policy(&mut rng),
            disk_eviction: policy(&mut rng),
        };
        let mut c = PagedCache::with_tiers(
            PagedConfig {
                total_blocks: device_blocks,
                block_size: bs,
                prefix_cache: true,
                placement: Placement::Lifo,
            },
            policy(&mut rng),
            tiers,
        );
        if let Some(f) = fault {
            c.inject_fault(f);
        }
        let scopes = (0..2)
            .map(|t| ScopeKey {
                model: "m".into(),
                tokenizer: "t".into(),
                reuse: ReuseScope::Tenant(t),
            })
            .collect();
        Run {
            seed,
            c,
            bs,
            device_blocks,
            rng,
            scopes,
            live: BTreeMap::new(),
            next_seq: 1,
            next_token: 10_000,
            in_flight: Vec::new(),
            content: HashMap::new(),
            reading: Vec::new(),
            key_tokens: HashMap::new(),
            counted: [0; 4],
            ops_seen: 0,
            onloads_seen: 0,
            starts: [0; 2],
        }
    }

    fn keys_now(&self) -> Vec<Option<Key>> {
        (0..self.device_blocks)
            .map(|b| self.c.block_key(b))
            .collect()
    }

    /// Drain after a call and execute the ops in the model. `before`: each device block's key
    /// just before the call (what an offload of it copies).
    fn drain(&mut self, before: &[Option<Key>], started: Option<u64>) -> Result<(), String> {
        let mut ops: Vec<TierOp> = Vec::new();
        self.c.drain_tier_ops(&mut ops);
        for op in ops {
            self.ops_seen += 1;
            self.execute(&op, before, started)?;
        }
        self.check_slots()
    }

    fn execute(
        &mut self,
        op: &TierOp,
        before: &[Option<Key>],
        started: Option<u64>,
    ) -> Result<(), String> {
        if op.tokens != self.bs {
            return Err(format!(
                "op of {} tokens, block size {}",
                op.tokens, self.bs
            ));
        }
        match (op.from.tier, op.to.tier) {
            (Tier::Device, Tier::Host) | (Tier::Host, Tier::Disk) => {
                let what = if op.from.tier == Tier::Device {
                    before
                        .get(op.from.slot as usize)
                        .copied()
                        .flatten()
                        .ok_or(format!("offload of unpublished device block: {op:?}"))?
                } else {
                    *self
                        .content
                        .get(&op.from)
                        .ok_or(format!("move of an empty slot: {op:?}"))?
                };
                if let Some((_, step)) = self.reading.iter().find(|(l, _)| *l == op.to) {
                    return Err(format!(
                        "{op:?} overwrites a slot an onload of step {step:?} may still read"
                    ));
                }
                self.content.insert(op.to, what);
                self.counted[if op.to.tier == Tier::Host { 0 } else { 1 }] += 1;
            }
            (Tier::Host | Tier::Disk, Tier::Device) => {
                self.onloads_seen += 1;
                let seq = op.seq.ok_or("an onload without a sequence")?;
                if Some(seq) != started {
                    return Err(format!("onload for seq {seq} drained after another call"));
                }
                let expected = self
                    .c
                    .block_key(op.to.slot)
                    .ok_or(format!("onloaded block is not published: {op:?}"))?;
                let held = self.content.get(&op.from).copied();
                if held != Some(expected) {
                    return Err(format!(
                        "{op:?} reads a slot holding {:?}, expected {:?}",
                        held.map(|k| k[0]),
                        expected[0]
                    ));
                }
                let live = &self.live[&seq];
                let table = self.c.block_table(seq).ok_or("no table")?;
                let pos = table
                    .iter()
                    .position(|&b| b == op.to.slot)
                    .ok_or("onload into a block the sequence does not map")?;
                let bs = self.bs as usize;
                let chunk = &live.tokens[pos * bs..(pos + 1) * bs];
                if self.key_tokens.get(&expected).map(Vec::as_slice) != Some(chunk) {
                    return Err(format!(
                        "onloaded key's tokens differ from the prompt at {pos}"
                    ));
                }
                self.reading.push((op.from, None));
                self.counted[if op.from.tier == Tier::Host { 2 } else { 3 }] += 1;
            }
            _ => return Err(format!("unexpected op {op:?}")),
        }
        Ok(())
    }

    /// Every slot the manager says holds a key holds it in the model; counters match the ops.
    fn check_slots(&self) -> Result<(), String> {
        for tier in [Tier::Host, Tier::Disk] {
            for slot in 0..64 {
                let loc = BlockLoc { tier, slot };
                if let Some(k) = self.c.tier_slot_key(tier, slot) {
                    if self.content.get(&loc) != Some(&k) {
                        return Err(format!(
                            "{loc:?}: manager says {:?}, model {:?}",
                            k[0],
                            self.content.get(&loc).map(|k| k[0])
                        ));
                    }
                }
            }
        }
        let stats = self.c.tier_stats();
        let host = stats.first().ok_or("no host stats")?;
        let disk = stats.get(1).copied().unwrap_or_default();
        let got = [
            host.offloaded_blocks,
            disk.offloaded_blocks,
            host.onloaded_blocks,
            disk.onloaded_blocks,
        ];
        // Ops still undrained are counted already: the model drains after every call.
        if got != self.counted {
            return Err(format!(
                "counters {got:?} but the ops say {:?}",
                self.counted
            ));
        }
        for s in &stats {
            if s.offloaded_blocks - s.evicted_blocks != s.used_blocks
                || s.used_blocks > s.capacity_blocks
            {
                return Err(format!("unbalanced {s:?}"));
            }
        }
        Ok(())
    }

    /// Record the keys of the full blocks a sequence has filled (and check a key never means
    /// two token strings).
    fn note_keys(&mut self, seq: u64) -> Result<(), String> {
        let Some(live) = self.live.get(&seq) else {
            return Ok(());
        };
        let table = self.c.block_table(seq).ok_or("no table")?.to_vec();
        let bs = self.bs as usize;
        for (i, &b) in table.iter().enumerate() {
            if (i + 1) * bs > live.filled as usize || (i + 1) * bs > live.tokens.len() {
                break;
            }
            if let Some(k) = self.c.block_key(b) {
                let chunk = live.tokens[i * bs..(i + 1) * bs].to_vec();
                if let Some(old) = self.key_tokens.insert(k, chunk.clone()) {
                    if old != chunk {
                        return Err("one key published for two token strings".into());
                    }
                }
            }
        }
        Ok(())
    }

    fn prompt(&mut self) -> Vec<u32> {
        let family = self.rng.gen_range(0..8u32);
        let shared = self.rng.gen_range(0..=3u32) * self.bs + self.rng.gen_range(0..self.bs);
        let tail = self.rng.gen_range(1..=self.bs);
        let mut t: Vec<u32> = (0..shared).map(|i| family * 1000 + i).collect();
        for _ in 0..tail {
            self.next_token += 1;
            t.push(self.next_token);
        }
        t
    }

    fn step(&mut self) -> Result<(), String> {
        let before = self.keys_now();
        match self.rng.gen_range(0..100) {
            0..=27 => {
                let tokens = self.prompt();
                let scope = self.scopes[usize::from(self.rng.gen_bool(0.2))].clone();
                let seq = self.next_seq;
                self.next_seq += 1;
                let req = StartRequest {
                    seq,
                    tokens: &tokens,
                    scope: Some(&scope),
                    reserve_tokens: tokens.len() as u32,
                };
                let probe = self.c.probe_start(&req);
                let res = self.c.start(&req);
                self.starts[usize::from(res.is_ok())] += 1;
                if let Ok(s) = res {
                    let onloaded = s.tier_hits.onload_tokens();
                    if (s.cached_tokens, onloaded) != (probe.cached_tokens, probe.onload_tokens) {
                        return Err(format!("start {s:?} disagrees with its probe {probe:?}"));
                    }
                    self.live.insert(
                        seq,
                        Live {
                            len: tokens.len() as u32,
                            filled: s.cached_tokens,
                            tokens,
                        },
                    );
                    let before_onloads = self.onloads_seen;
                    self.drain(&before, Some(seq))?;
                    if self.onloads_seen - before_onloads != u64::from(onloaded / self.bs) {
                        return Err("onload ops differ from the tier hits".into());
                    }
                    return self.note_keys(seq);
                }
                // Refused: wait for a step, or preempt the oldest sequence, as a scheduler would.
                if !self.in_flight.is_empty() {
                    self.retire_one();
                } else if let Some((&old, _)) = self.live.iter().next() {
                    self.c
                        .release(old, ReleaseReason::Preempt)
                        .map_err(|e| e.to_string())?;
                    self.live.remove(&old);
                }
            }
            28..=52 => {
                if let Some(seq) = self.pick() {
                    let l = &self.live[&seq];
                    let n = self.rng.gen_range(0..=l.len - l.filled);
                    self.c.fill(seq, n).map_err(|e| e.to_string())?;
                    if let Some(l) = self.live.get_mut(&seq) {
                        l.filled += n;
                    }
                    self.note_keys(seq)?;
                }
            }
            53..=57 => {
                if let Some(seq) = self.pick() {
                    let l = &self.live[&seq];
                    if l.filled == l.len {
                        self.next_token += 1;
                        let t = self.next_token;
                        if self.c.append_token(seq, t).is_ok() {
                            if let Some(l) = self.live.get_mut(&seq) {
                                l.tokens.push(t);
                                l.len += 1;
                                l.filled += 1;
                            }
                            self.note_keys(seq)?;
                        }
                    }
                }
            }
            58..=75 => {
                if let Some(seq) = self.pick() {
                    self.c
                        .release(seq, ReleaseReason::Finish)
                        .map_err(|e| e.to_string())?;
                    self.live.remove(&seq);
                }
            }
            76..=87 if self.in_flight.len() < 3 => self.begin()?,
            76..=87 => self.retire_one(),
            88..=98 => self.retire_one(),
            _ => self.c.flush_prefix_cache(),
        }
        self.drain(&before, None)
    }

    fn pick(&mut self) -> Option<u64> {
        let n = self.live.len();
        (n > 0).then(|| {
            let i = self.rng.gen_range(0..n);
            *self.live.keys().nth(i).unwrap_or(&0)
        })
    }

    fn begin(&mut self) -> Result<(), String> {
        let before = self.keys_now();
        let step = self.c.begin_step();
        for r in self.reading.iter_mut().filter(|r| r.1.is_none()) {
            r.1 = Some(step);
        }
        self.in_flight.push(step);
        // Ops emitted by `begin_step` (write-through) belong to the next step.
        self.drain(&before, None)
    }

    fn retire_one(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        let i = self.rng.gen_range(0..self.in_flight.len());
        let step = self.in_flight.remove(i);
        self.c.retire_step(step);
        self.reading.retain(|r| r.1 != Some(step));
    }

    /// Random calls, then wind down: release everything, run and retire the last step.
    /// `self_checks`: also run the manager's own invariant and quiescence checks.
    fn run(&mut self, calls: usize, self_checks: bool) -> Result<(), String> {
        for i in 0..calls {
            self.step().map_err(|e| format!("call {i}: {e}"))?;
            if self_checks {
                self.c
                    .check_invariants()
                    .map_err(|e| format!("call {i}: invariants: {e}"))?;
            }
        }
        let seqs: Vec<u64> = self.live.keys().copied().collect();
        for s in seqs {
            self.c
                .release(s, ReleaseReason::Finish)
                .map_err(|e| e.to_string())?;
        }
        self.live.clear();
        self.begin()?;
        while !self.in_flight.is_empty() {
            self.retire_one();
        }
        // Write-through ops emitted by the last begin_step: drain them into one more step.
        self.begin()?;
        while !self.in_flight.is_empty() {
            self.retire_one();
        }
        if self_checks {
            self.c
                .assert_quiescent()
                .map_err(|e| format!("quiescent: {e}"))?;
        }
        Ok(())
    }
}

#[test]
fn lower_tiers_hold_exactly_what_was_offloaded() {
    let mut onloads = 0;
    let mut disk_onloads = 0;
    let mut ops = 0;
    let mut starts = [0u64; 2];
    for seed in seeds() {
        println!("seed {seed} (replay with KVBENCH_SEED={seed})");
        let mut r = Run::new(seed, None);
        if let Err(e) = r.run(400, true) {
            panic!("seed {seed}: {e}");
        }
        onloads += r.onloads_seen;
        ops += r.ops_seen;
        starts[0] += r.starts[0];
        starts[1] += r.starts[1];
        disk_onloads += r.counted[3];
        assert!(r.ops_seen >= r.onloads_seen, "seed {}", r.seed);
    }
    println!("{onloads} onloads checked, {disk_onloads} of them from disk, {ops} ops, starts refused/admitted {starts:?}");
    // The sweep exercised what it checks.
    assert!(onloads > 0, "no onload in the sweep");
    if seeds().len() > 10 {
        assert!(disk_onloads > 0, "no disk onload in the sweep");
    }
}

#[test]
fn stale_onload_is_caught_by_the_model() {
    let mut caught = None;
    let mut fired = 0;
    for seed in seeds() {
        let mut r = Run::new(seed, Some(Fault::StaleOnload));
        // The model's checks alone (the manager reports the fault itself too; that is not
        // what this test proves).
        let res = r.run(400, false);
        fired += r.c.fault_fired();
        if let Err(e) = res {
            println!("seed {seed}: stale-onload caught: {e}");
            caught = Some(seed);
            break;
        }
    }
    assert!(fired > 0, "stale-onload never fired");
    assert!(
        caught.is_some(),
        "stale-onload ran on every seed without a failed check"
    );
}

/// The shared operation model (`cache::fuzz`, whose reference keeps every slot's token ids)
/// with tiers: it performs each drained tier op on its own device and lower-tier memories, so
/// a prefix hit onloaded from a lower tier must read back this prompt's tokens of this scope.
#[test]
fn the_fuzz_model_reads_back_onloaded_prompts() {
    use kvbench::cache::fuzz::{self, FuzzConfig, FuzzSummary};
    let mut totals = FuzzSummary::default();
    for seed in seeds() {
        for (offload, disk) in [
            (OffloadMode::OnEvict, false),
            (OffloadMode::OnEvict, true),
            (OffloadMode::WriteThrough, true),
        ] {
            println!("seed {seed} {offload:?} disk {disk} (replay with KVBENCH_SEED={seed})");
            let s = fuzz::run_seed_with(seed, 400, FuzzConfig::tiered(offload, disk))
                .unwrap_or_else(|f| panic!("{f}"));
            totals.add(&s);
        }
    }
    println!("{totals:?}");
    if seeds().len() > 10 {
        assert!(
            totals.onloaded_tokens > 0 && totals.tier_ops > 0,
            "{totals:?}"
        );
    }
}
