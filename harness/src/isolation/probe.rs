//! The probe workload and its runs: a victim tenant sends prompts with fresh prefixes; shortly
//! after each, a probing tenant sends a prompt that either starts with that victim's prefix (a hit
//! probe) or with a fresh one of the same length (a miss probe). The prober sees only its TTFT, so
//! the AUC of hit vs miss TTFTs is how much the prefix cache tells one tenant about another.
//!
//! Probes alternate hit/miss so that load, and its drift over the run, is the same for both
//! classes; the victim's request arrives `gap_ms / 2` before its probe so it has finished
//! prefilling (the low-load case the leak is plainest in).
//!
//! Load: a third tenant sends background requests (Poisson, `load_rps` per second, prompts as long
//! as a probe's, fresh tokens, [`BACKGROUND_OUTPUT_TOKENS`] out) from its own seeded stream, so the
//! victim's and the prober's prompts are the same at every load. Their queueing and batching
//! spread both classes' TTFTs, which is how load hides (or fails to hide) a hit.
//!
//! A lower tier (`filler_tokens`, set when the scenario has `[cache.host_tier]`) makes a second,
//! slower hit class, and the prober reaches it the way a real attacker would: by waiting while
//! traffic pushes the victim's prefix off the device. Each round then has two probe slots — early
//! (`gap/8` after the victim, its prefix still on the device) and late (`7·gap/8`) — with
//! `filler_tokens` of the prober's own fresh-prompt requests spread over `[gap/4, gap/2)` in
//! between, more than the device's cache holds, so the device evicts the victim's prefix into the
//! host tier before the late slot. Rounds cycle through four intents — repeat early (device),
//! fresh early, repeat late (host), fresh late — so both slots have their misses and repeats still
//! alternate with fresh probes. What each probe *actually* hit is read from its stream record
//! (the columns `requests.csv` writes), never assumed from its intent.

use kvbench_cache_api::CacheMode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::experiment::{self, ExperimentError, RunOptions};
use crate::metrics::tiers::{hit_device_tokens, ttft_parts};
use crate::scenario::{PrefixScope, Scenario};
use crate::workload::{Prompt, Request, Workload};

use super::auc::{self, AucEstimate};
use super::noise;

/// The victim's tenant id; the prober is `VICTIM_TENANT + 1`.
pub const VICTIM_TENANT: u32 = 0;
pub const PROBER_TENANT: u32 = 1;
/// The tenant whose requests are the background load.
pub const BACKGROUND_TENANT: u32 = 2;
/// Output tokens of a background request: long enough that background decodes share steps with
/// the probes' prefills.
pub const BACKGROUND_OUTPUT_TOKENS: u32 = 32;
/// Mixed into the probe seed for the background stream (arrivals and tokens).
const BACKGROUND_STREAM: u64 = 0x6c6f_6164_5f72_7073; // "load_rps"

/// The shape of the probe workload.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Probes in all (half hits, half misses, alternating).
    pub probes: u32,
    /// Tokens of the shared (or fresh) prefix; rounded down to whole blocks by the cache.
    pub prefix_tokens: u32,
    /// Tokens after the prefix, fresh in every prompt.
    pub suffix_tokens: u32,
    /// Time between one victim request and the next; the probe arrives halfway.
    pub gap_ms: f64,
    /// Background requests per second from a third tenant (0 = none).
    pub load_rps: f64,
    pub seed: u64,
    /// Tokens of filler traffic per round between the early and the late probe slot (`None` or
    /// 0: no filler, one probe `gap/2` after its victim, the layout without a lower tier).
    pub filler_tokens: Option<u64>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            probes: 100,
            prefix_tokens: 1024,
            suffix_tokens: 16,
            gap_ms: 1000.0,
            load_rps: 0.0,
            seed: 1,
            filler_tokens: None,
        }
    }
}

/// Where a probe's prefix was meant to be found (`intended`) or was found (`observed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// In the device's prefix cache.
    Device,
    /// In a lower tier (host, or the disk below it): onloaded, not recomputed.
    Host,
    /// Nowhere: prefilled.
    Miss,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Device => "device",
            Class::Host => "host",
            Class::Miss => "miss",
        }
    }
}

