//! `trace.jsonl`: one event a line, `{"cache", "t_ms", "request", "event", ...}`, in time order
//! per cache mode. Every emitted token has a `first_token` or `token` line (unless the trace level
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
        TraceKind::SwapOut { bytes } | TraceKind::SwapIn { bytes } => format!(",\"bytes\":{bytes}"),
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
    /// (stream, class, sequence, line) of instant `t_ns`.
    batch: Vec<(u32, u8, u64, String)>,
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
        let line = format!(
            "{{\"cache\":\"{}\",\"t_ms\":{},\"request\":\"{}\",\"event\":\"{}\"{}}}\n",
            self.cache,
            fmt_ms(e.t_ns),
            label(e.request, e.rank),
            e.kind.name(),
            extra(&e.kind)
        );
        self.seq += 1;
        self.batch.push((e.stream, class(&e.kind), self.seq, line));
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
        self.batch.push((t.stream, 1, self.seq, line));
        Ok(())
    }

    /// Write out the held instant (at the end of a mode, and whenever time moves on).
    pub fn flush(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        self.batch.sort_unstable_by_key(|&(s, c, q, _)| (s, c, q));
        for (_, _, _, line) in self.batch.drain(..) {
            w.write_all(line.as_bytes())?;
        }
        Ok(())
    }
}
