//! Fuzz cases for `kvbench fuzz`: a seed becomes a random small scenario (bursts, cancellation
//! at every lifecycle point, shared prefixes, forks, pipelined steps, tight pools), run in both
//! cache modes with invariants checked after every step. One seed, one case: a failure replays
//! exactly.
//!
//! Two generators. `classic` switches each optional feature on with its own fixed probability,
//! so a defect that needs several rare features at once (one-token blocks, forks, pipelined
//! steps and the prefix cache together) comes up in about one case in a few hundred. `swarm`
//! (the default) first draws which features this case may use at all, each on or off with even
//! odds, then generates within them: any given four features meet in one case in sixteen, and
//! the features left off cannot mask the ones left on (swarm testing, Groce et al., ISSTA 2012).
//! Seeds printed by either replay with the same generator named.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::backend::{BackendKind, Clock};
use crate::experiment::{self, RunOptions};
use crate::scenario;

fn pick<'a, R: Rng>(rng: &mut R, xs: &[&'a str]) -> &'a str {
    xs[rng.gen_range(0..xs.len())]
}

/// How a seed becomes a case (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Generator {
    /// Each feature on with a fixed probability of its own (the seeds of earlier releases).
    Classic,
    /// Features drawn on or off first, with even odds; the case uses only those on.
    #[default]
    Swarm,
}

impl Generator {
    pub fn name(self) -> &'static str {
        match self {
            Generator::Classic => "classic",
            Generator::Swarm => "swarm",
        }
    }
}

/// The optional features a case may use. `None`: drawn per case with the classic probability;
/// `Some(on)`: decided for the case by the swarm's draw.
#[derive(Debug, Clone, Copy, Default)]
struct Features {
    one_token_blocks: Option<bool>,
    tight_pool: Option<bool>,
    shared_prefix: Option<bool>,
    parallel_sampling: Option<bool>,
    cancellation: Option<bool>,
    tenants: Option<bool>,
    swap: Option<bool>,
    prefix_cache: Option<bool>,
    tenant_fairness: Option<bool>,
    async_steps: Option<bool>,
}

impl Features {
    /// The swarm's draw for `seed`, from a stream of its own so the case's draws are untouched
    /// by how many features there are.
    fn swarm(seed: u64) -> Features {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(1);
        let mut on = || Some(rng.gen_bool(0.5));
        Features {
            one_token_blocks: on(),
            tight_pool: on(),
            shared_prefix: on(),
            parallel_sampling: on(),
            cancellation: on(),
            tenants: on(),
            swap: on(),
            prefix_cache: on(),
            tenant_fairness: on(),
            async_steps: on(),
        }
    }
}

/// `decided`, or a draw with probability `p`.
fn feature<R: Rng>(rng: &mut R, decided: Option<bool>, p: f64) -> bool {
    decided.unwrap_or_else(|| rng.gen_bool(p))
}

/// The scenario of one classic fuzz case, as TOML (so the schema's defaults and checks apply).
pub fn case_toml(seed: u64) -> String {
    case_toml_with(seed, Generator::Classic)
}

