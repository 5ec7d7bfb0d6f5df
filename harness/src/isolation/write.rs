//! `isolation.json`, `isolation.md` and `probes.csv`, written into a staging folder that becomes
//! the output folder only when all three are complete (no half-written results).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::results::{ResultsError, Staging};

use super::probe::{scope_name, ProbeConfig, ScopeResult, BACKGROUND_OUTPUT_TOKENS};

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

fn cell(r: &ScopeResult) -> ScopeJson {
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
    let grid: Vec<ScopeJson> = results.iter().map(cell).collect();
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
    s
}

pub fn probes_csv(results: &[ScopeResult]) -> String {
    let mut s = String::from(
        "scope,load_rps,noise_ms,request,hit,ttft_ms,observed_ttft_ms,cached_prompt_tokens\n",
    );
    for r in results {
        for p in &r.probes {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{}",
                scope_name(r.scope),
                r.load_rps,
                r.noise_ms,
                p.request,
                u8::from(p.hit),
                p.ttft_ms,
                p.observed_ttft_ms,
                p.cached_prompt_tokens
            );
        }
    }
    s
}

/// Write the three files into `out` (which must not exist yet) all at once.
pub fn write(out: &Path, j: &IsolationJson, results: &[ScopeResult]) -> Result<(), ResultsError> {
    let staging = Staging::begin(out, false)?;
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
