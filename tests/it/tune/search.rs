//! The tune search against synthetic evaluators whose every configuration has a known capacity
//! (the highest rate at which it passes): it finds a known optimum, prunes only what is shown
//! below the best, and breaks ties towards the simpler configuration.
//!
//! Randomized cases are seeded: `KVBENCH_SEED` replays one, `KVBENCH_FUZZ_SEEDS` widens them
//! (default 200); each prints its seed.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use kvbench::tune::rank::{self, Verdict};
use kvbench::tune::search::{self, Bracket, Evaluator, Interval, SearchConfig, Searched, Status};
use kvbench::tune::space::{Config, Knob, Space};
use kvbench_cache_api::CacheMode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Capacities per configuration (the same in both modes unless `contiguous` says otherwise),
/// times a per-(configuration, seed) factor where `seed_factor` has one (a workload draw's
/// luck); a probe passes iff its load is at most the capacity. `search` is a plain
/// double-then-bisect from `start`, as the sweep's.
struct Synthetic {
    paged: BTreeMap<Config, f64>,
    contiguous: Option<BTreeMap<Config, f64>>,
    seed_factor: BTreeMap<(Config, u64), f64>,
    refused: Vec<Config>,
    base: f64,
    precision: f64,
    probes: Mutex<u32>,
}

impl Synthetic {
    fn new(paged: BTreeMap<Config, f64>, base: f64) -> Synthetic {
        Synthetic {
            paged,
            contiguous: None,
            seed_factor: BTreeMap::new(),
            refused: Vec::new(),
            base,
            precision: 0.02,
            probes: Mutex::new(0),
        }
    }

    fn cap(&self, c: &Config, mode: CacheMode, seed: u64) -> f64 {
        let table = match (mode, &self.contiguous) {
            (CacheMode::Contiguous, Some(t)) => t,
            _ => &self.paged,
        };
        let f = self
            .seed_factor
            .get(&(c.clone(), seed))
            .copied()
            .unwrap_or(1.0);
        *table.get(c).expect("a configuration of the space") * f
    }
}

impl Evaluator for Synthetic {
    type Error = String;

    fn refusal(&self, c: &Config) -> Option<String> {
        self.refused
            .contains(c)
            .then(|| "refused by the synthetic scenario".to_string())
    }

    fn base_load(&self) -> f64 {
        self.base
    }

    fn probe(&self, c: &Config, mode: CacheMode, load: f64, seed: u64) -> Result<bool, String> {
        *self.probes.lock().unwrap() += 1;
        Ok(load <= self.cap(c, mode, seed))
    }

    fn search(
        &self,
        c: &Config,
        mode: CacheMode,
        start: f64,
        seed: u64,
    ) -> Result<Searched, String> {
        let mut n = 0u32;
        let mut pass = |load: f64| {
            n += 1;
            load <= self.cap(c, mode, seed)
        };
        let (mut lo, mut hi): (Option<f64>, Option<f64>) = (None, None);
        if pass(start) {
            lo = Some(start);
            let mut x = start;
            for _ in 0..16 {
                x *= 2.0;
                if pass(x) {
                    lo = Some(x);
                } else {
                    hi = Some(x);
                    break;
                }
            }
        } else {
            hi = Some(start);
            let mut x = start;
            for _ in 0..16 {
                x /= 2.0;
                if pass(x) {
                    lo = Some(x);
                    break;
                }
                hi = Some(x);
            }
        }
        while let (Some(a), Some(b)) = (lo, hi) {
            if b - a <= self.precision * a {
                break;
            }
            let mid = (a + b) / 2.0;
            if pass(mid) {
                lo = Some(mid);
            } else {
                hi = Some(mid);
            }
        }
        *self.probes.lock().unwrap() += n;
        Ok(Searched {
            bracket: Bracket { pass: lo, fail: hi },
            probes: n,
            capped: hi.is_none(),
        })
    }
}

fn int_knob(key: &str, xs: &[i64], own: i64) -> Knob {
    Knob::new(
        key,
        xs.iter().map(|&x| toml::Value::Integer(x)).collect(),
        Some(toml::Value::Integer(own)),
    )
}

fn all_configs(space: &Space) -> Vec<Config> {
    let mut out = vec![Vec::new()];
    for k in &space.knobs {
        out = out
            .into_iter()
            .flat_map(|c: Config| {
                (0..k.values.len()).map(move |i| {
                    let mut c = c.clone();
                    c.push(i);
                    c
                })
            })
            .collect();
    }
    out
}

