//! One request sent and its stream read: what arrived when, per choice, and what went wrong.
//!
//! Bounds: the whole request has a deadline (`request_timeout`), and the stream an idle deadline
//! reset only by a complete event (`idle_timeout`) — a server that trickles bytes without ever
//! finishing an event (slow loris) hits one of them; an event over the cap, or more tokens than
//! `max_tokens` in a choice, ends the request. Each is a [`Flag`] on the request, never a panic
//! or a hang. Cancellations close the connection at their scheduled point.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde::Serialize;

use super::chunk::{self, UsageState};
use super::http;
use super::sse::SseParser;
use super::url::BaseUrl;
use crate::workload::CancelPoint;

/// What every request of a run shares.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub base: BaseUrl,
    pub model: String,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_event_bytes: usize,
    /// The run's time zero: every time recorded is ns since it.
    pub t0: Instant,
}

impl ClientConfig {
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn at(&self, ns: u64) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.t0 + Duration::from_nanos(ns))
    }
}

/// One request as sent.
#[derive(Debug, Clone)]
pub struct Ask {
    pub id: u64,
    pub tenant: u32,
    pub max_tokens: u32,
    pub samples: u32,
    pub cancel: Option<CancelPoint>,
}

/// What was wrong with a request's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Flag {
    /// `malformed`, `token_count`, `timeout`, `idle_timeout`, `http_status`, `transport`,
    /// `server_abort`, `cut`.
    pub kind: &'static str,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every choice finished and `[DONE]` came (or the stream ended after every choice's finish).
    Completed,
    /// Closed by the client at the scheduled point.
    Cancelled { during: &'static str },
    /// A 4xx answer: the server refused the request (as the engine rejects a prompt too long).
    Rejected,
    /// Anything else: see the flags.
    Failed,
}

#[derive(Debug, Clone, Default)]
pub struct ChoiceRec {
    /// Arrival time of every token (a chunk's tokens share one).
    pub token_ns: Vec<u64>,
    /// Tokens per chunk, in order (they sum to `token_ns.len()`).
    pub chunk_tokens: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Answer {
    pub arrival_ns: u64,
    pub finish_ns: u64,
    pub choices: Vec<ChoiceRec>,
    pub outcome: Outcome,
    pub flags: Vec<Flag>,
    pub http_status: Option<u16>,
    /// The server's own prefix hit for the prompt, where its usage reports one.
    pub cached_prompt_tokens: Option<u64>,
    /// The connection was refused, reset or cut: the server may be gone.
    pub transport_failure: bool,
    /// The rejection's message (4xx).
    pub reject_reason: Option<String>,
}

impl Answer {
    fn flag(&mut self, kind: &'static str, detail: impl Into<String>) {
        self.flags.push(Flag {
            kind,
            detail: detail.into(),
        });
    }

