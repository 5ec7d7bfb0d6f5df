//! HTTP routing and the bounds on what a client can make the server hold: the routes
//! (`POST /v1/completions`, `GET /v1/models`, `/health`, `/metrics`), each request's body read
//! under a size cap and a deadline, the waiting-requests cap, and the answer — streamed as
//! server-sent events from the request's bounded channel, or whole.
//!
//! An answer's end is watched by a guard: if the answer is dropped before the engine finished
//! the request (the client closed the connection, so hyper dropped the body), the guard tells
//! the engine to cancel it.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::mpsc as tmpsc;

use super::bridge::{Event, ToEngine, CHANNEL_EVENTS};
use super::metrics::Metrics;
use super::sse::{finish_reason, Answer};
use super::wire::{self, ModelLimits, WireError};

/// A request body larger than this is refused (413) before or while it is read.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The default time a request's headers (else hyper closes the connection) and then its body
/// (else 408) may take to arrive: a slow client cannot hold a connection open for nothing.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

pub type RespBody = BoxBody<Bytes, Infallible>;

/// What every handler shares.
pub struct App {
    pub model: ModelLimits,
    pub metrics: Arc<Metrics>,
    pub to_engine: mpsc::Sender<ToEngine>,
    /// Set at shutdown: new completions are answered 503.
    pub draining: AtomicBool,
    pub next_handle: AtomicU64,
    /// Requests handed to the engine whose answer has not ended.
    pub outstanding: AtomicU64,
    /// The most requests that may wait to start (outstanding less running); beyond: 429.
    pub max_waiting: u64,
    /// See [`READ_TIMEOUT`].
    pub read_timeout: Duration,
}

fn full(status: StatusCode, content_type: &'static str, body: String) -> Response<RespBody> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn error(app: &App, e: WireError) -> Response<RespBody> {
    app.metrics.refused();
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    full(status, "application/json", e.body())
}

/// Route one request.
pub async fn handle(
    app: Arc<App>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    let path = req.uri().path().to_string();
    let r = match (req.method(), path.as_str()) {
        (&Method::POST, "/v1/completions") => completions(&app, req).await,
        (&Method::GET, "/v1/models") => full(
            StatusCode::OK,
            "application/json",
            serde_json::json!({"object": "list", "data": [{
                "id": app.model.name, "object": "model", "created": 0,
                "owned_by": "kvbench", "max_model_len": app.model.max_seq_len,
            }]})
            .to_string(),
        ),
        (&Method::GET, "/health") => {
            if app.draining.load(Ordering::SeqCst) {
                full(StatusCode::SERVICE_UNAVAILABLE, "text/plain", String::new())
            } else {
                full(StatusCode::OK, "text/plain", String::new())
            }
        }
        (&Method::GET, "/metrics") => full(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            app.metrics.text(),
        ),
        (_, "/v1/completions" | "/v1/models" | "/health" | "/metrics") => error(
            &app,
            WireError {
                status: 405,
                message: format!("{} {path}: method not allowed", req.method()),
            },
        ),
        _ => error(
            &app,
            WireError {
                status: 404,
                message: format!("{path}: no such route"),
            },
        ),
    };
    Ok(r)
}

/// The body, capped and under a deadline.
async fn read_body(req: Request<Incoming>, timeout: Duration) -> Result<Bytes, WireError> {
    let too_big = || WireError {
        status: 413,
        message: format!("request body over {MAX_BODY_BYTES} bytes"),
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_big());
    }
    let body = Limited::new(req.into_body(), MAX_BODY_BYTES);
    match tokio::time::timeout(timeout, body.collect()).await {
        Err(_) => Err(WireError {
            status: 408,
            message: format!(
                "request body not received within {} s",
                timeout.as_secs_f64()
            ),
        }),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_big()),
        Ok(Err(e)) => Err(WireError::bad(format!("request body: {e}"))),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

