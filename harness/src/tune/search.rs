//! The search, generic over an [`Evaluator`] so its pruning can be tested without running
//! anything.
//!
//! Per cache mode: the scenario's own configuration is searched as the sweep searches (double,
//! then bisect), once per seed. Each configuration's **interval** is the sweep's interval over
//! its per-seed brackets (`stats::bracket_interval`: with one seed, the bracket
//! itself). Round 1 is a coarse pass, one knob at a time: every value of every knob with the
//! others at the scenario's (a neighbour search from the scenario's values alone stops at a
//! plateau or a dip beside them). Later rounds try every untried configuration one knob away
//! from the current centre (the adjacent values of a numeric knob, every other value of a named
//! one). Every configuration of a round is tried in parallel, starting from the centre: each
//! seed is probed at the lower end `L` of the centre's interval, and a configuration that passes
//! on no seed there is **pruned** (one probe a seed: its interval is `[0, L]`, wholly below the
//! centre's). Otherwise each seed continues from the centre's bracket `[a, b]` on that seed: up
//! to `a`, then `b`, then upwards in growing steps ([`gallop`]), or downwards from `L` in
//! growing steps when it failed there ([`descend`]); then bisected to the stated precision. The
//! centre moves to the preferred configuration of the round whose interval's lower end is above
//! the centre's; the search ends when none is (a local optimum), or when the time budget is
//! spent.
//!
//! In the contiguous mode a knob of a lower tier never moves ([`Space::distinct_in`]): the
//! baseline has no tiers, so each of its values would be the same configuration measured again.
//!
//! A configuration is pruned only when its interval's upper end is at most the centre's lower
//! end; a centre is a searched configuration, and the best's lower end is the highest searched,
//! so a pruned configuration's interval lies wholly below the best's — whatever the evaluator
//! says, since the argument uses only the loads recorded (`tests/it/tune/search.rs` checks it).

use std::collections::BTreeMap;
use std::time::Instant;

use kvbench_cache_api::CacheMode;
use rayon::prelude::*;

use super::rank;
use super::space::{Config, Space};

/// A configuration's highest passing and lowest failing rate on one seed (the sweep's per-seed
/// bracket).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Bracket {
    pub pass: Option<f64>,
    pub fail: Option<f64>,
}

impl Bracket {
    /// Lower end: the highest load shown to pass (0 when none did).
    pub fn lo(&self) -> f64 {
        self.pass.unwrap_or(0.0)
    }
    /// Upper end: the lowest load shown not to pass (unbounded when none was found).
    pub fn hi(&self) -> f64 {
        self.fail.unwrap_or(f64::INFINITY)
    }
}

/// A configuration's interval over its seeds, as the search and the tie rule read it: the
/// sweep's `[mean(a) − t·sd(a)/√n, mean(b) + t·sd(b)/√n]` over the per-seed brackets, unbounded
/// above when a seed found no failing load, `[0, highest failing]` when a seed never passed.
/// With one seed it is the bracket `[a, b]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    pub fn of(per_seed: &[Bracket]) -> Interval {
        let passes: Option<Vec<f64>> = per_seed.iter().map(|b| b.pass).collect();
        match passes {
            Some(a) if !a.is_empty() => {
                let b: Option<Vec<f64>> = per_seed
                    .iter()
                    .zip(&a)
                    .map(|(b, &a)| b.fail.map(|f| f.max(a)))
                    .collect();
                match b {
                    Some(b) => {
                        let [lo, hi] = crate::stats::bracket_interval(&a, &b);
                        Interval { lo, hi }
                    }
                    None => Interval {
                        lo: crate::stats::bracket_interval(&a, &a)[0],
                        hi: f64::INFINITY,
                    },
                }
            }
            _ => Interval {
                lo: 0.0,
                hi: per_seed.iter().map(Bracket::hi).fold(0.0, f64::max).max(
                    if per_seed.is_empty() {
                        f64::INFINITY
                    } else {
                        0.0
                    },
                ),
            },
        }
    }
    /// Wholly below `other`: its upper end at most `other`'s lower end.
    pub fn below(&self, other: &Interval) -> bool {
        self.hi <= other.lo
    }
    /// Neither is shown below the other: statistically indistinguishable.
    pub fn overlaps(&self, other: &Interval) -> bool {
        !self.below(other) && !other.below(self)
    }
}

