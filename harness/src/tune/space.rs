//! The space `tune` searches: knobs (dotted scenario keys) with their candidate values, read
//! from a `--space` TOML file (`key = [values]`) or the default. A configuration is one index per
//! knob; the scenario's own value is always part of each knob's list (the search starts there),
//! and a value is applied only through the `--set` override path, so a candidate is checked by
//! exactly the rules a scenario file is.

use std::path::Path;

use kvbench_cache_api::CacheMode;
use serde::{Deserialize, Serialize};

use crate::scenario::{Diagnostic, Origin, Scenario, SourceMap};

/// One index into each knob's `values`, in knob order.
pub type Config = Vec<usize>;

/// Tables a knob may live in: the serving configuration. The model, device, traffic and SLO are
/// the question being asked, and the rate is the axis every configuration is searched along.
pub const KNOB_TABLES: [&str; 3] = ["cache", "scheduler", "memory"];

/// Tables whose knobs configure only the paged cache: the contiguous baseline runs without lower
/// tiers (`experiment/tiers.rs`), so to it every value of such a knob is one configuration.
pub const PAGED_ONLY_TABLES: [&str; 2] = ["cache.host_tier", "cache.disk_tier"];

/// Whether two values of a knob are one: equal, or two byte sizes of the same bytes however
/// spelled ("1 MiB" and "1024 KiB"), which a run reads as the same capacity.
pub fn same_value(a: &toml::Value, b: &toml::Value) -> bool {
    if a == b {
        return true;
    }
    match (a, b) {
        (toml::Value::String(x), toml::Value::String(y)) => {
            match (crate::units::parse_bytes(x), crate::units::parse_bytes(y)) {
                (Ok(x), Ok(y)) => x == y,
                _ => false,
            }
        }
        _ => false,
    }
}

/// A value left out of the default space because the scenario refuses it on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeftOut {
    pub value: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Knob {
    /// Dotted scenario key, as `--set` takes it.
    pub key: String,
    /// Candidate values; `None` is "as the scenario is written" (a key it leaves unset).
    pub values: Vec<Option<toml::Value>>,
    /// Numbers: neighbours are the adjacent values. Otherwise every other value is a neighbour.
    pub ordered: bool,
    /// Index of the scenario's own value.
    pub start: usize,
    pub left_out: Vec<LeftOut>,
}

impl Knob {
    /// A knob over `values` (kept in the order given unless all are numbers, then ascending),
    /// with the scenario's value `own` added when missing.
    pub fn new(key: &str, mut values: Vec<toml::Value>, own: Option<toml::Value>) -> Knob {
        let ordered = values.iter().chain(own.iter()).all(|v| number(v).is_some());
        if let Some(o) = &own {
            if !values.iter().any(|v| same_value(v, o)) {
                values.push(o.clone());
            }
        }
        if ordered {
            values.sort_by(|a, b| {
                number(a)
                    .unwrap_or(0.0)
                    .total_cmp(&number(b).unwrap_or(0.0))
            });
        }
        let mut values: Vec<Option<toml::Value>> = values.into_iter().map(Some).collect();
        let start = match &own {
            Some(o) => values
                .iter()
                .position(|v| v.as_ref().is_some_and(|v| same_value(v, o)))
                .unwrap_or(0),
            None => {
                values.insert(0, None);
                0
            }
        };
        Knob {
            key: key.to_string(),
            values,
            ordered,
            start,
            left_out: Vec::new(),
        }
    }

    /// Whether the knob changes anything in a `mode` run ([`PAGED_ONLY_TABLES`]).
    pub fn applies_to(&self, mode: CacheMode) -> bool {
        mode == CacheMode::Paged
            || !PAGED_ONLY_TABLES.iter().any(|t| {
                self.key
                    .strip_prefix(t)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
            })
    }

    /// The value at `i` as text (`as written` for the scenario's unset key).
    pub fn text(&self, i: usize) -> String {
        match self.values.get(i) {
            Some(Some(v)) => v.to_string(),
            _ => "as written".into(),
        }
    }
}

fn number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    pub knobs: Vec<Knob>,
}

