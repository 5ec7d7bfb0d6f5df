//! `kvbench run --endpoint URL`: the scenario's request list sent to a live OpenAI-compatible
//! server (vLLM's completions API; the wire contract is in docs/endpoint.md), measured with the
//! run's metrics code into a run's results folder.
//!
//! One job per file: `url.rs` (the base URL; plain HTTP only), `http.rs` (connections, capped
//! GETs), `sse.rs` (bounded incremental event parsing), `chunk.rs` (a chunk's tokens per
//! choice), `client.rs` (one request and its stream, flags and cancellation), `drive.rs` (the
//! open-loop dispatcher, closed-loop clients and sessions), `prom.rs` (`/metrics`),
//! `record.rs` (answers as the engine's records), `files.rs` and `summary.rs` (the folder).
//!
//! Nothing is written before the server answered `/v1/models` (a refused connection is an
//! error naming the URL, and no folder); from then on the folder is staged and put in place
//! whatever the server does, marked partial when the run stopped early.

mod chunk;
mod client;
mod drive;
mod files;
mod http;
pub mod prom;
mod record;
mod sse;
pub mod summary;
mod url;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvbench_cache_api::CacheMode;

pub use client::Flag;
pub use url::BaseUrl;

use crate::backend::sim::profile::DeviceProfile;
use crate::backend::BackendKind;
use crate::engine::sink::{replay, Tee};
use crate::experiment::{self, RunOptions};
use crate::metrics::accum::MetricsAccum;
use crate::results::summary::{Checks, SessionsSummary};
use crate::results::{marker, ResultsError, Staging};
use crate::scenario::Scenario;
use crate::workload::{self, Workload};
use summary::{
    EndpointInfo, EndpointRunSummary, EndpointSummary, LagMs, Prediction, PrefixView, ServerMetrics,
};

#[derive(Debug, Clone)]
pub struct EndpointOptions {
    pub url: String,
    /// The model name to send; default: the first of the server's `/v1/models`.
    pub model: Option<String>,
    pub seed: Option<u64>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_event_bytes: usize,
    /// Interval of `/metrics` scrapes during the run.
    pub scrape_interval: Duration,
    pub trace_tokens: bool,
    /// A device profile: `sim`'s prediction of the same scenario goes beside the measurement.
    pub predict: Option<String>,
    /// Runtime worker threads (default: the machine's cores, at most 8).
    pub worker_threads: Option<usize>,
}