/// When in its round a probe arrives: `Mid` (`gap/2`, the layout without a filler), or `Early`
/// (`gap/8`) and `Late` (`7·gap/8`) on either side of the filler. A hit class is compared with
/// the misses of its own slot, so the filler's left-over state (a full device evicting, say)
/// never reads as a hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    Mid,
    Early,
    Late,
}

impl Slot {
    pub fn name(self) -> &'static str {
        match self {
            Slot::Mid => "mid",
            Slot::Early => "early",
            Slot::Late => "late",
        }
    }
}

/// The prefix-cache hits a probe's stream record shows at its first admission, tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProbeHits {
    pub device_tokens: u32,
    pub host_tokens: u32,
    pub disk_tokens: u32,
}

impl ProbeHits {
    /// The class the run gave the probe: any token from a lower tier makes it a lower-tier hit
    /// (its TTFT waits on the onload), else any device token a device hit, else a miss.
    pub fn class(self) -> Class {
        if self.host_tokens > 0 || self.disk_tokens > 0 {
            Class::Host
        } else if self.device_tokens > 0 {
            Class::Device
        } else {
            Class::Miss
        }
    }
}

/// One probe as the prober saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub request: u64,
    /// Whether the probe repeated the victim's prefix.
    pub hit: bool,
    /// Where the prober meant its prefix to be: `Miss` for a fresh prefix; for a repeat, `Device`
    /// in the early slot and `Host` in the late one (after the filler).
    pub intended: Class,
    /// What the run's record says the probe hit (what the prober does not see).
    pub tier_hits: ProbeHits,
    pub slot: Slot,
    /// The engine's TTFT in parts (queue, onload wait, prefill), ms: why a class is as fast as
    /// it is (what the prober does not see).
    pub ttft_parts_ms: [f64; 3],
    /// The engine's TTFT.
    pub ttft_ms: f64,
    /// What the prober measured: `ttft_ms` plus its noise (`noise.rs`); the AUC is taken on this.
    pub observed_ttft_ms: f64,
    /// Prompt tokens the cache supplied (what the prober does *not* see; kept to explain the AUC).
    pub cached_prompt_tokens: u32,
}

/// The result of one grid cell: a scope at a background load, seen through a noise level.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeResult {
    pub scope: PrefixScope,
    pub load_rps: f64,
    pub noise_ms: f64,
    pub estimate: AucEstimate,
    pub probes: Vec<Probe>,
}

impl ScopeResult {
    pub fn hit_probes(&self) -> usize {
        self.probes.iter().filter(|p| p.hit).count()
    }
    pub fn miss_probes(&self) -> usize {
        self.probes.len() - self.hit_probes()
    }
    /// Observed TTFTs (ms, noisy) of the probes the run put in `class`, in `slot` if given.
    pub fn observed_of(&self, class: Class, slot: Option<Slot>) -> Vec<f64> {
        self.observed_where(|p| p.tier_hits.class() == class && slot.is_none_or(|s| p.slot == s))
    }
    /// Observed TTFTs (ms, noisy) of the probes the prober meant for `class`, in `slot` if given.
    pub fn intended_of(&self, class: Class, slot: Option<Slot>) -> Vec<f64> {
        self.observed_where(|p| p.intended == class && slot.is_none_or(|s| p.slot == s))
    }
    fn observed_where(&self, keep: impl Fn(&Probe) -> bool) -> Vec<f64> {
        self.probes
            .iter()
            .filter(|p| keep(p))
            .map(|p| p.observed_ttft_ms)
            .collect()
    }
}

/// The scopes every isolation run compares, in report order.
pub const SCOPES: [PrefixScope; 3] = [PrefixScope::Global, PrefixScope::Tenant, PrefixScope::None];

pub fn scope_name(s: PrefixScope) -> &'static str {
    match s {
        PrefixScope::Global => "global",
        PrefixScope::Tenant => "tenant",
        PrefixScope::None => "none",
    }
}

fn fresh_tokens(rng: &mut ChaCha8Rng, n: u32, vocab: u32) -> Vec<u32> {
    (0..n).map(|_| rng.gen_range(1..vocab.max(2))).collect()
}

