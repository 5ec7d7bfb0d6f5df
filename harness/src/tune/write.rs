//! `tune.json` (every configuration tried) and `tune.md` (written from `tune.json`'s figures
//! only: [`markdown`] takes the JSON, so every number in the page can be recomputed from it) and
//! `report.html` (likewise, [`super::html`]),
//! staged and renamed into place like every results folder.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::rank::{self, Verdict};
use super::search::{Bracket, Status};
use super::space::LeftOut;
use super::Tune;
use crate::results::{ResultsError, Staging};

pub const INTERVAL_SEEDS: &str = "the sweep's interval over the seeds, [mean(a) − t·sd(a)/√n, \
mean(b) + t·sd(b)/√n] of the per-seed brackets [a, b] (highest passing, lowest failing rate; b = a \
where a seed's search hit its limit), each probe's verdict itself resolved at 95%; a configuration \
a seed never passed has [0, the highest rate it failed at]";

pub const SEARCH: &str = "the scenario as written searched as the sweep searches, on every seed; \
round 1 a coarse pass, every value of every knob with the others as written; then rounds of \
single-knob neighbours of the centre (adjacent values of a number, every other value of a name). \
A configuration is probed on every seed at the lower end of the centre's interval and pruned when \
it passes on none (its interval then lies wholly below the centre's, and so the best's)";

pub const SEARCH_LOCAL: &str = "the scenario as written searched as the sweep searches, on every \
seed; then rounds of single-knob neighbours of the centre (adjacent values of a number, every \
other value of a name), no coarse pass. A configuration is probed on every seed at the lower end \
of the centre's interval and pruned when it passes on none";