impl EndpointOptions {
    pub fn new(url: &str) -> EndpointOptions {
        EndpointOptions {
            url: url.to_string(),
            model: None,
            seed: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(60),
            max_event_bytes: 1 << 20,
            scrape_interval: Duration::from_secs(1),
            trace_tokens: true,
            predict: None,
            worker_threads: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Bad input or an endpoint that cannot be reached before the run: no folder.
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Results(#[from] ResultsError),
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
}

/// What a finished endpoint run says.
#[derive(Debug)]
pub struct EndpointRun {
    pub summary: EndpointSummary,
    pub out: PathBuf,
    /// Each stream's token ids as the server sent them (empty where it sent none), by
    /// (request, choice): what a caller compares with an in-process run of the same list.
    pub token_ids: std::collections::BTreeMap<(u64, u32), Vec<u32>>,
}

impl EndpointRun {
    pub fn failures(&self) -> &[String] {
        &self.summary.checks.failures
    }
}

/// Bytes of a `/v1/models` or `/metrics` answer the client reads at most.
const MODELS_CAP: usize = 1 << 20;
const METRICS_CAP: usize = 8 << 20;

/// Run `scenario`'s request list against the endpoint and write the results folder `out`.
pub fn run(
    scenario: &Scenario,
    opts: &EndpointOptions,
    out: &Path,
    replace: bool,
) -> Result<EndpointRun, EndpointError> {
    let input = EndpointError::Input;
    let base = BaseUrl::parse(&opts.url).map_err(input)?;
    let seed = opts.seed.unwrap_or(scenario.seed);
    let workload = workload::generate(scenario, seed).map_err(|e| input(e.to_string()))?;
    if workload.closed_loop.is_some() && workload.requests.iter().any(|r| r.session.is_some()) {
        return Err(input(
            "traffic: a closed-loop scenario with sessions cannot be sent to an endpoint \
             (a later turn's prompt needs its session's previous turn)"
                .into(),
        ));
    }
    let profile = match &opts.predict {
        None => None,
        Some(name) => {
            let dir = scenario.source.as_deref().and_then(Path::parent);
            Some(DeviceProfile::load(name, dir).map_err(|e| input(format!("--predict: {e}")))?)
        }
    };
    crate::results::check_target(out, marker::Kind::Run, replace)?;
    let threads = opts.worker_threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .min(8)
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| input(format!("cannot start the client's runtime: {e}")))?;
    // Preflight: the server must answer before anything is written.
    let preflight_timeout = opts.connect_timeout + Duration::from_secs(5);
    let (status, body) = rt
        .block_on(http::get(
            &base,
            "/v1/models",
            preflight_timeout,
            MODELS_CAP,
        ))
        .map_err(|e| input(format!("--endpoint {}: {e}", base.text)))?;
    let models: serde_json::Value = if status == 200 {
        serde_json::from_slice(&body).map_err(|e| {
            input(format!(
                "--endpoint {}: /v1/models is not JSON: {e}",
                base.text
            ))
        })?
    } else {
        serde_json::Value::Null
    };
    let served = models
        .get("data")
        .and_then(|d| d.get(0))
        .and_then(|m| m.get("id"))
        .and_then(|m| m.as_str())
        .map(str::to_string);
    let model = match (&opts.model, served) {
        (Some(m), _) => m.clone(),
        (None, Some(m)) => m,
        (None, None) => {
            return Err(input(format!(
                "--endpoint {}: /v1/models answered HTTP {status} without a model; name one with --model",
                base.text
            )))
        }
    };
    let staging = Staging::begin(out, marker::Kind::Run, replace)?;
    let t0 = Instant::now();
    let cfg = client::ClientConfig {
        base: base.clone(),
        model: model.clone(),
        connect_timeout: opts.connect_timeout,
        request_timeout: opts.request_timeout,
        idle_timeout: opts.idle_timeout,
        max_event_bytes: opts.max_event_bytes,
        t0,
    };
    // /metrics before, during and after.
    let scraper = Arc::new(Scraper::default());
    let scrape_timeout = opts.connect_timeout.min(Duration::from_secs(5));
    rt.block_on(scraper.scrape(&base, scrape_timeout));
    let running = Arc::new(AtomicBool::new(true));
    let during = {
        let (s, b, r, every) = (
            scraper.clone(),
            base.clone(),
            running.clone(),
            opts.scrape_interval,
        );
        rt.spawn(async move {
            if s.answered() == 0 {
                return;
            }
            while r.load(Ordering::SeqCst) {
                tokio::time::sleep(every).await;
                s.scrape(&b, scrape_timeout).await;
            }
        })
    };
    let workload = Arc::new(workload);
    let driven = drive::drive(cfg, workload.clone(), scenario.cache.max_seq_len, &rt);
    running.store(false, Ordering::SeqCst);
    during.abort();
    if driven.stopped_at_ns.is_none() {
        rt.block_on(scraper.scrape(&base, scrape_timeout));
    }
    drop(rt);

    let dir = staging.dir().to_path_buf();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| EndpointError::Io { path, err }
    };
    let record = record::record(&driven.done, driven.end_ns);
    let mut files =
        files::RunFiles::create(&dir, opts.trace_tokens, &driven.done).map_err(io(&dir))?;
    let mut accum = MetricsAccum::new(&scenario.slo);
    replay(&record, &mut Tee(&mut accum, &mut files));
    files.finish().map_err(io(&dir))?;
    let mut metrics = accum.finish(&record.end);
    record::chunk_gaps(&driven.done, &mut metrics);
    let token_ids = record
        .streams
        .into_iter()
        .map(|st| ((st.request, st.rank), st.token_ids))
        .collect();
    files::write_endpoint_csv(&dir, &driven.done).map_err(io(&dir.join("endpoint.csv")))?;

    let prediction = profile.map(|p| predict(scenario, seed, p, &metrics));
    let summary = summarize(SummaryInput {
        scenario,
        seed,
        workload: &workload,
        base: &base,
        model,
        models,
        driven: &driven,
        metrics: &metrics,
        scraper: &scraper,
        opts,
        prediction,
    });
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(io(&path))
    };
    write(
        "summary.json",
        format!(
            "{}\n",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        ),
    )?;
    write("report.md", report(&summary))?;
    let mut env = crate::results::env::collect("endpoint");
    env.device_profile = None;
    write(
        "environment.json",
        format!(
            "{}\n",
            serde_json::to_string_pretty(&env).unwrap_or_default()
        ),
    )?;
    staging.commit()?;
    Ok(EndpointRun {
        summary,
        out: out.to_path_buf(),
        token_ids,
    })
}