/// The scenario of one fuzz case made by `generator`, as TOML.
pub fn case_toml_with(seed: u64, generator: Generator) -> String {
    let f = match generator {
        Generator::Classic => Features::default(),
        Generator::Swarm => Features::swarm(seed),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let block = match f.one_token_blocks {
        None => [1u32, 2, 4, 8, 16, 32][rng.gen_range(0..6)],
        Some(true) => 1,
        Some(false) => [2u32, 4, 8, 16, 32][rng.gen_range(0..5)],
    };
    let max_seq_len = rng.gen_range(64..=512u32);
    let prompt_max = rng.gen_range(1..=max_seq_len / 2);
    let output_max = rng.gen_range(1..=(max_seq_len - prompt_max).clamp(1, 128));
    // Between one and ~12 longest requests' worth of KV (tiny: 1 KiB per token); a tight pool
    // holds at most two, so preemption and eviction run all the time.
    let most = match f.tight_pool {
        None | Some(false) => max_seq_len as u64 * 12,
        Some(true) => max_seq_len as u64 * 2,
    };
    let slots = rng.gen_range(max_seq_len as u64 + 64..=most);
    let mut t = format!(
        "name = \"fuzz-{seed}\"\nseed = {seed}\ndevice = \"cpu\"\n[model]\npreset = \"tiny\"\n[memory]\nkv_budget = \"{} KiB\"\n\
         [cache]\nblock_size = {block}\ncontiguous_reservation = \"{}\"\nmax_seq_len = {max_seq_len}\n[traffic]\nrequests = {}\n",
        slots,
        pick(&mut rng, &["max_seq_len", "prompt_plus_output"]),
        rng.gen_range(5..=60)
    );
    t += &match rng.gen_range(0..4) {
        0 => "[traffic.arrival]\nkind = \"burst\"\n".to_string(),
        1 => format!(
            "[traffic.arrival]\nkind = \"poisson\"\nrate_per_s = {}\n",
            rng.gen_range(20.0..2000.0f64)
        ),
        2 => format!(
            "[traffic.arrival]\nkind = \"gamma\"\nrate_per_s = {}\nshape = {}\n",
            rng.gen_range(20.0..2000.0f64),
            rng.gen_range(0.1..1.0f64)
        ),
        _ => format!(
            "[traffic.arrival]\nkind = \"closed_loop\"\nclients = {}\nthink_ms = {}\n",
            rng.gen_range(1..12),
            rng.gen_range(0.0..5.0f64)
        ),
    };
    t += &format!("[traffic.prompt_tokens]\ndist = \"uniform\"\nmin = 1\nmax = {prompt_max}\n");
    t += &format!("[traffic.output_tokens]\ndist = \"uniform\"\nmin = 1\nmax = {output_max}\n");
    if feature(&mut rng, f.shared_prefix, 0.5) {
        t += &format!(
            "[traffic.shared_prefix]\ngroups = {}\nprefix_tokens = {}\nshare = {}\n",
            rng.gen_range(1..4),
            rng.gen_range(1..=prompt_max.max(1)),
            rng.gen_range(0.3..1.0f64)
        );
    }
    if feature(&mut rng, f.parallel_sampling, 0.4) {
        t += &format!(
            "[traffic.parallel_sampling]\nn = {}\nshare = {}\n",
            rng.gen_range(2..5),
            rng.gen_range(0.2..1.0f64)
        );
    }
    if feature(&mut rng, f.cancellation, 0.6) {
        t += &format!(
            "[traffic.cancellation]\nshare = {}\nwhen = \"{}\"\ndelay = {{ dist = \"exponential\", mean_ms = {} }}\nafter_tokens = {{ dist = \"uniform\", min = 1, max = {} }}\n",
            rng.gen_range(0.1..1.0f64),
            pick(&mut rng, &["queued", "after_delay", "after_tokens", "mixed"]),
            rng.gen_range(0.05..20.0f64),
            rng.gen_range(1..=output_max.max(1))
        );
    }
    if feature(&mut rng, f.tenants, 0.3) {
        t += &format!("[traffic.tenants]\ncount = {}\n", rng.gen_range(2..4));
    }
    t += &format!(
        "[scheduler]\npolicy = \"{}\"\nmax_tokens_per_step = {}\nmax_seqs_per_step = {}\npreemption = \"{}\"\nprefix_cache = {}\nprefix_scope = \"{}\"\ntenant_fairness = {}\nwatermark = {}\nasync_steps = {}\n",
        pick(&mut rng, &["decode_first", "prefill_first"]),
        rng.gen_range(8..=512),
        rng.gen_range(1..=64),
        match f.swap {
            None => pick(&mut rng, &["recompute", "swap"]),
            Some(true) => "swap",
            Some(false) => "recompute",
        },
        feature(&mut rng, f.prefix_cache, 0.7),
        pick(&mut rng, &["tenant", "global"]),
        feature(&mut rng, f.tenant_fairness, 0.3),
        rng.gen_range(0.0..0.1f64),
        feature(&mut rng, f.async_steps, 0.5)
    );
    t
}

pub enum Outcome {
    Passed,
    /// The generator made a scenario the validator refuses (not a bug).
    Infeasible(String),
    Failed(String),
}

pub fn run_case(seed: u64) -> Outcome {
    run_case_on(seed, BackendKind::Sim)
}

/// One classic case on `backend` (`sim`, or `cuda-emu` with its delay seed set by the caller).
pub fn run_case_on(seed: u64, backend: BackendKind) -> Outcome {
    run_case_with(seed, Generator::Classic, backend)
}

/// One case made by `generator`, on `backend`: `sim`; `cpu` on the model clock, so its schedule
/// is the cost model's and the same on any machine, its every token checked by the oracle; or
/// `cuda-emu` (its delay seed set by the caller).
pub fn run_case_with(seed: u64, generator: Generator, backend: BackendKind) -> Outcome {
    let text = case_toml_with(seed, generator);
    let s = match scenario::parse_str(&text, None, &[]) {
        Ok(s) => s,
        Err(e) => return Outcome::Infeasible(e.to_string()),
    };
    let opts = RunOptions {
        backend,
        invariant_check_every: 1,
        clock: Clock::Model,
        ..RunOptions::default()
    };
    match experiment::run_scenario(&s, &opts) {
        Ok(exp) => {
            let f = exp.failures();
            if f.is_empty() {
                Outcome::Passed
            } else {
                Outcome::Failed(f.join("; "))
            }
        }
        Err(experiment::ExperimentError::Engine { mode, source }) => {
            Outcome::Failed(format!("{mode}: {source}"))
        }
        Err(e) => Outcome::Infeasible(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(generator, seed)` of every line of the corpus of seeds that once failed.
    fn corpus() -> Vec<(Generator, u64)> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/fuzz/corpus.txt"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        text.lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (g, seed) = l.split_once(' ').unwrap_or_else(|| panic!("{path}: {l}"));
                let g = match g {
                    "classic" => Generator::Classic,
                    "swarm" => Generator::Swarm,
                    _ => panic!("{path}: unknown generator in {l}"),
                };
                (
                    g,
                    seed.trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("{path}: {l}")),
                )
            })
            .collect()
    }

    /// Every corpus seed on one backend (a test per backend, so the three run side by side).
    fn corpus_passes_on(backend: BackendKind) {
        let seeds = corpus();
        assert!(!seeds.is_empty());
        let name = backend.name();
        for (g, seed) in seeds {
            if backend == BackendKind::CudaEmu {
                crate::backend::cuda::set_emu_seed(seed);
            }
            match run_case_with(seed, g, backend) {
                Outcome::Passed => {}
                Outcome::Infeasible(e) => panic!("{name} seed {seed}: refused: {e}"),
                Outcome::Failed(e) => panic!(
                    "{name} seed {seed}: {e}\nreplay: kvbench fuzz --backend {name} \
                     --generator {} --seed {seed}",
                    g.name()
                ),
            }
        }
    }

    #[test]
    fn every_seed_that_once_failed_passes_on_sim() {
        corpus_passes_on(BackendKind::Sim);
    }

    #[test]
    fn every_seed_that_once_failed_passes_on_cpu() {
        corpus_passes_on(BackendKind::Cpu);
    }

    #[test]
    fn every_seed_that_once_failed_passes_on_cuda_emu() {
        corpus_passes_on(BackendKind::CudaEmu);
    }

    /// The classic generator is what printed the corpus's classic seeds: it must keep making
    /// the same case from one (here, the features the first corpus seed needed together).
    #[test]
    fn a_classic_seed_still_makes_its_case() {
        let t = case_toml_with(1796655952543237090, Generator::Classic);
        assert_eq!(t, case_toml(1796655952543237090));
        for needed in [
            "block_size = 1\n",
            "[traffic.parallel_sampling]",
            "prefix_cache = true\n",
            "async_steps = true\n",
        ] {
            assert!(t.contains(needed), "{needed:?} missing from\n{t}");
        }
    }

    /// A swarm case uses exactly the features its draw switched on, and over many seeds every
    /// feature comes up both on and off.
    #[test]
    fn a_swarm_case_uses_the_features_it_drew() {
        let mut seen_on = [0u32; 3];
        for seed in 0..200u64 {
            let f = Features::swarm(seed);
            let t = case_toml_with(seed, Generator::Swarm);
            let checks = [
                (f.one_token_blocks, t.contains("block_size = 1\n")),
                (
                    f.parallel_sampling,
                    t.contains("[traffic.parallel_sampling]"),
                ),
                (f.async_steps, t.contains("async_steps = true\n")),
            ];
            for (i, (drawn, present)) in checks.into_iter().enumerate() {
                assert_eq!(drawn, Some(present), "seed {seed}, feature {i}:\n{t}");
                seen_on[i] += u32::from(present);
            }
            assert_eq!(t, case_toml_with(seed, Generator::Swarm), "seed {seed}");
        }
        for (i, on) in seen_on.into_iter().enumerate() {
            assert!(
                (40..=160).contains(&on),
                "feature {i} on in {on} of 200 cases"
            );
        }
    }
}
