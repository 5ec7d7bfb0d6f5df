//! `report.html`: one self-contained page per results folder — a run, a sweep or a suite —
//! written beside `report.md`/`sweep.md`/`suite.md`. Tables and inline SVG plots only: no
//! scripts or styles from elsewhere, no network, and a Content-Security-Policy that forbids
//! loading anything, so the page reads the same from an archive years later.
//!
//! Every figure on the page is read back from the folder's own files (see
//! [`super::plot::data`]), never from the in-memory experiment, so `kvbench report DIR`
//! re-renders any folder and the page cannot show a number the folder does not hold.
//!
//! The page carries a small inline check: on load it verifies that every `<svg>` drew something
//! and that nothing failed to load, and records the verdict on `#kvbench-check`
//! (`data-status="ok"`, `data-plots=N`), with where the verdict line ends on screen
//! (`data-verdict-bottom`, `data-viewport`, CSS pixels), which the headless-browser tests read.

mod run;
mod suite;
mod sweep;
mod tiers;
mod verdict;

use std::path::{Path, PathBuf};

use super::plot::data::file_error;
pub use super::plot::data::FileError;
use super::plot::PlotError;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error("{}: not a results folder (no summary.json, sweep.json or suite.json/suite.csv)", .0.display())]
    NotResults(PathBuf),
}

/// What kind of results folder `dir` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Run,
    Sweep,
    Suite,
}

pub fn kind(dir: &Path) -> Option<Kind> {
    if dir.join("sweep.json").is_file() {
        Some(Kind::Sweep)
    } else if dir.join("suite.json").is_file() || dir.join("suite.csv").is_file() {
        Some(Kind::Suite)
    } else if dir.join("summary.json").is_file() {
        Some(Kind::Run)
    } else {
        None
    }
}

/// (Re)render `dir/report.html` for whatever kind of folder `dir` is; for a suite, each of its
/// cells' pages too (those that kept their raw files). Returns the pages written.
pub fn write_report(dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    match kind(dir) {
        Some(Kind::Run) => Ok(vec![write_run_report(dir)?]),
        Some(Kind::Sweep) => Ok(vec![write_sweep_report(dir)?]),
        Some(Kind::Suite) => {
            let mut pages = Vec::new();
            for cell in suite::cell_dirs(dir)? {
                // A trimmed cell (the committed reference keeps only summary.json and report.md)
                // has no samples to plot; the suite page still lists it.
                if kind(&cell) == Some(Kind::Run) && cell.join("requests.csv").is_file() {
                    pages.push(write_run_report(&cell)?);
                }
            }
            pages.push(write_suite_report(dir)?);
            Ok(pages)
        }
        None => Err(ReportError::NotResults(dir.to_path_buf())),
    }
}

/// `report.html` of one run folder (`summary.json`, `report.md`, `requests.csv`, `trace.jsonl`,
/// `memory.csv`).
pub fn write_run_report(dir: &Path) -> Result<PathBuf, ReportError> {
    let (title, body) = run::page(dir)?;
    write_page(dir, &title, &body)
}

/// `report.html` of a sweep folder, from its `sweep.json`: the sweep writer calls this after
/// writing `sweep.json`.
pub fn write_sweep_report(dir: &Path) -> Result<PathBuf, ReportError> {
    let (title, body) = sweep::page(dir)?;
    write_page(dir, &title, &body)
}

/// `report.html` of a suite folder (`suite.json` or `suite.csv`, and its cells' folders).
pub fn write_suite_report(dir: &Path) -> Result<PathBuf, ReportError> {
    let (title, body) = suite::page(dir)?;
    write_page(dir, &title, &body)
}

fn write_page(dir: &Path, title: &str, body: &str) -> Result<PathBuf, ReportError> {
    let path = dir.join("report.html");
    let tmp = dir.join(format!(".report.html.tmp-{}", std::process::id()));
    std::fs::write(&tmp, page(title, body)).map_err(|e| file_error(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        file_error(&path, e)
    })?;
    Ok(path)
}

const STYLE: &str =
    "body{font-family:sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:1em 0;font-size:14px}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}\
td.num{text-align:right;font-variant-numeric:tabular-nums}\
figure{margin:1.5em 0}figcaption{font-size:13px;color:#555}\
code{background:#f3f3f3;padding:0 3px}.wide{overflow-x:auto}.note{color:#555;font-style:italic}\
.verdict{font-size:17px;line-height:1.45;background:#f4f8fc;border-left:4px solid #1f77b4;padding:8px 12px;margin:0.6em 0 1em}\
.bad{color:#c00}table.compact{font-size:13px}table.compact td,table.compact th{padding:2px 6px}table.compact td{white-space:nowrap}h1{margin:0.3em 0}";

