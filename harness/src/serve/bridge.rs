//! The engine thread and what joins it to the HTTP side: the engine keeps its one-owner loop on
//! a thread of its own (it owns the cache manager and the backend); handlers talk to it by
//! message ([`ToEngine`]) and hear back on a bounded channel per request ([`Event`]).
//!
//! On the engine thread, [`Source`] turns messages into the engine's live inputs (numbering
//! requests as the engine will) and [`Forward`], one of the run's sinks, hands each token and
//! each stream's end to its request's channel. A channel is bounded: a reader that falls
//! [`CHANNEL_EVENTS`] events behind (or went away) gets its request cancelled, and the answer
//! ends with `finish_reason: "abort"` — memory never grows with a slow reader.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc as tmpsc;

use super::metrics::Metrics;
use crate::engine::{
    LiveInput, LiveSource, LiveStats, RunSink, StreamRecord, StreamStatus, TokenEvent, TraceEvent,
    TraceKind,
};
use crate::workload::Request;

/// Events one request's channel holds before its reader counts as gone.
pub const CHANNEL_EVENTS: usize = 4096;

/// What a handler tells the engine thread.
#[derive(Debug)]
pub enum ToEngine {
    /// A checked request; `handle` names it in a later `Cancel`.
    Submit {
        handle: u64,
        request: Request,
        events: tmpsc::Sender<Event>,
    },
    /// The client of `handle` went away.
    Cancel { handle: u64 },
    /// Stop taking requests; `cancel`: cancel what is unresolved instead of letting it finish.
    Shutdown { cancel: bool },
}

/// What the engine tells one request's handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Choice `rank` produced `token`.
    Token { rank: u32, token: u32 },
    /// Choice `rank` ended.
    Done { rank: u32, status: StreamStatus },
    /// The request's prompt tokens the prefix cache supplied at its first admission.
    Cached { tokens: u32 },
    /// The engine refused the request before running it.
    Refused { message: String },
}

struct Live {
    events: tmpsc::Sender<Event>,
    handle: u64,
    index: u32,
    samples: u32,
    /// The reader fell behind or went away: later events are dropped.
    gone: bool,
    /// Its first admission is the last event seen of it (a prefix hit may follow).
    admitted: bool,
    all_completed: bool,
}

/// What the source and the sink share on the engine thread.
#[derive(Default)]
struct Shared {
    /// Unresolved requests by the id the engine records them under.
    by_id: HashMap<u64, Live>,
    /// Request index by handle, for cancellations.
    by_handle: HashMap<u64, (u32, u64)>,
    /// Requests handed to the engine so far (the next one's index).
    handed: u32,
    /// Cancellations the sink decided (a reader gone), handed over at the next poll.
    cancels: Vec<u32>,
    /// Requests cancelled because their client went away or fell behind.
    client_cancels: u64,
    /// A cancelling shutdown came while requests were unresolved.
    cut: bool,
}

/// The engine's live source: the handlers' messages.
pub struct Source {
    rx: mpsc::Receiver<ToEngine>,
    shared: Rc<RefCell<Shared>>,
    metrics: Arc<Metrics>,
    /// Every handler is gone: nothing more can arrive.
    closed: bool,
}

/// The sink that forwards tokens and stream ends to the handlers, and counts for `/metrics`.
pub struct Forward {
    shared: Rc<RefCell<Shared>>,
    metrics: Arc<Metrics>,
}

/// The source and the sink of one live run.
pub fn pair(rx: mpsc::Receiver<ToEngine>, metrics: Arc<Metrics>) -> (Source, Forward) {
    let shared = Rc::new(RefCell::new(Shared::default()));
    (
        Source {
            rx,
            shared: shared.clone(),
            metrics: metrics.clone(),
            closed: false,
        },
        Forward { shared, metrics },
    )
}

impl Source {
    /// Requests cancelled because their client went away or fell behind.
    pub fn client_cancels(&self) -> u64 {
        self.shared.borrow().client_cancels
    }

    /// Whether the shutdown cancelled requests (rather than every one resolving first).
    pub fn cut(&self) -> bool {
        self.shared.borrow().cut
    }

    fn shutdown(&self, cancel: bool, out: &mut Vec<LiveInput>) {
        let mut sh = self.shared.borrow_mut();
        if cancel && !sh.by_id.is_empty() {
            sh.cut = true;
        }
        out.push(LiveInput::Shutdown { cancel });
    }