    fn tokens(&self) -> usize {
        self.choices.iter().map(|c| c.token_ns.len()).sum()
    }
}

/// The request body of the wire contract.
pub fn body(cfg: &ClientConfig, ask: &Ask, prompt: &[u32]) -> Vec<u8> {
    let v = serde_json::json!({
        "model": cfg.model,
        "prompt": prompt,
        "max_tokens": ask.max_tokens,
        "min_tokens": ask.max_tokens,
        "ignore_eos": true,
        "stream": true,
        "n": ask.samples.max(1),
        "seed": ask.id,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        "kvbench": {"tenant": ask.tenant, "request_id": ask.id},
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Bytes of an error answer kept for its message.
const ERROR_BODY_CAP: usize = 64 * 1024;

/// Send `ask` now (its arrival is `arrival_ns`) and read the stream to its end.
pub async fn send(cfg: &ClientConfig, ask: &Ask, prompt: &[u32], arrival_ns: u64) -> Answer {
    let samples = ask.samples.max(1) as usize;
    let mut a = Answer {
        arrival_ns,
        finish_ns: arrival_ns,
        choices: vec![ChoiceRec::default(); samples],
        outcome: Outcome::Failed,
        flags: Vec::new(),
        http_status: None,
        cached_prompt_tokens: None,
        transport_failure: false,
        reject_reason: None,
    };
    let deadline = arrival_ns.saturating_add(cfg.request_timeout.as_nanos() as u64);
    let cancel_ns = |after_ms: f64| arrival_ns.saturating_add((after_ms.max(0.0) * 1e6) as u64);
    let (delay_cancel, queued_cancel, token_limit) = match ask.cancel {
        Some(CancelPoint::AfterDelay { after_ms }) => (Some(cancel_ns(after_ms)), None, None),
        Some(CancelPoint::Queued { after_ms }) => (None, Some(cancel_ns(after_ms)), None),
        Some(CancelPoint::AfterTokens { tokens }) if tokens < ask.max_tokens => {
            (None, None, Some(tokens))
        }
        _ => (None, None, None),
    };
    let body = body(cfg, ask, prompt);
    // Connecting and the answer's head, within the request's deadline and before a delay
    // cancellation.
    let head_deadline = delay_cancel.map_or(deadline, |c| c.min(deadline));
    let head = async {
        let mut conn = http::connect(&cfg.base, cfg.connect_timeout).await?;
        let req = http::request(&cfg.base, "POST", "/v1/completions", Some(body))?;
        let resp = conn
            .sender
            .send_request(req)
            .await
            .map_err(|e| format!("POST /v1/completions: {e}"))?;
        Ok::<_, String>((conn, resp))
    };
    let (conn, resp) = match tokio::time::timeout_at(cfg.at(head_deadline), head).await {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            a.transport_failure = true;
            a.finish_ns = cfg.now_ns();
            a.flag("transport", e);
            return a;
        }
        Err(_) => {
            a.finish_ns = cfg.now_ns();
            if delay_cancel.is_some_and(|c| c <= deadline) {
                a.outcome = Outcome::Cancelled { during: "queued" };
            } else {
                a.flag("timeout", "no answer within the request timeout");
            }
            return a;
        }
    };
    let status = resp.status().as_u16();
    a.http_status = Some(status);
    if status != 200 {
        let msg = match tokio::time::timeout_at(
            cfg.at(deadline),
            http::read_capped(resp.into_body(), ERROR_BODY_CAP),
        )
        .await
        {
            Ok(Ok(b)) => error_message(&b),
            _ => String::new(),
        };
        a.finish_ns = cfg.now_ns();
        if (400..500).contains(&status) {
            a.outcome = Outcome::Rejected;
            a.reject_reason = Some(format!("HTTP {status}: {msg}"));
        } else {
            a.flag("http_status", format!("HTTP {status}: {msg}"));
        }
        return a;
    }
    let mut body = resp.into_body();
    let mut parser = SseParser::new(cfg.max_event_bytes);
    let mut usage = UsageState::default();
    let mut events = Vec::new();
    let mut done = false;
    let mut last_event_ns = cfg.now_ns();
    let limit = token_limit.unwrap_or(ask.max_tokens);
    // Set where the read stopped on an error (the flag says which).
    let mut broke = false;
    'read: loop {
        let idle = last_event_ns.saturating_add(cfg.idle_timeout.as_nanos() as u64);
        let queued = queued_cancel.filter(|_| a.tokens() == 0);
        let wake = [Some(deadline), Some(idle), delay_cancel, queued]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(deadline);
        let frame = match tokio::time::timeout_at(cfg.at(wake), body.frame()).await {
            Ok(f) => f,
            Err(_) => {
                a.finish_ns = cfg.now_ns();
                if delay_cancel == Some(wake) || (queued == Some(wake) && wake < deadline) {
                    let during = if a.tokens() == 0 { "queued" } else { "decode" };
                    a.outcome = Outcome::Cancelled { during };
                } else if wake == deadline {
                    broke = true;
                    a.flag(
                        "timeout",
                        format!(
                            "not finished within the request timeout ({:.1} s)",
                            cfg.request_timeout.as_secs_f64()
                        ),
                    );
                } else {
                    broke = true;
                    a.flag(
                        "idle_timeout",
                        format!(
                            "no complete event for {:.1} s",
                            cfg.idle_timeout.as_secs_f64()
                        ),
                    );
                }
                break 'read;
            }
        };
        let frame = match frame {
            None => break 'read,
            Some(Err(e)) => {
                a.finish_ns = cfg.now_ns();
                a.transport_failure = true;
                broke = true;
                a.flag("transport", format!("the stream broke: {e}"));
                break 'read;
            }
            Some(Ok(f)) => f,
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let now = cfg.now_ns();
        if let Err(e) = parser.push(data, &mut events) {
            a.finish_ns = now;
            broke = true;
            a.flag("malformed", e.0);
            break 'read;
        }
        for ev in events.drain(..) {
            last_event_ns = now;
            if ev.trim() == "[DONE]" {
                done = true;
                continue;
            }
            if done {
                a.flag("malformed", "an event after [DONE]");
                continue;
            }
            let c = match chunk::parse(&ev, &mut usage) {
                Ok(c) => c,
                Err(e) => {
                    a.flag("malformed", e);
                    continue;
                }
            };
            if c.cached_prompt_tokens.is_some() {
                a.cached_prompt_tokens = c.cached_prompt_tokens;
            }
            for d in c.choices {
                let Some(ch) = a.choices.get_mut(d.index as usize) else {
                    a.flag(
                        "malformed",
                        format!("choice {} of a request with n = {samples}", d.index),
                    );
                    continue;
                };
                let room = limit.saturating_sub(ch.token_ns.len() as u32);
                let take = d.tokens.min(room);
                if d.tokens > room && token_limit.is_none() {
                    a.flags.push(Flag {
                        kind: "token_count",
                        detail: format!(
                            "choice {} sent more than max_tokens = {} tokens",
                            d.index, ask.max_tokens
                        ),
                    });
                    a.finish_ns = now;
                    broke = true;
                    break 'read;
                }
                if take > 0 {
                    ch.token_ns.extend(std::iter::repeat_n(now, take as usize));
                    ch.chunk_tokens.push(take);
                    let ids = d.token_ids.len().min(take as usize);
                    ch.token_ids.extend_from_slice(&d.token_ids[..ids]);
                }
                if d.finish_reason.is_some() {
                    ch.finish_reason = d.finish_reason;
                }
            }
            if let Some(l) = token_limit {
                if a.choices.iter().all(|c| c.token_ns.len() as u32 >= l) {
                    a.finish_ns = now;
                    a.outcome = Outcome::Cancelled { during: "decode" };
                    break 'read;
                }
            }
        }
        if done {
            break 'read;
        }
    }
    drop(body);
    drop(conn);
    if a.outcome != Outcome::Failed || broke {
        return a;
    }
    // The stream ended: by [DONE], or by the server closing it.
    a.finish_ns = cfg.now_ns();
    if !done {
        if parser.has_partial() {
            a.flag("cut", "the stream ended inside an event");
        } else if a.choices.iter().any(|c| c.finish_reason.is_none()) {
            a.flag(
                "cut",
                "the stream ended before [DONE] with a choice unfinished",
            );
        }
    }
    let mut aborted = false;
    for (i, c) in a.choices.iter().enumerate() {
        if c.finish_reason.as_deref() == Some("abort") {
            aborted = true;
            a.flags.push(Flag {
                kind: "server_abort",
                detail: format!("choice {i} finished with \"abort\""),
            });
        }
        if c.token_ns.len() as u32 != ask.max_tokens {
            a.flags.push(Flag {
                kind: "token_count",
                detail: format!(
                    "choice {i}: {} tokens for max_tokens = {}",
                    c.token_ns.len(),
                    ask.max_tokens
                ),
            });
        }
    }
    // Every token that came is measured: a malformed event skipped or a count off is flagged,
    // not the request dropped. A cut stream failed; one the server aborted was cancelled.
    a.outcome = if aborted {
        Outcome::Cancelled { during: "decode" }
    } else if a.flags.iter().any(|f| f.kind == "cut") {
        Outcome::Failed
    } else {
        Outcome::Completed
    };
    a
}

/// An OpenAI error body's message, else the body's start.
fn error_message(b: &[u8]) -> String {
    let text = String::from_utf8_lossy(b);
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("error")
                .and_then(|e| e.get("message"))
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| chunk::excerpt(text.trim()))
}
