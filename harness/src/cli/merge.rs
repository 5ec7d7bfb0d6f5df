//! `kvbench merge SHARD... --out DIR`: combine the folders of `kvbench suite --shard K/N` runs
//! into one suite folder (table, metadata, cell folders, report). Exit 2 when the shards do not
//! fit together (other builds, other plans, a cell twice or missing); exit 1 when a merged cell
//! failed a check.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::ExitStatus;
use crate::results::suite;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Shard folders written by `kvbench suite --shard K/N`.
    #[arg(required = true)]
    pub shards: Vec<PathBuf>,
    /// The merged suite folder.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Replace an existing output folder: only a results folder (a suite, run or sweep) or an
    /// empty one, never another folder or a file.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let meta = suite::merge(&args.shards, &args.out, args.force)?;
    print!("{}", suite::markdown(&meta.header, &meta.rows()));
    println!(
        "merged {} shards ({} cells) into {}",
        args.shards.len(),
        meta.plan.len(),
        args.out.display()
    );
    let failed = meta.failures();
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("check failed: {f}");
        }
        return Err(anyhow::Error::new(ExitStatus(1)).context("one or more checks failed"));
    }
    Ok(ExitCode::SUCCESS)
}
