//! `kvbench plan`: prints what [`crate::plan`] computes. The shape comes from `--preset`, from
//! `--scenario`, or from the explicit flags (which override either).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use crate::model::{Dtype, ModelShape};
use crate::plan::{DistributionPlan, Plan, PlanInput};
use crate::scenario::{self, Reservation};
use crate::units::{format_bytes, parse_bytes};
use crate::workload;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Start from a preset shape (llama3-8b, llama3-70b, llama3-405b, llama2-7b, tiny).
    #[arg(long)]
    pub preset: Option<String>,
    /// Take shape, block size, max_seq_len, budget, reservation and the length distribution
    /// from a scenario file (flags override).
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    #[arg(long)]
    pub layers: Option<u32>,
    #[arg(long)]
    pub kv_heads: Option<u32>,
    #[arg(long)]
    pub head_dim: Option<u32>,
    /// KV element type: f32, f16, bf16, fp8.
    #[arg(long)]
    pub dtype: Option<String>,
    /// Tensor-parallel degree (splits KV heads across devices).
    #[arg(long)]
    pub tp: Option<u32>,
    /// Sequence length in tokens.
    #[arg(long)]
    pub tokens: Option<u32>,
    #[arg(long)]
    pub block_size: Option<u32>,
    /// KV budget per device, e.g. "80 GiB".
    #[arg(long)]
    pub budget: Option<String>,
    /// Contiguous reservation size (default 4096, or --tokens if longer).
    #[arg(long)]
    pub max_seq_len: Option<u32>,
    /// Reserve prompt + output (the sequence itself) instead of max_seq_len.
    #[arg(long)]
    pub reserve_exact: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let loaded = match &a.scenario {
        Some(p) => Some(scenario::load(p, &[])?),
        None => None,
    };
    let mut shape = match (&a.preset, &loaded) {
        (Some(p), _) => ModelShape::preset(p).with_context(|| {
            format!(
                "--preset: unknown `{p}` (known: {})",
                ModelShape::PRESETS.join(", ")
            )
        })?,
        (None, Some(s)) => s.model_shape().context("the scenario has no model shape")?,
        (None, None) => {
            let missing: Vec<&str> = [
                ("--layers", a.layers.is_none()),
                ("--kv-heads", a.kv_heads.is_none()),
                ("--head-dim", a.head_dim.is_none()),
            ]
            .into_iter()
            .filter_map(|(f, m)| m.then_some(f))
            .collect();
            if !missing.is_empty() {
                bail!(
                    "give --preset, --scenario, or the shape; missing {}",
                    missing.join(", ")
                );
            }
            ModelShape {
                name: "custom".into(),
                ..ModelShape::llama3_8b()
            }
        }
    };
    if let Some(v) = a.layers {
        shape.layers = v;
    }
    if let Some(v) = a.kv_heads {
        shape.kv_heads = v;
    }
    if let Some(v) = a.head_dim {
        shape.head_dim = v;
    }
    if let Some(v) = a.tp {
        shape.tp = v;
    }
    if let Some(d) = &a.dtype {
        shape.kv_dtype = Dtype::parse(d)
            .with_context(|| format!("--dtype: unknown `{d}` (use f32, f16, bf16, fp8)"))?;
    }
    let budget_bytes = match (&a.budget, &loaded) {
        (Some(b), _) => Some(parse_bytes(b).with_context(|| format!("--budget `{b}`"))?),
        (None, Some(s)) => Some(
            s.kv_budget_bytes(scenario::device_memory_bytes(&s.device))
                .context("the scenario's budget")?,
        ),
        (None, None) => None,
    };
    let max_seq_len = a
        .max_seq_len
        .or(loaded.as_ref().map(|s| s.cache.max_seq_len))
        .unwrap_or_else(|| a.tokens.unwrap_or(0).max(4096));
    let reservation = if a.reserve_exact {
        Reservation::PromptPlusOutput
    } else {
        loaded
            .as_ref()
            .map_or(Reservation::MaxSeqLen, |s| s.cache.contiguous_reservation)
    };
    let input = PlanInput {
        shape,
        block_size: a
            .block_size
            .or(loaded.as_ref().map(|s| s.block_size()))
            .unwrap_or(16),
        max_seq_len,
        reservation,
        budget_bytes,
    };
    let single = match a.tokens {
        Some(t) => Some(Plan::compute(&input, t).context("--tokens")?),
        None => None,
    };
    let dist = match &loaded {
        Some(s) => {
            let w = workload::generate(s, s.seed)?;
            let lengths: Vec<u32> = w
                .requests
                .iter()
                .flat_map(|r| {
                    let len = r.prompt.len_tokens().saturating_add(r.output_tokens);
                    (0..r.samples).map(move |_| len)
                })
                .collect();
            Some(DistributionPlan::compute(&input, &lengths)?)
        }
        None => None,
    };
    if single.is_none() && dist.is_none() {
        bail!("give --tokens N (a sequence length) or --scenario FILE (a length distribution)");
    }
    if a.json {
        let v = serde_json::json!({ "sequence": single, "distribution": dist });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(p) = &single {
        print!("{}", render(p));
    }
    if let Some(d) = &dist {
        if single.is_some() {
            println!();
        }
        print!("{}", render_distribution(d, &input));
    }
    Ok(ExitCode::SUCCESS)
}