/// How far a configuration's search went.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Bracketed to the stated precision (or the search's limit) on every seed.
    Searched,
    /// Stopped once shown below the centre (its interval wholly below the best's).
    Pruned,
    /// The scenario refuses this combination (the message says why); nothing ran.
    Refused(String),
    /// The time budget ran out before its search finished.
    Unfinished,
}

/// One configuration tried in one cache mode.
#[derive(Debug, Clone, PartialEq)]
pub struct Tried {
    pub config: Config,
    /// One bracket per seed, in the search's seed order.
    pub per_seed: Vec<Bracket>,
    pub status: Status,
    /// Probes spent on it, over all seeds (a sweep probe rerun longer counts once, as in `sweep`).
    pub probes: u32,
    /// 0 for the scenario's own configuration, then the round it was tried in.
    pub round: u32,
    /// Some seed's search hit its limit without a failure: the rate is a lower bound.
    pub capped: bool,
}

impl Tried {
    fn new(config: Config, round: u32, seeds: usize) -> Tried {
        Tried {
            config,
            per_seed: vec![Bracket::default(); seeds],
            status: Status::Searched,
            probes: 0,
            round,
            capped: false,
        }
    }

    /// The interval over the seeds ([`Interval::of`]).
    pub fn interval(&self) -> Interval {
        Interval::of(&self.per_seed)
    }

    /// The rate at target: the mean over the seeds of the highest passing rate, when every seed
    /// passed somewhere (with one seed, a load whose probe passed).
    pub fn rate(&self) -> Option<f64> {
        let a: Vec<f64> = self
            .per_seed
            .iter()
            .map(|b| b.pass)
            .collect::<Option<_>>()?;
        (!a.is_empty()).then(|| crate::stats::mean_sd(&a).0)
    }
}

/// A full search's outcome on one seed, as the evaluator reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Searched {
    pub bracket: Bracket,
    pub probes: u32,
    pub capped: bool,
}

/// What the search needs from the thing that measures: whether a configuration passes at a
/// load on a seed, and the sweep's full search from a starting load on a seed.
pub trait Evaluator: Sync {
    type Error: Send;
    /// Why the scenario refuses `c`, if it does.
    fn refusal(&self, c: &Config) -> Option<String>;
    /// The scenario's own load, where a search without a bracket starts.
    fn base_load(&self) -> f64;
    /// Whether `c` passes in `mode` at `load` on `seed` (a resolved verdict; not passing =
    /// failing).
    fn probe(&self, c: &Config, mode: CacheMode, load: f64, seed: u64)
        -> Result<bool, Self::Error>;
    /// The sweep's search of `c` in `mode` on `seed`, starting at `start`.
    fn search(
        &self,
        c: &Config,
        mode: CacheMode,
        start: f64,
        seed: u64,
    ) -> Result<Searched, Self::Error>;
}

#[derive(Debug, Clone, PartialEq)]
pub struct SearchConfig {
    /// Relative width at which bisection stops, as the sweep's.
    pub precision: f64,
    /// No probe or search starts after this instant.
    pub deadline: Option<Instant>,
    /// The workload seeds every configuration is measured under (at least one).
    pub seeds: Vec<u64>,
    /// Round 1 tries every value of every knob (the coarse pass), not only the adjacent ones.
    pub coarse_first: bool,
}

