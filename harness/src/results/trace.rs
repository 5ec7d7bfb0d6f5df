//! `trace.jsonl`: one event a line, `{"cache", "t_ms", "request", "event", ...}`, in time order
//! per cache mode. Lower-tier events — `offload` and `onload` (`step`, `from` and `to` as
//! `{"tier", "slot"}`, `seq`, `tokens`) and a step's `onload_wait` (`step`, `wait_ms`) — lead
//! their instant in the order they happened; those that belong to no request (offloads, waits)
//! have `"request":null`. Every emitted token has a `first_token` or `token` line (unless the trace level
//! is `requests`, which keeps `first_token` and drops `token`), so inter-token gaps recompute
//! from this file alone.

use std::io::Write;

use super::tables::fmt_ms;
use crate::engine::{TokenEvent, TraceEvent, TraceKind};

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn extra(kind: &TraceKind) -> String {
    match kind {
        TraceKind::PrefillChunk { tokens, context } => {
            format!(",\"tokens\":{tokens},\"context\":{context}")
        }
        TraceKind::Preempt { swap } => {
            format!(",\"mode\":\"{}\"", if *swap { "swap" } else { "recompute" })
        }
        TraceKind::SwapOut { bytes, tokens } | TraceKind::SwapIn { bytes, tokens } => {
            format!(",\"bytes\":{bytes},\"tokens\":{tokens}")
        }
        TraceKind::PrefixHit {
            tokens,
            blocks,
            scope,
            publishers,
        } => format!(
            ",\"tokens\":{tokens},\"blocks\":{blocks},\"scope\":{},\"publishers\":{}",
            json_str(scope),
            serde_json::to_string(publishers).unwrap_or_default()
        ),
        TraceKind::Cancel { during } => format!(",\"during\":\"{during}\""),
        TraceKind::Reject { reason } => format!(",\"reason\":{}", json_str(reason)),
        TraceKind::Offload { step, op } | TraceKind::Onload { step, op } => format!(
            ",\"step\":{step},\"from\":{{\"tier\":\"{}\",\"slot\":{}}},\"to\":{{\"tier\":\"{}\",\"slot\":{}}},\"seq\":{},\"tokens\":{}",
            op.from.tier.name(),
            op.from.slot,
            op.to.tier.name(),
            op.to.slot,
            op.seq.map_or("null".to_string(), |s| s.to_string()),
            op.tokens
        ),
        TraceKind::OnloadWait { step, wait_ns } => {
            format!(",\"step\":{step},\"wait_ms\":{}", fmt_ms(*wait_ns))
        }
        _ => String::new(),
    }
}

/// Order within one instant: lifecycle before tokens before the final finish/cancel.
fn class(kind: &TraceKind) -> u8 {
    match kind {
        TraceKind::Finish | TraceKind::Cancel { .. } => 2,
        _ => 0,
    }
}

/// Order within one instant, before the stream: tier events (offloads, onloads, a step's onload
/// wait) first, in the order they happened — a step's ops in the order they execute — then the
/// streams' lines.
fn group(kind: &TraceKind) -> u8 {
    if kind.is_tier() {
        0
    } else {
        1
    }
}

fn label(request: u64, rank: u32) -> String {
    if rank == 0 {
        request.to_string()
    } else {
        format!("{request}.{rank}")
    }
}

/// `trace.jsonl` written as the run goes. Events and tokens come in time order; the lines of
/// one instant wait until time moves on and go out ordered by (stream, class, arrival order) —
/// the order the whole-run sort by (time, stream, class, index) gives — so the buffer holds one
/// instant's lines, never the run's.
pub struct TraceWriter {
    tokens: bool,
    cache: &'static str,
    t_ns: u64,
    /// (group, stream, class, sequence, line) of instant `t_ns`; a tier event's stream is
    /// 0 (its group orders it by sequence alone).
    batch: Vec<(u8, u32, u8, u64, String)>,
    seq: u64,
}

impl TraceWriter {
    /// `tokens`: a line for every token and prefill chunk (false: lifecycle and `first_token` only,
    /// `--trace-level requests`).
    pub fn new(tokens: bool) -> TraceWriter {
        TraceWriter {
            tokens,
            cache: "",
            t_ns: 0,
            batch: Vec::new(),
            seq: 0,
        }
    }

    pub fn begin_mode(&mut self, cache: &'static str, w: &mut impl Write) -> std::io::Result<()> {
        self.flush(w)?;
        self.cache = cache;
        self.t_ns = 0;
        Ok(())
    }

    fn at(&mut self, t_ns: u64, w: &mut impl Write) -> std::io::Result<()> {
        if t_ns != self.t_ns {
            self.flush(w)?;
            self.t_ns = t_ns;
        }
        Ok(())
    }

    pub fn event(&mut self, e: &TraceEvent, w: &mut impl Write) -> std::io::Result<()> {
        // Prefill chunks are step detail, like tokens: a day-long replay at `requests` keeps a
        // request's lifecycle and first token, not each chunk (a fifth of the lines otherwise).
        if !self.tokens && matches!(e.kind, TraceKind::PrefillChunk { .. }) {
            return Ok(());
        }
        self.at(e.t_ns, w)?;
        let request = if e.stream == TraceEvent::NO_STREAM {
            "null".to_string()
        } else {
            format!("\"{}\"", label(e.request, e.rank))
        };
        let line = format!(
            "{{\"cache\":\"{}\",\"t_ms\":{},\"request\":{request},\"event\":\"{}\"{}}}\n",
            self.cache,
            fmt_ms(e.t_ns),
            e.kind.name(),
            extra(&e.kind)
        );
        self.seq += 1;
        let (g, stream) = match group(&e.kind) {
            0 => (0, 0),
            g => (g, e.stream),
        };
        self.batch.push((g, stream, class(&e.kind), self.seq, line));
        Ok(())
    }

    pub fn token(&mut self, t: &TokenEvent, w: &mut impl Write) -> std::io::Result<()> {
        if t.index > 0 && !self.tokens {
            return Ok(());
        }
        self.at(t.t_ns, w)?;
        let event = if t.index == 0 { "first_token" } else { "token" };
        let line = format!(
            "{{\"cache\":\"{}\",\"t_ms\":{},\"request\":\"{}\",\"event\":\"{event}\",\"index\":{}}}\n",
            self.cache,
            fmt_ms(t.t_ns),
            label(t.request, t.rank),
            t.index
        );
        self.seq += 1;
        self.batch.push((1, t.stream, 1, self.seq, line));
        Ok(())
    }

    /// Write out the held instant (at the end of a mode, and whenever time moves on).
    pub fn flush(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        self.batch
            .sort_unstable_by_key(|&(g, s, c, q, _)| (g, s, c, q));
        for (_, _, _, _, line) in self.batch.drain(..) {
            w.write_all(line.as_bytes())?;
        }
        Ok(())
    }
}
