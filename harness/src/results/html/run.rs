//! The page of one run folder. First screen: the verdict (paged ÷ contiguous, SLO met or not,
//! from `summary.json`), then `report.md`'s table. Below: TTFT and inter-token CDFs per cache
//! mode on log time axes (`requests.csv`, `trace.jsonl`), and both modes' KV memory on one time
//! axis (`memory.csv`, with the budget and interval from `summary.json`).

use std::path::Path;

use super::super::plot::data::{self, file_error};
use super::super::plot::{cdf, memory, Series};
use super::{figure, markdown, note, verdict, ReportError};

fn cdf_series(samples: &data::ByCache<Vec<u64>>) -> Vec<Series> {
    samples
        .iter()
        .map(|(cache, v)| Series {
            label: format!("{cache} (n={})", v.len()),
            points: cdf::points(v),
            ci: Vec::new(),
        })
        .collect()
}

/// What the ledger's categories are, for the memory caption.
const CATEGORIES: &str = "live: tokens written and still needed; allocated, unfilled: reserved \
for a sequence but not yet written (the waste a contiguous cache reserves up front); cached free: \
blocks no running sequence holds that keep their tokens for a later prompt with the same prefix — \
reusable at once, and evicted (least recently used first) when a new block is needed; pending \
free: released but waiting for an in-flight step to finish; free: empty.";

pub fn page(dir: &Path) -> Result<(String, String), ReportError> {
    let md_path = dir.join("report.md");
    let md = std::fs::read_to_string(&md_path).map_err(|e| file_error(&md_path, e))?;
    let title = md
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .unwrap_or("kvbench run")
        .to_string();
    let summary = data::run_folder(dir)?;
    // The title, the verdict right under it, then report.md's own content.
    let mut lines = md.lines();
    let first = lines.next().unwrap_or("");
    let mut body = markdown(first);
    body.push_str(&verdict::run(&summary));
    body.push_str(&markdown(&lines.collect::<Vec<_>>().join("\n")));

    body.push_str("<h2>Latency distributions</h2>\n");
    let ttft = data::ttft_ns(dir)?;
    if ttft.iter().all(|(_, v)| v.is_empty()) {
        body.push_str(&note("No request produced a first token: no TTFT to plot."));
    } else {
        let svg = cdf::svg("TTFT CDF", "time to first token", &cdf_series(&ttft), true)?;
        body.push_str(&figure(
            &svg,
            "Time to first token (first_token_ms − arrival_ms) of every stream that was not rejected, from `requests.csv`; log time axis.",
        ));
    }
    match data::itl_ns(dir)? {
        Some(itl) => {
            let svg = cdf::svg(
                "Inter-token gap CDF",
                "gap between tokens",
                &cdf_series(&itl),
                true,
            )?;
            body.push_str(&figure(
                &svg,
                "Gaps between consecutive tokens of each stream, from the `first_token`/`token` lines of `trace.jsonl`; log time axis.",
            ));
        }
        None => body.push_str(&note(
            "trace.jsonl holds no per-token lines (written with --trace-level requests, or no stream produced a second token): no inter-token CDF.",
        )),
    }

    body.push_str("<h2>KV memory</h2>\n");
    let timelines = data::memory(dir)?;
    let panels: Vec<memory::Panel<'_>> = timelines
        .iter()
        .filter(|(_, t)| !t.t_ms.is_empty())
        .map(|(cache, timeline)| {
            let run = summary.runs.iter().find(|r| &r.cache == cache);
            memory::Panel {
                cache,
                timeline,
                budget_bytes: run.and_then(|r| r.memory.kv_budget_bytes),
                interval_ms: run.and_then(|r| r.memory_resolution_ms),
            }
        })
        .collect();
    if panels.is_empty() {
        body.push_str(&note("memory.csv holds no rows: no memory timeline."));
    } else {
        let svg = memory::svg("KV memory by ledger category", &panels)?;
        let rows: Vec<String> = panels
            .iter()
            .map(|p| match p.interval_ms {
                Some(ms) => format!(
                    "{} {} intervals of {}",
                    p.cache,
                    p.timeline.t_ms.len(),
                    super::super::plot::ticks::fmt_time_ms(ms)
                ),
                None => format!("{} {} steps", p.cache, p.timeline.t_ms.len()),
            })
            .collect();
        let mut how = String::new();
        if panels.iter().any(|p| p.interval_ms.is_none()) {
            how.push_str(
                "A row per step is drawn stacked: its categories add up to the KV budget. ",
            );
        }
        if panels.iter().any(|p| p.interval_ms.is_some()) {
            how.push_str("A row per interval holds each category's maximum over that interval; maxima of different steps do not add up, so they are drawn as separate lines, not stacked. ");
        }
        body.push_str(&figure(
            &svg,
            &format!(
                "Each cache mode's KV budget by ledger category over time, on one time axis, from `memory.csv` ({}); dashed red: the KV budget (`summary.json`). {how}{CATEGORIES}",
                rows.join(", ")
            ),
        ));
    }
    Ok((title, body))
}
