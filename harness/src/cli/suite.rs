//! `kvbench suite [SCENARIOS...]`: run a set of scenarios (default: every `scenarios/*.toml`
//! suited to the backend — the `quick-*` ones on cpu, all on sim) and write one combined table,
//! `suite.md` and `suite.csv`, beside each scenario's own results folder. The suite owns its
//! output folder, as `run` owns `results/latest`: results folders in it are replaced (never a
//! file or a folder that holds no `summary.json`). The whole suite is built in a temporary folder
//! beside the output and moved in once its table is written, so a failure or an interrupt leaves
//! the output as it was. A progress bar shows on a terminal.
//! `--seeds N`, block-size lists and host-tier capacity lists make several cells of one
//! scenario; `--shard K/N` runs a deterministic share of the cells for `kvbench merge` to combine
//! (see `results::suite`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::backend::BackendKind;
use crate::cli::progress::Progress;
use crate::cli::run::{default_root, load_all, run_one, RunFlags};
use crate::cli::ExitStatus;
use crate::results::suite::{self, CellResult, PlanItem, Shard, SuiteMeta};
use crate::results::{self, html, Experiment};
use crate::scenario::Scenario;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario files (default: scenarios/*.toml suited to the backend).
    pub scenarios: Vec<PathBuf>,
    /// Output folder for the per-scenario folders and the combined table (default results/latest,
    /// or results/fault-<KIND> with --inject-fault). Results folders in it are replaced.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seeds per scenario: the scenario's (or --seed's) and the N-1 after it.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub seeds: u32,
    /// Run only shard K of N (K 0-based) of the (scenario, block size, capacity, seed) cells;
    /// combine the shard folders with `kvbench merge`.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<Shard>,
    #[command(flatten)]
    pub flags: RunFlags,
}

/// `scenarios/*.toml` in name order; on cpu only the quick ones.
pub fn default_scenarios(kind: BackendKind) -> anyhow::Result<Vec<PathBuf>> {
    let dir = PathBuf::from("scenarios");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| {
            format!(
                "{}: cannot list scenarios (run from the repository root or name files)",
                dir.display()
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .filter(|p| {
            kind.resolve() == BackendKind::Sim
                || p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("quick-"))
        })
        .collect();
    out.sort();
    Ok(out)
}

pub const CSV_HEADER: &str = "scenario,cache,backend,seed,completed,cancelled,rejected,throughput_tokens_per_s,goodput_requests_per_s,ttft_p50_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,peak_running_sequences,kv_waste_fraction,preemptions,prefix_hit_rate,reclamation_ok,checks_ok,block_size,host_tier,hit_host_share";

fn rows(exp: &Experiment) -> Vec<Vec<String>> {
    let checks_ok = exp.failures().is_empty();
    exp.runs
        .iter()
        .map(|r| {
            let (m, rec) = (&r.metrics, &r.end);
            // The host tier's capacity labels every row of the scenario; the share of first
            // admissions' prompt tokens that came from it only rows of a run that had tiers.
            let host_tier = exp
                .scenario
                .cache
                .host_tier
                .as_ref()
                .and_then(|h| h.capacity.as_slice().first().cloned())
                .unwrap_or_default();
            let hits = &m.tiers.admission_hits;
            let prompt = hits
                .device_tokens
                .saturating_add(hits.host_tokens)
                .saturating_add(hits.disk_tokens)
                .saturating_add(hits.computed_tokens);
            let hit_host_share = if rec.tiers.is_empty() {
                String::new()
            } else if prompt == 0 {
                format!("{:.4}", 0.0)
            } else {
                format!("{:.4}", hits.host_tokens as f64 / prompt as f64)
            };
            let hit = if rec.prefix.lookup_tokens > 0 {
                rec.prefix.hit_tokens as f64 / rec.prefix.lookup_tokens as f64
            } else {
                0.0
            };
            vec![
                exp.scenario.name.clone(),
                rec.mode.name().into(),
                exp.backend.into(),
                exp.seed.to_string(),
                m.counts.completed.to_string(),
                m.counts.cancelled.to_string(),
                m.counts.rejected.to_string(),
                format!("{:.1}", m.throughput_tokens_per_s),
                format!("{:.3}", m.goodput_requests_per_s),
                format!("{:.3}", m.ttft.p50),
                format!("{:.3}", m.ttft.p99),
                format!("{:.3}", m.itl.p50),
                format!("{:.3}", m.itl.p99),
                rec.peak_running.to_string(),
                format!("{:.4}", m.ledger.kv_waste_fraction),
                m.preemptions.to_string(),
                format!("{hit:.4}"),
                rec.reclamation.ok.to_string(),
                checks_ok.to_string(),
                exp.scenario.block_size().to_string(),
                host_tier,
                hit_host_share,
            ]
        })
        .collect()
}

/// The host-tier capacities a scenario lists (empty without a host tier).
fn host_capacities(s: &Scenario) -> Vec<String> {
    s.cache
        .host_tier
        .as_ref()
        .map(|h| h.capacity.as_slice().to_vec())
        .unwrap_or_default()
}

/// Per scenario, one loaded copy per (block size, host-tier capacity) it lists
/// (`cache.block_size = [..]`, `cache.host_tier.capacity = [..]`), block sizes outer, in the
/// plan's order; each is loaded with `--set` overrides, as a user would run one of them.
fn block_size_variants(
    path: &std::path::Path,
    s: &Scenario,
    overrides: &[String],
) -> anyhow::Result<Vec<Scenario>> {
    let sizes = s.cache.block_size.as_slice();
    let caps = host_capacities(s);
    if sizes.len() == 1 && caps.len() <= 1 {
        return Ok(vec![s.clone()]);
    }
    let cap_choices: Vec<Option<&String>> = if caps.len() > 1 {
        caps.iter().map(Some).collect()
    } else {
        vec![None]
    };
    let mut out = Vec::new();
    for b in sizes {
        for cap in &cap_choices {
            let mut o = overrides.to_vec();
            if sizes.len() > 1 {
                o.push(format!("cache.block_size={b}"));
            }
            if let Some(c) = cap {
                o.push(format!("cache.host_tier.capacity={c}"));
            }
            let mut v = load_all(&[path.to_path_buf()], &o)?;
            out.push(v.pop().context("scenario did not load")?);
        }
    }
    Ok(out)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = args
        .flags
        .options_at(crate::cli::run::TraceLevel::Requests)?;
    let paths = if args.scenarios.is_empty() {
        default_scenarios(args.flags.backend)?
    } else {
        args.scenarios.clone()
    };
    if paths.is_empty() {
        anyhow::bail!("no scenarios to run");
    }
    let scenarios = load_all(&paths, &args.flags.overrides)?;
    // Counted before a seed list or a cell is allocated.
    suite::cell_count(scenarios.iter().map(|s| {
        (
            s.cache.block_size.as_slice().len() as u64,
            host_capacities(s).len().max(1) as u64,
            u64::from(args.seeds),
        )
    }))
    .map_err(|e| anyhow::anyhow!("--seeds {}: {e}", args.seeds))?;
    let mut items = Vec::new();
    crate::cli::run::check_fault_applies(&scenarios, opts.fault)?;
    let mut variants: Vec<Vec<Scenario>> = Vec::new();
    for (p, s) in paths.iter().zip(&scenarios) {
        let base = args.flags.seed.unwrap_or(s.seed);
        let seeds = (0..u64::from(args.seeds))
            .map(|i| base.checked_add(i))
            .collect::<Option<Vec<u64>>>()
            .context("--seeds: the seeds overflow u64")?;
        items.push(PlanItem {
            scenario: s.name.clone(),
            block_sizes: s.cache.block_size.as_slice().to_vec(),
            host_capacities: host_capacities(s),
            seeds,
        });
        variants.push(block_size_variants(p, s, &args.flags.overrides)?);
    }
    let cells = suite::plan(&items).map_err(anyhow::Error::msg)?;
    let scenario_json = variants
        .iter()
        .flatten()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    let backend = opts.backend.resolve().name();
    let plan_hash = suite::plan_hash(&cells, &scenario_json, backend, &format!("{opts:?}"));
    let selected: Vec<&suite::Cell> = cells
        .iter()
        .filter(|c| match args.shard {
            Some(s) => s.owns(c),
            None => true,
        })
        .collect();
    let out = args.out.clone().unwrap_or_else(|| default_root(opts.fault));
    // Everything the suite will write is checked before the first cell runs.
    for cell in &selected {
        let dir = results::scenario_folder(&out, &cell.dir)?;
        results::check_target(&dir, results::marker::Kind::Run, true)?;
    }
    for table_file in ["suite.csv", "suite.md", "suite.json", "report.html"] {
        let path = out.join(table_file);
        if path.symlink_metadata().is_ok_and(|m| !m.is_file()) {
            anyhow::bail!(
                "{}: is not a regular file; refusing to replace it",
                path.display()
            );
        }
    }
    // The whole suite is built in a temporary folder beside `out` and moved in only once its
    // table is written: a failed or interrupted suite leaves `out` as it was.
    let staging = results::Staging::begin_into(&out)?;
    let mut targets = Vec::with_capacity(selected.len());
    for cell in &selected {
        targets.push(results::scenario_folder(staging.dir(), &cell.dir)?);
    }
    let progress = Progress::new(selected.len());
    let mut results = Vec::new();
    for (cell, dir) in selected.iter().zip(&targets) {
        progress.start(&cell.dir);
        let item = items
            .iter()
            .position(|i| i.scenario == cell.scenario)
            .context("cell of no scenario")?;
        let bs = items[item]
            .block_sizes
            .iter()
            .position(|&b| b == cell.block_size)
            .context("cell of no block size")?;
        let caps = &items[item].host_capacities;
        let cap = if caps.len() > 1 {
            caps.iter()
                .position(|c| Some(c) == cell.host_capacity.as_ref())
                .context("cell of no host-tier capacity")?
        } else {
            0
        };
        let s = variants[item]
            .get(bs * caps.len().max(1) + cap)
            .context("cell of no scenario variant")?;
        let cell_opts = crate::experiment::RunOptions {
            seed: Some(cell.seed),
            ..opts.clone()
        };
        let (exp, failures) = run_one(s, &cell_opts, dir, true)?;
        results.push(CellResult {
            index: cell.index,
            rows: rows(&exp),
            failures,
        });
        progress.done_one();
    }
    progress.finish();
    let meta = SuiteMeta {
        format: suite::FORMAT,
        revision: suite::revision(),
        backend: backend.into(),
        plan_hash,
        shard: args.shard,
        merged_from: Vec::new(),
        header: CSV_HEADER.split(',').map(String::from).collect(),
        plan: cells.clone(),
        results,
    };
    let md = suite::write(staging.dir(), &meta)?;
    html::write_suite_report(staging.dir())?;
    staging.commit_into()?;
    print!("{md}");
    println!("wrote {}", out.join("suite.md").display());
    let failed = meta.failures();
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("check failed: {f}");
        }
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}
