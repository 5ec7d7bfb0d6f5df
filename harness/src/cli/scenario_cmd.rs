//! (in progress)
use std::process::ExitCode;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print the resolved scenario and a summary of its generated workload.
    Show { file: std::path::PathBuf },
}

pub fn run(_cmd: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
