//! The CSV formats (Azure, BurstGPT, plain): the header names the columns, each row is split at
//! commas (none of these traces quotes a comma) and each field knows its 1-based column.

use super::time::{azure_timestamp_ns, decimal_scaled};
use super::{RowError, TraceRow};
use crate::scenario::TraceFormat;

/// Where each column a format reads sits in the header.
#[derive(Debug, Clone)]
pub struct Layout {
    pub format: TraceFormat,
    fields: usize,
    time: usize,
    prompt: usize,
    output: usize,
    model: Option<usize>,
    log_type: Option<usize>,
    session: Option<usize>,
    tenant: Option<usize>,
    prefix_group: Option<usize>,
}

/// Header cells normalized: trimmed, unquoted, lower case.
fn cells(header: &str) -> Vec<String> {
    header
        .split(',')
        .map(|c| unquote(c.trim()).to_ascii_lowercase())
        .collect()
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(s)
}

/// The format a header line announces, if it announces one.
pub fn detect(header: &str) -> Option<TraceFormat> {
    if header.trim_start().starts_with('{') {
        return Some(TraceFormat::Mooncake);
    }
    let c = cells(header);
    let has = |n: &str| c.iter().any(|x| x == n);
    if has("timestamp") && has("contexttokens") && has("generatedtokens") {
        Some(TraceFormat::Azure)
    } else if has("timestamp") && has("request tokens") && has("response tokens") {
        Some(TraceFormat::Burstgpt)
    } else if has("arrival_ms") && has("prompt_tokens") && has("output_tokens") {
        Some(TraceFormat::Csv)
    } else {
        None
    }
}

impl Layout {
    /// The column layout of `header` for `format`, or the columns it lacks.
    pub fn new(format: TraceFormat, header: &str) -> Result<Layout, String> {
        let c = cells(header);
        let find = |n: &str| c.iter().position(|x| x == n);
        let need = |n: &str| find(n).ok_or_else(|| n.to_string());
        let names: &[&str] = match format {
            TraceFormat::Azure => &["timestamp", "contexttokens", "generatedtokens"],
            TraceFormat::Burstgpt => &["timestamp", "request tokens", "response tokens"],
            _ => &["arrival_ms", "prompt_tokens", "output_tokens"],
        };
        let found: Vec<Result<usize, String>> = names.iter().map(|n| need(n)).collect();
        let missing: Vec<String> = found.iter().filter_map(|r| r.clone().err()).collect();
        if !missing.is_empty() {
            return Err(format!(
                "the {} header lacks column(s) {}; it is `{header}`",
                format.name(),
                missing.join(", ")
            ));
        }
        let at = |i: usize| found[i].clone().unwrap_or(0);
        let csv = format == TraceFormat::Csv;
        Ok(Layout {
            format,
            fields: c.len(),
            time: at(0),
            prompt: at(1),
            output: at(2),
            model: find("model").filter(|_| format == TraceFormat::Burstgpt),
            log_type: find("log type").filter(|_| format == TraceFormat::Burstgpt),
            session: find("session_id").filter(|_| csv),
            tenant: find("tenant").filter(|_| csv),
            prefix_group: find("prefix_group").filter(|_| csv),
        })
    }

    /// Whether rows carry content identity (sessions or prefix groups share token ids).
    pub fn has_content_ids(&self) -> bool {
        self.session.is_some() || self.prefix_group.is_some()
    }

    pub fn parse<'a>(&self, line: &'a str) -> Result<TraceRow<'a>, RowError> {
        let mut fields: Vec<(usize, &str)> = Vec::with_capacity(self.fields);
        let mut col = 1;
        for f in line.split(',') {
            fields.push((col, f));
            col += f.len() + 1;
        }
        if fields.len() != self.fields {
            return Err(RowError {
                col: 1,
                message: format!("{} fields, the header has {}", fields.len(), self.fields),
            });
        }
        let text = |i: usize| -> (usize, &'a str) {
            let (c, f) = fields[i];
            let lead = f.len() - f.trim_start().len();
            (c + lead, unquote(f.trim()))
        };
        let count = |i: usize, what: &str| -> Result<u32, RowError> {
            let (c, v) = text(i);
            v.parse::<u32>().map_err(|_| RowError {
                col: c,
                message: format!("{what} `{v}` is not a whole number of tokens"),
            })
        };
        let (tc, tv) = text(self.time);
        let time_ns = match self.format {
            TraceFormat::Azure => azure_timestamp_ns(tv),
            TraceFormat::Burstgpt => {
                decimal_scaled(tv, 9).ok_or_else(|| format!("Timestamp `{tv}` is not seconds >= 0"))
            }
            _ => decimal_scaled(tv, 6)
                .ok_or_else(|| format!("arrival_ms `{tv}` is not a number of ms >= 0")),
        }
        .map_err(|message| RowError { col: tc, message })?;
        let opt_u32 = |i: Option<usize>, what: &str| -> Result<Option<u32>, RowError> {
            let Some(i) = i else { return Ok(None) };
            let (c, v) = text(i);
            if v.is_empty() {
                return Ok(None);
            }
            v.parse::<u32>().map(Some).map_err(|_| RowError {
                col: c,
                message: format!("{what} `{v}` is not a whole number"),
            })
        };
        let label = |i: Option<usize>| i.map(|i| text(i).1);
        Ok(TraceRow {
            time_ns,
            prompt_tokens: count(self.prompt, "prompt length")?,
            output_tokens: count(self.output, "output length")?,
            model: label(self.model),
            log_type: label(self.log_type),
            session: label(self.session).filter(|s| !s.is_empty()),
            tenant: opt_u32(self.tenant, "tenant")?,
            prefix_group: opt_u32(self.prefix_group, "prefix_group")?,
            hash_ids: Vec::new(),
        })
    }
}
