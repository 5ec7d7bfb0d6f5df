//! Reading plot inputs back from a results folder's own files (`requests.csv`, `trace.jsonl`,
//! `memory.csv`, `sweep.json`), so a report shows only what the folder holds and can be rendered
//! again later, on another machine, from the folder alone.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::memory::Timeline;

/// A file that could not be read or parsed: `FILE[:LINE]: message`.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct FileError {
    pub path: PathBuf,
    pub message: String,
}

pub fn file_error(path: &Path, message: impl std::fmt::Display) -> FileError {
    FileError {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// The most bytes a metadata file read whole (`summary.json`, `sweep.json`, `suite.json`,
/// `suite.csv`) may hold. The largest a kvbench run writes are a few MB (a sweep's probes, a
/// suite's rows); a file past this is refused by its size before a byte of it is read.
pub const MAX_READ_WHOLE_BYTES: u64 = 64 << 20;

/// A results file read whole, refused unless it is a regular file (never a FIFO or a device,
/// which could block or never end) no larger than `cap` bytes.
pub fn read_capped(path: &Path, cap: u64) -> Result<String, FileError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| file_error(path, e))?;
    let meta = file.metadata().map_err(|e| file_error(path, e))?;
    if !meta.is_file() {
        return Err(file_error(path, "not a regular file"));
    }
    if meta.len() > cap {
        return Err(file_error(
            path,
            format!(
                "{} bytes: larger than the {} bytes a results file may hold; refusing to read it",
                meta.len(),
                cap
            ),
        ));
    }
    let mut text = String::new();
    // `take`: a file that grows while being read still stops at the cap.
    file.take(cap.saturating_add(1))
        .read_to_string(&mut text)
        .map_err(|e| file_error(path, e))?;
    if text.len() as u64 > cap {
        return Err(file_error(
            path,
            format!("grew past {cap} bytes while read"),
        ));
    }
    Ok(text)
}

/// Samples per cache mode, in the order the modes first appear in the file.
pub type ByCache<T> = Vec<(String, T)>;

fn entry<'a, T: Default>(v: &'a mut ByCache<T>, cache: &str) -> &'a mut T {
    let i = match v.iter().position(|(c, _)| c == cache) {
        Some(i) => i,
        None => {
            v.push((cache.to_string(), T::default()));
            v.len() - 1
        }
    };
    &mut v[i].1
}

/// `"12.000345"` (milliseconds with up to six decimals, as the writers emit) as exact
/// nanoseconds.
pub fn parse_ms_ns(s: &str) -> Option<u64> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty()
        || frac.len() > 6
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let int: u64 = int.parse().ok()?;
    let frac_ns: u64 = format!("{frac:0<6}").parse().ok()?;
    int.checked_mul(1_000_000)?.checked_add(frac_ns)
}

fn csv_reader(path: &Path) -> Result<(csv::Reader<std::fs::File>, csv::StringRecord), FileError> {
    let mut r = csv::Reader::from_path(path).map_err(|e| file_error(path, e))?;
    let head = r.headers().map_err(|e| file_error(path, e))?.clone();
    Ok((r, head))
}

fn column(path: &Path, head: &csv::StringRecord, name: &str) -> Result<usize, FileError> {
    head.iter()
        .position(|h| h == name)
        .ok_or_else(|| file_error(path, format!("no column {name:?}")))
}

fn line_of(rec: &csv::StringRecord) -> u64 {
    rec.position().map_or(0, |p| p.line())
}

/// TTFT samples (first token − arrival) per cache mode from `requests.csv`, sorted: the streams
/// that were not rejected and produced a token, as the run's metrics count them.
pub fn ttft_ns(dir: &Path) -> Result<ByCache<Vec<u64>>, FileError> {
    let path = dir.join("requests.csv");
    let (mut r, head) = csv_reader(&path)?;
    let [cache, arrival, first, status] =
        ["cache", "arrival_ms", "first_token_ms", "status"].map(|c| column(&path, &head, c));
    let (cache, arrival, first, status) = (cache?, arrival?, first?, status?);
    let mut out: ByCache<Vec<u64>> = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| file_error(&path, e))?;
        let line = line_of(&rec);
        let get = |i: usize| rec.get(i).unwrap_or("");
        if get(status) == "rejected" || get(first).is_empty() {
            continue;
        }
        let ms = |i: usize| {
            parse_ms_ns(get(i)).ok_or_else(|| {
                file_error(
                    &path,
                    format!("line {line}: {}: not a time: {:?}", &head[i], get(i)),
                )
            })
        };
        let (a, f) = (ms(arrival)?, ms(first)?);
        let ttft = f
            .checked_sub(a)
            .ok_or_else(|| file_error(&path, format!("line {line}: first token before arrival")))?;
        entry(&mut out, get(cache)).push(ttft);
    }
    for (_, v) in &mut out {
        v.sort_unstable();
    }
    Ok(out)
}

