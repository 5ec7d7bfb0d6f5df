//! `report.html` of a tune folder, from the deserialized `tune.json` alone (like `tune.md`), so
//! `kvbench report`-style re-rendering can recompute every figure on it: the best configuration
//! per cache mode with its `--set` line, one chart per knob through the configurations that
//! differ from the best only in that knob, and every configuration tried with its verdict.
//! The page and its charts are the sweep report's own pieces ([`crate::results::html`],
//! [`crate::results::plot`]).

use std::collections::BTreeSet;

use super::rank::Verdict;
use super::write::{per_seed_text, seeds_text, ConfigJson, KnobJson, TuneJson};
use crate::results::html::{esc, figure, note, page, table, ReportError};
use crate::results::plot::{latency, Series};

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.3}"))
}

fn ci(c: [f64; 2]) -> String {
    format!("[{:.3}, {:.3}]", c[0], c[1])
}

fn set_or_own(set: &str) -> String {
    if set.is_empty() {
        "the scenario as written".into()
    } else {
        format!("`{set}`")
    }
}

/// The configurations of `best`'s mode that differ from it in `key` alone (the best included).
pub fn slice<'a>(j: &'a TuneJson, best: &ConfigJson, key: &str) -> Vec<&'a ConfigJson> {
    j.configurations
        .iter()
        .filter(|c| c.cache == best.cache)
        .filter(|c| {
            c.values
                .iter()
                .all(|(k, v)| k == key || best.values.get(k) == Some(v))
        })
        .collect()
}

/// The knob values of every mode's slice through its best: a knob is charted when it holds two.
pub fn slice_values(j: &TuneJson, key: &str) -> BTreeSet<String> {
    j.modes
        .iter()
        .filter_map(|m| m.best.and_then(|i| j.configurations.get(i)))
        .flat_map(|b| slice(j, b, key))
        .filter_map(|c| c.values.get(key).cloned())
        .collect()
}

/// Where a value sits on the x axis: the number itself when every value of the knob is one,
/// else its position in the space's list (named in the caption).
fn x_of(k: &KnobJson, numeric: bool, value: &str) -> Option<f64> {
    if numeric {
        value.parse().ok()
    } else {
        k.values.iter().position(|v| v == value).map(|i| i as f64)
    }
}