pub const INTERVAL: &str = "one seed: the sweep's one-seed interval, [highest passing, lowest \
failing] rate, each probe's verdict itself resolved at 95% (p99 order-statistic and Wilson \
intervals); a pruned configuration's is [0, the rate it failed at]";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SloJson {
    pub ttft_p99_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub attainment: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnobJson {
    pub key: String,
    pub values: Vec<String>,
    pub scenario_value: String,
    /// Neighbours are adjacent values (numbers) rather than every other value.
    pub ordered: bool,
    pub left_out: Vec<LeftOut>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigJson {
    pub cache: String,
    /// Knob → value (`as written`: the scenario leaves the key unset).
    pub values: BTreeMap<String, String>,
    /// The `--set` line that turns the scenario into this configuration.
    pub set: String,
    pub knobs_away: usize,
    pub block_size: Option<f64>,
    /// Highest passing rate, mean over the seeds (`null`: some seed passed nowhere, or pruned
    /// before any did).
    pub rate_at_target_rps: Option<f64>,
    pub rate_at_target_rps_ci: [f64; 2],
    /// Lowest failing rate, mean over the seeds (`null` when some seed found none).
    pub lowest_failing_rps: Option<f64>,
    /// Each seed's bracket, in `seeds` order.
    #[serde(default)]
    pub per_seed: Vec<SeedJson>,
    pub capped: bool,
    pub verdict: Verdict,
    pub probes: u32,
    pub round: u32,
    /// Why the scenario refuses it (verdict `refused`).
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedJson {
    pub seed: u64,
    /// This seed's highest passing rate (`null`: none passed).
    pub rate_at_target_rps: Option<f64>,
    pub lowest_failing_rps: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeJson {
    pub cache: String,
    /// Index into `configurations` of the best (`null`: nothing passed).
    pub best: Option<usize>,
    pub best_set: Option<String>,
    pub rate_at_target_rps: Option<f64>,
    pub rate_at_target_rps_ci: [f64; 2],
    pub configurations: usize,
    pub probes: u32,
    /// Indexes into `configurations` of each centre the search moved through.
    pub path: Vec<usize>,
    pub budget_hit: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneJson {
    pub scenario: String,
    pub scenario_file: String,
    pub base_overrides: Vec<String>,
    pub backend: String,
    pub device: Option<String>,
    pub seed: u64,
    /// Every seed each configuration was measured under (the first is `seed`).
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// The search in words (the coarse pass, the rounds, the prune rule).
    #[serde(default)]
    pub search: String,
    pub by: String,
    pub precision_pct: f64,
    pub max_extend: u32,
    pub requests: Option<u32>,
    pub slo: SloJson,
    pub space_file: Option<String>,
    pub space: Vec<KnobJson>,
    /// Configurations a blind grid would run per mode.
    pub grid_size: u64,
    pub budget_s: Option<f64>,
    pub budget_hit: bool,
    pub wall_s: f64,
    pub probes: u32,
    pub interval: String,
    pub tie_rule: String,
    pub modes: Vec<ModeJson>,
    pub configurations: Vec<ConfigJson>,
    pub checks_ok: bool,
    pub check_failures: Vec<String>,
}

/// The sweep's interval over the per-seed brackets (`stats::bracket_interval`, with
/// `b = a` where a seed's search hit its limit, as the sweep has it); `[0, highest failing]` when
/// some seed never passed.
pub fn interval(per_seed: &[Bracket]) -> [f64; 2] {
    let a: Option<Vec<f64>> = per_seed.iter().map(|b| b.pass).collect();
    match a {
        Some(a) if !a.is_empty() => {
            let b: Vec<f64> = per_seed
                .iter()
                .zip(&a)
                .map(|(b, &a)| b.fail.unwrap_or(a).max(a))
                .collect();
            crate::stats::bracket_interval(&a, &b)
        }
        _ => [
            0.0,
            per_seed.iter().filter_map(|b| b.fail).fold(0.0, f64::max),
        ],
    }
}

/// The mean of the seeds' failing rates, when every seed has one.
fn mean_fail(per_seed: &[Bracket]) -> Option<f64> {
    let f: Vec<f64> = per_seed.iter().map(|b| b.fail).collect::<Option<_>>()?;
    (!f.is_empty()).then(|| crate::stats::mean_sd(&f).0)
}

pub fn to_json(t: &Tune) -> TuneJson {
    let space = &t.space;
    let mut configurations = Vec::new();
    let mut modes = Vec::new();
    for m in &t.modes {
        let cache = m.mode.name().to_string();
        let (verdicts, best) = rank::verdicts(space, &m.tried);
        let offset = configurations.len();
        for (tr, v) in m.tried.iter().zip(&verdicts) {
            configurations.push(ConfigJson {
                cache: cache.clone(),
                values: space
                    .knobs
                    .iter()
                    .zip(&tr.config)
                    .map(|(k, &i)| (k.key.clone(), k.text(i)))
                    .collect(),
                set: space.set_line(&tr.config),
                knobs_away: space.knobs_away(&tr.config),
                block_size: space.block_size(&tr.config),
                rate_at_target_rps: tr.rate().filter(|_| tr.status == Status::Searched),
                rate_at_target_rps_ci: interval(&tr.per_seed),
                lowest_failing_rps: mean_fail(&tr.per_seed),
                per_seed: t
                    .seeds
                    .iter()
                    .zip(&tr.per_seed)
                    .map(|(&seed, b)| SeedJson {
                        seed,
                        rate_at_target_rps: b.pass,
                        lowest_failing_rps: b.fail,
                    })
                    .collect(),
                capped: tr.capped,
                verdict: *v,
                probes: tr.probes,
                round: tr.round,
                reason: match &tr.status {
                    Status::Refused(why) => Some(why.clone()),
                    _ => None,
                },
            });
        }
        let b = best.map(|i| &m.tried[i]);
        modes.push(ModeJson {
            cache,
            best: best.map(|i| offset + i),
            best_set: b.map(|b| space.set_line(&b.config)),
            rate_at_target_rps: b.and_then(|b| b.rate()),
            rate_at_target_rps_ci: b.map_or([0.0, 0.0], |b| interval(&b.per_seed)),
            configurations: m.tried.len(),
            probes: m.probes(),
            path: m.path.iter().map(|i| offset + i).collect(),
            budget_hit: m.budget_hit,
        });
    }
    let slo = &t.scenario.slo;
    TuneJson {
        scenario: t.scenario.name.clone(),
        scenario_file: t.scenario_path.display().to_string(),
        base_overrides: t.base_overrides.clone(),
        backend: t.backend.into(),
        device: crate::results::env::device_identity(&t.scenario),
        seed: t.seed,
        seeds: t.seeds.clone(),
        search: match t.config.coarse_first {
            true => SEARCH,
            false => SEARCH_LOCAL,
        }
        .into(),
        by: "rate".into(),
        precision_pct: t.config.search.precision * 100.0,
        max_extend: t.config.search.max_extend,
        requests: t.scenario.traffic.requests,
        slo: SloJson {
            ttft_p99_ms: slo.ttft_p99_ms,
            itl_p99_ms: slo.itl_p99_ms,
            attainment: slo.attainment,
        },
        space_file: t.space_file.as_ref().map(|p| p.display().to_string()),
        space: space
            .knobs
            .iter()
            .map(|k| KnobJson {
                key: k.key.clone(),
                values: (0..k.values.len()).map(|i| k.text(i)).collect(),
                scenario_value: k.text(k.start),
                ordered: k.ordered,
                left_out: k.left_out.clone(),
            })
            .collect(),
        grid_size: space.size(),
        budget_s: t.config.budget.map(|d| d.as_secs_f64()),
        budget_hit: t.modes.iter().any(|m| m.budget_hit),
        wall_s: t.wall_s,
        probes: t.modes.iter().map(|m| m.probes()).sum(),
        interval: match t.seeds.len() > 1 {
            true => INTERVAL_SEEDS,
            false => INTERVAL,
        }
        .into(),
        tie_rule: match t.seeds.len() > 1 {
            true => rank::TIE_RULE_SEEDS,
            false => rank::TIE_RULE,
        }
        .into(),
        modes,
        configurations,
        checks_ok: t.check_failures.is_empty(),
        check_failures: t.check_failures.clone(),
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.3}"))
}

fn ci(c: [f64; 2]) -> String {
    format!("[{:.3}, {:.3}]", c[0], c[1])
}

/// Each seed's rate at target and lowest failing rate: `SEED: a–b`, `-` where a seed has none.
pub fn per_seed_text(c: &ConfigJson) -> String {
    c.per_seed
        .iter()
        .map(|s| {
            format!(
                "{}: {}–{}",
                s.seed,
                opt(s.rate_at_target_rps),
                opt(s.lowest_failing_rps)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `seed S`, or `seeds S, T, U` when several.
pub fn seeds_text(j: &TuneJson) -> String {
    match j.seeds.len() > 1 {
        true => format!(
            "seeds {}",
            j.seeds
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        false => format!("seed {}", j.seed),
    }
}

fn set_or_own(set: &str) -> String {
    if set.is_empty() {
        "the scenario as written".into()
    } else {
        format!("`{set}`")
    }
}

/// `tune.md`, from the JSON alone.
pub fn markdown(j: &TuneJson) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# kvbench tune: {}\n", j.scenario);
    let target = [
        j.slo.ttft_p99_ms.map(|t| format!("p99 TTFT ≤ {t} ms")),
        j.slo
            .itl_p99_ms
            .map(|t| format!("p99 inter-token gap ≤ {t} ms")),
        Some(format!("attainment ≥ {}", j.slo.attainment)),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    let requests = j.requests.map_or_else(
        || "the scenario's duration".into(),
        |n| format!("{n} requests"),
    );
    let extra = if j.base_overrides.is_empty() {
        String::new()
    } else {
        format!(" with `--set {}`", j.base_overrides.join(" --set "))
    };
    let _ = writeln!(
        md,
        "`{}`{extra} on backend `{}`, {}, {requests} a probe (up to {}x when unresolved), by {}, precision {}%; target: {target}.\n",
        j.scenario_file, j.backend, seeds_text(j), j.max_extend, j.by, j.precision_pct
    );
    let _ = writeln!(
        md,
        "Space: {} — {} knobs, {} configurations per mode in a full grid. Tried {} in {} probes, {:.1} s wall{}.\n",
        j.space_file
            .as_ref()
            .map_or_else(|| "the default".into(), |f| format!("`{f}`")),
        j.space.len(),
        j.grid_size,
        j.modes
            .iter()
            .map(|m| format!("{} ({})", m.configurations, m.cache))
            .collect::<Vec<_>>()
            .join(" and "),
        j.probes,
        j.wall_s,
        match (j.budget_hit, j.budget_s) {
            (true, Some(b)) => format!(
                "; **the time budget of {b} s was hit**: the search stopped before it finished"
            ),
            _ => String::new(),
        }
    );
    for k in &j.space {
        let _ = writeln!(
            md,
            "- `{}` ∈ {{{}}} (scenario: {})",
            k.key,
            k.values.join(", "),
            k.scenario_value
        );
        for l in &k.left_out {
            let _ = writeln!(md, "  - left out {}: {}", l.value, l.reason);
        }
    }
    let _ = writeln!(
        md,
        "\nSearch: {}.\n\nInterval: {}.\n\nTie rule: {}\n",
        j.search, j.interval, j.tie_rule
    );
    let several = j.seeds.len() > 1;
    for m in &j.modes {
        let _ = writeln!(md, "## {}\n", m.cache);
        match m.best.and_then(|i| j.configurations.get(i)) {
            Some(b) => {
                let _ = writeln!(
                    md,
                    "Best: {} — rate at target {} req/s, interval {}{} (knobs moved: {}). {} configurations, {} probes{}.\n",
                    set_or_own(&b.set),
                    opt(b.rate_at_target_rps),
                    ci(b.rate_at_target_rps_ci),
                    if b.capped { " (search limit: a lower bound)" } else { "" },
                    b.knobs_away,
                    m.configurations,
                    m.probes,
                    if m.budget_hit { ", budget hit" } else { "" }
                );
                if several {
                    let _ = writeln!(
                        md,
                        "Per seed (passing–failing, req/s): {}.\n",
                        per_seed_text(b)
                    );
                }
                let runner = j
                    .configurations
                    .iter()
                    .filter(|c| c.cache == m.cache && c.verdict == Verdict::Indistinguishable)
                    .max_by(|x, y| {
                        x.rate_at_target_rps_ci[0].total_cmp(&y.rate_at_target_rps_ci[0])
                    });
                if let Some(r) = runner {
                    let _ = writeln!(
                        md,
                        "Runner-up, statistically indistinguishable (intervals overlap): {} — rate at target {} req/s, interval {}.\n",
                        set_or_own(&r.set),
                        opt(r.rate_at_target_rps),
                        ci(r.rate_at_target_rps_ci)
                    );
                }
            }
            None => {
                let _ = writeln!(
                    md,
                    "No configuration tried met the target at any load. {} configurations, {} probes.\n",
                    m.configurations, m.probes
                );
            }
        }
        let _ = writeln!(
            md,
            "| verdict | configuration | knobs moved | rate at target (req/s) | interval | probes | round |{}\n| --- | --- | --- | --- | --- | --- | --- |{}",
            if several { " per seed: passing–failing (req/s) |" } else { "" },
            if several { " --- |" } else { "" }
        );
        let mut rows: Vec<&ConfigJson> = j
            .configurations
            .iter()
            .filter(|c| c.cache == m.cache)
            .collect();
        rows.sort_by(|x, y| {
            order(x.verdict)
                .cmp(&order(y.verdict))
                .then(y.rate_at_target_rps_ci[0].total_cmp(&x.rate_at_target_rps_ci[0]))
                .then(x.knobs_away.cmp(&y.knobs_away))
        });
        for c in rows {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {}{} | {} | {} | {} |{}",
                c.verdict.name(),
                if c.set.is_empty() {
                    "as written".into()
                } else {
                    format!("`{}`", c.set)
                },
                c.knobs_away,
                opt(c.rate_at_target_rps),
                if c.capped { " (limit)" } else { "" },
                if c.verdict == Verdict::Refused {
                    c.reason.clone().unwrap_or_default().replace('|', "/")
                } else {
                    ci(c.rate_at_target_rps_ci)
                },
                c.probes,
                c.round,
                if several {
                    format!(" {} |", per_seed_text(c))
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(md);
    }
    if !j.check_failures.is_empty() {
        let _ = writeln!(md, "## Check failures\n");
        for f in &j.check_failures {
            let _ = writeln!(md, "- {f}");
        }
    }
    md
}

fn order(v: Verdict) -> u8 {
    match v {
        Verdict::Best => 0,
        Verdict::Indistinguishable => 1,
        Verdict::Below => 2,
        Verdict::Pruned => 3,
        Verdict::NoPass => 4,
        Verdict::Unfinished => 5,
        Verdict::Refused => 6,
    }
}

/// A few lines for the terminal: per mode the best and the `--set` line that reproduces it
/// (with the backend the search ran on: `sweep`'s default, `auto`, may pick another).
pub fn summary_lines(j: &TuneJson) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} on {}: {} probes, {:.1} s wall{}",
        j.scenario,
        j.backend,
        j.probes,
        j.wall_s,
        if j.budget_hit {
            " (time budget hit: the search stopped early)"
        } else {
            ""
        }
    );
    let base: String = j
        .base_overrides
        .iter()
        .map(|o| format!(" --set {}", shell_word(o)))
        .collect();
    for m in &j.modes {
        let line = match m.best.and_then(|i| j.configurations.get(i)) {
            Some(b) => format!(
                "best rate at target {} req/s {} ({} configurations, {} probes){}\n             reproduce: kvbench sweep {} --backend {}{base}{}{}",
                opt(b.rate_at_target_rps),
                ci(b.rate_at_target_rps_ci),
                m.configurations,
                m.probes,
                if b.set.is_empty() {
                    ": the scenario as written"
                } else {
                    ""
                },
                shell_word(&j.scenario_file),
                shell_word(&j.backend),
                if b.set.is_empty() { "" } else { " " },
                b.set
            ),
            None => format!(
                "no configuration met the target ({} configurations, {} probes)",
                m.configurations, m.probes
            ),
        };
        let _ = writeln!(s, "  {:<10} {line}", m.cache);
    }
    s
}

/// One shell word: as it is when the shell leaves it alone, else single-quoted.
fn shell_word(w: &str) -> String {
    let safe = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-+=/,:@".contains(c));
    if safe {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

/// Write `tune.json`, `tune.md` and `report.html` into `out` at once (staged, renamed into
/// place). The page is rendered before anything is staged, so a failed chart writes nothing.
pub fn write_folder(j: &TuneJson, out: &Path, replace: bool) -> Result<(), ResultsError> {
    let html = super::html::report(j)?;
    let staging = Staging::begin(out, crate::results::marker::Kind::Tune, replace)?;
    let io = |p: &Path, e: std::io::Error| ResultsError::Io {
        path: p.to_path_buf(),
        err: e,
    };
    let json = serde_json::to_string_pretty(j)
        .map_err(|e| io(&out.join("tune.json"), std::io::Error::other(e)))?;
    for (name, text) in [
        ("tune.json", json + "\n"),
        ("tune.md", markdown(j)),
        ("report.html", html),
    ] {
        let p = staging.dir().join(name);
        std::fs::write(&p, text).map_err(|e| io(&p, e))?;
    }
    staging.commit()
}