fn cfg() -> SearchConfig {
    SearchConfig {
        precision: 0.02,
        deadline: None,
        seeds: vec![0],
        coarse_first: true,
    }
}

fn seeds() -> Vec<u64> {
    support::seeds("KVBENCH_FUZZ_SEEDS", 200, 0)
}

/// Capacity falls by a fifth for every step away from a chosen optimum on every knob: a
/// separable, unimodal landscape the neighbour search must climb to its top, in fewer
/// configurations than the grid.
#[test]
fn finds_the_known_optimum_of_a_unimodal_space_with_fewer_tries_than_a_grid() {
    let space = Space {
        knobs: vec![
            int_knob("cache.block_size", &[8, 16, 32, 64], 16),
            int_knob(
                "scheduler.max_tokens_per_step",
                &[512, 1024, 2048, 4096, 8192],
                4096,
            ),
            int_knob("scheduler.max_seqs_per_step", &[64, 128, 256, 512], 256),
        ],
    };
    let optimum: Config = vec![3, 0, 0]; // block 64, 512 tokens, 64 sequences
    let caps: BTreeMap<Config, f64> = all_configs(&space)
        .into_iter()
        .map(|c| {
            let d: i64 = c
                .iter()
                .zip(&optimum)
                .map(|(&a, &b)| (a as i64 - b as i64).abs())
                .sum();
            let cap = 40.0 * 0.8f64.powi(d as i32);
            (c, cap)
        })
        .collect();
    let e = Synthetic::new(caps, 10.0);
    let out = search::search_mode(&e, &space, CacheMode::Paged, &cfg()).unwrap();
    let (verdicts, best) = rank::verdicts(&space, &out.tried);
    let best = best.expect("a best");
    assert_eq!(out.tried[best].config, optimum, "{:#?}", out.tried);
    assert_eq!(verdicts[best], Verdict::Best);
    let b = out.tried[best].interval();
    assert!(
        b.lo <= 40.0 && 40.0 < b.hi,
        "the interval holds the capacity: {b:?}"
    );
    assert!(
        (out.tried.len() as u64) < space.size(),
        "tried {} of a {}-configuration grid",
        out.tried.len(),
        space.size()
    );
    assert_eq!(
        out.probes(),
        *e.probes.lock().unwrap(),
        "every probe counted"
    );
    // The centre moved one knob at a time and only upwards.
    for w in out.path.windows(2) {
        let (x, y) = (&out.tried[w[0]], &out.tried[w[1]]);
        let moved = x
            .config
            .iter()
            .zip(&y.config)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(moved, 1, "{:?} -> {:?}", x.config, y.config);
        assert!(y.interval().lo > x.interval().lo);
    }
}