impl SearchConfig {
    fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// One cache mode's search: every configuration tried, in the order tried.
#[derive(Debug, Clone, PartialEq)]
pub struct ModeSearch {
    pub mode: CacheMode,
    pub tried: Vec<Tried>,
    /// Index (into `tried`) of each centre in turn.
    pub path: Vec<usize>,
    pub budget_hit: bool,
}

impl ModeSearch {
    pub fn probes(&self) -> u32 {
        self.tried.iter().map(|t| t.probes).sum()
    }
}

/// Search both cache modes at once.
pub fn search<E: Evaluator>(
    e: &E,
    space: &Space,
    cfg: &SearchConfig,
) -> Result<Vec<ModeSearch>, E::Error> {
    let (paged, contiguous) = rayon::join(
        || search_mode(e, space, CacheMode::Paged, cfg),
        || search_mode(e, space, CacheMode::Contiguous, cfg),
    );
    Ok(vec![paged?, contiguous?])
}

/// The search of one cache mode (module doc).
pub fn search_mode<E: Evaluator>(
    e: &E,
    space: &Space,
    mode: CacheMode,
    cfg: &SearchConfig,
) -> Result<ModeSearch, E::Error> {
    let seeds = cfg.seeds.len().max(1);
    let start = space.start();
    let first = Tried::new(start.clone(), 0, seeds);
    let first = match e.refusal(&start) {
        Some(why) => Tried {
            status: Status::Refused(why),
            ..first
        },
        None => full(e, mode, e.base_load(), cfg, first)?,
    };
    let mut out = ModeSearch {
        mode,
        tried: vec![first],
        path: vec![0],
        budget_hit: false,
    };
    let mut seen: BTreeMap<Config, usize> = BTreeMap::from([(start, 0)]);
    let mut round = 0u32;
    let mut centre = 0usize;
    loop {
        if cfg.over() {
            out.budget_hit = true;
            break;
        }
        let c = out.tried[centre].clone();
        if c.status != Status::Searched {
            break;
        }
        let around = match round == 0 && cfg.coarse_first {
            true => space.axis(&c.config),
            false => space.neighbours(&c.config),
        };
        let fresh: Vec<Config> = around
            .into_iter()
            .filter(|n| space.distinct_in(mode, n) && !seen.contains_key(n))
            .collect();
        if fresh.is_empty() {
            break;
        }
        round += 1;
        let results = fresh
            .par_iter()
            .map(|n| seeded(e, mode, n.clone(), round, &c, cfg))
            .collect::<Result<Vec<_>, _>>()?;
        for t in results {
            seen.insert(t.config.clone(), out.tried.len());
            out.budget_hit |= t.status == Status::Unfinished;
            out.tried.push(t);
        }
        // Better: its interval's lower end above the centre's. Among the better, the highest
        // lower end, then the simpler configuration.
        let better = (0..out.tried.len())
            .filter(|&i| out.tried[i].round == round && out.tried[i].status == Status::Searched)
            .filter(|&i| out.tried[i].interval().lo > c.interval().lo)
            .min_by(|&x, &y| rank::preferred(space, &out.tried[x], &out.tried[y]));
        match better {
            Some(i) => {
                centre = i;
                out.path.push(i);
            }
            None => break,
        }
    }
    Ok(out)
}

fn seed_of(cfg: &SearchConfig, i: usize) -> u64 {
    cfg.seeds.get(i).copied().unwrap_or_default()
}

/// `t`'s configuration searched the sweep's way from `start`, on every seed.
fn full<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    start: f64,
    cfg: &SearchConfig,
    mut t: Tried,
) -> Result<Tried, E::Error> {
    for i in 0..t.per_seed.len() {
        if cfg.over() {
            t.status = Status::Unfinished;
            return Ok(t);
        }
        let s = e.search(&t.config, mode, start, seed_of(cfg, i))?;
        t.probes = t.probes.saturating_add(s.probes);
        t.per_seed[i] = s.bracket;
        t.capped |= s.capped;
    }
    Ok(t)
}

/// One probe of `t` on seed `i`, unless the budget is spent (then `t` is unfinished).
fn probe<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    cfg: &SearchConfig,
    t: &mut Tried,
    i: usize,
    load: f64,
) -> Result<Option<bool>, E::Error> {
    if cfg.over() {
        t.status = Status::Unfinished;
        return Ok(None);
    }
    t.probes = t.probes.saturating_add(1);
    let passed = e.probe(&t.config, mode, load, seed_of(cfg, i))?;
    let b = &mut t.per_seed[i];
    match passed {
        true => b.pass = Some(load),
        false => b.fail = Some(load),
    }
    Ok(Some(passed))
}

