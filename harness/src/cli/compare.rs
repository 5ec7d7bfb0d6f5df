//! `kvbench compare A B`: every metric two results folders (runs, suites or sweeps) share, with
//! absolute and relative change, a 95% interval and significance; prints markdown, and with
//! `--out` writes `compare.md` and `compare.csv`. Folders that ran different workloads are
//! compared all the same, with the difference stated first (`gate` refuses them).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::compare;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The reference folder.
    pub a: PathBuf,
    /// The folder compared with it.
    pub b: PathBuf,
    /// Write compare.md and compare.csv here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let c = compare::compare(&args.a, &args.b)?;
    let md = compare::write::markdown(&c);
    print!("{md}");
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        for (name, text) in [
            ("compare.md", md.clone()),
            ("compare.csv", compare::write::csv(&c)),
        ] {
            let path = dir.join(name);
            let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
            std::fs::write(&tmp, text).with_context(|| format!("{}", tmp.display()))?;
            std::fs::rename(&tmp, &path).with_context(|| format!("{}", path.display()))?;
        }
        println!("wrote {}", dir.join("compare.csv").display());
    }
    Ok(ExitCode::SUCCESS)
}