/// Random spaces, random capacities (with deliberate ties) and one to three seeds, each seed
/// moving every configuration's capacity by its own factor: a pruned configuration's interval
/// never overlaps the top's, every finished per-seed bracket holds that seed's capacity, and the
/// best is the simplest of those indistinguishable from the top.
#[test]
fn pruning_never_drops_a_configuration_whose_interval_overlaps_the_best() {
    let mut pruned_seen = 0usize;
    let mut several_pruned = 0usize;
    for seed in seeds() {
        eprintln!("seed {seed} (replay: KVBENCH_SEED={seed})");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n_knobs = rng.gen_range(1..=4);
        let knobs: Vec<Knob> = (0..n_knobs)
            .map(|k| {
                let n = rng.gen_range(2..=5);
                let key = if k == 0 {
                    "cache.block_size".to_string()
                } else {
                    format!("scheduler.k{k}")
                };
                if rng.gen_bool(0.3) {
                    let names: Vec<toml::Value> = (0..n)
                        .map(|i| toml::Value::String(format!("v{i}")))
                        .collect();
                    let own = names[rng.gen_range(0..n)].clone();
                    Knob::new(&key, names, Some(own))
                } else {
                    let xs: Vec<i64> = (0..n as i64).map(|i| 8 << i).collect();
                    let own = xs[rng.gen_range(0..n)];
                    int_knob(&key, &xs, own)
                }
            })
            .collect();
        let space = Space { knobs };
        // A few capacity levels, so ties are common; some well apart, some within precision.
        let levels: Vec<f64> = (0..rng.gen_range(1..=6))
            .map(|_| rng.gen_range(1.0..100.0))
            .collect();
        let caps: BTreeMap<Config, f64> = all_configs(&space)
            .into_iter()
            .map(|c| {
                let cap = levels[rng.gen_range(0..levels.len())];
                (c, cap)
            })
            .collect();
        let run_seeds: Vec<u64> = (0..rng.gen_range(1..=3u64)).map(|i| 100 + i).collect();
        let spread = rng.gen_range(0.0..0.3);
        let mut e = Synthetic::new(caps.clone(), rng.gen_range(1.0..50.0));
        if run_seeds.len() > 1 {
            for c in all_configs(&space) {
                for &s in &run_seeds {
                    e.seed_factor
                        .insert((c.clone(), s), 1.0 + rng.gen_range(-spread..=spread));
                }
            }
        }
        e.refused = all_configs(&space)
            .into_iter()
            .filter(|c| *c != space.start() && rng.gen_bool(0.1))
            .collect();
        let config = SearchConfig {
            seeds: run_seeds.clone(),
            coarse_first: rng.gen_bool(0.5),
            ..cfg()
        };
        let out = search::search_mode(&e, &space, CacheMode::Paged, &config).unwrap();
        let top = rank::top(&space, &out.tried).expect("the start configuration passes somewhere");
        let top_interval: Interval = out.tried[top].interval();
        let mean_cap = |c: &Config| {
            run_seeds
                .iter()
                .map(|&s| e.cap(c, CacheMode::Paged, s))
                .sum::<f64>()
                / run_seeds.len() as f64
        };
        for t in &out.tried {
            assert_eq!(t.per_seed.len(), run_seeds.len(), "seed {seed}");
            match &t.status {
                Status::Pruned => {
                    pruned_seen += 1;
                    several_pruned += usize::from(run_seeds.len() > 1);
                    assert!(
                        !t.interval().overlaps(&top_interval),
                        "seed {seed}: pruned {:?} {:?} overlaps the top {:?}",
                        t.config,
                        t.interval(),
                        top_interval
                    );
                    assert!(
                        mean_cap(&t.config) < mean_cap(&out.tried[top].config),
                        "seed {seed}"
                    );
                }
                Status::Searched => {
                    for (b, &s) in t.per_seed.iter().zip(&run_seeds) {
                        let cap = e.cap(&t.config, CacheMode::Paged, s);
                        assert!(
                            b.lo() <= cap && cap < b.hi(),
                            "seed {seed}: {:?} on seed {s}: bracket {b:?} misses capacity {cap}",
                            t.config
                        );
                    }
                }
                Status::Refused(_) => {
                    assert!(e.refused.contains(&t.config));
                    assert_eq!(t.probes, 0);
                }
                Status::Unfinished => panic!("seed {seed}: no budget was set"),
            }
        }
        // No configuration was tried twice.
        let mut configs: Vec<&Config> = out.tried.iter().map(|t| &t.config).collect();
        configs.sort();
        configs.dedup();
        assert_eq!(configs.len(), out.tried.len(), "seed {seed}");
        // The best: indistinguishable from the top, and no tied configuration simpler.
        let (verdicts, best) = rank::verdicts(&space, &out.tried);
        let best = best.expect("a best");
        assert!(
            out.tried[best].interval().overlaps(&top_interval),
            "seed {seed}"
        );
        for (i, t) in out.tried.iter().enumerate() {
            if verdicts[i] == Verdict::Indistinguishable {
                assert!(t.interval().overlaps(&top_interval), "seed {seed}");
                assert_ne!(
                    rank::simpler(&space, t, &out.tried[best]),
                    std::cmp::Ordering::Less,
                    "seed {seed}: {:?} is simpler than the best {:?}",
                    t.config,
                    out.tried[best].config
                );
            }
            if verdicts[i] == Verdict::Below {
                assert!(t.interval().below(&top_interval), "seed {seed}");
            }
        }
    }
    assert!(pruned_seen > 0, "the cases exercised pruning");
    assert!(
        several_pruned > 0 || seeds().len() < 20,
        "the cases exercised pruning under several seeds"
    );
}

/// The interval over the seeds is the sweep's (`bracket_interval`): one seed's is its bracket,
/// several seeds' widen with their spread, and a seed that never passed makes it `[0, …]`.
#[test]
fn the_interval_over_seeds_is_the_sweeps() {
    let b = |pass: f64, fail: f64| Bracket {
        pass: Some(pass),
        fail: Some(fail),
    };
    let one = Interval::of(&[b(10.0, 11.0)]);
    assert_eq!((one.lo, one.hi), (10.0, 11.0));
    let three = [b(10.0, 11.0), b(12.0, 13.0), b(14.0, 15.0)];
    let i = Interval::of(&three);
    let [lo, hi] = kvbench::stats::bracket_interval(&[10.0, 12.0, 14.0], &[11.0, 13.0, 15.0]);
    assert_eq!((i.lo, i.hi), (lo, hi));
    assert!(i.lo < 10.0 && i.hi > 15.0, "wider than any one seed: {i:?}");
    let capped = Interval::of(&[
        b(10.0, 11.0),
        Bracket {
            pass: Some(12.0),
            fail: None,
        },
    ]);
    assert!(capped.hi.is_infinite());
    let never = Interval::of(&[
        b(10.0, 11.0),
        Bracket {
            pass: None,
            fail: Some(3.0),
        },
    ]);
    assert_eq!((never.lo, never.hi), (0.0, 11.0));
}

