//! `kvbench validate FILE...`: load every scenario (with overrides) and report each problem as
//! `file:line:col: key: message`. Exit 0 when all are valid, 2 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::scenario;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario files to check.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Override a key before checking, e.g. `--set traffic.requests=10` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut failed = 0usize;
    for file in &args.files {
        match scenario::load(file, &args.overrides) {
            Ok(s) => println!("{}: ok ({})", file.display(), s.name),
            Err(e) => {
                failed += 1;
                eprintln!("{e}");
            }
        }
    }
    if failed == 0 {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{failed} of {} scenario file(s) invalid", args.files.len());
        Ok(ExitCode::from(2))
    }
}
