//! `kvbench validate FILE...`: load every scenario (with overrides) and report each problem as
//! `file:line:col: key: message`. Exit 0 when all are valid, 2 otherwise.
//!
//! A scenario is valid when `kvbench run` accepts it as input: its device profile too is looked
//! up and checked, as a run does (a `devices/NAME.toml` beside the file first), since `load`
//! alone does not read it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::backend::sim::profile::DeviceProfile;
use crate::scenario::{self, Diagnostic, Origin, Scenario};

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
        let problem = match scenario::load(file, &args.overrides) {
            Ok(s) => match device_problem(file, &s, &args.overrides) {
                None => {
                    println!("{}: ok ({})", file.display(), s.name);
                    None
                }
                problem => problem,
            },
            Err(e) => Some(e.to_string()),
        };
        if let Some(text) = problem {
            failed += 1;
            eprintln!("{text}");
        }
    }
    if failed == 0 {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{failed} of {} scenario file(s) invalid", args.files.len());
        Ok(ExitCode::from(2))
    }
}

/// What a run would refuse in the device profile `s` names: an unknown name, placed at the
/// `device` key (or its `--set`), or the profile's own problems, each at its line in the profile,
/// after a line at the scenario's `device` key that says which scenario uses it.
fn device_problem(file: &Path, s: &Scenario, overrides: &[String]) -> Option<String> {
    let at = |message: String| {
        let set = overrides
            .iter()
            .any(|o| o.split_once('=').map_or(o.as_str(), |(k, _)| k).trim() == "device");
        match set {
            true => Diagnostic {
                origin: Origin::Override,
                key: "device".into(),
                message,
            },
            false => scenario::locate_in_source(Some(file), "device", message),
        }
    };
    match DeviceProfile::find(&s.device, file.parent()) {
        Ok(Some(_)) => None,
        Ok(None) => Some(at(DeviceProfile::unknown(&s.device)).to_string()),
        Err(e) => Some(format!(
            "{}\n{e}",
            at(format!("device profile {:?} does not validate:", s.device))
        )),
    }
}
