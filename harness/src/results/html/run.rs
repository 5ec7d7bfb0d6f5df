//! The page of one run folder: `report.md`'s table and checks, TTFT and inter-token CDFs per
//! cache mode (`requests.csv`, `trace.jsonl`), and the KV memory timeline per mode
//! (`memory.csv`).

use std::path::Path;

use super::super::plot::data::{self, file_error};
use super::super::plot::{cdf, memory, Series};
use super::{figure, markdown, note, ReportError};

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

pub fn page(dir: &Path) -> Result<(String, String), ReportError> {
    let md_path = dir.join("report.md");
    let md = std::fs::read_to_string(&md_path).map_err(|e| file_error(&md_path, e))?;
    let title = md
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .unwrap_or("kvbench run")
        .to_string();
    let mut body = markdown(&md);

    body.push_str("<h2>Latency distributions</h2>\n");
    let ttft = data::ttft_ns(dir)?;
    if ttft.iter().all(|(_, v)| v.is_empty()) {
        body.push_str(&note("No request produced a first token: no TTFT to plot."));
    } else {
        let svg = cdf::svg("TTFT CDF", "time to first token (ms)", &cdf_series(&ttft))?;
        body.push_str(&figure(
            &svg,
            "Time to first token (first_token_ms − arrival_ms) of every stream that was not rejected, from `requests.csv`.",
        ));
    }
    match data::itl_ns(dir)? {
        Some(itl) => {
            let svg = cdf::svg("Inter-token gap CDF", "gap between tokens (ms)", &cdf_series(&itl))?;
            body.push_str(&figure(
                &svg,
                "Gaps between consecutive tokens of each stream, from the `first_token`/`token` lines of `trace.jsonl`.",
            ));
        }
        None => body.push_str(&note(
            "trace.jsonl holds no per-token lines (written with --trace-level requests, or no stream produced a second token): no inter-token CDF.",
        )),
    }

    body.push_str("<h2>KV memory</h2>\n");
    for (cache, timeline) in data::memory(dir)? {
        if timeline.t_ms.is_empty() {
            continue;
        }
        let svg = memory::svg(&format!("KV memory, {cache}"), &timeline)?;
        body.push_str(&figure(
            &svg,
            &format!(
                "The {cache} cache's KV budget by ledger category at the end of each step, from `memory.csv` ({} steps).",
                timeline.t_ms.len()
            ),
        ));
    }
    Ok((title, body))
}