/// Try `config` starting from the centre (module doc).
fn seeded<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    config: Config,
    round: u32,
    centre: &Tried,
    cfg: &SearchConfig,
) -> Result<Tried, E::Error> {
    let mut t = Tried::new(config, round, centre.per_seed.len());
    if let Some(why) = e.refusal(&t.config) {
        t.status = Status::Refused(why);
        return Ok(t);
    }
    let l = centre.interval().lo;
    if centre.rate().is_none() || l <= 0.0 {
        return full(e, mode, e.base_load(), cfg, t);
    }
    for i in 0..t.per_seed.len() {
        if probe(e, mode, cfg, &mut t, i, l)?.is_none() {
            return Ok(t);
        }
    }
    if t.per_seed.iter().all(|b| b.pass.is_none()) {
        t.status = Status::Pruned;
        return Ok(t);
    }
    for i in 0..t.per_seed.len() {
        let hint = centre.per_seed[i];
        match t.per_seed[i].pass {
            Some(_) => upwards(e, mode, cfg, &mut t, i, hint)?,
            None => descend(e, mode, cfg, &mut t, i)?,
        }
        if t.status == Status::Unfinished {
            return Ok(t);
        }
    }
    Ok(t)
}

/// Seed `i` passed at the centre's lower end: up to the centre's passing load on that seed,
/// then its failing load, then [`gallop`]; bisect once a probe fails.
fn upwards<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    cfg: &SearchConfig,
    t: &mut Tried,
    i: usize,
    hint: Bracket,
) -> Result<(), E::Error> {
    for next in [hint.pass, hint.fail].into_iter().flatten() {
        if t.per_seed[i].pass.is_some_and(|p| next <= p) {
            continue;
        }
        match probe(e, mode, cfg, t, i, next)? {
            None => return Ok(()),
            Some(true) => {}
            Some(false) => return bisect(e, mode, cfg, t, i),
        }
    }
    gallop(e, mode, cfg, t, i)
}

/// Up from a passing load in growing steps (4, 8, 16… times the precision) until a probe does
/// not pass, then bisect: a neighbour's rate is near its centre's, where the sweep's doubling
/// would overshoot and spend its bisection coming back. Capped where the sweep's search is.
fn gallop<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    cfg: &SearchConfig,
    t: &mut Tried,
    i: usize,
) -> Result<(), E::Error> {
    let limit = e.base_load() * f64::from(1u32 << crate::sweep::search::MAX_DOUBLINGS);
    let mut step = 4.0 * cfg.precision;
    while let (Some(lo), None) = (t.per_seed[i].pass, t.per_seed[i].fail) {
        let next = lo * (1.0 + step);
        if next > limit || next <= lo {
            t.capped = true;
            return Ok(());
        }
        if probe(e, mode, cfg, t, i, next)?.is_none() {
            return Ok(());
        }
        step *= 2.0;
    }
    bisect(e, mode, cfg, t, i)
}

/// Down from a failing load in growing steps until a probe passes, then bisect; a seed that
/// passes nowhere above the sweep's lowest load keeps no passing load.
fn descend<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    cfg: &SearchConfig,
    t: &mut Tried,
    i: usize,
) -> Result<(), E::Error> {
    let floor = e.base_load() / f64::from(1u32 << crate::sweep::search::MAX_DOUBLINGS);
    let mut step = 4.0 * cfg.precision;
    while let (None, Some(hi)) = (t.per_seed[i].pass, t.per_seed[i].fail) {
        let next = hi / (1.0 + step);
        if next < floor || next >= hi {
            return Ok(());
        }
        if probe(e, mode, cfg, t, i, next)?.is_none() {
            return Ok(());
        }
        step *= 2.0;
    }
    bisect(e, mode, cfg, t, i)
}

/// Narrow seed `i`'s bracket to the stated precision.
fn bisect<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    cfg: &SearchConfig,
    t: &mut Tried,
    i: usize,
) -> Result<(), E::Error> {
    while let (Some(lo), Some(hi)) = (t.per_seed[i].pass, t.per_seed[i].fail) {
        let mid = (lo + hi) / 2.0;
        if hi - lo <= cfg.precision * lo || mid <= lo || mid >= hi {
            break;
        }
        if probe(e, mode, cfg, t, i, mid)?.is_none() {
            return Ok(());
        }
    }
    Ok(())
}