#[derive(Deserialize)]
struct TraceLine {
    cache: String,
    t_ms: f64,
    request: String,
    event: String,
    #[serde(default)]
    index: u32,
}

/// The value of `"key":` in one of our own JSON lines: the text up to the next `,`/`}` (or the
/// string's contents, unquoted). `None` for anything unusual; the caller then parses the line
/// properly.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    let rest = line.get(at..)?;
    if let Some(q) = rest.strip_prefix('"') {
        let end = q.find('"')?;
        let v = q.get(..end)?;
        (!v.contains('\\')).then_some(v)
    } else {
        let end = rest.find([',', '}'])?;
        let v = rest.get(..end)?;
        (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'.')).then_some(v)
    }
}

/// `(cache, request, event is "token", index, t_ns)` of a token line, read without a JSON parser
/// (traces run to hundreds of megabytes); falls back to serde for anything unusual.
fn token_line(line: &str) -> Result<(String, String, bool, u32, u64), String> {
    let fast = || -> Option<(String, String, bool, u32, u64)> {
        let event = field(line, "\"event\":")?;
        Some((
            field(line, "\"cache\":")?.to_string(),
            field(line, "\"request\":")?.to_string(),
            event == "token",
            field(line, "\"index\":")?.parse().ok()?,
            parse_ms_ns(field(line, "\"t_ms\":")?)?,
        ))
    };
    if let Some(v) = fast() {
        return Ok(v);
    }
    let e: TraceLine = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let t_ns = (e.t_ms * 1e6).round() as u64;
    Ok((e.cache, e.request, e.event == "token", e.index, t_ns))
}

/// One cache mode's gaps so far, and per stream its last token's `(index, t_ns)`.
#[derive(Default)]
struct ModeGaps {
    gaps: Vec<u64>,
    last: HashMap<String, (u32, u64)>,
}