fn knob_chart(j: &TuneJson, k: &KnobJson) -> Result<Option<String>, ReportError> {
    if slice_values(j, &k.key).len() < 2 {
        return Ok(None);
    }
    let numeric = k.values.iter().all(|v| v.parse::<f64>().is_ok());
    let mut series = Vec::new();
    for m in &j.modes {
        let Some(best) = m.best.and_then(|i| j.configurations.get(i)) else {
            continue;
        };
        let mut pts: Vec<(f64, f64, (f64, f64))> = slice(j, best, &k.key)
            .into_iter()
            .filter_map(|c| {
                let x = x_of(k, numeric, c.values.get(&k.key)?)?;
                let r = c.rate_at_target_rps?;
                let [lo, hi] = c.rate_at_target_rps_ci;
                Some((x, r, (lo, hi)))
            })
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.push(Series {
            label: m.cache.clone(),
            points: pts.iter().map(|p| (p.0, p.1)).collect(),
            ci: pts.iter().map(|p| p.2).collect(),
        });
    }
    let title = format!("Rate at target against {}", k.key);
    let x_label = if numeric {
        k.key.clone()
    } else {
        format!("{} (position in the space's list)", k.key)
    };
    let svg = latency::svg(&latency::LatencyPlot {
        title: &title,
        x_label: &x_label,
        y_label: "rate at target (req/s)",
        series: &series,
        slo: None,
        unit: "req/s",
        targets: &[],
        log_ok: false,
    })?;
    let positions = if numeric {
        String::new()
    } else {
        format!(
            " Positions: {}.",
            k.values
                .iter()
                .enumerate()
                .map(|(i, v)| format!("{i} = `{v}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Ok(Some(figure(
        &svg,
        &format!(
            "Per cache mode, the configurations of `tune.json` that differ from that mode's best only in `{}`, with error bars for each one's interval; configurations with no rate at target are left out.{positions}",
            k.key
        ),
    )))
}

fn best_table(j: &TuneJson) -> String {
    let head = [
        "cache",
        "best configuration",
        "rate at target (req/s)",
        "interval",
        "knobs moved",
        "configurations",
        "probes",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = j
        .modes
        .iter()
        .map(|m| match m.best.and_then(|i| j.configurations.get(i)) {
            Some(b) => vec![
                m.cache.clone(),
                set_or_own(&b.set),
                format!(
                    "{}{}",
                    opt(b.rate_at_target_rps),
                    if b.capped { " (limit)" } else { "" }
                ),
                ci(b.rate_at_target_rps_ci),
                b.knobs_away.to_string(),
                m.configurations.to_string(),
                m.probes.to_string(),
            ],
            None => vec![
                m.cache.clone(),
                "none met the target".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                m.configurations.to_string(),
                m.probes.to_string(),
            ],
        })
        .collect();
    table(&head, &rows)
}

/// Every configuration in `tune.json`'s order; `#` is its index there.
fn all_table(j: &TuneJson) -> String {
    let several = j.seeds.len() > 1;
    let mut head = [
        "#",
        "cache",
        "verdict",
        "configuration",
        "knobs moved",
        "rate at target (req/s)",
        "interval",
        "probes",
        "round",
    ]
    .map(String::from)
    .to_vec();
    if several {
        head.push("per seed: passing–failing (req/s)".into());
    }
    let rows: Vec<Vec<String>> = j
        .configurations
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut row = vec![
                i.to_string(),
                c.cache.clone(),
                c.verdict.name().to_string(),
                if c.set.is_empty() {
                    "as written".into()
                } else {
                    format!("`{}`", c.set)
                },
                c.knobs_away.to_string(),
                opt(c.rate_at_target_rps),
                if c.verdict == Verdict::Refused {
                    c.reason.clone().unwrap_or_default()
                } else {
                    format!(
                        "{}{}",
                        ci(c.rate_at_target_rps_ci),
                        if c.capped { " (limit)" } else { "" }
                    )
                },
                c.probes.to_string(),
                c.round.to_string(),
            ];
            if several {
                row.push(per_seed_text(c));
            }
            row
        })
        .collect();
    table(&head, &rows)
}

/// The whole `report.html` text.
pub fn report(j: &TuneJson) -> Result<String, ReportError> {
    let title = format!("kvbench tune: {}", j.scenario);
    let mut body = format!("<h1>{}</h1>\n", esc(&title));
    body.push_str(&format!(
        "<p>scenario <code>{}</code> on backend <code>{}</code>, {}, by {}, precision {}%; \
         {} probes, {:.1} s wall{}</p>\n",
        esc(&j.scenario_file),
        esc(&j.backend),
        esc(&seeds_text(j)),
        esc(&j.by),
        j.precision_pct,
        j.probes,
        j.wall_s,
        if j.budget_hit {
            "; the time budget was hit: the search stopped before it finished"
        } else {
            ""
        }
    ));
    body.push_str("<h2>Best per cache mode</h2>\n");
    body.push_str(&best_table(j));
    body.push_str(&note(&format!(
        "Search: {}. Interval: {}. Tie rule: {}",
        j.search, j.interval, j.tie_rule
    )));
    body.push_str("<h2>Each knob around the best</h2>\n");
    let mut charts = 0;
    for k in &j.space {
        if let Some(f) = knob_chart(j, k)? {
            body.push_str(&f);
            charts += 1;
        }
    }
    if charts == 0 {
        body.push_str(&note(
            "No knob was tried at two values around a best configuration.",
        ));
    }
    body.push_str("<h2>Every configuration tried</h2>\n");
    body.push_str(&all_table(j));
    if !j.check_failures.is_empty() {
        body.push_str("<h2>Check failures</h2>\n<ul>\n");
        for f in &j.check_failures {
            body.push_str(&format!("<li>{}</li>\n", esc(f)));
        }
        body.push_str("</ul>\n");
    }
    Ok(page(&title, &body))
}
