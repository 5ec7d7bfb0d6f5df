//! The command line: a thin layer over the library. Exit codes are part of the interface:
//! 0 ok, 1 a check failed (reclamation, oracle, invariant, regression), 2 bad input.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "kvbench", version, about = "Benchmark and verify KV-cache management for LLM serving")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {}
}
