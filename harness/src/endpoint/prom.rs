//! The few `/metrics` figures the client reads, from Prometheus' text exposition: tolerant (an
//! unknown or unparsable line is skipped, not an error: a scrape is a side view of the server,
//! never a reason to fail a run) and bounded (the caller caps the body; a line over
//! [`MAX_LINE_BYTES`] is skipped). Samples of one name are summed over their label sets (one
//! model per server is the common case; a server with several sums them, which `summary.json`
//! states beside the figures).

use serde::Serialize;

pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// One scrape's figures (`None`: the server does not expose it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Scrape {
    pub prefix_cache_queries: Option<f64>,
    pub prefix_cache_hits: Option<f64>,
    pub requests_running: Option<f64>,
    pub requests_waiting: Option<f64>,
    /// 0..1.
    pub kv_cache_usage: Option<f64>,
    pub request_success: Option<f64>,
    pub prompt_tokens: Option<f64>,
    pub generation_tokens: Option<f64>,
}

/// Where a name's value goes in a [`Scrape`].
type Field = fn(&mut Scrape) -> &mut Option<f64>;

/// Names read, with vLLM's older spellings beside the current ones.
const NAMES: &[(&str, Field)] = &[
    ("vllm:prefix_cache_queries_total", |s| {
        &mut s.prefix_cache_queries
    }),
    ("vllm:gpu_prefix_cache_queries_total", |s| {
        &mut s.prefix_cache_queries
    }),
    ("vllm:prefix_cache_hits_total", |s| &mut s.prefix_cache_hits),
    ("vllm:gpu_prefix_cache_hits_total", |s| {
        &mut s.prefix_cache_hits
    }),
    ("vllm:num_requests_running", |s| &mut s.requests_running),
    ("vllm:num_requests_waiting", |s| &mut s.requests_waiting),
    ("vllm:kv_cache_usage_perc", |s| &mut s.kv_cache_usage),
    ("vllm:gpu_cache_usage_perc", |s| &mut s.kv_cache_usage),
    ("vllm:request_success_total", |s| &mut s.request_success),
    ("vllm:prompt_tokens_total", |s| &mut s.prompt_tokens),
    ("vllm:generation_tokens_total", |s| &mut s.generation_tokens),
];

pub fn parse(text: &str) -> Scrape {
    let mut out = Scrape::default();
    for line in text.lines() {
        if line.len() > MAX_LINE_BYTES || line.starts_with('#') {
            continue;
        }
        let line = line.trim();
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let name = &line[..name_end];
        let Some((_, field)) = NAMES.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let mut rest = &line[name_end..];
        if rest.starts_with('{') {
            // Label values may hold '}' inside quotes.
            let mut quoted = false;
            let mut escaped = false;
            let mut end = None;
            for (i, c) in rest.char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' if quoted => escaped = true,
                    '"' => quoted = !quoted,
                    '}' if !quoted => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let Some(end) = end else { continue };
            rest = &rest[end + 1..];
        }
        let Some(value) = rest.split_whitespace().next() else {
            continue;
        };
        let Some(v) = parse_value(value) else {
            continue;
        };
        let slot = field(&mut out);
        *slot = Some(slot.unwrap_or(0.0) + v);
    }
    out
}

fn parse_value(s: &str) -> Option<f64> {
    let v = match s {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        _ => s.parse::<f64>().ok()?,
    };
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_spellings_sums_labels_and_skips_junk() {
        let text = "# HELP vllm:prefix_cache_hits_total x\n\
            # TYPE vllm:prefix_cache_hits_total counter\n\
            vllm:prefix_cache_hits_total{model_name=\"a}b\"} 30\n\
            vllm:prefix_cache_hits_total{model_name=\"c\"} 12 1700000000\n\
            vllm:gpu_prefix_cache_queries_total 100\n\
            vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n\
            vllm:num_requests_running garbage\n\
            vllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 4\n\
            {broken\n";
        let s = parse(text);
        assert_eq!(s.prefix_cache_hits, Some(42.0));
        assert_eq!(s.prefix_cache_queries, Some(100.0));
        assert_eq!(s.kv_cache_usage, Some(0.25));
        assert_eq!(s.requests_running, None);
    }
}