/// Equal capacities everywhere but one knob: the best is the scenario's own configuration
/// (fewest knobs moved), and between equally distant ties the smaller block size.
#[test]
fn ties_go_to_fewer_knobs_moved_then_the_smaller_block_size() {
    let space = Space {
        knobs: vec![
            int_knob("cache.block_size", &[8, 16, 32], 16),
            int_knob("scheduler.max_seqs_per_step", &[64, 128], 128),
        ],
    };
    let flat: BTreeMap<Config, f64> = all_configs(&space).into_iter().map(|c| (c, 20.0)).collect();
    let e = Synthetic::new(flat, 5.0);
    let out = search::search_mode(&e, &space, CacheMode::Paged, &cfg()).unwrap();
    let (verdicts, best) = rank::verdicts(&space, &out.tried);
    assert_eq!(out.tried[best.unwrap()].config, space.start());
    assert!(
        verdicts
            .iter()
            .filter(|v| **v == Verdict::Indistinguishable)
            .count()
            >= 2
    );

    // The scenario's own configuration is worse; block sizes 8 and 32 are equally good.
    let mut caps: BTreeMap<Config, f64> =
        all_configs(&space).into_iter().map(|c| (c, 10.0)).collect();
    caps.insert(vec![0, 1], 30.0);
    caps.insert(vec![2, 1], 30.0);
    let e = Synthetic::new(caps, 5.0);
    let out = search::search_mode(&e, &space, CacheMode::Paged, &cfg()).unwrap();
    let (_, best) = rank::verdicts(&space, &out.tried);
    assert_eq!(
        out.tried[best.unwrap()].config,
        vec![0, 1],
        "block size 8 wins the tie"
    );
}

/// Both modes are searched, each towards its own optimum; a spent budget stops the search and
/// says so.
#[test]
fn each_mode_has_its_own_optimum_and_a_spent_budget_is_reported() {
    let space = Space {
        knobs: vec![int_knob("cache.block_size", &[8, 16, 32, 64], 16)],
    };
    let paged: BTreeMap<Config, f64> = [(0, 10.0), (1, 20.0), (2, 40.0), (3, 30.0)]
        .into_iter()
        .map(|(i, c)| (vec![i], c))
        .collect();
    let contiguous: BTreeMap<Config, f64> = [(0, 50.0), (1, 20.0), (2, 10.0), (3, 5.0)]
        .into_iter()
        .map(|(i, c)| (vec![i], c))
        .collect();
    let mut e = Synthetic::new(paged, 8.0);
    e.contiguous = Some(contiguous);
    let modes = search::search(&e, &space, &cfg()).unwrap();
    let best = |m: &search::ModeSearch| {
        let (_, b) = rank::verdicts(&space, &m.tried);
        m.tried[b.unwrap()].config.clone()
    };
    assert_eq!(modes[0].mode, CacheMode::Paged);
    assert_eq!(best(&modes[0]), vec![2]);
    assert_eq!(best(&modes[1]), vec![0]);
    assert!(!modes[0].budget_hit && !modes[1].budget_hit);

    let spent = SearchConfig {
        deadline: Some(Instant::now()),
        ..cfg()
    };
    let out = search::search_mode(&e, &space, CacheMode::Paged, &spent).unwrap();
    assert!(out.budget_hit);
    assert_eq!(out.tried[0].status, Status::Unfinished);
    assert_eq!(out.probes(), 0, "no probe starts after the deadline");
}