/// `/metrics` scrapes: the first and last answers, the peaks in between.
#[derive(Default)]
struct Scraper {
    state: Mutex<ScrapeState>,
}

#[derive(Default)]
struct ScrapeState {
    answered: u64,
    first: Option<prom::Scrape>,
    last: Option<prom::Scrape>,
    peak_running: Option<f64>,
    peak_waiting: Option<f64>,
    peak_kv: Option<f64>,
    unavailable: Option<String>,
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

impl Scraper {
    fn answered(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.answered)
    }

    async fn scrape(&self, base: &BaseUrl, timeout: Duration) {
        let got = http::get(base, "/metrics", timeout, METRICS_CAP).await;
        let Ok(mut s) = self.state.lock() else { return };
        match got {
            Ok((200, body)) => {
                let p = prom::parse(&String::from_utf8_lossy(&body));
                s.answered += 1;
                s.first.get_or_insert(p);
                s.last = Some(p);
                s.peak_running = max_opt(s.peak_running, p.requests_running);
                s.peak_waiting = max_opt(s.peak_waiting, p.requests_waiting);
                s.peak_kv = max_opt(s.peak_kv, p.kv_cache_usage);
            }
            Ok((status, _)) => {
                s.unavailable
                    .get_or_insert_with(|| format!("/metrics answered HTTP {status}"));
            }
            Err(e) => {
                s.unavailable.get_or_insert(e);
            }
        }
    }

    fn metrics(&self) -> (Option<ServerMetrics>, Option<String>) {
        let Ok(s) = self.state.lock() else {
            return (None, Some("the scraper failed".into()));
        };
        let (Some(before), Some(after)) = (s.first, s.last) else {
            return (None, s.unavailable.clone().or(Some("no scrape".into())));
        };
        let delta = |f: fn(&prom::Scrape) -> Option<f64>| match (f(&before), f(&after)) {
            (Some(a), Some(b)) if s.answered >= 2 => Some((b - a).max(0.0)),
            _ => None,
        };
        let hits = delta(|p| p.prefix_cache_hits);
        let queries = delta(|p| p.prefix_cache_queries);
        let share = match (hits, queries) {
            (Some(h), Some(q)) if q > 0.0 => Some(h / q),
            _ => None,
        };
        (
            Some(ServerMetrics {
                scrapes: s.answered,
                before,
                after,
                prefix_hit_tokens: hits,
                prefix_query_tokens: queries,
                prefix_hit_share: share,
                peak_requests_running: s.peak_running,
                peak_requests_waiting: s.peak_waiting,
                peak_kv_cache_usage: s.peak_kv,
            }),
            None,
        )
    }
}

