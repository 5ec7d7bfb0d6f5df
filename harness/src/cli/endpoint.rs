//! `kvbench run SCENARIO --endpoint URL`: the scenario's request list against a live
//! OpenAI-compatible server instead of the in-process engine (library: `crate::endpoint`). Exit
//! 0 when every request answered as asked; 1 when the folder was written but the run is partial
//! (the server failed mid-run), a request was flagged, or the offered rate was not achieved; 2
//! when nothing could be run (bad flags, an endpoint that does not answer: no folder).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::ExitStatus;
use crate::endpoint::{self, EndpointOptions};

#[derive(clap::Args, Debug, Default)]
pub struct EndpointFlags {
    /// Send the scenario's request list to this OpenAI-compatible server
    /// (http://HOST:PORT; plain HTTP only) and measure it, instead of running the engine.
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// With --endpoint: the model name to send (default: the first of the server's /v1/models).
    #[arg(long, value_name = "NAME", requires = "endpoint")]
    pub model: Option<String>,
    /// With --endpoint: put sim's prediction of the same scenario on this device profile
    /// (a name in scenarios/devices or a file) beside the measurement, with the ratios.
    #[arg(long, value_name = "DEVICE", requires = "endpoint")]
    pub predict: Option<String>,
    /// With --endpoint: the most a request may take from send to its last event, seconds.
    #[arg(long, value_name = "S", default_value_t = 600.0, requires = "endpoint")]
    pub request_timeout_s: f64,
    /// With --endpoint: the longest a stream may go without a complete event, seconds.
    #[arg(long, value_name = "S", default_value_t = 60.0, requires = "endpoint")]
    pub idle_timeout_s: f64,
}

fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    if !(s.is_finite() && s > 0.0 && s <= 86_400.0) {
        anyhow::bail!("{flag}: {s} is not a duration in seconds (0 < S ≤ 86400)");
    }
    Ok(Duration::from_secs_f64(s))
}

/// Run `--endpoint` for one scenario (the caller checked there is one).
pub fn run(
    flags: &EndpointFlags,
    scenario: &crate::scenario::Scenario,
    seed: Option<u64>,
    trace_tokens: bool,
    out: PathBuf,
    replace: bool,
) -> anyhow::Result<ExitCode> {
    let Some(url) = &flags.endpoint else {
        anyhow::bail!("--endpoint: missing");
    };
    let mut opts = EndpointOptions::new(url);
    opts.model = flags.model.clone();
    opts.seed = seed;
    opts.predict = flags.predict.clone();
    opts.trace_tokens = trace_tokens;
    opts.request_timeout = seconds("--request-timeout-s", flags.request_timeout_s)?;
    opts.idle_timeout = seconds("--idle-timeout-s", flags.idle_timeout_s)?;
    eprintln!("{}: sending to {url}", scenario.name);
    let r = endpoint::run(scenario, &opts, &out, replace)?;
    let s = &r.summary;
    let m = &s.runs[0];
    println!(
        "{} on {} (model {}): {} requests, {} completed, {} cancelled, {} rejected; TTFT p50 {:.2} ms p99 {:.2} ms; ITL p99 {:.2} ms; {:.1} tokens/s; lag p99 {:.3} ms",
        s.scenario,
        s.endpoint.url,
        s.endpoint.model,
        m.requests.total,
        m.requests.completed,
        m.requests.cancelled,
        m.requests.rejected,
        m.ttft_ms.p50,
        m.ttft_ms.p99,
        m.itl_ms.p99,
        m.throughput_tokens_per_s,
        s.endpoint.lag_ms.p99,
    );
    println!("wrote {}", r.out.display());
    if !r.failures().is_empty() {
        for f in r.failures() {
            eprintln!("check failed: {}: {f}", s.scenario);
        }
        let what = if s.endpoint.partial {
            "partial results"
        } else {
            "results with failed checks"
        };
        return Err(
            anyhow::Error::new(ExitStatus(1)).context(format!("{what} in {}", r.out.display()))
        );
    }
    Ok(ExitCode::SUCCESS)
}