/// A plateau and a dip beside the scenario's block size, and the optimum two values away: the
/// neighbour search alone stops at the scenario's value (neither adjacent value is better), the
/// coarse first pass sees the optimum in round 1 and ends there, in fewer configurations than
/// the grid.
#[test]
fn the_coarse_pass_crosses_a_plateau_the_neighbour_search_stops_at() {
    let space = Space {
        knobs: vec![
            int_knob("cache.block_size", &[8, 16, 32, 64], 16),
            int_knob("scheduler.max_seqs_per_step", &[64, 128, 256], 128),
        ],
    };
    let optimum: Config = vec![3, 1]; // block 64, the scenario's 128 sequences
    for (name, by_block) in [
        ("plateau", [10.0, 20.0, 20.0, 40.0]),
        ("dip", [20.0, 30.0, 25.0, 50.0]),
    ] {
        // Sequences per step: the scenario's value is best, the others a fifth lower.
        let caps: BTreeMap<Config, f64> = all_configs(&space)
            .into_iter()
            .map(|c| {
                let seqs = if c[1] == 1 { 1.0 } else { 0.8 };
                (c.clone(), by_block[c[0]] * seqs)
            })
            .collect();
        let e = Synthetic::new(caps.clone(), 5.0);
        let local = SearchConfig {
            coarse_first: false,
            ..cfg()
        };
        let out = search::search_mode(&e, &space, CacheMode::Paged, &local).unwrap();
        let (_, best) = rank::verdicts(&space, &out.tried);
        assert_eq!(
            out.tried[best.unwrap()].config,
            space.start(),
            "{name}: the neighbour search alone stops at the scenario's values"
        );
        assert!(out.tried.iter().all(|t| t.config != optimum), "{name}");

        let e = Synthetic::new(caps, 5.0);
        let out = search::search_mode(&e, &space, CacheMode::Paged, &cfg()).unwrap();
        let (verdicts, best) = rank::verdicts(&space, &out.tried);
        let best = best.unwrap();
        assert_eq!(out.tried[best].config, optimum, "{name}: {:#?}", out.tried);
        assert_eq!(verdicts[best], Verdict::Best);
        assert_eq!(out.tried[best].round, 1, "{name}: found by the coarse pass");
        assert!((out.tried.len() as u64) < space.size(), "{name}");
        let i = out.tried[best].interval();
        assert!(i.lo <= by_block[3] && by_block[3] < i.hi, "{name}: {i:?}");
    }
}

/// The contiguous baseline has no host tier: its search never moves the host-tier capacity (two
/// configurations that differ only there are one run measured twice), while the paged search
/// tries every capacity, coarse pass or not.
#[test]
fn the_contiguous_search_does_not_vary_a_host_tier_knob() {
    let text = |xs: &[&str]| xs.iter().map(|&x| toml::Value::from(x)).collect();
    let space = Space {
        knobs: vec![
            int_knob("cache.block_size", &[8, 16, 32], 16),
            Knob::new(
                "cache.host_tier.capacity",
                text(&["1 GiB", "4 GiB"]),
                Some("2 GiB".into()),
            ),
        ],
    };
    let host = space.knobs[1].start;
    // Each larger tier is better for the paged cache, so a search that may move it does.
    let caps: BTreeMap<Config, f64> = all_configs(&space)
        .into_iter()
        .map(|c| {
            let tier = 1.0 + c[1] as f64;
            let block = 1.0 + c[0] as f64;
            (c, 10.0 * tier * block)
        })
        .collect();
    let e = Synthetic::new(caps, 8.0);
    for coarse_first in [true, false] {
        let cfg = SearchConfig {
            coarse_first,
            ..cfg()
        };
        let modes = search::search(&e, &space, &cfg).unwrap();
        let contiguous = &modes[1];
        assert_eq!(contiguous.mode, CacheMode::Contiguous);
        for t in &contiguous.tried {
            assert_eq!(
                t.config[1],
                host,
                "contiguous tried host-tier capacity {} (coarse pass {coarse_first})",
                space.knobs[1].text(t.config[1])
            );
        }
        // The block size still moves there.
        assert!(contiguous.tried.iter().any(|t| t.config[0] != 1));
        let paged = &modes[0];
        assert!(
            paged.tried.iter().any(|t| t.config[1] != host),
            "the paged search moves the host tier (coarse pass {coarse_first})"
        );
    }
}

/// A capacity is one value however it is spelled: the scenario's "1 MiB" is the list's
/// "1024 KiB", not a third value beside it.
#[test]
fn a_knob_counts_a_capacity_once_however_it_is_spelled() {
    let k = Knob::new(
        "cache.host_tier.capacity",
        vec!["1024 KiB".into(), "2 MiB".into()],
        Some("1 MiB".into()),
    );
    assert_eq!(k.values.len(), 2, "{:?}", k.values);
    assert_eq!(k.text(k.start), "\"1024 KiB\"");
    assert!(kvbench::tune::space::same_value(
        &"1 MiB".into(),
        &"1048576".into()
    ));
    assert!(!kvbench::tune::space::same_value(
        &"1 MiB".into(),
        &"2 MiB".into()
    ));
}
