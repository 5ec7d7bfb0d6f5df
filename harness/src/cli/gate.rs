//! `kvbench gate --baseline DIR --current DIR [--max-regression PCT]`: exit 1 when a gated
//! metric regressed beyond the threshold with significance (its relative change's 95% interval
//! lies wholly beyond it, criterion's rule), 0 otherwise, 2 when the comparison cannot be made —
//! each reason a sentence on stderr (`compare` module doc: a figure on one side only, a figure
//! that is not a number, an entry twice, a headline off its own per-seed figures, failed checks,
//! another backend, device profile, workload or definition, a suite of mixed revisions) — or a
//! folder cannot be read. Prints every gated figure and why it passed or failed.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::ExitStatus;
use crate::compare::{self, Better, GateVerdict};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, value_name = "DIR")]
    pub baseline: PathBuf,
    #[arg(long, value_name = "DIR")]
    pub current: PathBuf,
    /// Largest tolerated regression, percent.
    #[arg(long, default_value_t = 5.0, value_name = "PCT")]
    pub max_regression: f64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !(args.max_regression >= 0.0 && args.max_regression.is_finite()) {
        anyhow::bail!("--max-regression: must be a percentage ≥ 0");
    }
    let c = compare::compare(&args.baseline, &args.current)?;
    println!(
        "gate: baseline {} ({} on {}) vs current {} ({} on {}), max regression {}%",
        args.baseline.display(),
        c.a.kind.name(),
        c.a.backend,
        args.current.display(),
        c.b.kind.name(),
        c.b.backend,
        args.max_regression
    );
    if !c.refusals.is_empty() {
        for m in &c.refusals {
            eprintln!("not comparable: {m}");
        }
        return Err(anyhow::Error::new(ExitStatus(2)).context(format!(
            "the gate refuses to judge what it cannot compare ({} reason(s) above)",
            c.refusals.len()
        )));
    }
    let threshold = args.max_regression / 100.0;
    let gated: Vec<_> = c.changes.iter().filter(|ch| ch.a.gated).collect();
    if gated.is_empty() {
        return Err(anyhow::Error::new(ExitStatus(2)).context("no gated metric on both sides"));
    }
    let mut regressed = 0;
    for ch in gated {
        let v = compare::gate_verdict(ch, threshold);
        let why = match (ch.rel_ci, ch.b.value) {
            (_, None) if ch.a.value.is_some() => "no longer met at any load".to_string(),
            (None, Some(_)) if ch.a.value.is_none() => "met now, at no load in the baseline".into(),
            (Some([lo, hi]), _) => {
                let (bound, side) = match ch.a.better {
                    Better::Higher => (hi, "upper"),
                    Better::Lower => (lo, "lower"),
                };
                let beyond = if v == GateVerdict::Regressed {
                    "beyond"
                } else {
                    "within"
                };
                format!(
                    "{:+.2}% [{:+.2}%, {:+.2}%]: {side} end {:+.2}% is {beyond} the {}{}% threshold",
                    ch.rel.unwrap_or(f64::NAN) * 100.0,
                    lo * 100.0,
                    hi * 100.0,
                    bound * 100.0,
                    if ch.a.better == Better::Higher { "-" } else { "+" },
                    args.max_regression
                )
            }
            // Runs and suites are refused before this point; a sweep where no load passed.
            _ => "no load passed on either side".into(),
        };
        if v == GateVerdict::Regressed {
            regressed += 1;
        }
        println!(
            "  {} {}/{} {}: {} -> {}: {why}",
            if v == GateVerdict::Regressed {
                "REGRESSED"
            } else {
                "ok       "
            },
            ch.a.scenario,
            ch.a.cache,
            ch.a.name,
            ch.a.value.map_or_else(|| "-".into(), |x| format!("{x:.3}")),
            ch.b.value.map_or_else(|| "-".into(), |x| format!("{x:.3}")),
        );
    }
    if regressed > 0 {
        return Err(anyhow::Error::new(ExitStatus(1)).context(format!(
            "{regressed} gated metric(s) regressed beyond {}%",
            args.max_regression
        )));
    }
    println!("gate: passed");
    Ok(ExitCode::SUCCESS)
}
