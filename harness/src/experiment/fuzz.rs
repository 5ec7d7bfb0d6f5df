//! Fuzz cases for `kvbench fuzz`: a seed becomes a random small scenario on `sim` (bursts,
//! cancellation at every lifecycle point, shared prefixes, forks, pipelined steps, tight pools),
//! run in both cache modes with invariants checked after every step. One seed, one case: a
//! failure replays exactly.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::backend::BackendKind;
use crate::experiment::{self, RunOptions};
use crate::scenario;

fn pick<'a, R: Rng>(rng: &mut R, xs: &[&'a str]) -> &'a str {
    xs[rng.gen_range(0..xs.len())]
}

/// The scenario of one fuzz case, as TOML (so the schema's defaults and checks apply).
pub fn case_toml(seed: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let block = [1u32, 2, 4, 8, 16, 32][rng.gen_range(0..6)];
    let max_seq_len = rng.gen_range(64..=512u32);
    let prompt_max = rng.gen_range(1..=max_seq_len / 2);
    let output_max = rng.gen_range(1..=(max_seq_len - prompt_max).clamp(1, 128));
    // Between one and ~12 longest requests' worth of KV (tiny: 1 KiB per token).
    let slots = rng.gen_range(max_seq_len as u64 + 64..=max_seq_len as u64 * 12);
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
    if rng.gen_bool(0.5) {
        t += &format!(
            "[traffic.shared_prefix]\ngroups = {}\nprefix_tokens = {}\nshare = {}\n",
            rng.gen_range(1..4),
            rng.gen_range(1..=prompt_max.max(1)),
            rng.gen_range(0.3..1.0f64)
        );
    }
    if rng.gen_bool(0.4) {
        t += &format!(
            "[traffic.parallel_sampling]\nn = {}\nshare = {}\n",
            rng.gen_range(2..5),
            rng.gen_range(0.2..1.0f64)
        );
    }
    if rng.gen_bool(0.6) {
        t += &format!(
            "[traffic.cancellation]\nshare = {}\nwhen = \"{}\"\ndelay = {{ dist = \"exponential\", mean_ms = {} }}\nafter_tokens = {{ dist = \"uniform\", min = 1, max = {} }}\n",
            rng.gen_range(0.1..1.0f64),
            pick(&mut rng, &["queued", "after_delay", "after_tokens", "mixed"]),
            rng.gen_range(0.05..20.0f64),
            rng.gen_range(1..=output_max.max(1))
        );
    }
    if rng.gen_bool(0.3) {
        t += &format!("[traffic.tenants]\ncount = {}\n", rng.gen_range(2..4));
    }
    t += &format!(
        "[scheduler]\npolicy = \"{}\"\nmax_tokens_per_step = {}\nmax_seqs_per_step = {}\npreemption = \"{}\"\nprefix_cache = {}\nprefix_scope = \"{}\"\ntenant_fairness = {}\nwatermark = {}\nasync_steps = {}\n",
        pick(&mut rng, &["decode_first", "prefill_first"]),
        rng.gen_range(8..=512),
        rng.gen_range(1..=64),
        pick(&mut rng, &["recompute", "swap"]),
        rng.gen_bool(0.7),
        pick(&mut rng, &["tenant", "global"]),
        rng.gen_bool(0.3),
        rng.gen_range(0.0..0.1f64),
        rng.gen_bool(0.5)
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

/// One case on `backend` (`sim`, or `cuda-emu` with its delay seed set by the caller).
pub fn run_case_on(seed: u64, backend: BackendKind) -> Outcome {
    let text = case_toml(seed);
    let s = match scenario::parse_str(&text, None, &[]) {
        Ok(s) => s,
        Err(e) => return Outcome::Infeasible(e.to_string()),
    };
    let opts = RunOptions {
        backend,
        invariant_check_every: 1,
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