fn bytes(b: u64) -> String {
    format!("{b} bytes ({})", format_bytes(b))
}

fn render(p: &Plan) -> String {
    let mut o = String::new();
    let tp = if p.tp > 1 {
        format!(
            ", tp {} ({} KV heads per device)",
            p.tp, p.kv_heads_per_device
        )
    } else {
        String::new()
    };
    o += &format!(
        "shape       {} layers x {} KV heads x head dim {} x {} ({} bytes){tp}\n",
        p.layers, p.kv_heads, p.head_dim, p.dtype, p.bytes_per_element
    );
    o += &format!(
        "per token   {} bytes per token ({})\n",
        p.bytes_per_token,
        format_bytes(p.bytes_per_token)
    );
    o += &format!(
        "sequence    {} tokens: {}\n",
        p.tokens,
        bytes(p.sequence_bytes)
    );
    o += &format!(
        "blocks      {} blocks of {} tokens, {} each\n",
        p.blocks,
        p.block_size,
        bytes(p.block_bytes)
    );
    o += &format!(
        "last block  {} empty slots, {} of tail waste\n",
        p.empty_slots,
        bytes(p.tail_waste_bytes)
    );
    o += &format!(
        "contiguous  {} slots reserved ({}): {}, {} unused\n",
        p.contiguous_slots,
        if p.contiguous_slots == p.max_seq_len as u64 {
            format!("max_seq_len {}", p.max_seq_len)
        } else {
            "prompt + output".to_string()
        },
        bytes(p.contiguous_bytes),
        bytes(p.contiguous_unused_bytes)
    );
    match (p.budget_bytes, p.fits_paged, p.fits_contiguous) {
        (Some(b), Some(fp), Some(fc)) => {
            o += &format!("budget      {}\n", bytes(b));
            o += &format!(
                "fit         paged {fp} sequences ({} blocks), contiguous {fc} sequences\n",
                fp * p.blocks
            );
        }
        _ => o += "budget      not given (add --budget \"80 GiB\" to see how many sequences fit)\n",
    }
    o
}

fn render_distribution(d: &DistributionPlan, input: &PlanInput) -> String {
    let mut o = String::new();
    o += &format!(
        "lengths     {} sequences from the scenario: tokens p50 {} / p90 {} / p99 {} / max {} (mean {:.1})\n",
        d.sequences, d.tokens.p50, d.tokens.p90, d.tokens.p99, d.tokens.max, d.tokens.mean
    );
    o += &format!(
        "per token   {} bytes per token ({})\n",
        d.bytes_per_token,
        format_bytes(d.bytes_per_token)
    );
    o += &format!(
        "paged       blocks of {}: mean {:.2} blocks and {:.2} empty slots per sequence; {:.2}% of the allocation is tail waste\n",
        d.block_size,
        d.mean_blocks,
        d.mean_empty_slots,
        d.paged_waste_share * 100.0
    );
    let policy = match input.reservation {
        Reservation::MaxSeqLen => format!("max_seq_len {}", input.max_seq_len),
        Reservation::PromptPlusOutput => "prompt + output".to_string(),
    };
    o += &format!(
        "contiguous  reserving {policy}: {:.2}% of the reservation holds no token\n",
        d.contiguous_waste_share * 100.0
    );
    o += &format!(
        "mean size   paged {}, contiguous {} per sequence\n",
        format_bytes(d.mean_paged_bytes as u64),
        format_bytes(d.mean_contiguous_bytes as u64)
    );
    if let (Some(b), Some(fp), Some(fc)) = (d.budget_bytes, d.fits_paged, d.fits_contiguous) {
        o += &format!("budget      {}\n", bytes(b));
        o += &format!("fit         paged {fp} mean sequences, contiguous {fc} sequences\n");
    }
    o
}
