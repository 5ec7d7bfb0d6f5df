//! The request list sent on the wall clock. Open loop: a dispatcher thread sleeps until each
//! request's scheduled arrival (the OS's high-resolution sleep, not the runtime's millisecond
//! timer wheel) and hands it to the runtime; the request's task records when it really started,
//! so scheduling lag = start − schedule is measured per request and never hidden (no coordinated
//! omission: a late client shows as lag, and the run is flagged when it fell behind). Closed
//! loop: `clients` tasks each send the next request in id order `think_ms` after their previous
//! one finished. A session's later turn is sent by its session's task `think_ms` after the
//! previous turn's last token, its prompt the conversation so far as the engine builds it
//! (every earlier prompt and output token id, then the new tokens, cut at the front to
//! `max_seq_len` where the scenario says so); a turn that did not complete ends its session.
//!
//! The first transport failure (connection refused, reset or cut) stops dispatching: the server
//! may be gone, and a run that kept firing would measure only refusals. In-flight requests end
//! by their own bounds; the results are marked partial.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::client::{self, Answer, Ask, ClientConfig, Outcome};
use crate::workload::{Request, Workload};

/// One request's result.
#[derive(Debug, Clone)]
pub struct Done {
    pub id: u64,
    pub tenant: u32,
    /// When it was meant to be sent: its scheduled arrival (open loop), or when its client or
    /// session issued it.
    pub intended_ns: u64,
    /// It had a scheduled arrival (its lag counts).
    pub scheduled: bool,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub answer: Answer,
}

/// How the run went as a whole.
#[derive(Debug, Clone)]
pub struct Driven {
    /// Results in request id order.
    pub done: Vec<Done>,
    /// Requests of the list never sent (the run stopped, or a session ended early).
    pub not_sent: u64,
    /// When the first transport failure stopped dispatching (ns since the run's start).
    pub stopped_at_ns: Option<u64>,
    /// Wall time from the run's start to the last answer, ns.
    pub end_ns: u64,
    /// Later session turns whose conversation lacked the previous outputs' token ids (the
    /// server sent none), so their prompts hold fewer tokens than the engine's would.
    pub turns_without_token_ids: u64,
}

struct Shared {
    cfg: ClientConfig,
    workload: Arc<Workload>,
    max_seq_len: u32,
    stop: AtomicBool,
    stopped_at_ns: AtomicU64,
    turns_without_ids: AtomicU64,
}

impl Shared {
    fn note(&self, a: &Answer) {
        if a.transport_failure && !self.stop.swap(true, Ordering::SeqCst) {
            self.stopped_at_ns
                .store(self.cfg.now_ns(), Ordering::SeqCst);
        }
    }
}

fn ask(r: &Request) -> Ask {
    Ask {
        id: r.id,
        tenant: r.tenant,
        max_tokens: r.output_tokens,
        samples: r.samples.max(1),
        cancel: r.cancel,
    }
}

fn ms_ns(ms: f64) -> u64 {
    (ms.max(0.0) * 1e6).round() as u64
}