/// `sim`'s paged run of the same scenario and seed on `profile`.
fn predict(
    scenario: &Scenario,
    seed: u64,
    profile: DeviceProfile,
    measured: &crate::metrics::RunMetrics,
) -> Result<Prediction, String> {
    let device = profile.name.clone();
    let opts = RunOptions {
        backend: BackendKind::Sim,
        seed: Some(seed),
        trace_tokens: false,
        invariant_check_every: 0,
        shadow: false,
        profile: Some(profile),
        ..RunOptions::default()
    };
    let exp = experiment::run_scenario(scenario, &opts).map_err(|e| e.to_string())?;
    let run = exp
        .runs
        .iter()
        .find(|r| r.end.mode == CacheMode::Paged)
        .ok_or("the prediction has no paged run")?;
    let m = &run.metrics;
    let prefix_hit_rate = exp.prefix_bounds.as_ref().ok().map(|b| {
        if b.lookup_tokens > 0 {
            m.request_prefix_hit_tokens as f64 / b.lookup_tokens as f64
        } else {
            0.0
        }
    });
    let mut ratio = BTreeMap::new();
    for (name, got, want) in [
        ("ttft_p50", measured.ttft.p50, m.ttft.p50),
        ("ttft_p99", measured.ttft.p99, m.ttft.p99),
        ("itl_p50", measured.itl.p50, m.itl.p50),
        ("itl_p99", measured.itl.p99, m.itl.p99),
        ("tpot_p50", measured.tpot.p50, m.tpot.p50),
        ("e2e_p99", measured.e2e.p99, m.e2e.p99),
        (
            "throughput_tokens_per_s",
            measured.throughput_tokens_per_s,
            m.throughput_tokens_per_s,
        ),
    ] {
        if want > 0.0 {
            ratio.insert(name, got / want);
        }
    }
    Ok(Prediction {
        device,
        ttft_p50_ms: m.ttft.p50,
        ttft_p99_ms: m.ttft.p99,
        itl_p50_ms: m.itl.p50,
        itl_p99_ms: m.itl.p99,
        tpot_p50_ms: m.tpot.p50,
        e2e_p99_ms: m.e2e.p99,
        throughput_tokens_per_s: m.throughput_tokens_per_s,
        prefix_hit_rate,
        ratio,
    })
}

struct SummaryInput<'a> {
    scenario: &'a Scenario,
    seed: u64,
    workload: &'a Workload,
    base: &'a BaseUrl,
    model: String,
    models: serde_json::Value,
    driven: &'a drive::Driven,
    metrics: &'a crate::metrics::RunMetrics,
    scraper: &'a Scraper,
    opts: &'a EndpointOptions,
    prediction: Option<Result<Prediction, String>>,
}

/// Offered and achieved rate of the scheduled requests, and their lags.
fn rates(done: &[drive::Done]) -> (Option<f64>, Option<f64>, LagMs) {
    let sched: Vec<&drive::Done> = done.iter().filter(|d| d.scheduled).collect();
    let mut lags: Vec<u64> = sched
        .iter()
        .map(|d| d.answer.arrival_ns.saturating_sub(d.intended_ns))
        .collect();
    lags.sort_unstable();
    let q = |p: f64| -> f64 {
        if lags.is_empty() {
            return 0.0;
        }
        let i = ((p * lags.len() as f64).ceil() as usize).clamp(1, lags.len()) - 1;
        lags[i] as f64 / 1e6
    };
    let lag = LagMs {
        p50: q(0.50),
        p99: q(0.99),
        max: lags.last().map_or(0.0, |&l| l as f64 / 1e6),
        count: lags.len() as u64,
    };
    let span = |f: fn(&drive::Done) -> u64| {
        let lo = sched.iter().map(|d| f(d)).min()?;
        let hi = sched.iter().map(|d| f(d)).max()?;
        (hi > lo && sched.len() >= 2).then(|| (sched.len() - 1) as f64 / ((hi - lo) as f64 / 1e9))
    };
    (span(|d| d.intended_ns), span(|d| d.answer.arrival_ns), lag)
}

