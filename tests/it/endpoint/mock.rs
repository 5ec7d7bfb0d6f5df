//! A small OpenAI-compatible server for the endpoint tests: tokio + hyper in its own thread, on
//! an ephemeral port, answering `/v1/models`, `/metrics` and streamed `/v1/completions` as the
//! wire contract says, with per-request misbehaviour chosen by the test (multi-token chunks,
//! malformed events, a wrong token count, a slow-loris drip, dying after N requests). It
//! records what it was asked and when a client closed a stream.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use tokio::sync::{mpsc, watch};

/// How the server answers one request.
#[derive(Debug, Clone)]
pub enum Misbehave {
    None,
    /// One event that is not JSON, after the first token.
    Malformed,
    /// This many tokens fewer than max_tokens, then a normal finish.
    ShortBy(u32),
    /// A byte every `Duration`, never finishing an event.
    SlowLoris(Duration),
    /// Tokens until the client closes the stream (a bound far past any test's timeout).
    Endless,
}

#[derive(Clone)]
pub struct Config {
    pub model: String,
    /// Tokens per chunk.
    pub chunk_tokens: u32,
    /// Delay before each chunk.
    pub chunk_delay: Duration,
    /// Stop answering (close everything) once this many completions were started.
    pub die_after: Option<u64>,
    /// Whether `/metrics` exists; each completion adds `prompt/4` hits and `prompt` queries.
    pub metrics: bool,
    pub misbehave: Arc<dyn Fn(u64) -> Misbehave + Send + Sync>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            model: "mock-model".into(),
            chunk_tokens: 1,
            chunk_delay: Duration::from_millis(1),
            die_after: None,
            metrics: true,
            misbehave: Arc::new(|_| Misbehave::None),
        }
    }
}

/// What one completion request asked and how it ended on the server.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub request_id: u64,
    pub prompt_len: usize,
    pub max_tokens: u32,
    pub n: u32,
    /// Tokens per choice sent before the client closed the stream (None: not closed early).
    pub closed_after_tokens: Option<u32>,
}

#[derive(Default)]
pub struct Log {
    pub seen: Mutex<Vec<Seen>>,
    hits: AtomicU64,
    queries: AtomicU64,
    started: AtomicU64,
}

pub struct Mock {
    pub addr: SocketAddr,
    pub log: Arc<Log>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mock {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        let mut v = self.log.seen.lock().unwrap().clone();
        v.sort_by_key(|s| s.request_id);
        v
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A response body fed from a channel (dropped by hyper when the client goes away).
struct ChanBody(mpsc::Receiver<Bytes>);

impl Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

type Answer = Response<http_body_util::Either<Full<Bytes>, ChanBody>>;

fn full(status: u16, ctype: &str, body: String) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", ctype)
        .body(http_body_util::Either::Left(Full::new(Bytes::from(body))))
        .unwrap()
}

pub fn start(cfg: Config) -> Mock {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Log::default());
    let (stop, stop_rx) = watch::channel(false);
    let (log2, stop2) = (log.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(serve(listener, cfg, log2, stop_rx, stop2));
        rt.shutdown_timeout(Duration::from_millis(100));
    });
    Mock {
        addr,
        log,
        stop,
        thread: Some(thread),
    }
}

