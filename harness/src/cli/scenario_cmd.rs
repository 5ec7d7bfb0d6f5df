//! `kvbench scenario show FILE`: the resolved scenario (every default written out) as TOML,
//! followed by a summary of the workload it generates, as TOML comments so the output still
//! parses as a scenario.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::scenario::{self, Scenario};
use crate::units::format_bytes;
use crate::workload::{self, Summary};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print the resolved scenario and a summary of its generated workload.
    Show(ShowArgs),
}

#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    pub file: PathBuf,
    /// Override a key, e.g. `--set traffic.requests=10` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Workload seed (defaults to the scenario's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the scenario and summary as one JSON object instead.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Show(a) => show(a),
    }
}

fn show(a: ShowArgs) -> anyhow::Result<ExitCode> {
    let s = scenario::load(&a.file, &a.overrides)?;
    let seed = a.seed.unwrap_or(s.seed);
    let w = workload::generate(&s, seed)
        .with_context(|| format!("generating the workload of {}", a.file.display()))?;
    let prefix = s
        .traffic
        .shared_prefix
        .as_ref()
        .map_or(0, |p| p.prefix_tokens);
    let summary = Summary::of(&w, prefix);
    if a.json {
        let out = serde_json::json!({
            "scenario": resolved_json(&s)?,
            "seed": seed,
            "workload": summary
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    print!(
        "{}",
        toml::to_string(&s).context("rendering the scenario as TOML")?
    );
    println!();
    for line in derived(&s) {
        println!("# {line}");
    }
    println!("# workload (seed {seed})");
    for line in summary.to_string().lines() {
        println!("#   {line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The scenario as JSON with its model resolved: every shape field from the preset or the file
/// (a preset leaves the file's fields unset, which would print as nulls).
fn resolved_json(s: &Scenario) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(s)?;
    if let Some(model) = v.get_mut("model").and_then(|m| m.as_object_mut()) {
        if let Some(shape) = s.model_shape() {
            if let serde_json::Value::Object(fields) = serde_json::to_value(&shape)? {
                model.extend(fields);
            }
        }
        model.retain(|_, x| !x.is_null());
    }
    Ok(v)
}

/// Figures the file implies but does not state.
fn derived(s: &Scenario) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(m) = s.model_shape() {
        out.push(format!(
            "model {}: {} layers, {} query / {} KV heads, head dim {}, KV {}, tp {}",
            m.name,
            m.layers,
            m.q_heads,
            m.kv_heads,
            m.head_dim,
            m.kv_dtype.name(),
            m.tp
        ));
        let bpt = m.kv_bytes_per_token();
        out.push(format!("KV bytes per token {bpt} ({})", format_bytes(bpt)));
        out.push(format!(
            "weights per device {}",
            format_bytes(m.weight_bytes_per_device())
        ));
        let device = scenario::device_memory_bytes(&s.device);
        if let Ok(b) = s.kv_budget_bytes(device) {
            out.push(format!(
                "KV budget {b} bytes ({}) = {} tokens = {} blocks of {}",
                format_bytes(b),
                b / bpt.max(1),
                b / (bpt * s.block_size() as u64).max(1),
                s.block_size()
            ));
        }
        if let Ok(n) = scenario::request_need(s, &m) {
            out.push(format!(
                "largest request {} tokens x {} continuation(s): {} paged, {} contiguous",
                n.tokens,
                n.samples,
                format_bytes(n.paged_bytes),
                format_bytes(n.contiguous_bytes)
            ));
        }
    }
    out
}