fn summarize(i: SummaryInput<'_>) -> EndpointSummary {
    let d = i.driven;
    let mut flags: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut flagged = 0;
    for r in &d.done {
        if !r.answer.flags.is_empty() {
            flagged += 1;
        }
        let kinds: std::collections::BTreeSet<&'static str> =
            r.answer.flags.iter().map(|f| f.kind).collect();
        for k in kinds {
            *flags.entry(k).or_default() += 1;
        }
    }
    let (offered, achieved, lag) = rates(&d.done);
    let rate_not_achieved = matches!((offered, achieved), (Some(o), Some(a)) if a < 0.9 * o);
    let partial = d.stopped_at_ns.is_some();
    let mut failures = Vec::new();
    if partial {
        failures.push(format!(
            "partial: the run stopped at {:.3} s on a transport failure ({} of {} requests sent, {} completed)",
            d.stopped_at_ns.unwrap_or(0) as f64 / 1e9,
            d.done.len(),
            i.workload.requests.len(),
            i.metrics.counts.completed
        ));
    }
    if flagged > 0 {
        let kinds: Vec<String> = flags.iter().map(|(k, n)| format!("{k} {n}")).collect();
        failures.push(format!(
            "{flagged} request(s) flagged ({}; endpoint.csv has each)",
            kinds.join(", ")
        ));
    }
    if rate_not_achieved {
        failures.push(format!(
            "offered rate not achieved: {:.2}/s sent of {:.2}/s scheduled (lag p99 {:.3} ms)",
            achieved.unwrap_or(0.0),
            offered.unwrap_or(0.0),
            lag.p99
        ));
    }
    let stopped_because = d.stopped_at_ns.and_then(|_| {
        d.done
            .iter()
            .filter(|r| r.answer.transport_failure)
            .min_by_key(|r| r.answer.finish_ns)
            .and_then(|r| r.answer.flags.iter().find(|f| f.kind == "transport"))
            .map(|f| f.detail.clone())
    });
    let (server_metrics, server_metrics_unavailable) = i.scraper.metrics();
    let server_hit_share = server_metrics.as_ref().and_then(|m| m.prefix_hit_share);
    let bounds = prefix_bounds(i.scenario, i.seed, i.workload);
    let cached: Option<u64> = d
        .done
        .iter()
        .filter_map(|r| r.answer.cached_prompt_tokens)
        .fold(None, |acc, c| Some(acc.unwrap_or(0) + c));
    let mut predict = None;
    match i.prediction {
        Some(Ok(p)) => predict = Some(p),
        Some(Err(e)) => failures.push(format!("--predict: {e}")),
        None => {}
    }
    EndpointSummary {
        scenario: i.scenario.name.clone(),
        backend: "endpoint",
        seed: i.seed,
        workload_hash: i.workload.workload_hash.clone(),
        trace: i.workload.trace.clone(),
        sessions: SessionsSummary::of(i.workload),
        slo: i.scenario.slo.clone(),
        checks: Checks {
            ok: failures.is_empty(),
            failures,
        },
        runs: vec![EndpointRunSummary::new(i.metrics, cached)],
        endpoint: EndpointInfo {
            url: i.base.text.clone(),
            model: i.model,
            models: i.models,
            client_version: format!("kvbench {}", env!("CARGO_PKG_VERSION")),
            partial,
            stopped_at_ms: d.stopped_at_ns.map(|t| t as f64 / 1e6),
            stopped_because,
            requests_planned: i.workload.requests.len() as u64,
            requests_sent: d.done.len() as u64,
            requests_not_sent: d.not_sent,
            flagged_requests: flagged,
            flags,
            offered_rate_per_s: offered,
            achieved_rate_per_s: achieved,
            lag_ms: lag,
            rate_not_achieved,
            request_timeout_s: i.opts.request_timeout.as_secs_f64(),
            idle_timeout_s: i.opts.idle_timeout.as_secs_f64(),
            session_turns_without_token_ids: d.turns_without_token_ids,
            server_metrics,
            server_metrics_unavailable,
        },
        prefix_cache: PrefixView {
            server_hit_share,
            admission_hit_share: match (&bounds, cached) {
                (Ok(b), Some(c)) if b.lookup_tokens > 0 => Some(c as f64 / b.lookup_tokens as f64),
                _ => None,
            },
            bounds: bounds.as_ref().ok().cloned(),
            bounds_unavailable: bounds.err(),
        },
        predict,
    }
}

