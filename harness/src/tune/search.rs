//! The neighbour search, generic over an [`Evaluator`] so its pruning can be tested without
//! running anything.
//!
//! Per cache mode: the scenario's own configuration is searched as the sweep searches (double,
//! then bisect). Then, round by round, every untried configuration one knob away from the
//! current centre is tried, in parallel, starting from the centre's bracket `[a, b]` (its highest
//! passing and lowest failing rate): a probe at `a` that does not pass shows the configuration
//! below the centre, and it is pruned there (one probe); one that passes at `a` but not at `b`
//! shares the centre's bracket, bisected to the stated precision; one that passes at `b` is
//! better, and is searched upwards from `b` in growing steps, then bisected ([`gallop`]). The
//! centre moves to the best neighbour that is better; the search ends when none is (a local
//! optimum: no single-knob move improves it), or when the time budget is spent.
//!
//! A configuration is pruned only when it failed at a load the centre passed; the centre is a
//! searched configuration, so the best's highest passing load is at least that load, and a
//! pruned configuration's interval lies wholly below the best's — whatever the evaluator says,
//! since the argument uses only the loads recorded (`tests/tune_search.rs` checks it).

use std::collections::BTreeMap;
use std::time::Instant;

use kvbench_cache_api::CacheMode;
use rayon::prelude::*;

use super::rank;
use super::space::{Config, Space};

/// A configuration's highest passing and lowest failing rate (the sweep's per-seed bracket).
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
    /// Wholly below `other`: this failed at a load `other` passed.
    pub fn below(&self, other: &Bracket) -> bool {
        self.hi() <= other.lo()
    }
    /// Neither is shown below the other: statistically indistinguishable at this resolution.
    pub fn overlaps(&self, other: &Bracket) -> bool {
        !self.below(other) && !other.below(self)
    }
}

/// How far a configuration's search went.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Bracketed to the stated precision (or the search's limit).
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
    pub bracket: Bracket,
    pub status: Status,
    /// Probes spent on it (a sweep probe rerun longer counts once, as in `sweep`).
    pub probes: u32,
    /// 0 for the scenario's own configuration, then the round it was tried in.
    pub round: u32,
    /// The sweep's doubling hit its limit without a failure: the rate is a lower bound.
    pub capped: bool,
}

impl Tried {
    fn new(config: Config, round: u32) -> Tried {
        Tried {
            config,
            bracket: Bracket::default(),
            status: Status::Searched,
            probes: 0,
            round,
            capped: false,
        }
    }
}

/// A full search's outcome, as the evaluator reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Searched {
    pub bracket: Bracket,
    pub probes: u32,
    pub capped: bool,
}

