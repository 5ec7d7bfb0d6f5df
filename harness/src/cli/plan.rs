//! `kvbench plan`: prints what [`crate::plan`] computes. The shape comes from `--preset`, from
//! `--scenario`, or from the explicit flags (which override either).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use crate::backend::sim::link::HostLink;
use crate::backend::sim::profile::DeviceProfile;
use crate::model::{Dtype, KvScale, ModelShape};
use crate::plan::{DistributionPlan, Plan, PlanError, PlanInput, TierPlan, WeightsPlan};
use crate::scenario::{self, Reservation};
use crate::units::{format_bytes, parse_bytes};
use crate::workload;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Start from a preset shape (llama3-8b, llama3-70b, llama3-405b, llama2-7b, mixtral-8x7b,
    /// deepseek-v3, gemma3-27b, gpt-oss-120b, qwen3-next-80b, tiny).
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
    /// KV element type: f32, f16, bf16, fp8_e4m3 (alias fp8), fp8_e5m2.
    #[arg(long)]
    pub dtype: Option<String>,
    /// FP8 scale granularity: per_tensor (default), per_head, per_block.
    #[arg(long)]
    pub kv_scale: Option<String>,
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
    /// Price a host-memory tier of this size per device (e.g. "512 GiB"): the tokens it holds,
    /// and onloading a prefix over the device's host link against recomputing it.
    #[arg(long, value_name = "SIZE")]
    pub host_tier: Option<String>,
    /// Prefix length the host tier's onload and recompute are priced at.
    #[arg(long, default_value_t = 4096, value_name = "TOKENS")]
    pub prefix_tokens: u32,
    /// Device profile the host tier is priced on (default: the scenario's, else h200).
    #[arg(long)]
    pub device: Option<String>,
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
        shape.kv_dtype = Dtype::parse(d).with_context(|| {
            format!("--dtype: unknown `{d}` (use f32, f16, bf16, fp8_e4m3, fp8_e5m2)")
        })?;
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
    let block_size = a
        .block_size
        .or(loaded.as_ref().map(|s| s.block_size()))
        .unwrap_or(16);
    // Per-block scales are priced over the block size this plan uses.
    let granularity = match &a.kv_scale {
        Some(g) => Some(match g.as_str() {
            "per_tensor" => KvScale::PerTensor,
            "per_head" => KvScale::PerHead,
            "per_block" => KvScale::PerBlock,
            _ => bail!("--kv-scale: unknown `{g}` (use per_tensor, per_head, per_block)"),
        }),
        None => shape.kv_scale.map(|(g, _)| g),
    };
    if granularity.is_some() && a.kv_scale.is_some() && !shape.kv_dtype.is_fp8() {
        bail!(
            "--kv-scale: scales belong to an FP8 cache (--dtype fp8_e4m3 or fp8_e5m2), not {}",
            shape.kv_dtype.name()
        );
    }
    shape.kv_scale = granularity.map(|g| (g, block_size));
    let input = PlanInput {
        shape,
        block_size,
        max_seq_len,
        reservation,
        budget_bytes,
    };
    // Checked before any figure, so the message names the flag whose value is refused (each
    // figure would otherwise carry the context of the one being computed).
    input.check().map_err(|e| {
        let flag = blame(&e, &a);
        anyhow::Error::new(e).context(flag)
    })?;
    // The weights are priced for a named shape only: flags alone give no d_model or vocab.
    let weights = if a.preset.is_some() || loaded.is_some() {
        Some(WeightsPlan::of(&input.shape)?)
    } else {
        None
    };
    let tier = match &a.host_tier {
        // Recomputing a prefix costs the model's weights and FLOPs, which flags do not state.
        Some(_) if weights.is_none() => {
            bail!("--host-tier prices recomputing with the model's weights: give --preset or --scenario")
        }
        Some(size) => {
            let capacity = parse_bytes(size).with_context(|| format!("--host-tier `{size}`"))?;
            if capacity == 0 {
                bail!(
                    "--host-tier `{size}`: a tier of 0 bytes holds nothing to onload; give a \
                     capacity of at least one block"
                );
            }
            let name = a
                .device
                .clone()
                .or(loaded.as_ref().map(|s| s.device.clone()))
                .unwrap_or_else(|| "h200".into());
            let dir = a.scenario.as_deref().and_then(|p| p.parent());
            let profile = DeviceProfile::load(&name, dir).context("--device")?;
            // A scenario's swap bandwidth restates its host link, as `sim` reads it.
            let swap = loaded
                .as_ref()
                .and_then(|s| s.scheduler.swap_gbytes_per_s)
                .map(|g| g * 1e9);
            let link = HostLink::of(&profile, swap);
            Some(
                TierPlan::compute_over(&input, &profile, link, capacity, a.prefix_tokens)
                    .context("--host-tier")?,
            )
        }
        None => None,
    };
    let single = match a.tokens {
        Some(t) => Some(Plan::compute(&input, t).map_err(|e| {
            // Longer than the reservation: either flag may be the one to change.
            let flag = match (&e, a.max_seq_len) {
                (PlanError::TooLong { .. }, Some(_)) => "--tokens, --max-seq-len",
                _ => "--tokens",
            };
            anyhow::Error::new(e).context(flag)
        })?),
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
    if single.is_none() && dist.is_none() && tier.is_none() {
        bail!(
            "give --tokens N (a sequence length), --scenario FILE (a length distribution) or --host-tier SIZE"
        );
    }
    if a.json {
        let mut v = serde_json::json!({ "sequence": single, "distribution": dist });
        if let Some(o) = v.as_object_mut() {
            if let Some(w) = &weights {
                o.insert("weights".into(), serde_json::to_value(w)?);
            }
            if let Some(t) = &tier {
                o.insert("host_tier".into(), serde_json::to_value(t)?);
            }
        }
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
    if let Some(w) = &weights {
        print!("{}", render_weights(w));
    }
    if let Some(t) = &tier {
        print!("{}", render_tier(t));
    }
    Ok(ExitCode::SUCCESS)
}

/// The flag (or flags) whose value `e` refuses. A value no flag gave comes from `--preset` or
/// `--scenario`, whose own checks pass only values a plan can use, so that is named last.
fn blame(e: &PlanError, a: &Args) -> String {
    let source = match (&a.preset, &a.scenario) {
        (Some(_), _) => "--preset",
        (None, Some(_)) => "--scenario",
        (None, None) => "--layers, --kv-heads, --head-dim",
    };
    let given = |flags: &[(&'static str, bool)]| -> String {
        let named: Vec<&str> = flags
            .iter()
            .filter_map(|&(f, set)| set.then_some(f))
            .collect();
        match named.is_empty() {
            true => source.to_string(),
            false => named.join(", "),
        }
    };
    let shape = [
        ("--layers", a.layers.is_some()),
        ("--kv-heads", a.kv_heads.is_some()),
        ("--head-dim", a.head_dim.is_some()),
        ("--dtype", a.dtype.is_some()),
    ];
    match e {
        PlanError::BlockSize(_) => given(&[("--block-size", a.block_size.is_some())]),
        PlanError::Zero("layers") => given(&[("--layers", a.layers.is_some())]),
        PlanError::Zero("kv_heads") => given(&[("--kv-heads", a.kv_heads.is_some())]),
        PlanError::Zero("head_dim") => given(&[("--head-dim", a.head_dim.is_some())]),
        PlanError::Zero("tp") => given(&[("--tp", a.tp.is_some())]),
        PlanError::Zero("max_seq_len") => given(&[("--max-seq-len", a.max_seq_len.is_some())]),
        PlanError::TpDoesNotDivide { .. } => given(&[
            ("--tp", a.tp.is_some()),
            ("--kv-heads", a.kv_heads.is_some()),
        ]),
        PlanError::GroupLayers { .. } => given(&[("--layers", a.layers.is_some())]),
        PlanError::Overflow("bytes per token") => given(&shape),
        PlanError::Overflow("reservation bytes") => given(
            &[
                ("--max-seq-len", a.max_seq_len.is_some()),
                ("--block-size", a.block_size.is_some()),
            ]
            .into_iter()
            .chain(shape)
            .collect::<Vec<_>>(),
        ),
        PlanError::Overflow("scale bytes") => given(&[
            ("--layers", a.layers.is_some()),
            ("--kv-heads", a.kv_heads.is_some()),
            ("--kv-scale", a.kv_scale.is_some()),
        ]),
        _ => source.to_string(),
    }
}

/// Billions, to three significant decimals.
fn billions(n: u64) -> String {
    format!("{:.2} B", n as f64 / 1e9)
}

fn render_weights(w: &WeightsPlan) -> String {
    let per_device = if w.tp > 1 {
        format!(" per device (tp {})", w.tp)
    } else {
        String::new()
    };
    match w.moe {
        None => format!(
            "weights     {} parameters: {}{per_device}\n",
            billions(w.parameters),
            bytes(w.weight_bytes_per_device)
        ),
        Some(m) => {
            let shared = if m.shared_experts > 0 {
                format!(" + {} shared", m.shared_experts)
            } else {
                String::new()
            };
            format!(
                "weights     {} parameters in all ({} experts of {} per layer{shared}): {}{per_device}\n\
                 active      {} parameters per token ({} of {} experts{shared}): {}{per_device}\n",
                billions(w.parameters),
                m.experts,
                m.expert_ffn_dim,
                bytes(w.weight_bytes_per_device),
                billions(w.active_parameters),
                m.active_experts,
                m.experts,
                bytes(w.active_weight_bytes_per_device)
            )
        }
    }
}

fn render_tier(t: &TierPlan) -> String {
    let mut o = String::new();
    o += &format!(
        "host tier   {} holds {} tokens ({} blocks of {}) at {} bytes per token\n",
        bytes(t.capacity_bytes),
        t.tokens_held,
        t.blocks_held,
        t.block_size,
        t.bytes_per_token
    );
    o += &format!(
        "onload      a {}-token prefix ({}) over {}'s host link ({:.1} GB/s + {:.1} us): {:.3} ms\n",
        t.prefix_tokens,
        format_bytes(t.prefix_bytes),
        t.device,
        t.host_link_bytes_per_s / 1e9,
        t.host_link_latency_s * 1e6,
        t.onload_s * 1e3
    );
    o += &format!(
        "recompute   the same prefix as one prefill step (sim cost model): {:.3} ms, {:.0} tokens/s\n",
        t.recompute_s * 1e3,
        t.prefill_tokens_per_s
    );
    let per_token = format!(
        "recomputing costs {:.2} us a token at the prefill rate, onloading {:.2} us a token + the latency",
        1e6 / t.prefill_tokens_per_s,
        1e6 * t.bytes_per_token as f64 / t.host_link_bytes_per_s
    );
    o += &match t.break_even_tokens {
        Some(n) => format!(
            "break-even  onloading is no slower than recomputing for prefixes of {n} token{} or more ({per_token})\n",
            if n == 1 { "" } else { "s" }
        ),
        None => format!("break-even  none: recomputing is faster at every length ({per_token})\n"),
    };
    o
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
    o += &if p.groups.is_empty() {
        format!(
            "shape       {} layers x {} KV heads x head dim {} x {} ({} bytes){tp}\n",
            p.layers, p.kv_heads, p.head_dim, p.dtype, p.bytes_per_element
        )
    } else {
        let tp = if p.tp > 1 {
            format!(", tp {}", p.tp)
        } else {
            String::new()
        };
        format!(
            "shape       {} layers in {} layer groups (below), KV {} ({} bytes){tp}\n",
            p.layers,
            p.groups.len(),
            p.dtype,
            p.bytes_per_element
        )
    };
    o += &format!(
        "per token   {} bytes per token ({})\n",
        p.bytes_per_token,
        format_bytes(p.bytes_per_token)
    );
    // An MLA-only model's FP8 scales are in its per-token layout (the group line), none fixed.
    let scales_elsewhere =
        !p.groups.is_empty() && p.scale_fixed_bytes == 0 && p.scale_bytes_per_block == 0;
    if let (Some(g), false) = (&p.kv_scale, scales_elsewhere) {
        o += &if p.scale_bytes_per_block > 0 {
            format!(
                "scales      {g} f32: {} bytes per block of {} tokens = {} bytes per token (rounded up), in the figure above\n",
                p.scale_bytes_per_block, p.block_size, p.scale_bytes_per_token
            )
        } else {
            format!(
                "scales      {g} f32: {} bytes in all, fixed (not per token), taken off the budget\n",
                p.scale_fixed_bytes
            )
        };
    }
    // A model whose groups keep tokens differently runs the hybrid manager: its figure leads,
    // the summed managers' follows for comparison (the block, contiguous and fit lines are it).
    match p
        .group_totals
        .as_ref()
        .filter(|t| t.sequence_bytes != p.sequence_bytes)
    {
        Some(t) => {
            o += &format!(
                "sequence    {} tokens: {} by group, what the hybrid manager holds (state {})\n",
                p.tokens,
                bytes(t.sequence_bytes),
                bytes(t.state_bytes_per_sequence)
            );
            o += &format!(
                "summed      {} tokens: {} at the summed bytes a token, what the summed managers \
                 slot (the lines below)\n",
                p.tokens,
                bytes(p.sequence_bytes)
            );
        }
        None => {
            o += &format!(
                "sequence    {} tokens: {}\n",
                p.tokens,
                bytes(p.sequence_bytes)
            )
        }
    }
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
    o += &render_groups(p);
    o
}

/// Each layer group, and what a sequence holds when each keeps only its own (a sliding layer
/// its window, a recurrent layer its state); nothing for a model of one full group.
fn render_groups(p: &Plan) -> String {
    let Some(t) = &p.group_totals else {
        return String::new();
    };
    let mut o = String::new();
    for (i, g) in p.groups.iter().enumerate() {
        let kind = match (g.window, g.kv_heads_per_device) {
            (Some(w), Some(h)) => {
                format!("sliding (window {w}), {} layers x {h} KV heads", g.layers)
            }
            (None, Some(h)) => format!("{}, {} layers x {h} KV heads", g.attention, g.layers),
            _ => format!("{}, {} layers", g.attention, g.layers),
        };
        let held = if g.state_bytes_per_sequence > 0 {
            format!("state {} per sequence", bytes(g.state_bytes_per_sequence))
        } else {
            format!(
                "{} bytes per token per layer, {} per token; keeps {} of {} tokens: {}",
                g.bytes_per_token_per_layer,
                g.bytes_per_token,
                g.resident_tokens,
                p.tokens,
                bytes(g.sequence_bytes)
            )
        };
        o += &format!(
            "group {i:<5} {kind}: {held}; contiguous reserves {} tokens: {}\n",
            g.contiguous_tokens,
            bytes(g.contiguous_bytes)
        );
    }
    o += &format!(
        "by group    a {}-token sequence holds {} (state {}); contiguous reserves {}\n",
        p.tokens,
        bytes(t.sequence_bytes),
        bytes(t.state_bytes_per_sequence),
        bytes(t.contiguous_bytes)
    );
    if let (Some(h), Some(c)) = (t.fits_held, t.fits_contiguous) {
        o += &format!(
            "fit         by group: {h} sequences held, {c} contiguous (the summed managers slot \
             every token at {} bytes: the figures above)\n",
            p.bytes_per_token
        );
    }
    o += &render_hybrid(p);
    o
}

/// The grouped managers' tables, page and fit (`cache.manager = "hybrid"`).
fn render_hybrid(p: &Plan) -> String {
    let Some(h) = &p.hybrid else {
        return String::new();
    };
    let tables: Vec<String> = h
        .tables
        .iter()
        .map(|t| {
            let kind = match t.window {
                Some(w) => format!("sliding (window {w})"),
                None => t.kind.to_string(),
            };
            let mut tail = String::new();
            if t.scale_bytes_per_page > 0 {
                tail += &format!(", {} of scales a page", bytes(t.scale_bytes_per_page));
            }
            if t.tail_bytes_per_page > 0 {
                tail += &format!(", {} unused a page", bytes(t.tail_bytes_per_page));
            }
            format!(
                "{} {kind} x {} tokens a page{tail}",
                t.tables, t.tokens_per_page
            )
        })
        .collect();
    let mut o = format!(
        "hybrid      tables of {} layers: {}; page {} (slot {})\n",
        h.layers_per_table,
        tables.join(", "),
        bytes(h.page_bytes),
        bytes(h.slot_bytes)
    );
    o += &format!(
        "hybrid fit  {} pages in the budget; a {}-token sequence holds {}{}: {} sequences fit, {} with summed slots\n",
        h.pages,
        p.tokens,
        bytes(h.sequence_bytes),
        if h.state_bytes_per_sequence > 0 {
            format!(
                " (state {} in {} pages)",
                bytes(h.state_bytes_per_sequence),
                h.state_pages_per_sequence
            )
        } else {
            String::new()
        },
        h.fits_hybrid,
        h.fits_summed
    );
    if let Some(c) = &h.checkpoints {
        o += &format!(
            "checkpoint  a state checkpoint every {} blocks ({} tokens, the default of \
             cache.checkpoint_every_blocks) takes {} pages, {}: a {}-token prefix keeps {}, {}, \
             {:.1}% of the pool\n",
            c.every_blocks,
            c.every_tokens,
            c.pages,
            bytes(c.bytes),
            p.tokens,
            c.per_prefix,
            bytes(c.prefix_bytes),
            c.pool_share * 100.0
        );
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
