//! `isolation.json`, `isolation.md` and `probes.csv`, written into a staging folder that becomes
//! the output folder only when all three are complete (no half-written results).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::results::{ResultsError, Staging};

use super::auc;
use super::probe::{scope_name, Class, ProbeConfig, ScopeResult, Slot, BACKGROUND_OUTPUT_TOKENS};

/// One grid cell: a scope at a background load, through a noise level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScopeJson {
    pub scope: &'static str,
    /// Background requests per second from a third tenant.
    pub load_rps: f64,
    /// Standard deviation of the prober's Gaussian measurement jitter.
    pub noise_ms: f64,
    /// P(miss TTFT > hit TTFT), ties half: 1 = the prober always tells, 0.5 = it cannot.
    pub auc: f64,
    /// 95% Hanley–McNeil interval.
    pub auc_ci: [f64; 2],
    pub hit_probes: usize,
    pub miss_probes: usize,
    /// Medians of the engine's TTFT (before the noise): the gap the noise has to hide.
    pub median_hit_ttft_ms: f64,
    pub median_miss_ttft_ms: f64,
    /// With a lower tier: the three hit classes, as the run made them (absent without a tier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classes: Option<ClassesJson>,
}

/// One pair of classes: the AUC of the best threshold classifier telling the faster class from
/// the slower one (P(slower's TTFT > faster's), ties half), on the observed TTFT.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairJson {
    /// `null` when either class has no probe (e.g. no host hit under tenant scope).
    pub auc: Option<f64>,
    pub auc_ci: Option<[f64; 2]>,
    /// The class expected faster (called the hit), and the slower one.
    pub faster: &'static str,
    pub slower: &'static str,
    pub faster_probes: usize,
    pub slower_probes: usize,
}

/// Where the probes meant for one class landed, by what the run did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LandedJson {
    pub probes: usize,
    pub device: usize,
    pub host: usize,
    pub miss: usize,
}

/// The pairs of the classes the run made. A hit class is compared with the misses of its own
/// slot (host hits arrive late, device hits early), so the filler's left-over state is not read
/// as a hit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairsJson {
    /// Host (lower-tier) hit vs a late miss: the new, slower hit class.
    pub host_hit: PairJson,
    /// Device hit vs an early miss: the hit class without tiers.
    pub device_hit: PairJson,
    /// Device hit vs host hit: whether the prober also learns *how long ago*.
    pub device_vs_host: PairJson,
}

/// The pairs by the prober's intent, each against the fresh probes of the same slot (an early
/// repeat against a late one would compare the slots, the prober's own choice, not the victim).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IntentPairsJson {
    /// Late repeat vs late fresh probe.
    pub host_hit: PairJson,
    /// Early repeat vs early fresh probe.
    pub device_hit: PairJson,
}

/// The hit classes of one grid cell with a lower tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassesJson {
    /// Probes per class as the run made them (the record's hit columns, the ones `requests.csv`
    /// writes): any host or disk token = host, else any device token = device, else miss.
    pub device_probes: usize,
    pub host_probes: usize,
    pub miss_probes: usize,
    /// Median engine TTFT per observed class (`null` for an empty class).
    pub median_device_ttft_ms: Option<f64>,
    pub median_host_ttft_ms: Option<f64>,
    pub median_miss_ttft_ms: Option<f64>,
    /// The AUCs by the classes the run made: the channel as the cache opened it. `miss_probes`
    /// above counts both slots; each pair's `slower_probes` counts the misses it used.
    #[serde(flatten)]
    pub observed: PairsJson,
    /// The same pairs by the prober's intent (early repeat, late repeat, fresh): what the prober
    /// can claim without knowing where the prefix was; defined under every scope.
    pub by_intent: IntentPairsJson,
    /// Where the intended-device, intended-host and fresh probes landed.
    pub intended_device: LandedJson,
    pub intended_host: LandedJson,
    pub intended_miss: LandedJson,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IsolationJson {
    pub scenario: String,
    pub backend: String,
    pub probes: u32,
    pub prefix_tokens: u32,
    pub suffix_tokens: u32,
    pub gap_ms: f64,
    pub seed: u64,
    /// Filler tokens per round between the early and the late probe (with a lower tier only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filler_tokens_per_round: Option<u64>,
    pub interval: &'static str,
    pub background_output_tokens: u32,
    pub loads_rps: Vec<f64>,
    pub noises_ms: Vec<f64>,
    /// One entry per scope at the first load and noise level given (the plainest case).
    pub scopes: Vec<ScopeJson>,
    /// Every cell: scope-major, then load, then noise, in the orders given.
    pub grid: Vec<ScopeJson>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn median_of(v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| median(v))
}

