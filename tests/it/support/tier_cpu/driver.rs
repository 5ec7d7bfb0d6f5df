//! A small serial driver over the tiered paged manager: each request starts (its prefix looked
//! up on the device, then in the host and disk tiers), its prefill and a few decode steps run
//! on the backend with the tier ops the manager drained for each step, and it finishes. A
//! device cache of a few blocks and several shared system prompts make device evictions
//! (offloads) and lower-tier hits (onloads) frequent. The backend's oracle check covers every
//! sequence, so a wrong onload is a wrong logit.

use kvbench::backend::{Backend, NumericsReport, SeqWork, StepPlan};
use kvbench::cache::{CacheSpec, EvictionPolicy, TierConfig};
use kvbench_cache_api::{
    CacheMode, Fault, KvCacheManager, OffloadMode, ReleaseReason, ReuseScope, ScopeKey,
    StartRequest, Tier, TierOp,
};

use super::BLOCK;

/// Device blocks: one request needs at most 4, so a start usually evicts another prompt's.
pub const DEVICE_BLOCKS: u64 = 6;
pub const SYSTEM_PROMPTS: u32 = 4;
/// Each system prompt is two full blocks.
pub const SYSTEM_TOKENS: u32 = 2 * BLOCK;
pub const DECODE_TOKENS: u32 = 3;

pub struct Drive {
    pub numerics: NumericsReport,
    pub host_hit_tokens: u64,
    pub disk_hit_tokens: u64,
    pub offloads: u64,
    pub onloads: u64,
    pub moves_to_disk: u64,
    pub fault_fired: u64,
}

impl Drive {
    /// What a tiered run gives on every compute backend: the oracle passed, and blocks came
    /// back from both the host and the disk (not a vacuous pass).
    pub fn assert_passed_with_host_and_disk_hits(&self, label: &str) {
        assert!(self.numerics.ok, "{label}: {:?}", self.numerics);
        assert!(
            self.host_hit_tokens > 0 && self.disk_hit_tokens > 0,
            "{label}: no lower-tier hit"
        );
    }
}

/// splitmix64: the driver's only randomness, from the seed the test prints.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

pub fn tiers(host_blocks: u32, disk_blocks: u32, offload: OffloadMode) -> TierConfig {
    TierConfig {
        host_blocks,
        disk_blocks,
        offload,
        host_eviction: EvictionPolicy::Lru,
        disk_eviction: EvictionPolicy::Lru,
    }
}

/// One step: the drained tier ops, then `plan`; the manager's invariants checked after it
/// unless a fault is planted (the manager would report the fault itself: the point is that
/// the oracle catches it without the manager's help). Returns the sampled tokens in plan order.
fn step(
    backend: &mut dyn Backend,
    cache: &mut dyn KvCacheManager,
    mut plan: StepPlan,
    d: &mut Drive,
    check: bool,
) -> Vec<u32> {
    let mut ops: Vec<TierOp> = Vec::new();
    cache.drain_tier_ops(&mut ops);
    for op in &ops {
        match (op.from.tier, op.to.tier) {
            (Tier::Device, _) => d.offloads += 1,
            (_, Tier::Device) => d.onloads += 1,
            _ => d.moves_to_disk += 1,
        }
    }
    plan.tier_ops = ops;
    backend.submit(&plan, cache).expect("step submitted");
    let id = cache.begin_step();
    let out = backend.complete().expect("step completes");
    cache.retire_step(id);
    if check {
        cache.check_invariants().expect("manager invariants");
    }
    out.sampled.iter().map(|s| s.token).collect()
}

/// `requests` requests one at a time on [`DEVICE_BLOCKS`] device blocks.
pub fn drive(
    backend: &mut dyn Backend,
    seed: u64,
    requests: u64,
    tiers: TierConfig,
    fault: Option<Fault>,
) -> Drive {
    drive_batched(backend, seed, requests, 1, tiers, fault)
}