/// Inter-token gaps per cache mode from `trace.jsonl` (consecutive `first_token`/`token` events of
/// one stream), sorted; `None` when the trace holds no `token` lines (written with
/// `--trace-level requests`, or no stream produced a second token).
pub fn itl_ns(dir: &Path) -> Result<Option<ByCache<Vec<u64>>>, FileError> {
    let path = dir.join("trace.jsonl");
    let file = std::fs::File::open(&path).map_err(|e| file_error(&path, e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    // Per cache mode: the gaps so far, and per stream its last token's (index, t_ns). The trace is
    // time-ordered, so a stream's tokens come in index order; anything else is a broken file.
    let mut out: ByCache<ModeGaps> = Vec::new();
    let mut any_token = false;
    let mut line = String::new();
    let mut n = 0usize;
    loop {
        line.clear();
        n += 1;
        if reader
            .read_line(&mut line)
            .map_err(|e| file_error(&path, e))?
            == 0
        {
            break;
        }
        if !line.contains("token\"") {
            continue;
        }
        let (cache, request, is_token, index, t_ns) =
            token_line(line.trim_end()).map_err(|e| file_error(&path, format!("line {n}: {e}")))?;
        any_token |= is_token;
        let ModeGaps { gaps, last } = entry(&mut out, &cache);
        let prev = last.get(request.as_str()).copied();
        match prev {
            Some((i, t)) if i.checked_add(1) == Some(index) => gaps.push(t_ns.saturating_sub(t)),
            None if index == 0 => {}
            _ => {
                return Err(file_error(
                    &path,
                    format!(
                        "line {n}: {cache} request {request}: token {index} follows token {:?}",
                        prev.map(|p| p.0)
                    ),
                ))
            }
        }
        last.insert(request, (index, t_ns));
    }
    if !any_token {
        return Ok(None);
    }
    let mut result: ByCache<Vec<u64>> = Vec::with_capacity(out.len());
    for (cache, ModeGaps { mut gaps, .. }) in out {
        gaps.sort_unstable();
        result.push((cache, gaps));
    }
    Ok(Some(result))
}

/// The KV ledger categories of `memory.csv`, bottom of the stack first.
pub const KV_LAYERS: [(&str, &str); 5] = [
    ("kv_live_bytes", "live"),
    ("kv_allocated_unfilled_bytes", "allocated, unfilled"),
    ("kv_cached_free_bytes", "cached free"),
    ("kv_pending_free_bytes", "pending free"),
    ("kv_free_bytes", "free"),
];

/// The KV timeline per cache mode from `memory.csv`.
pub fn memory(dir: &Path) -> Result<ByCache<Timeline>, FileError> {
    let path = dir.join("memory.csv");
    let (mut r, head) = csv_reader(&path)?;
    let cache = column(&path, &head, "cache")?;
    let t = column(&path, &head, "t_ms")?;
    let cols: Vec<usize> = KV_LAYERS
        .iter()
        .map(|(c, _)| column(&path, &head, c))
        .collect::<Result<_, _>>()?;
    let mut out: ByCache<Timeline> = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| file_error(&path, e))?;
        let line = line_of(&rec);
        let get = |i: usize| rec.get(i).unwrap_or("");
        let tl = entry(&mut out, get(cache));
        if tl.layers.is_empty() {
            tl.layers = KV_LAYERS
                .iter()
                .map(|(_, n)| (n.to_string(), Vec::new()))
                .collect();
        }
        let t_ns = parse_ms_ns(get(t))
            .ok_or_else(|| file_error(&path, format!("line {line}: t_ms: not a time")))?;
        tl.t_ms.push(t_ns as f64 / 1e6);
        for (k, &c) in cols.iter().enumerate() {
            let v: u64 = get(c).parse().map_err(|_| {
                file_error(
                    &path,
                    format!("line {line}: {}: not a byte count: {:?}", &head[c], get(c)),
                )
            })?;
            tl.layers[k].1.push(v);
        }
    }
    Ok(out)
}

/// `sweep.json` as the sweep writes it (the fields the report shows; others are ignored).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sweep {
    pub scenario: String,
    pub backend: String,
    #[serde(default)]
    pub by: String,
    #[serde(default)]
    pub seeds: Vec<u64>,
    #[serde(default)]
    pub precision_pct: Option<f64>,
    #[serde(default)]
    pub workload_hash: String,
    #[serde(default)]
    pub slo: SweepSlo,
    pub runs: Vec<SweepRun>,
    #[serde(default)]
    pub ratio_paged_over_contiguous: Option<f64>,
    #[serde(default)]
    pub ratio_paged_over_contiguous_ci: Option<[f64; 2]>,
}

