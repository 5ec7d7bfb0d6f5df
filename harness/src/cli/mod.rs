//! The command line: a thin layer over the library. Exit codes are part of the interface:
//! 0 ok, 1 a check failed (reclamation, oracle, invariant, regression), 2 bad input.
//!
//! Each subcommand lives in its own file with an `Args` struct and a `run` function returning
//! `anyhow::Result<ExitCode>`; an error that reaches here is reported with its chain and exits 2
//! unless it carries an [`ExitStatus`] saying otherwise.

/// Every subcommand prints through `out.rs`, which survives a closed pipe; these shadow std's
/// macros for the files declared below (textual macro scope), so no file can reach the panicking
/// ones by accident.
macro_rules! println {
    () => { $crate::cli::out::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::cli::out::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}
macro_rules! print {
    ($($arg:tt)*) => { $crate::cli::out::write_stdout(format_args!($($arg)*)) };
}

mod out;

mod calibrate;
mod compare;
mod cuda_check;
mod doctor;
mod endpoint;
mod fuzz;
mod gate;
mod isolation;
mod kernel_bench;
mod kernel_bench_cuda;
mod kernel_bench_grid;
mod kernel_bench_ratio;
mod merge;
mod plan;
mod progress;
mod report_cmd;
mod run;
mod scenario_cmd;
mod serve;
mod suite;
mod sweep;
mod trace_cmd;
mod tune;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "kvbench",
    version,
    about = "Benchmark and verify KV-cache management (paged vs contiguous) for LLM serving"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// KV memory calculator: bytes per token, blocks, tail waste, and how many sequences fit.
    Plan(plan::Args),
    /// Check scenario files; exit 0 if all are valid, 2 otherwise.
    Validate(validate::Args),
    /// Inspect scenarios.
    #[command(subcommand)]
    Scenario(scenario_cmd::Command),
    /// Run scenarios with the paged cache and the contiguous baseline on the same request list.
    Run(run::Args),
    /// Run a set of scenarios and write one combined table.
    Suite(suite::Args),
    /// Throughput at the scenario's latency target: a resolved rate (or concurrency) search.
    Sweep(sweep::Args),
    /// The configuration with the highest rate at target per cache mode: a neighbour search.
    Tune(tune::Args),
    /// Compare two results folders (runs, suites or sweeps): change, 95% interval, significance.
    Compare(compare::Args),
    /// Exit 1 when the current folder regressed significantly beyond a threshold against a baseline.
    Gate(gate::Args),
    /// How well one tenant tells another's prefix-cache hits from its own TTFT, per prefix scope.
    Isolation(isolation::Args),
    /// Random scenarios on `sim`, checking cache invariants every step.
    Fuzz(fuzz::Args),
    /// Decode-attention microbenchmark: paged vs contiguous vs a streaming-read ceiling.
    KernelBench(kernel_bench::Args),
    /// Inspect request traces (Azure, BurstGPT, Mooncake, plain CSV).
    #[command(subcommand)]
    Trace(trace_cmd::Command),
    /// What this machine offers: CPU, memory, CUDA driver, GPU, NVRTC, cuBLAS; compiles every
    /// CUDA kernel for sm_80/sm_90 where NVRTC exists.
    Doctor(doctor::Args),
    /// The CUDA kernels against an f64 reference over the correctness grid (needs a GPU).
    CudaCheck(cuda_check::Args),
    /// (Re)render report.html for results folders (run, sweep or suite).
    Report(report_cmd::Args),
    /// Combine `suite --shard K/N` folders into one suite.
    Merge(merge::Args),
    /// Fit a device profile to measured step times (`--check`: its error against a real run).
    Calibrate(calibrate::Args),
    /// Serve a scenario's model and cache over HTTP (OpenAI completions, /metrics) on cpu.
    Serve(serve::Args),
}

/// An error that carries its own exit code (1 for a failed check, 2 for bad input).
#[derive(Debug)]
pub struct ExitStatus(pub u8);

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for ExitStatus {}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` takes its stop signals itself (a signal drains it, never ends it).
    let serving = matches!(cli.command, Command::Serve(_));
    if serving {
    } else if let Err(e) = crate::results::staging::install_interrupt_cleanup() {
        eprintln!(
            "warning: no interrupt handler ({e}): an interrupted run may leave a temporary folder"
        );
    }
    let result = match cli.command {
        Command::Plan(a) => plan::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Scenario(c) => scenario_cmd::run(c),
        Command::Run(a) => run::run(a),
        Command::Suite(a) => suite::run(a),
        Command::Sweep(a) => sweep::run(a),
        Command::Tune(a) => tune::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Gate(a) => gate::run(a),
        Command::Isolation(a) => isolation::run(a),
        Command::Fuzz(a) => fuzz::run(a),
        Command::KernelBench(a) => kernel_bench::run(a),
        Command::Trace(c) => trace_cmd::run(c),
        Command::Doctor(a) => doctor::run(a),
        Command::CudaCheck(a) => cuda_check::run(a),
        Command::Report(a) => report_cmd::run(a),
        Command::Merge(a) => merge::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Serve(a) => serve::run(a),
    };
    // An interrupt that arrived while the command finished decides the exit status.
    crate::results::staging::wait_if_interrupted();
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            let code = err
                .chain()
                .find_map(|e| e.downcast_ref::<ExitStatus>())
                .map_or(2, |s| s.0);
            ExitCode::from(code)
        }
    }
}