async fn serve(
    listener: std::net::TcpListener,
    cfg: Config,
    log: Arc<Log>,
    mut stop_rx: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let cfg = Arc::new(cfg);
    let stop = Arc::new(stop);
    loop {
        let (tcp, _) = tokio::select! {
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
            _ = stop_rx.changed() => return,
        };
        let (cfg, log, stop) = (cfg.clone(), log.clone(), stop.clone());
        let mut conn_stop = stop_rx.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let (cfg, log, stop) = (cfg.clone(), log.clone(), stop.clone());
                async move { Ok::<_, Infallible>(handle(req, &cfg, &log, &stop).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc);
            tokio::select! {
                _ = conn => {}
                _ = conn_stop.changed() => {}
            }
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    cfg: &Arc<Config>,
    log: &Arc<Log>,
    stop: &Arc<watch::Sender<bool>>,
) -> Answer {
    match (req.method().as_str(), req.uri().path()) {
        ("GET", "/v1/models") => full(
            200,
            "application/json",
            format!(
                "{{\"object\":\"list\",\"data\":[{{\"id\":\"{}\",\"object\":\"model\",\"created\":0,\"owned_by\":\"kvbench\",\"max_model_len\":256}}]}}",
                cfg.model
            ),
        ),
        ("GET", "/metrics") if cfg.metrics => full(
            200,
            "text/plain; version=0.0.4",
            format!(
                "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{{model_name=\"{m}\"}} {}\nvllm:prefix_cache_queries_total{{model_name=\"{m}\"}} {}\nvllm:num_requests_running{{model_name=\"{m}\"}} 0\n",
                log.hits.load(Ordering::SeqCst),
                log.queries.load(Ordering::SeqCst),
                m = cfg.model
            ),
        ),
        ("POST", "/v1/completions") => completion(req, cfg, log, stop).await,
        _ => full(404, "text/plain", "not found".into()),
    }
}

async fn completion(
    req: Request<Incoming>,
    cfg: &Arc<Config>,
    log: &Arc<Log>,
    stop: &Arc<watch::Sender<bool>>,
) -> Answer {
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let prompt_len = v["prompt"].as_array().map_or(0, |a| a.len());
    let max_tokens = v["max_tokens"].as_u64().unwrap() as u32;
    let n = v["n"].as_u64().unwrap_or(1) as u32;
    let id = v["kvbench"]["request_id"].as_u64().unwrap();
    assert_eq!(v["model"].as_str(), Some(cfg.model.as_str()));
    assert_eq!(v["stream"], serde_json::Value::Bool(true));
    let started = log.started.fetch_add(1, Ordering::SeqCst) + 1;
    if cfg.die_after.is_some_and(|d| started > d) {
        let _ = stop.send(true);
    }
    log.hits.fetch_add(prompt_len as u64 / 4, Ordering::SeqCst);
    log.queries.fetch_add(prompt_len as u64, Ordering::SeqCst);
    let index = {
        let mut s = log.seen.lock().unwrap();
        s.push(Seen {
            request_id: id,
            prompt_len,
            max_tokens,
            n,
            closed_after_tokens: None,
        });
        s.len() - 1
    };
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let (cfg, log) = (cfg.clone(), log.clone());
    tokio::spawn(async move {
        let misbehave = (cfg.misbehave)(id);
        let total = match misbehave {
            Misbehave::ShortBy(k) => max_tokens.saturating_sub(k),
            Misbehave::Endless => 1_000_000,
            _ => max_tokens,
        };
        let mut sent = 0u32;
        let mut usage = 0u64;
        let closed = |sent: u32| {
            log.seen.lock().unwrap()[index].closed_after_tokens = Some(sent);
        };
        if let Misbehave::SlowLoris(every) = misbehave {
            for b in b"data: {\"choices\":[".iter().cycle() {
                tokio::time::sleep(every).await;
                if tx.send(Bytes::copy_from_slice(&[*b])).await.is_err() {
                    return closed(0);
                }
            }
        }
        while sent < total {
            tokio::time::sleep(cfg.chunk_delay).await;
            let k = cfg.chunk_tokens.min(total - sent);
            let mut text = String::new();
            for choice in 0..n {
                usage += u64::from(k);
                let ids: Vec<u32> = (sent..sent + k).map(|t| (t + choice) % 500).collect();
                text.push_str(&format!(
                    "data: {{\"id\":\"cmpl-{id}\",\"object\":\"text_completion\",\"created\":0,\"model\":\"{}\",\"choices\":[{{\"index\":{choice},\"text\":\" t\",\"token_ids\":{:?},\"finish_reason\":null}}],\"usage\":{{\"prompt_tokens\":{prompt_len},\"completion_tokens\":{usage}}}}}\n\n",
                    cfg.model, ids
                ));
            }
            if sent == 0 && matches!(misbehave, Misbehave::Malformed) {
                text.push_str("data: {this is not json\n\n");
            }
            if tx.send(Bytes::from(text)).await.is_err() {
                return closed(sent);
            }
            sent += k;
        }
        let mut end = String::new();
        for choice in 0..n {
            end.push_str(&format!(
                "data: {{\"choices\":[{{\"index\":{choice},\"text\":\"\",\"finish_reason\":\"length\"}}],\"usage\":{{\"prompt_tokens\":{prompt_len},\"completion_tokens\":{usage}}}}}\n\n"
            ));
        }
        end.push_str("data: [DONE]\n\n");
        if tx.send(Bytes::from(end)).await.is_err() {
            closed(sent);
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(http_body_util::Either::Right(ChanBody(rx)))
        .unwrap()
}