fn pair(faster: (Class, Vec<f64>), slower: (Class, Vec<f64>)) -> PairJson {
    let est = auc::estimate(&faster.1, &slower.1, 0.95).ok();
    PairJson {
        auc: est.map(|e| e.auc),
        auc_ci: est.map(|e| [e.ci.0, e.ci.1]),
        faster: faster.0.name(),
        slower: slower.0.name(),
        faster_probes: faster.1.len(),
        slower_probes: slower.1.len(),
    }
}

fn observed_pairs(r: &ScopeResult) -> PairsJson {
    let (d, h, m) = (Class::Device, Class::Host, Class::Miss);
    let of = |c: Class, s: Option<Slot>| r.observed_of(c, s);
    PairsJson {
        host_hit: pair((h, of(h, None)), (m, of(m, Some(Slot::Late)))),
        device_hit: pair((d, of(d, None)), (m, of(m, Some(Slot::Early)))),
        device_vs_host: pair((d, of(d, None)), (h, of(h, None))),
    }
}

fn intent_pairs(r: &ScopeResult) -> IntentPairsJson {
    let (d, h, m) = (Class::Device, Class::Host, Class::Miss);
    let of = |c: Class, s: Slot| r.intended_of(c, Some(s));
    IntentPairsJson {
        host_hit: pair((h, of(h, Slot::Late)), (m, of(m, Slot::Late))),
        device_hit: pair((d, of(d, Slot::Early)), (m, of(m, Slot::Early))),
    }
}

fn landed(r: &ScopeResult, intended: Class) -> LandedJson {
    let meant: Vec<Class> = r
        .probes
        .iter()
        .filter(|p| p.intended == intended)
        .map(|p| p.tier_hits.class())
        .collect();
    let n = |c: Class| meant.iter().filter(|&&x| x == c).count();
    LandedJson {
        probes: meant.len(),
        device: n(Class::Device),
        host: n(Class::Host),
        miss: n(Class::Miss),
    }
}

fn classes(r: &ScopeResult) -> ClassesJson {
    let raw = |c: Class| -> Vec<f64> {
        r.probes
            .iter()
            .filter(|p| p.tier_hits.class() == c)
            .map(|p| p.ttft_ms)
            .collect()
    };
    ClassesJson {
        device_probes: raw(Class::Device).len(),
        host_probes: raw(Class::Host).len(),
        miss_probes: raw(Class::Miss).len(),
        median_device_ttft_ms: median_of(raw(Class::Device)),
        median_host_ttft_ms: median_of(raw(Class::Host)),
        median_miss_ttft_ms: median_of(raw(Class::Miss)),
        observed: observed_pairs(r),
        by_intent: intent_pairs(r),
        intended_device: landed(r, Class::Device),
        intended_host: landed(r, Class::Host),
        intended_miss: landed(r, Class::Miss),
    }
}