impl Space {
    /// The scenario as written: every knob at its own value.
    pub fn start(&self) -> Config {
        self.knobs.iter().map(|k| k.start).collect()
    }

    /// Whether `c` is a configuration of its own in a `mode` run: every knob that changes nothing
    /// there ([`Knob::applies_to`]) stays at the scenario's value, so no two configurations
    /// searched in that mode differ only in such a knob.
    pub fn distinct_in(&self, mode: CacheMode, c: &Config) -> bool {
        self.knobs
            .iter()
            .zip(c)
            .all(|(k, &i)| k.applies_to(mode) || i == k.start)
    }

    /// How many knobs `c` moves away from the scenario's values.
    pub fn knobs_away(&self, c: &Config) -> usize {
        self.knobs
            .iter()
            .zip(c)
            .filter(|(k, &i)| i != k.start)
            .count()
    }

    /// The `--set KEY=VALUE` overrides that turn the scenario into `c` (only the knobs it moves).
    pub fn overrides(&self, c: &Config) -> Vec<String> {
        self.knobs
            .iter()
            .zip(c)
            .filter(|(k, &i)| i != k.start)
            .filter_map(|(k, &i)| Some(format!("{}={}", k.key, k.values.get(i)?.as_ref()?)))
            .collect()
    }

    /// The same overrides as a shell line: `--set KEY=VALUE ...`, a value quoted only when the
    /// shell or the override parser needs it.
    pub fn set_line(&self, c: &Config) -> String {
        self.knobs
            .iter()
            .zip(c)
            .filter(|(k, &i)| i != k.start)
            .filter_map(|(k, &i)| {
                let v = k.values.get(i)?.as_ref()?;
                Some(format!("--set {}={}", k.key, shell_value(v)))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Configurations one knob away from `c`: the adjacent values of an ordered knob, every
    /// other value of an unordered one.
    pub fn neighbours(&self, c: &Config) -> Vec<Config> {
        let mut out = Vec::new();
        for (k, knob) in self.knobs.iter().enumerate() {
            let Some(&i) = c.get(k) else { continue };
            let others: Vec<usize> = if knob.ordered {
                [i.checked_sub(1), i.checked_add(1)]
                    .into_iter()
                    .flatten()
                    .filter(|&j| j < knob.values.len())
                    .collect()
            } else {
                (0..knob.values.len()).filter(|&j| j != i).collect()
            };
            for j in others {
                let mut n = c.clone();
                n[k] = j;
                out.push(n);
            }
        }
        out
    }

    /// Every configuration one knob away from `c`, at any value of that knob (ordered or not):
    /// the coarse first pass, which sees past a plateau or a dip next to the scenario's value.
    pub fn axis(&self, c: &Config) -> Vec<Config> {
        let mut out = Vec::new();
        for (k, knob) in self.knobs.iter().enumerate() {
            let Some(&i) = c.get(k) else { continue };
            for j in (0..knob.values.len()).filter(|&j| j != i) {
                let mut n = c.clone();
                n[k] = j;
                out.push(n);
            }
        }
        out
    }

    /// The block size of `c` when `cache.block_size` is a knob (the tie rule's second key).
    pub fn block_size(&self, c: &Config) -> Option<f64> {
        let k = self
            .knobs
            .iter()
            .position(|k| k.key == "cache.block_size")?;
        number(self.knobs[k].values.get(*c.get(k)?)?.as_ref()?)
    }

    /// Every configuration of the space (what a blind grid would try).
    pub fn size(&self) -> u64 {
        self.knobs
            .iter()
            .map(|k| k.values.len() as u64)
            .fold(1, u64::saturating_mul)
    }
}

/// A value as one shell word for `--set`: bare when the override parser reads it back as the
/// same value and the shell leaves it alone, else single-quoted TOML.
fn shell_value(v: &toml::Value) -> String {
    let safe = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-+".contains(c))
    };
    if let toml::Value::String(s) = v {
        let reads_as_other = toml::from_str::<toml::Table>(&format!("v = {s}")).is_ok();
        if safe(s) && !reads_as_other {
            return s.clone();
        }
    }
    let text = v.to_string();
    if safe(&text) {
        text
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// The scenario's value at a dotted key (a list's first entry: a run uses the first block
/// size), or `None` when the scenario leaves it unset.
pub fn own_value(s: &Scenario, key: &str) -> Option<toml::Value> {
    let mut v = toml::Value::try_from(s).ok()?;
    for part in key.split('.') {
        v = v.as_table()?.get(part)?.clone();
    }
    match v {
        toml::Value::Array(a) => a.first().cloned(),
        v => Some(v),
    }
}

/// Every value a scheduler enum takes (a match without a wildcard: a new variant stops the
/// build here until the space knows it).
fn policy_values() -> Vec<toml::Value> {
    use crate::scenario::PolicyName as P;
    let all = [P::DecodeFirst, P::PrefillFirst];
    for p in all {
        match p {
            P::DecodeFirst | P::PrefillFirst => {}
        }
    }
    all.iter()
        .filter_map(|p| toml::Value::try_from(p).ok())
        .collect()
}

fn preemption_values() -> Vec<toml::Value> {
    use crate::scenario::PreemptionMode as P;
    let all = [P::Recompute, P::Swap];
    for p in all {
        match p {
            P::Recompute | P::Swap => {}
        }
    }
    all.iter()
        .filter_map(|p| toml::Value::try_from(p).ok())
        .collect()
}

/// The default space: block size, chunk size (tokens per step), policy, preemption and the
/// sequences per step, each with the scenario's own value added. A value the scenario refuses
/// on its own (`check` fails for `KEY=VALUE` alone) is left out and recorded.
pub fn default_space(s: &Scenario, check: impl Fn(&str) -> Result<(), String>) -> Space {
    let ints = |xs: &[i64]| xs.iter().map(|&x| toml::Value::Integer(x)).collect();
    let lists: Vec<(&str, Vec<toml::Value>)> = vec![
        ("cache.block_size", ints(&[8, 16, 32, 64])),
        (
            "scheduler.max_tokens_per_step",
            ints(&[512, 1024, 2048, 4096, 8192]),
        ),
        ("scheduler.policy", policy_values()),
        ("scheduler.preemption", preemption_values()),
        ("scheduler.max_seqs_per_step", ints(&[64, 128, 256, 512])),
    ];
    let knobs = lists
        .into_iter()
        .map(|(key, values)| {
            let own = own_value(s, key);
            let mut left_out = Vec::new();
            let kept = values
                .into_iter()
                .filter(|v| {
                    if Some(v) == own.as_ref() {
                        return true;
                    }
                    match check(&format!("{key}={v}")) {
                        Ok(()) => true,
                        Err(reason) => {
                            left_out.push(LeftOut {
                                value: v.to_string(),
                                reason,
                            });
                            false
                        }
                    }
                })
                .collect();
            let mut k = Knob::new(key, kept, own);
            k.left_out = left_out;
            k
        })
        .collect();
    Space { knobs }
}

/// Read a `--space` file: every leaf `key = [values]` under [`KNOB_TABLES`] becomes a knob, each
/// value checked alone through the override path (`check`). Every problem is reported as
/// `FILE:LINE:COL: KEY: message`.
pub fn parse_space(
    text: &str,
    path: &Path,
    s: &Scenario,
    check: impl Fn(&str) -> Result<(), String>,
) -> Result<Space, Vec<Diagnostic>> {
    let at = |map: Option<&SourceMap>, key: &str, message: String| {
        let (line, col) = map.map_or((1, 1), |m| m.position_of(key));
        Diagnostic {
            origin: Origin::File {
                path: path.to_path_buf(),
                line,
                col,
            },
            key: key.to_string(),
            message,
        }
    };
    let map = SourceMap::parse(text).map_err(|(message, offset)| {
        let (line, col) = line_col(text, offset);
        vec![Diagnostic {
            origin: Origin::File {
                path: path.to_path_buf(),
                line,
                col,
            },
            key: "(syntax)".into(),
            message,
        }]
    })?;
    let table: toml::Table = toml::from_str(text)
        .map_err(|e| vec![at(Some(&map), "(syntax)", e.message().trim().to_string())])?;
    let mut leaves = Vec::new();
    flatten("", &toml::Value::Table(table), &mut leaves);
    let mut problems = Vec::new();
    let mut knobs = Vec::new();
    for (key, value) in leaves {
        let p = |m: String| at(Some(&map), &key, m);
        let top = key.split('.').next().unwrap_or("");
        if !KNOB_TABLES.contains(&top) || !key.contains('.') {
            problems.push(p(format!(
                "not a knob tune searches: knobs are keys under {} (the model, device, traffic \
                 and SLO are the question; the rate is the searched axis)",
                KNOB_TABLES.join(", ")
            )));
            continue;
        }
        let toml::Value::Array(values) = value else {
            problems.push(p(format!(
                "expected a list of values, e.g. {key} = [{value}]"
            )));
            continue;
        };
        if values.is_empty() {
            problems.push(p("an empty list: give at least one value".into()));
            continue;
        }
        let mut seen: Vec<&toml::Value> = Vec::new();
        let mut bad = false;
        for v in &values {
            if let Some(first) = seen.iter().find(|w| same_value(w, v)) {
                let bytes = v
                    .as_str()
                    .and_then(|t| crate::units::parse_bytes(t).ok())
                    .filter(|_| *first != v);
                problems.push(p(match bytes {
                    None => format!("{v} is listed twice"),
                    Some(b) => {
                        format!("{first} and {v} are the same size ({b} bytes): list it once")
                    }
                }));
                bad = true;
                continue;
            }
            seen.push(v);
            if let Err(reason) = check(&format!("{key}={v}")) {
                problems.push(p(format!("value {v}: {reason}")));
                bad = true;
            }
        }
        if !bad {
            knobs.push(Knob::new(&key, values, own_value(s, &key)));
        }
    }
    if knobs.is_empty() && problems.is_empty() {
        problems.push(at(
            None,
            "(top level)",
            "no knob: write key = [values]".into(),
        ));
    }
    if problems.is_empty() {
        Ok(Space { knobs })
    } else {
        Err(problems)
    }
}

/// 1-based line and column of a byte offset (the file did not parse, so no `SourceMap`).
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Leaves of a table as `(dotted key, value)`, tables walked, anything else a leaf.
fn flatten(prefix: &str, v: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        v => out.push((prefix.to_string(), v.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_knob(key: &str, xs: &[i64], own: i64) -> Knob {
        Knob::new(
            key,
            xs.iter().map(|&x| toml::Value::Integer(x)).collect(),
            Some(toml::Value::Integer(own)),
        )
    }

    #[test]
    fn own_value_joins_the_list_in_order_and_starts_there() {
        let k = int_knob("cache.block_size", &[32, 8, 64], 16);
        assert_eq!(k.values.len(), 4);
        assert_eq!(k.text(k.start), "16");
        assert_eq!(k.text(0), "8");
        assert!(k.ordered);
    }

    #[test]
    fn neighbours_are_adjacent_for_numbers_and_all_others_for_names() {
        let s = Space {
            knobs: vec![
                int_knob("cache.block_size", &[8, 16, 32], 16),
                Knob::new(
                    "scheduler.policy",
                    vec!["decode_first".into(), "prefill_first".into()],
                    Some("decode_first".into()),
                ),
            ],
        };
        let n = s.neighbours(&s.start());
        assert_eq!(n, vec![vec![0, 0], vec![2, 0], vec![1, 1]]);
        assert_eq!(s.knobs_away(&vec![2, 1]), 2);
        assert_eq!(
            s.set_line(&vec![2, 1]),
            "--set cache.block_size=32 --set scheduler.policy=prefill_first"
        );
        assert_eq!(
            s.overrides(&vec![2, 1]),
            vec!["cache.block_size=32", "scheduler.policy=\"prefill_first\""]
        );
    }

    #[test]
    fn a_string_that_reads_as_another_type_is_quoted() {
        assert_eq!(
            shell_value(&toml::Value::String("true".into())),
            "'\"true\"'"
        );
        assert_eq!(
            shell_value(&toml::Value::String("8 GiB".into())),
            "'\"8 GiB\"'"
        );
        assert_eq!(shell_value(&toml::Value::String("swap".into())), "swap");
    }
}