/// The probe workload: its requests, and which requests are hit probes (by request id).
#[derive(Debug, Clone)]
pub struct ProbeWorkload {
    pub workload: Workload,
    /// `Some(hit)` for a probe request, `None` for a victim or background request; by request id.
    pub probe_hit: Vec<Option<bool>>,
    /// The intended class and slot of each probe request (`None` for the others); by request id.
    pub probe_intent: Vec<Option<(Class, Slot)>>,
}

struct Draft {
    tenant: u32,
    arrival_ms: f64,
    prompt: Vec<u32>,
    output_tokens: u32,
    probe_intent: Option<Class>,
    slot: Slot,
}

/// Round `i`'s intent with a filler: repeat early, fresh early, repeat late, fresh late.
fn tiered_intent(i: u32) -> (Class, bool) {
    match i % 4 {
        0 => (Class::Device, false),
        1 => (Class::Miss, false),
        2 => (Class::Host, true),
        _ => (Class::Miss, true),
    }
}

/// The filler requests of one round starting at `t_ms`: `ceil(filler_tokens / prompt)` prompts of
/// a probe's length, fresh tokens, spread evenly over `[gap/4, gap/2)`, one token out.
fn filler(cfg: &ProbeConfig, rng: &mut ChaCha8Rng, vocab: u32, t_ms: f64, out: &mut Vec<Draft>) {
    let prompt = u64::from(cfg.prefix_tokens) + u64::from(cfg.suffix_tokens);
    let n = cfg.filler_tokens.unwrap_or(0).div_ceil(prompt.max(1));
    for k in 0..n {
        out.push(Draft {
            tenant: PROBER_TENANT,
            arrival_ms: t_ms + cfg.gap_ms / 4.0 * (1.0 + k as f64 / n as f64),
            prompt: fresh_tokens(rng, cfg.prefix_tokens + cfg.suffix_tokens, vocab),
            output_tokens: 1,
            probe_intent: None,
            slot: Slot::Mid,
        });
    }
}

/// The background tenant's requests over `[0, horizon_ms)`: Poisson at `cfg.load_rps`.
fn background(cfg: &ProbeConfig, vocab: u32, horizon_ms: f64) -> Vec<Draft> {
    let mut out = Vec::new();
    if cfg.load_rps <= 0.0 {
        return out;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ BACKGROUND_STREAM);
    let mean_gap_ms = 1000.0 / cfg.load_rps;
    let mut t_ms = 0.0;
    loop {
        // Inverse-CDF exponential gap; 1 - u lies in (0, 1], so the log is finite.
        let u: f64 = rng.gen();
        t_ms += -mean_gap_ms * (1.0 - u).ln();
        if t_ms >= horizon_ms {
            return out;
        }
        out.push(Draft {
            tenant: BACKGROUND_TENANT,
            arrival_ms: t_ms,
            prompt: fresh_tokens(&mut rng, cfg.prefix_tokens + cfg.suffix_tokens, vocab),
            output_tokens: BACKGROUND_OUTPUT_TOKENS,
            probe_intent: None,
            slot: Slot::Mid,
        });
    }
}

