//! `kvbench isolation SCENARIO --out DIR [--load R,..] [--noise-ms S,..]`: how much a probing
//! tenant learns about another tenant's prompts from its own TTFT, for prefix scope global, tenant
//! and none, at each background load and measurement-noise level. Writes `isolation.json`,
//! `isolation.md` and `probes.csv`; exit 2 on bad input. With `[cache.host_tier]` in the scenario
//! (or set with `--set`), the prober also waits behind filler traffic so some repeats find the
//! victim's prefix in the host tier, and each cell reports the three hit classes.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::backend::BackendKind;
use crate::cli::run::load_all;
use crate::cli::ExitStatus;
use crate::experiment::RunOptions;
use crate::isolation::probe::{self, ProbeConfig};
use crate::isolation::{noise, write};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario file: its model, device, block size and scheduler; the workload is the probe's.
    pub scenario: PathBuf,
    /// Output folder (must not exist).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: BackendKind,
    /// Probes in all (half repeat the other tenant's prefix, half do not).
    #[arg(long, default_value_t = 100)]
    pub probes: u32,
    /// Tokens of the prefix a probe repeats (or replaces with fresh ones).
    #[arg(long, default_value_t = 1024)]
    pub prefix_tokens: u32,
    /// Time between one victim request and the next, in ms (lower = more load).
    #[arg(long, default_value_t = 1000.0)]
    pub gap_ms: f64,
    /// Background load: requests per second from a third tenant (comma-separated list: one run
    /// per scope and load).
    #[arg(
        long,
        value_name = "REQ_PER_S",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub load: Vec<f64>,
    /// The prober's measurement noise: standard deviation (ms) of a seeded Gaussian jitter on the
    /// TTFT it observes (comma-separated list; each level re-reads the same runs).
    #[arg(long, value_name = "MS", value_delimiter = ',', default_value = "0")]
    pub noise_ms: Vec<f64>,
    /// Probe workload seed (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// With a host tier: tokens of the prober's filler traffic per round, sent between its early
    /// and late probe to push the victim's prefix off the device (default: 1.5 × the device's KV
    /// slots). Refused without `[cache.host_tier]`.
    #[arg(long, value_name = "TOKENS")]
    pub filler_tokens: Option<u64>,
    /// Override a scenario key (repeatable), as for `run`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

fn bad(msg: String) -> anyhow::Error {
    anyhow::Error::new(ExitStatus(2)).context(msg)
}

/// Most levels a grid axis takes: each load is a run per scope.
const MAX_LEVELS: usize = 8;

/// A grid axis: 1..=MAX_LEVELS finite, non-negative, distinct values.
fn check_levels(flag: &str, levels: &[f64]) -> anyhow::Result<()> {
    if levels.is_empty() || levels.len() > MAX_LEVELS {
        return Err(bad(format!(
            "{flag}: give 1 to {MAX_LEVELS} values (got {})",
            levels.len()
        )));
    }
    for (i, v) in levels.iter().enumerate() {
        if !(v.is_finite() && *v >= 0.0) {
            return Err(bad(format!("{flag}: {v} is not a non-negative number")));
        }
        if levels[..i].contains(v) {
            return Err(bad(format!("{flag}: {v} is given twice")));
        }
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.probes < 2 {
        return Err(bad("--probes: need at least 2 (one hit, one miss)".into()));
    }
    if args.prefix_tokens == 0 {
        return Err(bad("--prefix-tokens: must be at least 1".into()));
    }
    if !(args.gap_ms.is_finite() && args.gap_ms > 0.0) {
        return Err(bad("--gap-ms: must be a positive number".into()));
    }
    if args.filler_tokens == Some(0) {
        return Err(bad("--filler-tokens: must be at least 1".into()));
    }
    check_levels("--load", &args.load)?;
    check_levels("--noise-ms", &args.noise_ms)?;
    if let Some(n) = args.noise_ms.iter().find(|&&n| n > noise::MAX_NOISE_MS) {
        return Err(bad(format!(
            "--noise-ms: {n} is above {} ms (a minute's jitter already hides any TTFT gap)",
            noise::MAX_NOISE_MS
        )));
    }
    let scenario = load_all(std::slice::from_ref(&args.scenario), &args.overrides)?
        .into_iter()
        .next()
        .ok_or_else(|| bad(format!("{}: no scenario", args.scenario.display())))?;
    // `isolation` has no --force: the generic "use --force" hint would name a flag it lacks.
    crate::results::staging::check_target(
        &args.out,
        crate::results::marker::Kind::Isolation,
        false,
    )
    .map_err(|e| match e {
        crate::results::ResultsError::Exists(p) => bad(format!(
            "{}: output folder exists (isolation never replaces a folder: name a new --out)",
            p.display()
        )),
        e => bad(e.to_string()),
    })?;
    let cfg = ProbeConfig {
        probes: args.probes,
        prefix_tokens: args.prefix_tokens,
        gap_ms: args.gap_ms,
        seed: args.seed.unwrap_or(scenario.seed),
        filler_tokens: args.filler_tokens,
        ..ProbeConfig::default()
    };
    let opts = RunOptions {
        backend: args.backend,
        trace_tokens: false,
        invariant_check_every: 0,
        ..RunOptions::default()
    };
    if args.filler_tokens.is_some() && scenario.cache.host_tier.is_none() {
        return Err(bad(format!(
            "--filler-tokens: {} has no [cache.host_tier] to push the victim's prefix into",
            args.scenario.display()
        )));
    }
    let cfg = probe::resolve(&scenario, &cfg, &opts).map_err(|e| bad(e.to_string()))?;
    let results = probe::run(&scenario, &cfg, &args.load, &args.noise_ms, &opts)
        .map_err(|e| bad(e.to_string()))?;
    let json = write::to_json(
        &scenario.name,
        args.backend.resolve().name(),
        &cfg,
        &args.load,
        &args.noise_ms,
        &results,
    );
    write::write(&args.out, &json, &results).map_err(|e| anyhow::anyhow!(e.to_string()))?;
    for s in &json.grid {
        println!(
            "{:<7} load {} req/s noise {} ms: AUC {:.3} [{:.3}, {:.3}]  ({} hit, {} miss probes)",
            s.scope,
            s.load_rps,
            s.noise_ms,
            s.auc,
            s.auc_ci[0],
            s.auc_ci[1],
            s.hit_probes,
            s.miss_probes
        );
        if let Some(c) = &s.classes {
            let show = |p: &write::PairJson| match (p.auc, p.auc_ci) {
                (Some(a), Some([lo, hi])) => format!("{a:.3} [{lo:.3}, {hi:.3}]"),
                _ => "-".into(),
            };
            println!(
                "        classes device {} host {} miss {}: host hit vs miss {}, device hit vs \
                 miss {}, device vs host {}; intended-host landed host {} device {} miss {}",
                c.device_probes,
                c.host_probes,
                c.miss_probes,
                show(&c.observed.host_hit),
                show(&c.observed.device_hit),
                show(&c.observed.device_vs_host),
                c.intended_host.host,
                c.intended_host.device,
                c.intended_host.miss,
            );
        }
    }
    println!("wrote {}", args.out.join("isolation.json").display());
    Ok(ExitCode::SUCCESS)
}