/// Checks on load that every plot drew and nothing failed to load; see the module doc.
const CHECK: &str = r#"(function(){
var problems=[];
window.addEventListener('error',function(e){var t=e.target||{};problems.push('failed to load: '+(t.src||t.href||e.message||'?'));},true);
document.addEventListener('securitypolicyviolation',function(e){problems.push('blocked: '+e.blockedURI);});
window.addEventListener('load',function(){
var svgs=document.querySelectorAll('svg'),drawn=0;
for(var i=0;i<svgs.length;i++){var s=svgs[i],b=s.getBBox();
if(s.querySelectorAll('path,polyline,polygon,rect,circle,line,text').length>0&&b.width>0&&b.height>0){drawn++;}else{problems.push('plot '+i+' is empty');}}
var imgs=document.querySelectorAll('img');
for(var j=0;j<imgs.length;j++){if(!(imgs[j].complete&&imgs[j].naturalWidth>0)){problems.push('image not loaded: '+imgs[j].src);}}
var m=document.getElementById('kvbench-check');
var v=document.getElementById('verdict');
if(v){m.setAttribute('data-verdict-bottom',String(Math.round(v.getBoundingClientRect().bottom)));}
m.setAttribute('data-viewport',String(window.innerHeight));
m.setAttribute('data-plots',String(drawn));
m.setAttribute('data-status',problems.length?'failed':'ok');
m.textContent=problems.join('; ');
});
})();"#;

/// The whole page around `body`.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n\
<title>{}</title>\n<style>{STYLE}</style>\n<script>{CHECK}</script>\n</head><body>\n{body}\n\
<div id=\"kvbench-check\" hidden></div>\n</body></html>\n",
        esc(title)
    )
}

/// HTML-escaped text.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Escaped text with `` `code` `` spans.
fn inline(s: &str) -> String {
    s.split('`')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 1 {
                format!("<code>{}</code>", esc(part))
            } else {
                esc(part)
            }
        })
        .collect()
}

fn looks_numeric(s: &str) -> bool {
    let s = s.trim().trim_end_matches('%');
    !s.is_empty() && s.parse::<f64>().is_ok()
}

/// A table; cells that are numbers are right-aligned.
pub fn table(head: &[String], rows: &[Vec<String>]) -> String {
    let mut s = String::from("<div class=\"wide\"><table><thead><tr>");
    for h in head {
        s.push_str(&format!("<th>{}</th>", inline(h)));
    }
    s.push_str("</tr></thead><tbody>\n");
    for r in rows {
        s.push_str("<tr>");
        for c in r {
            let class = if looks_numeric(c) {
                " class=\"num\""
            } else {
                ""
            };
            s.push_str(&format!("<td{class}>{}</td>", inline(c)));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
    s
}

/// The markdown the results writers emit (headings, pipe tables, bullets, paragraphs) as HTML:
/// the page shows the very table `report.md` holds.
pub fn markdown(md: &str) -> String {
    let mut out = String::new();
    let mut table_rows: Vec<Vec<String>> = Vec::new();
    let mut list = false;
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_start_matches('|')
            .trim_end_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let flush = |out: &mut String, rows: &mut Vec<Vec<String>>, list: &mut bool| {
        if !rows.is_empty() {
            let head = rows.remove(0);
            out.push_str(&table(&head, rows));
            rows.clear();
        }
        if *list {
            out.push_str("</ul>\n");
            *list = false;
        }
    };
    for line in md.lines() {
        let t = line.trim();
        if t.starts_with('|') {
            let row = cells(t);
            let separator = row
                .iter()
                .all(|c| !c.is_empty() && c.chars().all(|ch| ch == '-' || ch == ':'));
            if !separator {
                table_rows.push(row);
            }
            continue;
        }
        if let Some(item) = t.strip_prefix("- ") {
            if !table_rows.is_empty() {
                flush(&mut out, &mut table_rows, &mut false);
            }
            if !list {
                out.push_str("<ul>\n");
                list = true;
            }
            out.push_str(&format!("<li>{}</li>\n", inline(item)));
            continue;
        }
        flush(&mut out, &mut table_rows, &mut list);
        if let Some(h) = t.strip_prefix("## ") {
            out.push_str(&format!("<h2>{}</h2>\n", inline(h)));
        } else if let Some(h) = t.strip_prefix("# ") {
            out.push_str(&format!("<h1>{}</h1>\n", inline(h)));
        } else if !t.is_empty() {
            out.push_str(&format!("<p>{}</p>\n", inline(t)));
        }
    }
    flush(&mut out, &mut table_rows, &mut list);
    out
}

/// A plot with its caption.
pub fn figure(svg: &str, caption: &str) -> String {
    format!(
        "<figure>\n{svg}\n<figcaption>{}</figcaption>\n</figure>\n",
        inline(caption)
    )
}

pub fn note(text: &str) -> String {
    format!("<p class=\"note\">{}</p>\n", inline(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_tables_headings_and_lists_convert() {
        let md = "# kvbench run: x\n\nbackend `sim`\n\n| metric | paged |\n| --- | --- |\n| a<b | 1.5 |\n\n## Checks\n\n- FAILED: y\n";
        let h = markdown(md);
        assert!(h.contains("<h1>kvbench run: x</h1>"), "{h}");
        assert!(h.contains("<p>backend <code>sim</code></p>"), "{h}");
        assert!(h.contains("<th>metric</th><th>paged</th>"), "{h}");
        assert!(
            h.contains("<td>a&lt;b</td><td class=\"num\">1.5</td>"),
            "{h}"
        );
        assert!(!h.contains("---"), "{h}");
        assert!(h.contains("<ul>\n<li>FAILED: y</li>\n</ul>"), "{h}");
    }

    #[test]
    fn page_forbids_loading_anything() {
        let p = page("t<", "<p>x</p>");
        assert!(p.contains("default-src 'none'"));
        assert!(p.contains("<title>t&lt;</title>"));
        assert!(p.contains("id=\"kvbench-check\""));
    }
}