async fn completions(app: &Arc<App>, req: Request<Incoming>) -> Response<RespBody> {
    let draining = || WireError {
        status: 503,
        message: "the server is shutting down".into(),
    };
    if app.draining.load(Ordering::SeqCst) {
        return error(app, draining());
    }
    let bytes = match read_body(req, app.read_timeout).await {
        Ok(b) => b,
        Err(e) => return error(app, e),
    };
    let c = match wire::parse(&bytes, &app.model) {
        Ok(c) => c,
        Err(e) => return error(app, e),
    };
    let waiting = app
        .outstanding
        .load(Ordering::SeqCst)
        .saturating_sub(app.metrics.running());
    if waiting >= app.max_waiting {
        return error(
            app,
            WireError {
                status: 429,
                message: format!(
                    "{waiting} requests are waiting (the most is {}): try again later",
                    app.max_waiting
                ),
            },
        );
    }
    let handle = app.next_handle.fetch_add(1, Ordering::SeqCst);
    let id = c.request_id.unwrap_or(handle);
    let (tx, rx) = tmpsc::channel(CHANNEL_EVENTS);
    app.outstanding.fetch_add(1, Ordering::SeqCst);
    let guard = Guard {
        app: app.clone(),
        handle,
        finished: false,
    };
    let submitted = app.to_engine.send(ToEngine::Submit {
        handle,
        request: c.request(id),
        events: tx,
    });
    if submitted.is_err() {
        drop(guard);
        return error(app, draining());
    }
    let answer = Answer::new(
        format!("cmpl-{id}"),
        app.model.name.clone(),
        c.prompt.len() as u32,
        c.samples,
        c.include_usage,
    );
    if c.stream {
        let body = SseBody {
            rx,
            answer,
            guard,
            ended: false,
        };
        let mut r = Response::new(body.boxed());
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        r.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return r;
    }
    whole(app, rx, answer, guard).await
}

/// A `stream: false` answer: wait for every event, answer once.
async fn whole(
    app: &App,
    mut rx: tmpsc::Receiver<Event>,
    mut answer: Answer,
    mut guard: Guard,
) -> Response<RespBody> {
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { rank, token } => {
                answer.token(rank as usize, token);
            }
            Event::Done { rank, status } => {
                answer.finish(rank as usize, finish_reason(status));
            }
            Event::Cached { tokens } => answer.cached_tokens = tokens,
            Event::Refused { message } => {
                guard.finished = true;
                return error(app, WireError::bad(message));
            }
        }
    }
    guard.finished = true;
    full(StatusCode::OK, "application/json", answer.complete())
}

/// Cancels its request if the answer is dropped before the engine finished it.
struct Guard {
    app: Arc<App>,
    handle: u64,
    finished: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.app.to_engine.send(ToEngine::Cancel {
                handle: self.handle,
            });
        }
        self.app.outstanding.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A streamed answer: the request's events as they come, as server-sent events.
struct SseBody {
    rx: tmpsc::Receiver<Event>,
    answer: Answer,
    guard: Guard,
    ended: bool,
}

/// The most bytes one frame gathers from events already waiting.
const FRAME_BYTES: usize = 64 << 10;

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let mut buf = String::new();
        while buf.len() < FRAME_BYTES {
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Event::Token { rank, token })) => {
                    if let Some(e) = this.answer.token(rank as usize, token) {
                        buf.push_str(&e);
                    }
                }
                Poll::Ready(Some(Event::Done { rank, status })) => {
                    if let Some(e) = this.answer.finish(rank as usize, finish_reason(status)) {
                        buf.push_str(&e);
                    }
                }
                Poll::Ready(Some(Event::Cached { tokens })) => this.answer.cached_tokens = tokens,
                Poll::Ready(Some(Event::Refused { message })) => {
                    this.guard.app.metrics.refused();
                    let e = WireError::bad(message);
                    buf.push_str(&format!("data: {}\n\n", e.body()));
                    buf.push_str("data: [DONE]\n\n");
                    this.ended = true;
                    this.guard.finished = true;
                    break;
                }
                Poll::Ready(None) => {
                    buf.push_str(&this.answer.done());
                    this.ended = true;
                    this.guard.finished = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        if buf.is_empty() {
            return Poll::Pending;
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}