/// `requests` requests, `batch` at a time (started in one planning, prefilled in one step,
/// decoded together) on `batch` × [`DEVICE_BLOCKS`] device blocks; each is one of
/// [`SYSTEM_PROMPTS`] system prompts (distinct within a batch) plus a random suffix.
pub fn drive_batched(
    backend: &mut dyn Backend,
    seed: u64,
    requests: u64,
    batch: u64,
    tiers: TierConfig,
    fault: Option<Fault>,
) -> Drive {
    let batch = batch.clamp(1, SYSTEM_PROMPTS as u64);
    let mut cache = kvbench::cache::build(
        &CacheSpec::new(
            CacheMode::Paged,
            batch * DEVICE_BLOCKS * BLOCK as u64,
            BLOCK,
            true,
        )
        .with_tiers(tiers),
    );
    if let Some(f) = fault {
        cache.inject_fault(f);
    }
    let scope = ScopeKey {
        model: "tiny".into(),
        tokenizer: "tiny".into(),
        reuse: ReuseScope::Global,
    };
    let mut rng = Rng(seed);
    let mut d = Drive {
        numerics: backend.numerics().expect("numerics"),
        host_hit_tokens: 0,
        disk_hit_tokens: 0,
        offloads: 0,
        onloads: 0,
        moves_to_disk: 0,
        fault_fired: 0,
    };
    let check = fault.is_none();
    let mut next = 1u64;
    while next <= requests {
        let seqs: Vec<u64> = (next..=requests.min(next + batch - 1)).collect();
        next += seqs.len() as u64;
        let first_system = rng.below(SYSTEM_PROMPTS as u64) as u32;
        let mut prefill = Vec::new();
        let mut lens = Vec::new();
        for (i, &seq) in seqs.iter().enumerate() {
            let system = (first_system + i as u32) % SYSTEM_PROMPTS;
            let suffix = 4 + rng.below(17) as u32;
            let mut prompt: Vec<u32> = (0..SYSTEM_TOKENS)
                .map(|t| (system * 97 + t * 13 + 1) % 512)
                .collect();
            prompt.extend((0..suffix).map(|_| rng.below(512) as u32));
            let len = prompt.len() as u32;
            backend
                .register(seq, &prompt, Some(&scope))
                .expect("register");
            let started = cache
                .start(&StartRequest {
                    seq,
                    tokens: &prompt,
                    scope: Some(&scope),
                    reserve_tokens: len + DECODE_TOKENS,
                })
                .expect("start");
            d.host_hit_tokens += u64::from(started.tier_hits.host_tokens);
            d.disk_hit_tokens += u64::from(started.tier_hits.disk_tokens);
            let cached = started.cached_tokens;
            cache.fill(seq, len - cached).expect("fill");
            prefill.push(SeqWork {
                seq,
                context_tokens: cached,
                new_tokens: len - cached,
                sample: true,
            });
            lens.push(len);
        }
        let plan = StepPlan {
            seqs: prefill,
            ..StepPlan::default()
        };
        let mut tokens = step(backend, cache.as_mut(), plan, &mut d, check);
        assert_eq!(tokens.len(), seqs.len(), "one token per sequence");
        for k in 0..DECODE_TOKENS {
            let mut plan = StepPlan::default();
            for ((&seq, &len), &token) in seqs.iter().zip(&lens).zip(&tokens) {
                plan.copies
                    .extend(cache.append_token(seq, token).expect("append"));
                plan.seqs.push(SeqWork {
                    seq,
                    context_tokens: len + k,
                    new_tokens: 1,
                    sample: true,
                });
            }
            tokens = step(backend, cache.as_mut(), plan, &mut d, check);
        }
        for &seq in &seqs {
            cache.release(seq, ReleaseReason::Finish).expect("release");
            backend.forget(seq).expect("forget");
        }
    }
    // Write-through offloads of the last step go in one more.
    step(backend, cache.as_mut(), StepPlan::default(), &mut d, check);
    d.fault_fired = cache.fault_fired();
    if fault.is_none() {
        cache.assert_quiescent().expect("quiescent");
    }
    d.numerics = backend.numerics().expect("numerics");
    d
}