/// Send `workload` to the endpoint of `cfg`; blocks until every request ended.
pub fn drive(
    cfg: ClientConfig,
    workload: Arc<Workload>,
    max_seq_len: u32,
    rt: &tokio::runtime::Runtime,
) -> Driven {
    let shared = Arc::new(Shared {
        cfg,
        workload: workload.clone(),
        max_seq_len,
        stop: AtomicBool::new(false),
        stopped_at_ns: AtomicU64::new(0),
        turns_without_ids: AtomicU64::new(0),
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<Done>();
    let handle = rt.handle().clone();
    let dispatcher = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("kvbench-dispatch".into())
            .spawn(move || dispatch(&shared, &handle, tx))
    };
    let mut done = Vec::new();
    rt.block_on(async {
        while let Some(d) = rx.recv().await {
            done.push(d);
        }
    });
    if let Ok(d) = dispatcher {
        let _ = d.join();
    }
    done.sort_by_key(|d| d.id);
    let end_ns = done.iter().map(|d| d.answer.finish_ns).max().unwrap_or(0);
    let stopped = shared.stop.load(Ordering::SeqCst);
    Driven {
        not_sent: workload.requests.len() as u64 - done.len() as u64,
        stopped_at_ns: stopped.then(|| shared.stopped_at_ns.load(Ordering::SeqCst)),
        end_ns,
        turns_without_token_ids: shared.turns_without_ids.load(Ordering::SeqCst),
        done,
    }
}

fn dispatch(shared: &Arc<Shared>, rt: &tokio::runtime::Handle, tx: mpsc::UnboundedSender<Done>) {
    let w = &shared.workload;
    if let Some(cl) = w.closed_loop {
        let next = Arc::new(AtomicU64::new(0));
        for _ in 0..cl.clients.max(1) {
            let (shared, next, tx) = (shared.clone(), next.clone(), tx.clone());
            rt.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                    if i >= shared.workload.requests.len() || shared.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let intended = shared.cfg.now_ns();
                    let d = one(&shared, i, intended, false, None).await;
                    let _ = tx.send(d.done);
                    tokio::time::sleep(Duration::from_nanos(ms_ns(cl.think_ms))).await;
                }
            });
        }
        return;
    }
    for (i, r) in w.requests.iter().enumerate() {
        if r.session.is_some_and(|s| s.turn > 0) {
            continue;
        }
        let due = ms_ns(r.arrival_ms);
        loop {
            let now = shared.cfg.now_ns();
            if now >= due {
                break;
            }
            std::thread::sleep(Duration::from_nanos(due - now));
        }
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let (shared, tx) = (shared.clone(), tx.clone());
        rt.spawn(async move { session(&shared, i, due, &tx).await });
    }
}

/// A lone request, or a session from its first turn on.
async fn session(shared: &Arc<Shared>, first: usize, due: u64, tx: &mpsc::UnboundedSender<Done>) {
    let mut i = first;
    let mut intended = due;
    let mut scheduled = true;
    let mut conversation: Option<Vec<u32>> = None;
    loop {
        let d = one(shared, i, intended, scheduled, conversation.take()).await;
        let r = &shared.workload.requests[i];
        let next = r.session.and_then(|s| s.next);
        let head = d.answer.choices.first();
        let completed = d.answer.outcome == Outcome::Completed;
        let follow = match (next, completed, head) {
            (Some(n), true, Some(h)) if !shared.stop.load(Ordering::SeqCst) => {
                let n = n as usize;
                let Some(nreq) = shared.workload.requests.get(n) else {
                    let _ = tx.send(d.done);
                    return;
                };
                if h.token_ids.len() < h.token_ns.len() {
                    shared.turns_without_ids.fetch_add(1, Ordering::SeqCst);
                }
                let mut p = d.prompt.clone();
                p.extend_from_slice(&h.token_ids);
                p.extend_from_slice(&nreq.prompt.tokens());
                let room =
                    (shared.max_seq_len as usize).saturating_sub(nreq.output_tokens as usize);
                if nreq.session.is_some_and(|s| s.truncate_front) && p.len() > room {
                    p.drain(..p.len() - room);
                }
                Some((n, p, nreq.session.map_or(0.0, |s| s.think_ms)))
            }
            _ => None,
        };
        let _ = tx.send(d.done);
        let Some((n, p, think_ms)) = follow else {
            return;
        };
        tokio::time::sleep(Duration::from_nanos(ms_ns(think_ms))).await;
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        i = n;
        intended = shared.cfg.now_ns();
        scheduled = false;
        conversation = Some(p);
    }
}

struct Sent {
    done: Done,
    prompt: Vec<u32>,
}

impl std::ops::Deref for Sent {
    type Target = Done;
    fn deref(&self) -> &Done {
        &self.done
    }
}

async fn one(
    shared: &Arc<Shared>,
    i: usize,
    intended: u64,
    scheduled: bool,
    conversation: Option<Vec<u32>>,
) -> Sent {
    let arrival = shared.cfg.now_ns();
    let r = &shared.workload.requests[i];
    let prompt = conversation.unwrap_or_else(|| r.prompt.tokens().into_owned());
    let ask = ask(r);
    let answer = client::send(&shared.cfg, &ask, &prompt, arrival).await;
    shared.note(&answer);
    Sent {
        done: Done {
            id: r.id,
            tenant: r.tenant,
            intended_ns: intended,
            scheduled,
            prompt_tokens: prompt.len() as u32,
            max_tokens: r.output_tokens,
            answer,
        },
        prompt,
    }
}
