//! The tune search against synthetic evaluators whose every configuration has a known capacity
//! (the highest rate at which it passes): it finds a known optimum, prunes only what is shown
//! below the best, and breaks ties towards the simpler configuration.
//!
//! Randomized cases are seeded: `KVBENCH_SEED` replays one, `KVBENCH_FUZZ_SEEDS` widens them
//! (default 200); each prints its seed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use kvbench::tune::rank::{self, Verdict};
use kvbench::tune::search::{self, Bracket, Evaluator, SearchConfig, Searched, Status};
use kvbench::tune::space::{Config, Knob, Space};
use kvbench_cache_api::CacheMode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Capacities per configuration (the same in both modes unless `contiguous` says otherwise);
/// a probe passes iff its load is at most the capacity. `search` is a plain double-then-bisect
/// from `start`, as the sweep's.
struct Synthetic {
    paged: BTreeMap<Config, f64>,
    contiguous: Option<BTreeMap<Config, f64>>,
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
            refused: Vec::new(),
            base,
            precision: 0.02,
            probes: Mutex::new(0),
        }
    }

    fn cap(&self, c: &Config, mode: CacheMode) -> f64 {
        let table = match (mode, &self.contiguous) {
            (CacheMode::Contiguous, Some(t)) => t,
            _ => &self.paged,
        };
        *table.get(c).expect("a configuration of the space")
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

    fn probe(&self, c: &Config, mode: CacheMode, load: f64) -> Result<bool, String> {
        *self.probes.lock().unwrap() += 1;
        Ok(load <= self.cap(c, mode))
    }

    fn search(&self, c: &Config, mode: CacheMode, start: f64) -> Result<Searched, String> {
        let mut n = 0u32;
        let mut pass = |load: f64| {
            n += 1;
            load <= self.cap(c, mode)
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
    }
}

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![seed];
    }
    let n = std::env::var("KVBENCH_FUZZ_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    (0..n).collect()
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
    let b = out.tried[best].bracket;
    assert!(
        b.lo() <= 40.0 && 40.0 < b.hi(),
        "the bracket holds the capacity: {b:?}"
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
        assert!(y.bracket.lo() > x.bracket.lo());
    }
}

/// Random spaces and random capacities (with deliberate ties): a pruned configuration's
/// interval never overlaps the best's, every finished bracket holds its configuration's
/// capacity, and the best is the simplest of those indistinguishable from the top.
#[test]
fn pruning_never_drops_a_configuration_whose_interval_overlaps_the_best() {
    let mut pruned_seen = 0usize;
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
        let mut e = Synthetic::new(caps.clone(), rng.gen_range(1.0..50.0));
        e.refused = all_configs(&space)
            .into_iter()
            .filter(|c| *c != space.start() && rng.gen_bool(0.1))
            .collect();
        let out = search::search_mode(&e, &space, CacheMode::Paged, &cfg()).unwrap();
        let top = rank::top(&space, &out.tried).expect("the start configuration passes somewhere");
        let best_bracket = out.tried[top].bracket;
        for t in &out.tried {
            let cap = caps[&t.config];
            match &t.status {
                Status::Pruned => {
                    pruned_seen += 1;
                    assert!(
                        !t.bracket.overlaps(&best_bracket),
                        "seed {seed}: pruned {:?} {:?} overlaps the best {:?}",
                        t.config,
                        t.bracket,
                        best_bracket
                    );
                    assert!(cap < caps[&out.tried[top].config], "seed {seed}");
                }
                Status::Searched => assert!(
                    t.bracket.lo() <= cap && cap < t.bracket.hi(),
                    "seed {seed}: {:?} bracket {:?} misses capacity {cap}",
                    t.config,
                    t.bracket
                ),
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
            out.tried[best].bracket.overlaps(&best_bracket),
            "seed {seed}"
        );
        for (i, t) in out.tried.iter().enumerate() {
            if verdicts[i] == Verdict::Indistinguishable {
                assert!(t.bracket.overlaps(&best_bracket), "seed {seed}");
                assert_ne!(
                    rank::simpler(&space, t, &out.tried[best]),
                    std::cmp::Ordering::Less,
                    "seed {seed}: {:?} is simpler than the best {:?}",
                    t.config,
                    out.tried[best].config
                );
            }
            if verdicts[i] == Verdict::Below {
                assert!(t.bracket.below(&best_bracket), "seed {seed}");
            }
        }
    }
    assert!(pruned_seen > 0, "the cases exercised pruning");
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
        precision: 0.02,
        deadline: Some(Instant::now()),
    };
    let out = search::search_mode(&e, &space, CacheMode::Paged, &spent).unwrap();
    assert!(out.budget_hit);
    assert_eq!(out.tried[0].status, Status::Unfinished);
    assert_eq!(out.probes(), 0, "no probe starts after the deadline");
}
