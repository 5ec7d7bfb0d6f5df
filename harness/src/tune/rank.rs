//! From the configurations tried to a verdict on each: the highest rate at target, the ones
//! indistinguishable from it, and the tie rule that names one of them best.
//!
//! **Tie rule.** Among the configurations whose interval overlaps that of the highest rate at
//! target (neither failed at a load the other passed), the best is the simplest: fewest knobs
//! moved from the scenario's values, then the smaller block size, then the higher rate, then the
//! earlier in the space's order.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use super::search::{Status, Tried};
use super::space::Space;

pub const TIE_RULE: &str = "Among the configurations whose interval overlaps that of the highest \
rate at target (neither failed at a load the other passed), the best is the simplest: fewest \
knobs moved from the scenario's values, then the smaller block size, then the higher rate, then \
the earlier in the space's order.";

/// The tie rule when each configuration is measured under several seeds.
pub const TIE_RULE_SEEDS: &str = "The top is the configuration whose interval over the seeds has \
the highest lower end. Among the configurations whose interval overlaps the top's (neither's upper \
end at or below the other's lower end), the best is the simplest: fewest knobs moved from the \
scenario's values, then the smaller block size, then the higher lower end, then the earlier in the \
space's order.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The configuration named best (tie rule).
    Best,
    /// Its interval overlaps the top's: as good, within what was measured.
    Indistinguishable,
    /// Searched, and wholly below the highest rate's interval.
    Below,
    /// Stopped once shown wholly below the best's interval.
    Pruned,
    /// Never passed, at any load the search tried.
    NoPass,
    /// The scenario refuses this combination.
    Refused,
    /// The time budget ran out first.
    Unfinished,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Best => "best",
            Verdict::Indistinguishable => "indistinguishable",
            Verdict::Below => "below",
            Verdict::Pruned => "pruned",
            Verdict::NoPass => "no_pass",
            Verdict::Refused => "refused",
            Verdict::Unfinished => "unfinished",
        }
    }
}

/// Simpler first (the tie rule's keys after the rate).
pub fn simpler(space: &Space, x: &Tried, y: &Tried) -> Ordering {
    space
        .knobs_away(&x.config)
        .cmp(&space.knobs_away(&y.config))
        .then_with(|| {
            let b = |t: &Tried| space.block_size(&t.config).unwrap_or(0.0);
            b(x).total_cmp(&b(y))
        })
}

/// Preferred first: the higher lower end of the interval (with one seed, the rate at target),
/// then the simpler, then the space's order.
pub fn preferred(space: &Space, x: &Tried, y: &Tried) -> Ordering {
    y.interval()
        .lo
        .total_cmp(&x.interval().lo)
        .then_with(|| simpler(space, x, y))
        .then_with(|| x.config.cmp(&y.config))
}

fn passed(t: &Tried) -> bool {
    t.status == Status::Searched && t.rate().is_some()
}

/// The searched configuration with the highest rate at target (ties: the simpler).
pub fn top(space: &Space, tried: &[Tried]) -> Option<usize> {
    (0..tried.len())
        .filter(|&i| passed(&tried[i]))
        .min_by(|&x, &y| preferred(space, &tried[x], &tried[y]))
}

/// Every configuration's verdict, and the index of the best.
pub fn verdicts(space: &Space, tried: &[Tried]) -> (Vec<Verdict>, Option<usize>) {
    let top = top(space, tried);
    let tied =
        |t: &Tried| top.is_some_and(|i| passed(t) && t.interval().overlaps(&tried[i].interval()));
    let best = (0..tried.len())
        .filter(|&i| tied(&tried[i]))
        .min_by(|&x, &y| {
            simpler(space, &tried[x], &tried[y])
                .then_with(|| preferred(space, &tried[x], &tried[y]))
        });
    let v = tried
        .iter()
        .enumerate()
        .map(|(i, t)| match &t.status {
            Status::Refused(_) => Verdict::Refused,
            Status::Unfinished => Verdict::Unfinished,
            Status::Pruned => Verdict::Pruned,
            Status::Searched if Some(i) == best => Verdict::Best,
            Status::Searched if tied(t) => Verdict::Indistinguishable,
            Status::Searched if t.rate().is_none() => Verdict::NoPass,
            Status::Searched => Verdict::Below,
        })
        .collect();
    (v, best)
}
