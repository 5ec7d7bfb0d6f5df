//! `kvbench serve`: the engine with the `cpu` backend (real compute, the seeded model) on the wall
//! clock, behind an OpenAI-compatible HTTP server on a loopback address. See `docs/serve.md`.
//!
//! One job a file: `http.rs` routes and bounds what clients send, `wire.rs` reads a completions
//! request (and writes one for a scenario's request list), `sse.rs` formats answers,
//! `metrics.rs` keeps `/metrics`, `bridge.rs` joins the handlers to the engine thread,
//! `engine.rs` is the served run on that thread, `signals.rs` turns SIGINT/SIGTERM into a
//! shutdown. Here: binding, the runtime and the order things stop in.
//!
//! The engine keeps its one-owner step loop on a thread of its own; the HTTP side runs on a
//! small tokio runtime. Shutdown: the listener stops, new completions get 503, the engine drains
//! (or cancels), runs the end-of-run checks and writes the results folder; answers still being
//! sent get a moment to end, then the runtime stops.

pub mod bridge;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod signals;
pub mod sse;
pub mod wire;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use kvbench_cache_api::CacheMode;
use tokio::sync::{Notify, Semaphore};

use self::bridge::ToEngine;
use self::http::App;
use self::metrics::Metrics;
use self::wire::ModelLimits;
use crate::results::{marker, Staging};
use crate::scenario::Scenario;

/// Connections served at once; more wait in the listener's backlog.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long answers still being sent may take to end once the engine stopped.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// What to serve and where.
#[derive(Debug, Clone)]
pub struct Config {
    pub scenario: Scenario,
    pub mode: CacheMode,
    pub seed: Option<u64>,
    pub host: IpAddr,
    /// 0 picks a free port.
    pub port: u16,
    pub out: PathBuf,
    /// Replace an existing results folder at `out`.
    pub replace: bool,
    pub max_waiting: u64,
    /// How long a first stop signal lets running requests finish before cancelling them.
    pub drain_timeout: Duration,
    /// How long a request's headers, then its body, may take to arrive.
    pub read_timeout: Duration,
}

/// A bound server, not serving yet: its address is known (print it, then [`Server::run`]).
pub struct Server {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    plan: engine::Plan,
    staging: Staging,
    app: Arc<App>,
    rx: mpsc::Receiver<ToEngine>,
    stop: Arc<Notify>,
    drain_timeout: Duration,
}

/// Stops a running server (what a signal does): `cancel` cuts running requests at once, else
/// they drain for the drain timeout first.
#[derive(Clone)]
pub struct Stopper {
    app: Arc<App>,
    stop: Arc<Notify>,
    drain_timeout: Duration,
    stopping: Arc<AtomicBool>,
}

impl Stopper {
    pub fn stop(&self, cancel: bool) {
        self.app.draining.store(true, Ordering::SeqCst);
        self.stop.notify_one();
        let _ = self.app.to_engine.send(ToEngine::Shutdown { cancel });
        if !cancel && !self.stopping.swap(true, Ordering::SeqCst) {
            let (to_engine, wait) = (self.app.to_engine.clone(), self.drain_timeout);
            let _ = std::thread::Builder::new()
                .name("serve-drain".into())
                .spawn(move || {
                    std::thread::sleep(wait);
                    let _ = to_engine.send(ToEngine::Shutdown { cancel: true });
                });
        }
    }
}

/// Check the scenario, stage the results folder and bind the address: everything that can be
/// refused is refused here, before any request is taken.
pub fn bind(cfg: Config) -> anyhow::Result<Server> {
    let model = cfg
        .scenario
        .model_shape()
        .ok_or_else(|| anyhow::anyhow!("model: unknown preset or incomplete shape"))?;
    let limits = ModelLimits {
        name: model.name.clone(),
        max_seq_len: cfg.scenario.cache.max_seq_len,
        vocab: model.vocab,
    };
    let addr = SocketAddr::new(cfg.host, cfg.port);
    let plan = engine::plan(cfg.scenario, cfg.mode, cfg.seed, String::new())?;
    let staging = Staging::begin(&cfg.out, marker::Kind::Run, cfg.replace)?;
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("--host/--port: cannot listen on {addr}: {e}"))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let mut plan = plan;
    plan.address = addr.to_string();
    let (tx, rx) = mpsc::channel();
    let app = Arc::new(App {
        metrics: Arc::new(Metrics::new(&limits.name)),
        model: limits,
        to_engine: tx,
        draining: AtomicBool::new(false),
        next_handle: AtomicU64::new(0),
        outstanding: AtomicU64::new(0),
        max_waiting: cfg.max_waiting,
        read_timeout: cfg.read_timeout,
    });
    Ok(Server {
        listener,
        addr,
        plan,
        staging,
        app,
        rx,
        stop: Arc::new(Notify::new()),
        drain_timeout: cfg.drain_timeout,
    })
}

impl Server {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stopper(&self) -> Stopper {
        Stopper {
            app: self.app.clone(),
            stop: self.stop.clone(),
            drain_timeout: self.drain_timeout,
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Serve until stopped (by a [`Stopper`], or the engine ending on its own), then return
    /// the served run's outcome once its results folder is in place.
    pub fn run(self) -> anyhow::Result<engine::Outcome> {
        let Server {
            listener,
            plan,
            staging,
            app,
            rx,
            stop,
            ..
        } = self;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("serve-http")
            .enable_all()
            .build()?;
        let metrics = app.metrics.clone();
        let (engine_app, engine_stop) = (app.clone(), stop.clone());
        let engine = std::thread::Builder::new()
            .name("serve-engine".into())
            .spawn(move || {
                let out = engine::run(plan, staging, rx, metrics);
                // However the engine ended, the listener stops with it.
                engine_app.draining.store(true, Ordering::SeqCst);
                engine_stop.notify_one();
                out
            })?;
        let accept_app = app.clone();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            accept(listener, accept_app, stop).await;
            anyhow::Ok(())
        })?;
        let outcome = engine
            .join()
            .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
        // Answers the engine finished get a moment to reach their clients.
        rt.block_on(async {
            let t0 = Instant::now();
            while app.outstanding.load(Ordering::SeqCst) > 0 && t0.elapsed() < FLUSH_TIMEOUT {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        rt.shutdown_timeout(Duration::from_millis(100));
        outcome
    }
}

/// Accept connections until `stop` is notified.
async fn accept(listener: tokio::net::TcpListener, app: Arc<App>, stop: Arc<Notify>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = stop.notified() => return,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let conn = tokio::select! {
            _ = stop.notified() => return,
            c = listener.accept() => c,
        };
        let stream = match conn {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors or a connection reset before it was taken: try again soon.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let read_timeout = app.read_timeout;
        tokio::spawn(async move {
            let service = service_fn(move |req| http::handle(app.clone(), req));
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(read_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
}