/// An SLO as `sweep.json` states it (and `summary.json`, where it records one): the per-request
/// TTFT and time-per-output-token targets, ms, and the share of requests that must meet both.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SweepSlo {
    #[serde(default, alias = "ttft_ms")]
    pub ttft_p99_ms: Option<f64>,
    #[serde(default, alias = "tpot_ms", alias = "tpot_p99_ms", alias = "itl_ms")]
    pub itl_p99_ms: Option<f64>,
    #[serde(default)]
    pub attainment: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SweepRun {
    pub cache: String,
    /// Present when a sweep covers several block sizes (one run per mode and size).
    #[serde(default)]
    pub block_size: Option<u32>,
    pub rate_at_target_rps: Option<f64>,
    #[serde(default)]
    pub rate_at_target_rps_ci: Option<[f64; 2]>,
    pub throughput_at_target_tokens_per_s: Option<f64>,
    #[serde(default)]
    pub throughput_at_target_tokens_per_s_ci: Option<[f64; 2]>,
    #[serde(default)]
    pub ttft_ms: Option<Dist>,
    #[serde(default)]
    pub itl_ms: Option<Dist>,
    #[serde(default)]
    pub probes: Vec<Probe>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Dist {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    pub count: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Probe {
    pub load: f64,
    pub offered_rps: f64,
    pub achieved_rps: f64,
    pub throughput_tokens_per_s: f64,
    pub ttft_p99_ms: f64,
    #[serde(default)]
    pub ttft_p99_ms_ci: Option<[f64; 2]>,
    pub itl_p99_ms: f64,
    #[serde(default)]
    pub itl_p99_ms_ci: Option<[f64; 2]>,
    pub attainment: f64,
    #[serde(default)]
    pub attainment_ci: Option<[f64; 2]>,
    pub samples: u64,
    pub verdict: String,
    #[serde(default)]
    pub oversaturated: bool,
}

pub fn sweep(dir: &Path) -> Result<Sweep, FileError> {
    let path = dir.join("sweep.json");
    let text = read_capped(&path, MAX_READ_WHOLE_BYTES)?;
    serde_json::from_str(&text).map_err(|e| file_error(&path, e))
}

/// `summary.json` of a run folder: the figures the run page's verdict and memory panels need
/// (others are ignored). Figures a run could not form may be null.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunFolder {
    pub scenario: String,
    #[serde(default)]
    pub backend: String,
    #[serde(default)]
    pub checks: RunChecks,
    /// The SLO the run's goodput counts against, where the folder records it.
    #[serde(default)]
    pub slo: Option<SweepSlo>,
    pub runs: Vec<RunFigures>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunChecks {
    pub ok: bool,
    #[serde(default)]
    pub failures: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunFigures {
    pub cache: String,
    #[serde(default)]
    pub requests: RequestCounts,
    pub duration_s: Option<f64>,
    pub throughput_tokens_per_s: Option<f64>,
    pub goodput_requests_per_s: Option<f64>,
    #[serde(default)]
    pub ttft_ms: Option<Percentiles>,
    #[serde(default)]
    pub memory: RunMemory,
    /// `memory.csv`'s interval when its rows are per-interval maxima.
    #[serde(default)]
    pub memory_resolution_ms: Option<f64>,
    #[serde(default)]
    pub slo: Option<SweepSlo>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RequestCounts {
    pub total: u64,
    #[serde(default)]
    pub completed: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunMemory {
    pub kv_budget_bytes: Option<u64>,
}

pub fn run_folder(dir: &Path) -> Result<RunFolder, FileError> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|e| file_error(&path, e))?;
    serde_json::from_str(&text).map_err(|e| file_error(&path, e))
}

#[cfg(test)]
mod tests {
    use super::{parse_ms_ns, token_line};

    #[test]
    fn token_lines_parse_fast_and_fall_back_to_json() {
        let ours =
            r#"{"cache":"paged","t_ms":12.000345,"request":"17.2","event":"token","index":3}"#;
        assert_eq!(
            token_line(ours),
            Ok(("paged".into(), "17.2".into(), true, 3, 12_000_345))
        );
        // Reordered, spaced and escaped: not our writer's shape, so serde reads it.
        let other = r#"{ "event": "first_token", "index": 0, "request": "a\"b", "cache": "contiguous", "t_ms": 1.5 }"#;
        assert_eq!(
            token_line(other),
            Ok(("contiguous".into(), "a\"b".into(), false, 0, 1_500_000))
        );
        assert!(token_line(r#"{"event":"token"}"#).is_err());
        let spaced = r#"{"cache": "paged","t_ms":2.0,"request":"1","event":"token","index":1}"#;
        assert_eq!(
            token_line(spaced),
            Ok(("paged".into(), "1".into(), true, 1, 2_000_000))
        );
    }

    #[test]
    fn millisecond_strings_parse_exactly() {
        assert_eq!(parse_ms_ns("12345.678901"), Some(12_345_678_901));
        assert_eq!(parse_ms_ns("0.000001"), Some(1));
        assert_eq!(parse_ms_ns("3"), Some(3_000_000));
        assert_eq!(parse_ms_ns("1.5"), Some(1_500_000));
        assert_eq!(parse_ms_ns(""), None);
        assert_eq!(parse_ms_ns("-1.0"), None);
        assert_eq!(parse_ms_ns("1.0000001"), None);
    }
}