/// The victim/prober (and background) request list; `vocab` bounds the token ids.
pub fn probe_workload(cfg: &ProbeConfig, vocab: u32) -> ProbeWorkload {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut drafts = Vec::new();
    let tiered = cfg.filler_tokens.unwrap_or(0) > 0;
    for i in 0..cfg.probes {
        let t_ms = f64::from(i) * cfg.gap_ms;
        let prefix = fresh_tokens(&mut rng, cfg.prefix_tokens, vocab);
        let mut victim = prefix.clone();
        victim.extend(fresh_tokens(&mut rng, cfg.suffix_tokens, vocab));
        drafts.push(Draft {
            tenant: VICTIM_TENANT,
            arrival_ms: t_ms,
            prompt: victim,
            output_tokens: 4,
            probe_intent: None,
            slot: Slot::Mid,
        });
        let hit = i.is_multiple_of(2);
        let (intent, slot, at_ms) = if !tiered {
            let intent = if hit { Class::Device } else { Class::Miss };
            (intent, Slot::Mid, t_ms + cfg.gap_ms / 2.0)
        } else {
            let (intent, late) = tiered_intent(i);
            let (slot, at) = if late {
                (Slot::Late, 7.0 / 8.0)
            } else {
                (Slot::Early, 1.0 / 8.0)
            };
            (intent, slot, t_ms + cfg.gap_ms * at)
        };
        let mut probe = if hit {
            prefix
        } else {
            fresh_tokens(&mut rng, cfg.prefix_tokens, vocab)
        };
        probe.extend(fresh_tokens(&mut rng, cfg.suffix_tokens, vocab));
        drafts.push(Draft {
            tenant: PROBER_TENANT,
            arrival_ms: at_ms,
            prompt: probe,
            output_tokens: 1,
            probe_intent: Some(intent),
            slot,
        });
        if tiered {
            filler(cfg, &mut rng, vocab, t_ms, &mut drafts);
        }
    }
    let horizon_ms = f64::from(cfg.probes) * cfg.gap_ms;
    drafts.extend(background(cfg, vocab, horizon_ms));
    // Ids are dense in arrival order; a stable sort keeps a victim before its probe.
    drafts.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    let mut requests = Vec::with_capacity(drafts.len());
    let mut probe_hit = Vec::with_capacity(drafts.len());
    let mut probe_intent = Vec::with_capacity(drafts.len());
    for (id, d) in drafts.into_iter().enumerate() {
        probe_hit.push(d.probe_intent.map(|c| c != Class::Miss));
        probe_intent.push(d.probe_intent.map(|c| (c, d.slot)));
        requests.push(Request {
            id: id as u64,
            tenant: d.tenant,
            arrival_ms: d.arrival_ms,
            prompt: Prompt::Explicit(d.prompt),
            prefix_group: None,
            output_tokens: d.output_tokens,
            samples: 1,
            cancel: None,
            session: None,
        });
    }
    let workload_hash = crate::workload::workload_hash(&requests, None);
    ProbeWorkload {
        workload: Workload {
            requests,
            closed_loop: None,
            workload_hash,
            trace: None,
        },
        probe_hit,
        probe_intent,
    }
}

/// Filler per round, as a multiple of the device's KV slots (tokens): enough that the victim's
/// prefix is evicted from the device whatever else its cache holds, with room for the running
/// requests' own blocks.
pub const FILLER_PER_DEVICE_SLOTS: (u64, u64) = (3, 2);

/// `cfg` with its filler decided: with a host tier, the given filler or
/// [`FILLER_PER_DEVICE_SLOTS`] × the device's KV slots; without one, none (a filler is refused:
/// with nowhere to push the prefix to, the late repeats would only be misses).
pub fn resolve(
    scenario: &Scenario,
    cfg: &ProbeConfig,
    opts: &RunOptions,
) -> Result<ProbeConfig, ExperimentError> {
    let mut out = cfg.clone();
    if scenario.cache.host_tier.is_none() {
        if cfg.filler_tokens.is_some_and(|f| f > 0) {
            return Err(ExperimentError::Scenario(
                "a filler pushes the victim's prefix into the host tier; the scenario has no \
                 [cache.host_tier]"
                    .into(),
            ));
        }
        out.filler_tokens = None;
        return Ok(out);
    }
    if cfg.filler_tokens.is_none() {
        let setup = experiment::setup(scenario, opts)?;
        let (num, den) = FILLER_PER_DEVICE_SLOTS;
        let filler = setup
            .total_slots
            .checked_mul(num)
            .map(|t| t / den)
            .ok_or_else(|| ExperimentError::Scenario("filler tokens overflow".into()))?;
        out.filler_tokens = Some(filler.max(1));
    }
    Ok(out)
}

