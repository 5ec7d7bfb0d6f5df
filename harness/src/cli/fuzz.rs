//! `kvbench fuzz --seconds N [--seed S]`: random scenarios on `sim` — bursts, cancellation storms
//! at every lifecycle point, shared prefixes, forks, pipelined (delayed-retirement) steps, tight
//! pools that force preemption — with cache invariants checked after every step and the
//! reclamation check after every run. A failure prints its seed; `--seed S` replays exactly that
//! case (and prints its scenario). `--seed` with `--seconds` is refused: a replay is one case, and
//! a time limit there would be silently meaningless. `--backend cuda-emu` runs the cases on the
//! emulated device, whose completion delays have a seed of their own: a failure prints both.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::backend::BackendKind;
use crate::cli::ExitStatus;
use crate::experiment::fuzz::{case_toml, run_case_on, Outcome};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Keep generating cases for this long.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Replay one case (runs exactly that case; cannot be combined with --seconds).
    #[arg(long, conflicts_with = "seconds")]
    pub seed: Option<u64>,
    /// Where the cases run: sim (the default) or cuda-emu (the cuda backend on the emulated
    /// device, its math checked by the oracle).
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: FuzzBackend,
    /// On cuda-emu: the delay seed of a replayed case (with --seed), or of the first case.
    #[arg(long, value_name = "SEED")]
    pub emu_seed: Option<u64>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuzzBackend {
    Sim,
    CudaEmu,
}

impl FuzzBackend {
    fn kind(self) -> BackendKind {
        match self {
            FuzzBackend::Sim => BackendKind::Sim,
            FuzzBackend::CudaEmu => BackendKind::CudaEmu,
        }
    }
}

/// The replay command of one case.
fn replay(args: &Args, seed: u64, emu_seed: u64) -> String {
    match args.backend {
        FuzzBackend::Sim => format!("kvbench fuzz --seed {seed}"),
        FuzzBackend::CudaEmu => {
            format!("kvbench fuzz --backend cuda-emu --seed {seed} --emu-seed {emu_seed}")
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let kind = args.backend.kind();
    if let Some(seed) = args.seed {
        println!("{}", case_toml(seed));
        let emu_seed = args.emu_seed.unwrap_or(seed);
        crate::backend::cuda::set_emu_seed(emu_seed);
        return match run_case_on(seed, kind) {
            Outcome::Passed => {
                println!("seed {seed}: ok");
                Ok(ExitCode::SUCCESS)
            }
            Outcome::Infeasible(e) => anyhow::bail!("seed {seed}: scenario refused: {e}"),
            Outcome::Failed(e) => Err(anyhow::Error::new(ExitStatus(1)).context(format!(
                "seed {seed}: {e}\nreplay: {}",
                replay(&args, seed, emu_seed)
            ))),
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
    let emu_base = args.emu_seed.unwrap_or(base.rotate_left(32));
    match args.backend {
        FuzzBackend::Sim => println!("fuzzing for {} s from seed {base}", args.seconds),
        FuzzBackend::CudaEmu => println!(
            "fuzzing cuda-emu for {} s from seed {base}, delay seed {emu_base}",
            args.seconds
        ),
    }
    let (mut passed, mut refused) = (0u64, 0u64);
    let mut i = 0u64;
    while Instant::now() < deadline || i == 0 {
        let seed = base.wrapping_add(i);
        let emu_seed = emu_base.wrapping_add(i);
        i += 1;
        crate::backend::cuda::set_emu_seed(emu_seed);
        match run_case_on(seed, kind) {
            Outcome::Passed => passed += 1,
            Outcome::Infeasible(_) => refused += 1,
            Outcome::Failed(e) => {
                eprintln!(
                    "FAILED seed {seed} (delay seed {emu_seed}): {e}\nreplay: {}",
                    replay(&args, seed, emu_seed)
                );
                return Err(anyhow::Error::new(ExitStatus(1))
                    .context(format!("fuzz case failed (seed {seed})")));
            }
        }
    }
    println!("{passed} cases passed, {refused} refused by the validator");
    Ok(ExitCode::SUCCESS)
}
