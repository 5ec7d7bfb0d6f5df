//! `kvbench trace stats FILE` and the `--trace` flags of `kvbench run`: parsing and printing only;
//! the work is in `workload::trace`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::scenario::{ArrivalSpec, Scenario, TraceFormat, TraceSpec};
use crate::workload::trace;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Rows, time span, rate, gap CV, length percentiles, share over max_seq_len, ideal reuse.
    Stats(StatsArgs),
}

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum FormatArg {
    Auto,
    Azure,
    Burstgpt,
    Mooncake,
    Csv,
}

impl FormatArg {
    fn format(self) -> TraceFormat {
        match self {
            FormatArg::Auto => TraceFormat::Auto,
            FormatArg::Azure => TraceFormat::Azure,
            FormatArg::Burstgpt => TraceFormat::Burstgpt,
            FormatArg::Mooncake => TraceFormat::Mooncake,
            FormatArg::Csv => TraceFormat::Csv,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    pub file: PathBuf,
    /// The trace's format (auto: from its header).
    #[arg(long = "format", value_enum, default_value = "auto")]
    pub format: FormatArg,
    /// Report the share of requests whose prompt + output exceeds this.
    #[arg(long, value_name = "TOKENS")]
    pub max_seq_len: Option<u32>,
    /// Block granularity of the ideal prefix reuse (the cache's block size).
    #[arg(long, default_value_t = 16, value_name = "TOKENS",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub block_size: u32,
    /// Mooncake: prompt tokens per hash id (default: inferred from the rows; one the rows
    /// contradict is refused).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub hash_block_tokens: Option<u32>,
    #[arg(long)]
    pub skip_bad_rows: bool,
    /// Cache capacities (repeat or comma-separate) at which to replay lru, lfu and the offline
    /// optimum (belady) over the trace's content ids, beside the infinite ceiling: a block
    /// count, or a size ("10 GiB") with --kv-bytes-per-token.
    #[arg(long, value_name = "BLOCKS|SIZE", value_delimiter = ',')]
    pub capacity: Vec<String>,
    /// The model's K and V bytes per token (all layers), to read a --capacity size as blocks.
    #[arg(long, value_name = "BYTES")]
    pub kv_bytes_per_token: Option<u64>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Trace flags of `kvbench run`: replace a scenario's arrivals and lengths with a trace's.
#[derive(clap::Args, Debug, Default)]
pub struct TraceFlags {
    /// Replay this trace instead of the scenario's arrivals and lengths.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The trace's format (default: from its header).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub trace_format: Option<FormatArg>,
    /// Skip and count malformed rows instead of refusing the trace.
    #[arg(long)]
    pub skip_bad_rows: bool,
    /// Multiply the trace's times (2 = half the rate).
    #[arg(long, value_name = "X")]
    pub time_scale: Option<f64>,
    /// Multiply the trace's rate (divide its times).
    #[arg(long, value_name = "X")]
    pub rate_scale: Option<f64>,
}

impl TraceFlags {
    /// Apply the flags to a loaded scenario (a trace given here replaces its arrivals).
    pub fn apply(&self, s: &mut Scenario) -> anyhow::Result<()> {
        if let Some(file) = &self.trace {
            let abs = std::env::current_dir()
                .map(|d| d.join(file))
                .unwrap_or_else(|_| file.clone())
                .display()
                .to_string();
            match &mut s.traffic.arrival {
                // The scenario's own trace keys (filters, `failed`, `hash_block_tokens`,
                // `prefix_tokens`, the window) stay: only the file (and a --trace-format) change.
                ArrivalSpec::Trace(spec) => spec.path = abs,
                other => {
                    *other = ArrivalSpec::Trace(TraceSpec::new(abs));
                    if let Some(w) = inherited_window(s) {
                        eprintln!(
                            "warning: {}: --trace replays the trace within this scenario's \
                             synthetic window, {w}: rows past it are left out (see the trace \
                             line of the report; --set changes the window)",
                            s.name
                        );
                    }
                }
            }
        }
        let any = self.trace_format.is_some()
            || self.skip_bad_rows
            || self.time_scale.is_some()
            || self.rate_scale.is_some();
        let ArrivalSpec::Trace(spec) = &mut s.traffic.arrival else {
            if any {
                anyhow::bail!(
                    "{}: trace flags need --trace FILE or a scenario replaying a trace",
                    s.name
                );
            }
            return Ok(());
        };
        if let Some(f) = self.trace_format {
            spec.format = f.format();
        }
        spec.skip_bad_rows |= self.skip_bad_rows;
        if let Some(x) = self.time_scale {
            spec.time_scale = x;
        }
        if let Some(x) = self.rate_scale {
            spec.rate_scale = x;
        }
        s.validate().map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// The window a trace replay takes from `traffic.requests` / `traffic.duration_s`, in words.
fn inherited_window(s: &Scenario) -> Option<String> {
    let t = &s.traffic;
    let parts: Vec<String> = [
        t.requests
            .map(|n| format!("traffic.requests = {n} rows at most")),
        t.duration_s
            .map(|d| format!("traffic.duration_s = {d} s of trace time")),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(" and "))
}

pub fn run(c: Command) -> anyhow::Result<ExitCode> {
    match c {
        Command::Stats(a) => stats(a),
    }
}

fn stats(a: StatsArgs) -> anyhow::Result<ExitCode> {
    let mut spec = TraceSpec::new(a.file.display().to_string());
    spec.format = a.format.format();
    spec.skip_bad_rows = a.skip_bad_rows;
    spec.hash_block_tokens = a.hash_block_tokens;
    let capacities = a
        .capacity
        .iter()
        .map(|c| trace::capacity_blocks(c, a.block_size.max(1), a.kv_bytes_per_token))
        .collect::<Result<Vec<u64>, String>>()
        .map_err(|e| anyhow::anyhow!("--capacity: {e}"))?;
    let st = trace::trace_stats_with(
        &a.file,
        &spec,
        a.max_seq_len,
        a.block_size.max(1),
        &capacities,
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("trace        {} ({})", st.path, st.format);
    println!("blake3       {}", st.blake3);
    println!(
        "rows         {} ({} malformed, skipped)",
        st.rows, st.skipped_bad_rows
    );
    println!("time span    {:.3} s", st.span_s);
    let opt = |v: Option<f64>, d: usize| v.map_or("-".into(), |x| format!("{x:.d$}"));
    println!("mean rate    {} req/s", opt(st.mean_rate_per_s, 3));
    println!("gap CV       {}", opt(st.gap_cv, 3));
    let p = |x: &crate::workload::Percentiles| {
        format!(
            "p50 {} p90 {} p99 {} max {} mean {:.1}",
            x.p50, x.p90, x.p99, x.max, x.mean
        )
    };
    println!("prompt       {}", p(&st.prompt_tokens));
    println!("output       {}", p(&st.output_tokens));
    if let (Some(m), Some(share)) = (st.max_seq_len, st.over_max_seq_len_share) {
        println!("over {m} tokens  {:.2}%", 100.0 * share);
    }
    if let Some(h) = &st.hash_block {
        println!(
            "hash ids     {} tokens per id ({}; the rows allow {}): {} ids × {} = {} tokens for {} \
             input tokens, {:.1}%",
            h.tokens,
            if h.stated { "stated" } else { "inferred" },
            match h.allowed_max {
                Some(m) if m == h.allowed_min => format!("exactly {m}"),
                Some(m) => format!("{}..={m}", h.allowed_min),
                None => format!("{} or more", h.allowed_min),
            },
            h.ids,
            h.tokens,
            h.covered_tokens,
            h.input_tokens,
            100.0 * h.coverage()
        );
    }
    match &st.ideal_prefix_reuse {
        Some(r) => println!(
            "ideal prefix reuse (infinite cache, {}-token blocks)  {:.2}% ({} of {} prompt tokens)",
            r.block_tokens,
            100.0 * r.hit_rate,
            r.hit_tokens,
            r.lookup_tokens
        ),
        None => println!("ideal prefix reuse  - (the trace has no content ids)"),
    }
    if !a.capacity.is_empty() && st.ideal_prefix_reuse.is_none() {
        println!("eviction bounds  - (the trace has no content ids)");
    }
    for b in &st.eviction {
        println!(
            "capacity {} blocks ({} tokens; {} distinct blocks read)",
            b.capacity_blocks,
            b.capacity_blocks.saturating_mul(b.block_tokens as u64),
            b.distinct_blocks
        );
        let line = |name: &str, h: &trace::PolicyHits| {
            println!(
                "  {name:<9} {:>6.2}% of prompt tokens ({} tokens), {:>6.2}% of blocks ({} of {})",
                100.0 * h.hit_rate,
                h.hit_tokens,
                100.0 * h.block_hit_rate,
                h.hit_blocks,
                b.lookup_blocks
            )
        };
        for h in &b.policies {
            line(h.policy.name(), h);
        }
        line("infinite", &b.ceiling);
    }
    Ok(ExitCode::SUCCESS)
}