/// Run the probe workload once per scope in [`SCOPES`] and load in `loads_rps` (paged cache), and
/// measure the AUC of each run's probes seen through each level in `noises_ms`. Cells come out
/// scope-major, then load, then noise, in the orders given. `cfg.filler_tokens` is used as given
/// (see [`resolve`]).
pub fn run(
    scenario: &Scenario,
    cfg: &ProbeConfig,
    loads_rps: &[f64],
    noises_ms: &[f64],
    opts: &RunOptions,
) -> Result<Vec<ScopeResult>, ExperimentError> {
    let setup = experiment::setup(scenario, opts)?;
    check_memory(scenario, cfg, loads_rps, &setup)?;
    let draws = noise::unit_draws(cfg.seed, cfg.probes as usize);
    let mut out = Vec::new();
    for scope in SCOPES {
        let mut s = scenario.clone();
        s.scheduler.prefix_scope = scope;
        for &load_rps in loads_rps {
            let cell_cfg = ProbeConfig {
                load_rps,
                ..cfg.clone()
            };
            let pw = probe_workload(&cell_cfg, setup.model.vocab);
            let (run, _) = experiment::run_mode(&s, &setup, &pw.workload, opts, CacheMode::Paged)?;
            let record = run
                .record
                .ok_or_else(|| ExperimentError::Scenario("probe run kept no record".into()))?;
            let mut seen = Vec::new();
            for st in record.streams.iter().filter(|st| st.rank == 0) {
                let Some(Some((intended, slot))) =
                    pw.probe_intent.get(st.request as usize).copied()
                else {
                    continue;
                };
                let first_ns = st.token_ns.first().copied().ok_or_else(|| {
                    ExperimentError::Scenario(format!(
                        "probe {} produced no token: its prompt of {} tokens (--prefix-tokens \
                         {} and a {}-token suffix) was refused or cut short; the scenario's \
                         cache.max_seq_len is {} (lower --prefix-tokens, or --load {} if the \
                         background crowds it out)",
                        st.request,
                        u64::from(cfg.prefix_tokens) + u64::from(cfg.suffix_tokens),
                        cfg.prefix_tokens,
                        cfg.suffix_tokens,
                        scenario.cache.max_seq_len,
                        load_rps
                    ))
                })?;
                let tier_hits = ProbeHits {
                    device_tokens: hit_device_tokens(st),
                    host_tokens: st.admission_tier_hits.host_tokens,
                    disk_tokens: st.admission_tier_hits.disk_tokens,
                };
                let parts = ttft_parts(st).map_or([0.0; 3], |p| {
                    [p.queue_ns, p.onload_ns, p.prefill_ns].map(|ns| ns as f64 / 1e6)
                });
                seen.push((
                    st.request,
                    (intended, slot, parts),
                    first_ns.saturating_sub(st.arrival_ns) as f64 / 1e6,
                    st.cached_prompt_tokens,
                    tier_hits,
                ));
            }
            seen.sort_by_key(|p| p.0);
            for &noise_ms in noises_ms {
                let probes: Vec<Probe> = seen
                    .iter()
                    .zip(&draws)
                    .map(
                        |(&(request, (intended, slot, parts), ttft_ms, cached, tier_hits), &z)| {
                            Probe {
                                request,
                                hit: intended != Class::Miss,
                                intended,
                                tier_hits,
                                slot,
                                ttft_parts_ms: parts,
                                ttft_ms,
                                observed_ttft_ms: noise::observed_ms(ttft_ms, noise_ms, z),
                                cached_prompt_tokens: cached,
                            }
                        },
                    )
                    .collect();
                let (hits, misses) = split(&probes);
                let estimate = auc::estimate(&hits, &misses, 0.95).map_err(|e| {
                    ExperimentError::Scenario(format!("scope {}: {e}", scope_name(scope)))
                })?;
                out.push(ScopeResult {
                    scope,
                    load_rps,
                    noise_ms,
                    estimate,
                    probes,
                });
            }
        }
    }
    Ok(out)
}

/// Requests of one cell's probe workload — victims and probes, the filler's rounds, the
/// background load over the probes' horizon — from its configuration, before any is drawn:
/// `(victims and probes, filler, background)`.
pub fn cell_requests(cfg: &ProbeConfig) -> (f64, f64, f64) {
    let probes = f64::from(cfg.probes);
    let prompt = (f64::from(cfg.prefix_tokens) + f64::from(cfg.suffix_tokens)).max(1.0);
    let filler = match cfg.filler_tokens {
        Some(f) if f > 0 => (f as f64 / prompt).ceil() * probes,
        _ => 0.0,
    };
    let background = cfg.load_rps.max(0.0) * probes * cfg.gap_ms / 1000.0;
    (2.0 * probes, filler, background)
}

