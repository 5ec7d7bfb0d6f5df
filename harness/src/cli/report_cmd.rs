//! `kvbench report DIR...`: (re)render `report.html` for results folders — a run, a sweep or a
//! suite (with each of its cells) — from the folder's own files, each read size-capped and
//! strictly: a truncated `summary.json` is exit 2 naming it, never a page drawn from the rest.

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
        // A page is drawn from the folder's files: a truncated or malformed summary refuses it.
        crate::compare::read::check_summaries(dir)?;
        for page in html::write_report(dir)? {
            println!("wrote {}", page.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
