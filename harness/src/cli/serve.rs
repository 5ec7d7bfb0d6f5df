//! `kvbench serve SCENARIO`: the scenario's model and cache on the `cpu` backend behind an
//! OpenAI-compatible HTTP server (`crate::serve`, `docs/serve.md`). Prints one line
//! `listening on http://HOST:PORT` once it accepts connections; SIGINT/SIGTERM stop it (a
//! second one cancels what is still running). Exit 1 when a check of the served run failed
//! (reclamation, invariants, numerics), 2 on bad input.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kvbench_cache_api::CacheMode;

use crate::backend::BackendKind;
use crate::cli::ExitStatus;
use crate::results;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheArg {
    Paged,
    Contiguous,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario file: its model, cache and scheduler serve; its traffic is ignored.
    pub scenario: PathBuf,
    /// Port to listen on (0: a free one, printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// The cache manager that serves.
    #[arg(long, value_enum, default_value = "paged")]
    pub cache: CacheArg,
    /// Results folder written at shutdown (default results/serve/<scenario-name>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace an existing results folder at --out.
    #[arg(long)]
    pub force: bool,
    /// Seed of the model weights, overriding the scenario's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override a scenario key, e.g. `--set cache.max_seq_len=512` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// The most requests waiting to start; beyond it a request is answered 429.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub max_waiting: u64,
    /// Seconds a first SIGINT/SIGTERM lets running requests finish before cancelling them.
    #[arg(long, default_value_t = 30.0, value_name = "S")]
    pub drain_timeout_s: f64,
    /// Seconds a request's headers, then its body, may take to arrive (slow clients are cut).
    #[arg(long, default_value_t = 10.0, value_name = "S")]
    pub read_timeout_s: f64,
    /// Only `cpu` serves (real compute on the wall clock).
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendKind,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.backend != BackendKind::Cpu {
        anyhow::bail!(
            "--backend {}: serve runs the cpu backend only (real compute on the wall clock); \
             sim and cuda-emu run on a virtual clock, cuda is not served yet",
            args.backend.name()
        );
    }
    if !(args.drain_timeout_s.is_finite() && args.drain_timeout_s >= 0.0) {
        anyhow::bail!(
            "--drain-timeout-s: {} is not a duration (0 or more seconds)",
            args.drain_timeout_s
        );
    }
    if !(args.read_timeout_s.is_finite() && args.read_timeout_s > 0.0) {
        anyhow::bail!(
            "--read-timeout-s: {} is not a duration (more than 0 seconds)",
            args.read_timeout_s
        );
    }
    if args.max_waiting == 0 {
        anyhow::bail!("--max-waiting: must be at least 1");
    }
    let scenario = crate::scenario::load(&args.scenario, &args.overrides)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let replace = args.out.is_none() || args.force;
    let out = match &args.out {
        Some(d) => d.clone(),
        None => results::scenario_folder(&PathBuf::from("results/serve"), &scenario.name)?,
    };
    let mode = match args.cache {
        CacheArg::Paged => CacheMode::Paged,
        CacheArg::Contiguous => CacheMode::Contiguous,
    };
    // Before any thread starts: every thread inherits the blocked signals.
    crate::serve::signals::block()?;
    let server = crate::serve::bind(crate::serve::Config {
        scenario,
        mode,
        seed: args.seed,
        host: args.host,
        port: args.port,
        out: out.clone(),
        replace,
        max_waiting: args.max_waiting,
        drain_timeout: Duration::from_secs_f64(args.drain_timeout_s.min(1e9)),
        read_timeout: Duration::from_secs_f64(args.read_timeout_s.min(1e9)),
    })?;
    let stopper = server.stopper();
    crate::serve::signals::spawn(move |n| {
        eprintln!(
            "kvbench serve: {}",
            if n == 1 {
                "stopping: draining running requests (again to cancel them)"
            } else {
                "cancelling running requests"
            }
        );
        stopper.stop(n > 1);
    })?;
    println!("listening on http://{}", server.local_addr());
    let outcome = server.run().map_err(|e| {
        if e.downcast_ref::<crate::serve::engine::EngineFailed>()
            .is_some()
        {
            e.context(ExitStatus(1))
        } else {
            e
        }
    })?;
    let exp = &outcome.experiment;
    let mut text = format!("{}\n", results::report::markdown(exp));
    if let Some(s) = &exp.served {
        text.push_str(&format!(
            "served {} requests ({} refused, {} cancelled by their clients), {}\n",
            s.requests, s.refused, s.client_cancels, s.shutdown
        ));
    }
    text.push_str(&format!("wrote {}", out.display()));
    println!("{text}");
    if !outcome.failures.is_empty() {
        for f in &outcome.failures {
            eprintln!("check failed: {f}");
        }
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}