/// Refuses a grid whose busiest cell would not fit in the memory this process can still get
/// (its probe workload held whole, every stream's record collected, and what the backend holds),
/// naming the flag that costs most and the figure, before any workload is drawn.
fn check_memory(
    scenario: &Scenario,
    cfg: &ProbeConfig,
    loads_rps: &[f64],
    setup: &experiment::Setup,
) -> Result<(), ExperimentError> {
    let load_rps = loads_rps.iter().copied().fold(0.0, f64::max);
    let (probes, filler, background) = cell_requests(&ProbeConfig {
        load_rps,
        ..cfg.clone()
    });
    let block = u64::from(scenario.block_size().max(1));
    let (host_blocks, disk_blocks) = scenario.tier_slots(&setup.model);
    let requests = probes + filler + background;
    let prompt = f64::from(cfg.prefix_tokens) + f64::from(cfg.suffix_tokens);
    // Tier slot records grow with use: at most one per block the workload writes.
    let written_blocks = (requests * (prompt + f64::from(BACKGROUND_OUTPUT_TOKENS)) / block as f64)
        .ceil()
        .min(u64::MAX as f64) as u64;
    let need = crate::scenario::HostNeed {
        requests: requests.min(u64::MAX as f64) as u64,
        mean_prompt_tokens: f64::from(cfg.prefix_tokens) + f64::from(cfg.suffix_tokens),
        prompts_held: true,
        mean_output_tokens: f64::from(BACKGROUND_OUTPUT_TOKENS),
        mean_samples: 1.0,
        paged_blocks: setup.total_slots / block,
        block_tokens: block,
        host_kv_bytes: 0,
        tier_blocks: host_blocks.saturating_add(disk_blocks).min(written_blocks),
        host_tier_bytes: 0,
    };
    let resident = experiment::host::scenario_resident(
        scenario,
        setup.kind,
        &setup.model,
        setup.total_slots,
        setup.max_step_tokens,
    );
    let total = need
        .collected_bytes()
        .saturating_add(resident.total_bytes());
    let Some((available, source)) = crate::scenario::host_available_bytes() else {
        return Ok(());
    };
    if total <= available {
        return Ok(());
    }
    let flag = if background >= filler.max(probes) {
        format!("--load {load_rps}")
    } else if filler >= probes {
        match cfg.filler_tokens {
            Some(f) => format!("--filler-tokens {f}"),
            None => "--filler-tokens".into(),
        }
    } else {
        format!("--probes {}", cfg.probes)
    };
    Err(ExperimentError::Scenario(format!(
        "{flag}: a probe run would hold about {} of host memory ({:.0} requests of {} prompt          tokens: {:.0} probes and victims, {:.0} filler, {:.0} background; {} held by --backend          {}), and {} is available ({source})",
        crate::units::format_bytes(total),
        probes + filler + background,
        u64::from(cfg.prefix_tokens) + u64::from(cfg.suffix_tokens),
        probes,
        filler,
        background,
        crate::units::format_bytes(resident.total_bytes()),
        setup.kind.name(),
        crate::units::format_bytes(available)
    )))
}

