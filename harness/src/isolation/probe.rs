//! The probe workload and its runs: a victim tenant sends prompts with fresh prefixes; shortly
//! after each, a probing tenant sends a prompt that either starts with that victim's prefix (a hit
//! probe) or with a fresh one of the same length (a miss probe). The prober sees only its TTFT, so
//! the AUC of hit vs miss TTFTs is how much the prefix cache tells one tenant about another.
//!
//! Probes alternate hit/miss so that load, and its drift over the run, is the same for both
//! classes; the victim's request arrives `gap_ms / 2` before its probe so it has finished
//! prefilling (the low-load case the leak is plainest in).

use kvbench_cache_api::CacheMode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::experiment::{self, ExperimentError, RunOptions};
use crate::scenario::{PrefixScope, Scenario};
use crate::workload::{Prompt, Request, Workload};

use super::auc::{self, AucEstimate};

/// The victim's tenant id; the prober is `VICTIM_TENANT + 1`.
pub const VICTIM_TENANT: u32 = 0;
pub const PROBER_TENANT: u32 = 1;

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
    pub seed: u64,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            probes: 100,
            prefix_tokens: 1024,
            suffix_tokens: 16,
            gap_ms: 1000.0,
            seed: 1,
        }
    }
}

/// One probe as the prober saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub request: u64,
    /// Whether the probe repeated the victim's prefix.
    pub hit: bool,
    pub ttft_ms: f64,
    /// Prompt tokens the cache supplied (what the prober does *not* see; kept to explain the AUC).
    pub cached_prompt_tokens: u32,
}

/// The result of one scope.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeResult {
    pub scope: PrefixScope,
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

/// The victim/prober request list; `vocab` bounds the token ids.
pub fn probe_workload(cfg: &ProbeConfig, vocab: u32) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut requests = Vec::new();
    let mut push = |tenant: u32, arrival_ms: f64, prompt: Vec<u32>, output_tokens: u32| {
        let id = requests.len() as u64;
        requests.push(Request {
            id,
            tenant,
            arrival_ms,
            prompt: Prompt::Explicit(prompt),
            prefix_group: None,
            output_tokens,
            samples: 1,
            cancel: None,
            session: None,
        });
    };
    for i in 0..cfg.probes {
        let t_ms = f64::from(i) * cfg.gap_ms;
        let prefix = fresh_tokens(&mut rng, cfg.prefix_tokens, vocab);
        let mut victim = prefix.clone();
        victim.extend(fresh_tokens(&mut rng, cfg.suffix_tokens, vocab));
        push(VICTIM_TENANT, t_ms, victim, 4);
        let mut probe = if i.is_multiple_of(2) {
            prefix
        } else {
            fresh_tokens(&mut rng, cfg.prefix_tokens, vocab)
        };
        probe.extend(fresh_tokens(&mut rng, cfg.suffix_tokens, vocab));
        push(PROBER_TENANT, t_ms + cfg.gap_ms / 2.0, probe, 1);
    }
    let workload_hash = crate::workload::workload_hash(&requests, None);
    Workload {
        requests,
        closed_loop: None,
        workload_hash,
        trace: None,
    }
}

/// Whether probe request `id` is a hit probe (the layout [`probe_workload`] makes).
fn is_hit_probe(id: u64) -> bool {
    // Requests come in (victim, probe) pairs; pair k's probe is a hit when k is even.
    (id / 2).is_multiple_of(2)
}

/// Run the probe workload once per scope in [`SCOPES`] (paged cache) and measure each AUC.
pub fn run(
    scenario: &Scenario,
    cfg: &ProbeConfig,
    opts: &RunOptions,
) -> Result<Vec<ScopeResult>, ExperimentError> {
    let setup = experiment::setup(scenario, opts)?;
    let workload = probe_workload(cfg, setup.model.vocab);
    let mut out = Vec::new();
    for scope in SCOPES {
        let mut s = scenario.clone();
        s.scheduler.prefix_scope = scope;
        let (run, _) = experiment::run_mode(&s, &setup, &workload, opts, CacheMode::Paged)?;
        let record = run
            .record
            .ok_or_else(|| ExperimentError::Scenario("probe run kept no record".into()))?;
        let mut probes = Vec::new();
        for st in record.streams.iter().filter(|st| st.rank == 0) {
            if st.tenant != PROBER_TENANT {
                continue;
            }
            let first_ns = st.token_ns.first().copied().ok_or_else(|| {
                ExperimentError::Scenario(format!("probe {} produced no token", st.request))
            })?;
            probes.push(Probe {
                request: st.request,
                hit: is_hit_probe(st.request),
                ttft_ms: first_ns.saturating_sub(st.arrival_ns) as f64 / 1e6,
                cached_prompt_tokens: st.cached_prompt_tokens,
            });
        }
        probes.sort_by_key(|p| p.request);
        let (hits, misses) = split(&probes);
        let estimate = auc::estimate(&hits, &misses, 0.95)
            .map_err(|e| ExperimentError::Scenario(format!("scope {}: {e}", scope_name(scope))))?;
        out.push(ScopeResult {
            scope,
            estimate,
            probes,
        });
    }
    Ok(out)
}

/// Hit and miss TTFTs (ms) of a probe list.
pub fn split(probes: &[Probe]) -> (Vec<f64>, Vec<f64>) {
    let hits = probes.iter().filter(|p| p.hit).map(|p| p.ttft_ms).collect();
    let misses = probes
        .iter()
        .filter(|p| !p.hit)
        .map(|p| p.ttft_ms)
        .collect();
    (hits, misses)
}
