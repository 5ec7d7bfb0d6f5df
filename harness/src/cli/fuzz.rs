//! `kvbench fuzz --seconds N [--seed S]`: random scenarios on `sim` — bursts, cancellation storms
//! at every lifecycle point, shared prefixes, forks, pipelined (delayed-retirement) steps, tight
//! pools that force preemption — with cache invariants checked after every step and the
//! reclamation check after every run. A failure prints its seed; `--seed S` replays exactly that
//! case (and prints its scenario). `--seed` with `--seconds` is refused: a replay is one case, and
//! a time limit there would be silently meaningless.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::cli::ExitStatus;
use crate::experiment::fuzz::{case_toml, run_case, Outcome};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Keep generating cases for this long.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Replay one case (runs exactly that case; cannot be combined with --seconds).
    #[arg(long, conflicts_with = "seconds")]
    pub seed: Option<u64>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(seed) = args.seed {
        println!("{}", case_toml(seed));
        return match run_case(seed) {
            Outcome::Passed => {
                println!("seed {seed}: ok");
                Ok(ExitCode::SUCCESS)
            }
            Outcome::Infeasible(e) => anyhow::bail!("seed {seed}: scenario refused: {e}"),
            Outcome::Failed(e) => {
                Err(anyhow::Error::new(ExitStatus(1)).context(format!("seed {seed}: {e}")))
            }
        };
    }
    let deadline = Duration::try_from_secs_f64(args.seconds)
        .ok()
        .and_then(|d| Instant::now().checked_add(d))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--seconds {}: expected a non-negative number of seconds this machine's clock can \
                 reach",
                args.seconds
            )
        })?;
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    println!("fuzzing for {} s from seed {base}", args.seconds);
    let (mut passed, mut refused) = (0u64, 0u64);
    let mut i = 0u64;
    while Instant::now() < deadline || i == 0 {
        let seed = base.wrapping_add(i);
        i += 1;
        match run_case(seed) {
            Outcome::Passed => passed += 1,
            Outcome::Infeasible(_) => refused += 1,
            Outcome::Failed(e) => {
                eprintln!("FAILED seed {seed}: {e}\nreplay: kvbench fuzz --seed {seed}");
                return Err(anyhow::Error::new(ExitStatus(1))
                    .context(format!("fuzz case failed (seed {seed})")));
            }
        }
    }
    println!("{passed} cases passed, {refused} refused by the validator");
    Ok(ExitCode::SUCCESS)
}
