//! `kvbench report DIR...`: (re)render `report.html` for results folders — a run, a sweep or a
//! suite (with each of its cells) — from the folder's own files.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::results::html;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Results folders (run, sweep or suite).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    for dir in &args.dirs {
        for page in html::write_report(dir)? {
            println!("wrote {}", page.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