fn cell(r: &ScopeResult, tiered: bool) -> ScopeJson {
    let raw = |hit: bool| -> Vec<f64> {
        r.probes
            .iter()
            .filter(|p| p.hit == hit)
            .map(|p| p.ttft_ms)
            .collect()
    };
    let (hits, misses) = (raw(true), raw(false));
    ScopeJson {
        scope: scope_name(r.scope),
        load_rps: r.load_rps,
        noise_ms: r.noise_ms,
        auc: r.estimate.auc,
        auc_ci: [r.estimate.ci.0, r.estimate.ci.1],
        hit_probes: hits.len(),
        miss_probes: misses.len(),
        median_hit_ttft_ms: median(hits),
        median_miss_ttft_ms: median(misses),
        classes: tiered.then(|| classes(r)),
    }
}

pub fn to_json(
    scenario: &str,
    backend: &str,
    cfg: &ProbeConfig,
    loads_rps: &[f64],
    noises_ms: &[f64],
    results: &[ScopeResult],
) -> IsolationJson {
    let filler = cfg.filler_tokens.filter(|&f| f > 0);
    let grid: Vec<ScopeJson> = results.iter().map(|r| cell(r, filler.is_some())).collect();
    let first = |c: &&ScopeJson| {
        loads_rps.first() == Some(&c.load_rps) && noises_ms.first() == Some(&c.noise_ms)
    };
    let scopes = grid.iter().filter(first).cloned().collect();
    IsolationJson {
        scenario: scenario.to_string(),
        backend: backend.to_string(),
        probes: cfg.probes,
        prefix_tokens: cfg.prefix_tokens,
        suffix_tokens: cfg.suffix_tokens,
        gap_ms: cfg.gap_ms,
        seed: cfg.seed,
        filler_tokens_per_round: filler,
        interval: "95% Hanley-McNeil",
        background_output_tokens: BACKGROUND_OUTPUT_TOKENS,
        loads_rps: loads_rps.to_vec(),
        noises_ms: noises_ms.to_vec(),
        scopes,
        grid,
    }
}

pub fn markdown(j: &IsolationJson) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Isolation: {} on {}\n", j.scenario, j.backend);
    let _ = writeln!(
        s,
        "A probing tenant repeats another tenant's {}-token prefix (hit) or sends a fresh one \
         (miss), one probe every {} ms, seed {}. AUC: how well its TTFT alone tells the two \
         apart (0.5 = not at all, 1 = always); interval {}. Load: background requests per \
         second from a third tenant (prompts as long as a probe's, {} tokens out). Noise: the \
         standard deviation of a seeded Gaussian jitter on the TTFT the prober measures.\n",
        j.prefix_tokens, j.gap_ms, j.seed, j.interval, j.background_output_tokens
    );
    let _ = writeln!(
        s,
        "| scope | load req/s | noise ms | AUC | 95% interval | hit probes | miss probes | median hit TTFT ms | median miss TTFT ms |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for x in &j.grid {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.3} | [{:.3}, {:.3}] | {} | {} | {:.3} | {:.3} |",
            x.scope,
            x.load_rps,
            x.noise_ms,
            x.auc,
            x.auc_ci[0],
            x.auc_ci[1],
            x.hit_probes,
            x.miss_probes,
            x.median_hit_ttft_ms,
            x.median_miss_ttft_ms
        );
    }
    if let Some(filler) = j.filler_tokens_per_round {
        classes_markdown(&mut s, j, filler);
    }
    s
}

fn fmt_pair(p: &PairJson) -> String {
    match (p.auc, p.auc_ci) {
        (Some(a), Some([lo, hi])) => format!(
            "{a:.3} [{lo:.3}, {hi:.3}] ({}/{})",
            p.faster_probes, p.slower_probes
        ),
        _ => format!("— ({}/{})", p.faster_probes, p.slower_probes),
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v:.3}"))
}