/// Hit and miss observed TTFTs (ms) of a probe list: what the prober has to go on.
pub fn split(probes: &[Probe]) -> (Vec<f64>, Vec<f64>) {
    let hits = probes
        .iter()
        .filter(|p| p.hit)
        .map(|p| p.observed_ttft_ms)
        .collect();
    let misses = probes
        .iter()
        .filter(|p| !p.hit)
        .map(|p| p.observed_ttft_ms)
        .collect();
    (hits, misses)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Load adds only background requests: ids stay dense in arrival order, the victim and probe
    /// prompts are those of the unloaded workload, and the background count is about rate × span.
    #[test]
    fn background_load_leaves_the_probes_alone() {
        let quiet_cfg = ProbeConfig {
            probes: 20,
            prefix_tokens: 32,
            gap_ms: 500.0,
            seed: 9,
            ..ProbeConfig::default()
        };
        let loaded_cfg = ProbeConfig {
            load_rps: 20.0,
            ..quiet_cfg.clone()
        };
        let quiet = probe_workload(&quiet_cfg, 512);
        let loaded = probe_workload(&loaded_cfg, 512);
        let of = |pw: &ProbeWorkload, tenant: u32| -> Vec<Vec<u32>> {
            pw.workload
                .requests
                .iter()
                .filter(|r| r.tenant == tenant)
                .map(|r| r.prompt.tokens().into_owned())
                .collect()
        };
        assert_eq!(of(&quiet, VICTIM_TENANT), of(&loaded, VICTIM_TENANT));
        assert_eq!(of(&quiet, PROBER_TENANT), of(&loaded, PROBER_TENANT));
        for pw in [&quiet, &loaded] {
            for (i, r) in pw.workload.requests.iter().enumerate() {
                assert_eq!(r.id, i as u64);
                assert_eq!(pw.probe_hit[i].is_some(), r.tenant == PROBER_TENANT);
            }
            assert!(pw
                .workload
                .requests
                .windows(2)
                .all(|w| w[0].arrival_ms <= w[1].arrival_ms));
            let hits = pw.probe_hit.iter().filter(|h| **h == Some(true)).count();
            assert_eq!(hits, 10);
        }
        // 20 req/s over 10 s: 200 expected; a Poisson count is within ±4.5 σ (≈ 64) of it.
        let background = of(&loaded, BACKGROUND_TENANT).len();
        assert!((136..=264).contains(&background), "{background}");
        assert!(of(&quiet, BACKGROUND_TENANT).is_empty());
    }

    /// With a filler each round is: the victim, its probe in the early or late slot by the
    /// four-round intent cycle, and `ceil(filler / prompt)` fresh filler prompts from the prober,
    /// all after the early slot and before the late one; repeats start with their victim's prefix
    /// and fresh probes do not.
    #[test]
    fn a_filler_sits_between_the_early_and_the_late_slot() {
        let cfg = ProbeConfig {
            probes: 8,
            prefix_tokens: 32,
            suffix_tokens: 8,
            gap_ms: 800.0,
            filler_tokens: Some(100),
            seed: 4,
            ..ProbeConfig::default()
        };
        let pw = probe_workload(&cfg, 512);
        let reqs = &pw.workload.requests;
        // 8 victims, 8 probes, 8 × ceil(100 / 40) = 24 filler requests.
        assert_eq!(reqs.len(), 8 + 8 + 24);
        let want = [
            (Class::Device, Slot::Early),
            (Class::Miss, Slot::Early),
            (Class::Host, Slot::Late),
            (Class::Miss, Slot::Late),
        ];
        for round in 0..8u32 {
            let t0 = f64::from(round) * cfg.gap_ms;
            let in_round: Vec<usize> = (0..reqs.len())
                .filter(|&i| reqs[i].arrival_ms >= t0 && reqs[i].arrival_ms < t0 + cfg.gap_ms)
                .collect();
            assert_eq!(in_round.len(), 5, "round {round}");
            let victim = &reqs[in_round[0]];
            assert_eq!(victim.tenant, VICTIM_TENANT);
            let probes: Vec<usize> = in_round
                .iter()
                .copied()
                .filter(|&i| pw.probe_intent[i].is_some())
                .collect();
            assert_eq!(probes.len(), 1, "round {round}");
            let (intent, slot) = pw.probe_intent[probes[0]].unwrap();
            assert_eq!((intent, slot), want[round as usize % 4], "round {round}");
            let filler: Vec<&Request> = in_round
                .iter()
                .filter(|&&i| i != in_round[0] && i != probes[0])
                .map(|&i| &reqs[i])
                .collect();
            assert!(filler.iter().all(|r| r.tenant == PROBER_TENANT));
            let probe = &reqs[probes[0]];
            for f in &filler {
                if slot == Slot::Early {
                    assert!(f.arrival_ms > probe.arrival_ms, "round {round}");
                } else {
                    assert!(f.arrival_ms < probe.arrival_ms, "round {round}");
                }
            }
            let prefix = |r: &Request| r.prompt.tokens()[..32].to_vec();
            assert_eq!(prefix(probe) == prefix(victim), intent != Class::Miss);
            assert_eq!(pw.probe_hit[probes[0]], Some(intent != Class::Miss));
        }
    }
}