    fn take(&mut self, msg: ToEngine, out: &mut Vec<LiveInput>) {
        let mut sh = self.shared.borrow_mut();
        match msg {
            ToEngine::Submit {
                handle,
                request,
                events,
            } => {
                if sh.by_id.contains_key(&request.id) {
                    let _ = events.try_send(Event::Refused {
                        message: format!(
                            "kvbench.request_id: request {} is already in flight",
                            request.id
                        ),
                    });
                    return;
                }
                let index = sh.handed;
                sh.handed += 1;
                sh.by_handle.insert(handle, (index, request.id));
                sh.by_id.insert(
                    request.id,
                    Live {
                        events,
                        handle,
                        index,
                        samples: request.samples.max(1),
                        gone: false,
                        admitted: false,
                        all_completed: true,
                    },
                );
                out.push(LiveInput::Request(request));
            }
            ToEngine::Cancel { handle } => {
                if let Some(&(index, id)) = sh.by_handle.get(&handle) {
                    if let Some(l) = sh.by_id.get_mut(&id) {
                        if !l.gone {
                            l.gone = true;
                            sh.client_cancels += 1;
                        }
                    }
                    out.push(LiveInput::Cancel(index));
                }
            }
            ToEngine::Shutdown { cancel } => {
                drop(sh);
                self.shutdown(cancel, out);
            }
        }
    }
}

impl LiveSource for Source {
    fn poll(&mut self, wait: Option<Duration>) -> Vec<LiveInput> {
        let mut out: Vec<LiveInput> = {
            let mut sh = self.shared.borrow_mut();
            sh.cancels.drain(..).map(LiveInput::Cancel).collect()
        };
        if let (Some(d), true) = (wait, out.is_empty()) {
            let first = if self.closed {
                // Every sender is gone: nothing can arrive, so the run shuts down.
                Some(ToEngine::Shutdown { cancel: true })
            } else if d == Duration::MAX {
                self.rx.recv().ok()
            } else {
                self.rx.recv_timeout(d).ok()
            };
            match first {
                Some(m) => self.take(m, &mut out),
                None if d == Duration::MAX => {
                    self.closed = true;
                    self.shutdown(true, &mut out);
                }
                None => {}
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(m) => self.take(m, &mut out),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    if !self.closed {
                        self.closed = true;
                        self.shutdown(true, &mut out);
                    }
                    break;
                }
            }
        }
        out
    }

    fn observe(&mut self, stats: &LiveStats) {
        self.metrics.observe(stats);
    }
}

impl Forward {
    fn send(&mut self, id: u64, event: Event) {
        let mut sh = self.shared.borrow_mut();
        let Some(l) = sh.by_id.get_mut(&id) else {
            return;
        };
        if l.gone {
            return;
        }
        if l.events.try_send(event).is_err() {
            // Full (the reader fell behind) or closed (it went away): cancel the request.
            l.gone = true;
            let index = l.index;
            sh.client_cancels += 1;
            sh.cancels.push(index);
        }
    }
}

impl RunSink for Forward {
    fn event(&mut self, e: &TraceEvent) {
        // A first admission's prefix hit is traced right after its `admit` (a restart's after
        // `resume`): the one to report is a hit whose request's last event was its admission.
        let hit = {
            let mut sh = self.shared.borrow_mut();
            let Some(l) = sh.by_id.get_mut(&e.request) else {
                return;
            };
            let just_admitted = std::mem::replace(&mut l.admitted, false);
            match e.kind {
                TraceKind::Admit if e.rank == 0 => {
                    l.admitted = true;
                    None
                }
                TraceKind::PrefixHit { tokens, .. } if just_admitted => Some(tokens),
                _ => None,
            }
        };
        if let Some(tokens) = hit {
            self.send(e.request, Event::Cached { tokens });
        }
    }

    fn token(&mut self, t: &TokenEvent) {
        self.send(
            t.request,
            Event::Token {
                rank: t.rank,
                token: t.token,
            },
        );
    }

    fn stream_done(&mut self, _index: u32, record: &StreamRecord) {
        let id = record.request;
        let last = {
            let mut sh = self.shared.borrow_mut();
            match sh.by_id.get_mut(&id) {
                Some(l) => {
                    l.all_completed &= record.status == StreamStatus::Completed;
                    (record.rank + 1 >= l.samples).then_some(l.all_completed)
                }
                None => None,
            }
        };
        self.metrics.stream_done(record, last);
        let event = match record.status {
            StreamStatus::Rejected if record.rank == 0 => Event::Refused {
                message: "the KV cache cannot hold this request (prompt + max_tokens)".into(),
            },
            status => Event::Done {
                rank: record.rank,
                status,
            },
        };
        self.send(id, event);
        if last.is_some() {
            let mut sh = self.shared.borrow_mut();
            if let Some(l) = sh.by_id.remove(&id) {
                sh.by_handle.remove(&l.handle);
            }
        }
    }
}