/// The lower tier's table: the three classes as the run made them, and where the prober's
/// intended-host probes landed.
fn classes_markdown(s: &mut String, j: &IsolationJson, filler: u64) {
    let _ = writeln!(
        s,
        "\n## Hit classes with the host tier\n\nEach round the prober sends a repeat or a fresh \
         prompt either {e} ms after the victim (early: the prefix is still on the device) or {l} \
         ms after it (late), with {filler} tokens of its own fresh-prompt filler in between so \
         the device evicts the victim's prefix into the host tier. A probe's class is what the \
         run did (its prefix-cache hits: any host or disk token = host, else any device token = \
         device, else miss), not what was intended; a hit class is compared with the misses of \
         its own slot (host with late, device with early). AUC: P(slower class's TTFT > \
         faster's), ties half, 95% interval, (faster/slower probes); — when a class is empty.\n",
        e = j.gap_ms / 8.0,
        l = j.gap_ms * 7.0 / 8.0,
    );
    let _ = writeln!(
        s,
        "| scope | load req/s | noise ms | host hit vs miss | device hit vs miss | device vs host hit | median device / host / miss TTFT ms | intended-host landed host / device / miss |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for x in &j.grid {
        let Some(c) = &x.classes else { continue };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} / {} / {} | {} / {} / {} |",
            x.scope,
            x.load_rps,
            x.noise_ms,
            fmt_pair(&c.observed.host_hit),
            fmt_pair(&c.observed.device_hit),
            fmt_pair(&c.observed.device_vs_host),
            fmt_ms(c.median_device_ttft_ms),
            fmt_ms(c.median_host_ttft_ms),
            fmt_ms(c.median_miss_ttft_ms),
            c.intended_host.host,
            c.intended_host.device,
            c.intended_host.miss,
        );
    }
    let _ = writeln!(
        s,
        "\nBy the prober's intent, each repeat against the fresh probes of its own slot: what it \
         can claim without knowing where the prefix was.\n"
    );
    let _ = writeln!(
        s,
        "| scope | load req/s | noise ms | late repeat vs late fresh | early repeat vs early fresh |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    for x in &j.grid {
        let Some(c) = &x.classes else { continue };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            x.scope,
            x.load_rps,
            x.noise_ms,
            fmt_pair(&c.by_intent.host_hit),
            fmt_pair(&c.by_intent.device_hit),
        );
    }
}

pub fn probes_csv(results: &[ScopeResult]) -> String {
    let mut s = String::from(
        "scope,load_rps,noise_ms,request,hit,ttft_ms,observed_ttft_ms,cached_prompt_tokens,intended,slot,hit_device_tokens,hit_host_tokens,hit_disk_tokens,class,ttft_queue_ms,ttft_onload_ms,ttft_prefill_ms\n",
    );
    for r in results {
        for p in &r.probes {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                scope_name(r.scope),
                r.load_rps,
                r.noise_ms,
                p.request,
                u8::from(p.hit),
                p.ttft_ms,
                p.observed_ttft_ms,
                p.cached_prompt_tokens,
                p.intended.name(),
                p.slot.name(),
                p.tier_hits.device_tokens,
                p.tier_hits.host_tokens,
                p.tier_hits.disk_tokens,
                p.tier_hits.class().name(),
                p.ttft_parts_ms[0],
                p.ttft_parts_ms[1],
                p.ttft_parts_ms[2]
            );
        }
    }
    s
}

/// Write the three files into `out` (which must not exist yet) all at once.
pub fn write(out: &Path, j: &IsolationJson, results: &[ScopeResult]) -> Result<(), ResultsError> {
    let staging = Staging::begin(out, crate::results::marker::Kind::Isolation, false)?;
    let io = |p: &Path, e: std::io::Error| ResultsError::Io {
        path: p.to_path_buf(),
        err: e,
    };
    let json = serde_json::to_string_pretty(j)
        .map_err(|e| io(&out.join("isolation.json"), std::io::Error::other(e)))?;
    let files = [
        ("isolation.json", json + "\n"),
        ("isolation.md", markdown(j)),
        ("probes.csv", probes_csv(results)),
    ];
    for (name, text) in files {
        let p = staging.dir().join(name);
        std::fs::write(&p, text).map_err(|e| io(&p, e))?;
    }
    staging.commit()
}
