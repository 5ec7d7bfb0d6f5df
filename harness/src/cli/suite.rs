//! `kvbench suite [SCENARIOS...]`: run a set of scenarios (default: every `scenarios/*.toml`
//! suited to the backend — the `quick-*` ones on cpu, all on sim) and write one combined table,
//! `suite.md` and `suite.csv`, beside each scenario's own results folder. The suite owns its
//! output folder, as `run` owns `results/latest`: results folders in it are replaced (never a
//! file or a folder that holds no `summary.json`). A progress bar shows on a terminal.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::backend::BackendKind;
use crate::cli::progress::Progress;
use crate::cli::run::{default_root, load_all, plan_targets, run_one, RunFlags};
use crate::cli::ExitStatus;
use crate::results::{self, Experiment};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario files (default: scenarios/*.toml suited to the backend).
    pub scenarios: Vec<PathBuf>,
    /// Output folder for the per-scenario folders and the combined table (default results/latest,
    /// or results/fault-<KIND> with --inject-fault). Results folders in it are replaced.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
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

pub const CSV_HEADER: &str = "scenario,cache,backend,seed,completed,cancelled,rejected,throughput_tokens_per_s,goodput_requests_per_s,ttft_p50_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,peak_running_sequences,kv_waste_fraction,preemptions,prefix_hit_rate,reclamation_ok,checks_ok";

fn rows(exp: &Experiment) -> Vec<Vec<String>> {
    let checks_ok = exp.failures().is_empty();
    exp.runs
        .iter()
        .map(|r| {
            let (m, rec) = (&r.metrics, &r.record);
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
            ]
        })
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = args.flags.options()?;
    let paths = if args.scenarios.is_empty() {
        default_scenarios(args.flags.backend)?
    } else {
        args.scenarios.clone()
    };
    if paths.is_empty() {
        anyhow::bail!("no scenarios to run");
    }
    let scenarios = load_all(&paths, &args.flags.overrides)?;
    let out = args.out.clone().unwrap_or_else(|| default_root(opts.fault));
    // Everything the suite will write is checked before the first scenario runs.
    let targets = plan_targets(
        &scenarios,
        |s| results::scenario_folder(&out, &s.name),
        true,
    )?;
    for table_file in ["suite.csv", "suite.md"] {
        let path = out.join(table_file);
        if path.symlink_metadata().is_ok_and(|m| !m.is_file()) {
            anyhow::bail!(
                "{}: is not a regular file; refusing to replace it",
                path.display()
            );
        }
    }
    let progress = Progress::new(scenarios.len());
    let mut table: Vec<Vec<String>> = Vec::new();
    let mut failed = Vec::new();
    for (s, dir) in scenarios.iter().zip(&targets) {
        progress.start(&s.name);
        let (exp, failures) = run_one(s, &opts, dir, true)?;
        table.extend(rows(&exp));
        failed.extend(failures.into_iter().map(|f| format!("{}: {f}", s.name)));
        progress.done_one();
    }
    progress.finish();
    let mut csv = format!("{CSV_HEADER}\n");
    for r in &table {
        csv.push_str(&r.join(","));
        csv.push('\n');
    }
    let head: Vec<&str> = CSV_HEADER.split(',').collect();
    let mut md = format!(
        "# kvbench suite\n\n| {} |\n|{}\n",
        head.join(" | "),
        " --- |".repeat(head.len())
    );
    for r in &table {
        md.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    results::staging::write_file_atomic(&out.join("suite.csv"), &csv)?;
    results::staging::write_file_atomic(&out.join("suite.md"), &md)?;
    print!("{md}");
    println!("wrote {}", out.join("suite.md").display());
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("check failed: {f}");
        }
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}
