//! `kvbench suite [SCENARIOS...]`: run a set of scenarios (default: every `scenarios/*.toml`
//! suited to the backend — the `quick-*` ones on cpu, all on sim) and write one combined table,
//! `suite.md` and `suite.csv`, beside each scenario's own results folder. The suite owns its
//! output folder: per-scenario folders in it are replaced. A progress bar shows on a terminal.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::backend::BackendKind;
use crate::cli::run::{load_all, run_one, RunFlags};
use crate::cli::ExitStatus;
use crate::results::Experiment;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario files (default: scenarios/*.toml suited to the backend).
    pub scenarios: Vec<PathBuf>,
    /// Output folder for the per-scenario folders and the combined table.
    #[arg(long, value_name = "DIR", default_value = "results/latest")]
    pub out: PathBuf,
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
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(scenarios.len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}") {
            b.set_style(style);
        }
        Some(b)
    } else {
        None
    };
    let mut table: Vec<Vec<String>> = Vec::new();
    let mut failed = Vec::new();
    for s in &scenarios {
        if let Some(b) = &bar {
            b.set_message(s.name.clone());
        }
        let (exp, failures) = run_one(s, &opts, &args.out.join(&s.name), true)?;
        table.extend(rows(&exp));
        failed.extend(failures.into_iter().map(|f| format!("{}: {f}", s.name)));
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
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
    std::fs::create_dir_all(&args.out).with_context(|| format!("{}", args.out.display()))?;
    write_atomic(&args.out.join("suite.csv"), &csv)?;
    write_atomic(&args.out.join("suite.md"), &md)?;
    print!("{md}");
    println!("wrote {}", args.out.join("suite.md").display());
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("check failed: {f}");
        }
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}

fn write_atomic(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text).with_context(|| format!("{}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("{}", path.display()))?;
    Ok(())
}