/// The request list's bounds at the pool `kvbench run` would size for the scenario on `sim`.
fn prefix_bounds(
    scenario: &Scenario,
    seed: u64,
    workload: &Workload,
) -> Result<crate::metrics::prefix_bounds::PrefixBounds, String> {
    let opts = RunOptions {
        backend: BackendKind::Sim,
        seed: Some(seed),
        ..RunOptions::default()
    };
    let setup = experiment::setup(scenario, &opts).map_err(|e| e.to_string())?;
    let (host, disk) = scenario.tier_slots(&setup.model);
    crate::metrics::prefix_bounds::compute(
        scenario,
        workload,
        setup.cache_manager,
        setup.total_slots,
        host.saturating_add(disk),
    )
}

/// `report.md`: the headline figures and what the summary flags.
fn report(s: &EndpointSummary) -> String {
    let r = &s.runs[0];
    let e = &s.endpoint;
    let mut t = format!(
        "# {} against {} (model {})\n\n\
         | requests | completed | cancelled | rejected | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms | E2E p99 ms | tokens/s | goodput req/s |\n\
         |---|---|---|---|---|---|---|---|---|---|\n\
         | {} | {} | {} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} | {:.2} | {:.1} | {:.2} |\n\n",
        s.scenario,
        e.url,
        e.model,
        r.requests.total,
        r.requests.completed,
        r.requests.cancelled,
        r.requests.rejected,
        r.ttft_ms.p50,
        r.ttft_ms.p99,
        r.itl_ms.p50,
        r.itl_ms.p99,
        r.tpot_ms.p50,
        r.e2e_ms.p99,
        r.throughput_tokens_per_s,
        r.goodput_requests_per_s,
    );
    t.push_str(&format!(
        "Schedule: lag p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; offered {} /s, achieved {} /s{}.\n",
        e.lag_ms.p50,
        e.lag_ms.p99,
        e.lag_ms.max,
        e.offered_rate_per_s.map_or("-".into(), |x| format!("{x:.2}")),
        e.achieved_rate_per_s.map_or("-".into(), |x| format!("{x:.2}")),
        if e.rate_not_achieved { " (NOT achieved)" } else { "" }
    ));
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
    t.push_str(&format!(
        "Prefix hits: server counters {} (every lookup, restarts included), at admission {}; this request list: replayed LRU {}, offline optimum {}, infinite cache {}.\n",
        pct(s.prefix_cache.server_hit_share),
        pct(s.prefix_cache.admission_hit_share),
        pct(s.prefix_cache.bounds.as_ref().map(|b| b.replayed_lru_hit_rate)),
        pct(s.prefix_cache.bounds.as_ref().map(|b| b.optimum_hit_rate)),
        pct(s.prefix_cache.bounds.as_ref().map(|b| b.ceiling_hit_rate)),
    ));
    if let Some(p) = &s.predict {
        t.push_str(&format!(
            "Predicted by sim on {}: TTFT p99 {:.2} ms, ITL p99 {:.2} ms, {:.1} tokens/s (measured ÷ predicted: {}).\n",
            p.device,
            p.ttft_p99_ms,
            p.itl_p99_ms,
            p.throughput_tokens_per_s,
            p.ratio
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if e.partial {
        t.push_str("\n**Partial**: the run stopped early; the figures cover what completed.\n");
    }
    for f in &s.checks.failures {
        t.push_str(&format!("\n- check failed: {f}"));
    }
    t.push('\n');
    t
}