/// What the search needs from the thing that measures: whether a configuration passes at a
/// load, and the sweep's full search from a starting load.
pub trait Evaluator: Sync {
    type Error: Send;
    /// Why the scenario refuses `c`, if it does.
    fn refusal(&self, c: &Config) -> Option<String>;
    /// The scenario's own load, where a search without a bracket starts.
    fn base_load(&self) -> f64;
    /// Whether `c` passes in `mode` at `load` (a resolved verdict; not passing = failing).
    fn probe(&self, c: &Config, mode: CacheMode, load: f64) -> Result<bool, Self::Error>;
    /// The sweep's search of `c` in `mode`, starting at `start`.
    fn search(&self, c: &Config, mode: CacheMode, start: f64) -> Result<Searched, Self::Error>;
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchConfig {
    /// Relative width at which bisection stops, as the sweep's.
    pub precision: f64,
    /// No probe or search starts after this instant.
    pub deadline: Option<Instant>,
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

/// The neighbour search of one cache mode (module doc).
pub fn search_mode<E: Evaluator>(
    e: &E,
    space: &Space,
    mode: CacheMode,
    cfg: &SearchConfig,
) -> Result<ModeSearch, E::Error> {
    let start = space.start();
    let first = Tried::new(start.clone(), 0);
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
        let fresh: Vec<Config> = space
            .neighbours(&c.config)
            .into_iter()
            .filter(|n| !seen.contains_key(n))
            .collect();
        if fresh.is_empty() {
            break;
        }
        round += 1;
        let results = fresh
            .par_iter()
            .map(|n| seeded(e, mode, n.clone(), round, &c.bracket, cfg))
            .collect::<Result<Vec<_>, _>>()?;
        for t in results {
            seen.insert(t.config.clone(), out.tried.len());
            out.budget_hit |= t.status == Status::Unfinished;
            out.tried.push(t);
        }
        // Better: passed above the centre's highest passing load. Among the better, the highest
        // rate, then the simpler configuration.
        let better = (0..out.tried.len())
            .filter(|&i| out.tried[i].round == round && out.tried[i].status == Status::Searched)
            .filter(|&i| out.tried[i].bracket.lo() > c.bracket.lo())
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

/// `t`'s configuration searched the sweep's way from `start`.
fn full<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    start: f64,
    cfg: &SearchConfig,
    mut t: Tried,
) -> Result<Tried, E::Error> {
    if cfg.over() {
        t.status = Status::Unfinished;
        return Ok(t);
    }
    let s = e.search(&t.config, mode, start)?;
    t.probes = t.probes.saturating_add(s.probes);
    t.bracket = s.bracket;
    t.capped = s.capped;
    t.status = Status::Searched;
    Ok(t)
}

/// Try `config` starting from the centre's bracket (module doc).
fn seeded<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    config: Config,
    round: u32,
    centre: &Bracket,
    cfg: &SearchConfig,
) -> Result<Tried, E::Error> {
    let mut t = Tried::new(config, round);
    if let Some(why) = e.refusal(&t.config) {
        t.status = Status::Refused(why);
        return Ok(t);
    }
    let Some(a) = centre.pass else {
        return full(e, mode, e.base_load(), cfg, t);
    };
    if cfg.over() {
        t.status = Status::Unfinished;
        return Ok(t);
    }
    t.probes += 1;
    if !e.probe(&t.config, mode, a)? {
        t.bracket.fail = Some(a);
        t.status = Status::Pruned;
        return Ok(t);
    }
    t.bracket.pass = Some(a);
    let Some(b) = centre.fail else {
        return gallop(e, mode, cfg, t);
    };
    if cfg.over() {
        t.status = Status::Unfinished;
        return Ok(t);
    }
    t.probes += 1;
    if e.probe(&t.config, mode, b)? {
        t.bracket.pass = Some(b);
        return gallop(e, mode, cfg, t);
    }
    t.bracket.fail = Some(b);
    bisect(e, mode, cfg, t)
}

/// Up from a passing load in growing steps (4, 8, 16… times the precision) until a probe does
/// not pass, then bisect: a neighbour's rate is near its centre's, where the sweep's doubling
/// would overshoot and spend its bisection coming back. Capped where the sweep's search is.
fn gallop<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    cfg: &SearchConfig,
    mut t: Tried,
) -> Result<Tried, E::Error> {
    let limit = e.base_load() * f64::from(1u32 << crate::sweep::search::MAX_DOUBLINGS);
    let mut step = 4.0 * cfg.precision;
    while let Some(lo) = t.bracket.pass {
        let next = lo * (1.0 + step);
        if next > limit || next <= lo {
            t.capped = true;
            t.status = Status::Searched;
            return Ok(t);
        }
        if cfg.over() {
            t.status = Status::Unfinished;
            return Ok(t);
        }
        t.probes += 1;
        if e.probe(&t.config, mode, next)? {
            t.bracket.pass = Some(next);
            step *= 2.0;
        } else {
            t.bracket.fail = Some(next);
            break;
        }
    }
    bisect(e, mode, cfg, t)
}

/// Narrow a bracket to the stated precision.
fn bisect<E: Evaluator>(
    e: &E,
    mode: CacheMode,
    cfg: &SearchConfig,
    mut t: Tried,
) -> Result<Tried, E::Error> {
    while let (Some(lo), Some(hi)) = (t.bracket.pass, t.bracket.fail) {
        let mid = (lo + hi) / 2.0;
        if hi - lo <= cfg.precision * lo || mid <= lo || mid >= hi {
            break;
        }
        if cfg.over() {
            t.status = Status::Unfinished;
            return Ok(t);
        }
        t.probes += 1;
        if e.probe(&t.config, mode, mid)? {
            t.bracket.pass = Some(mid);
        } else {
            t.bracket.fail = Some(mid);
        }
    }
    t.status = Status::Searched;
    Ok(t)
}
