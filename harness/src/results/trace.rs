//! `trace.jsonl`: one event a line, `{"cache", "t_ms", "request", "event", ...}`, in time order
//! per cache mode. Every emitted token has a `first_token` or `token` line (unless the trace level
//! is `requests`, which keeps `first_token` and drops `token`), so inter-token gaps recompute
//! from this file alone.

use std::io::Write;

use super::experiment::Experiment;
use super::tables::fmt_ms;
use crate::engine::{RunRecord, TraceKind};

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

/// Sort key: time, then stream, then lifecycle before tokens before the final finish/cancel.
fn order(kind: &TraceKind) -> u8 {
    match kind {
        TraceKind::Finish | TraceKind::Cancel { .. } => 2,
        _ => 0,
    }
}

fn write_run(r: &RunRecord, tokens: bool, w: &mut impl Write) -> std::io::Result<()> {
    // (t_ns, stream, class, index): index is the event's position or the token's ordinal.
    let mut keys: Vec<(u64, u32, u8, u32)> = Vec::with_capacity(r.events.len());
    for (i, e) in r.events.iter().enumerate() {
        keys.push((e.t_ns, e.stream, order(&e.kind), i as u32));
    }
    for (s, st) in r.streams.iter().enumerate() {
        for (i, &t) in st.token_ns.iter().enumerate() {
            if i == 0 || tokens {
                keys.push((t, s as u32, 1, i as u32));
            }
        }
    }
    keys.sort_unstable();
    let cache = r.mode.name();
    for (t, s, class, i) in keys {
        let st = &r.streams[s as usize];
        let label = st.request_label();
        if class == 1 {
            let event = if i == 0 { "first_token" } else { "token" };
            writeln!(
                w,
                "{{\"cache\":\"{cache}\",\"t_ms\":{},\"request\":\"{label}\",\"event\":\"{event}\",\"index\":{i}}}",
                fmt_ms(t)
            )?;
        } else {
            let e = &r.events[i as usize];
            writeln!(
                w,
                "{{\"cache\":\"{cache}\",\"t_ms\":{},\"request\":\"{label}\",\"event\":\"{}\"{}}}",
                fmt_ms(t),
                e.kind.name(),
                extra(&e.kind)
            )?;
        }
    }
    Ok(())
}

pub fn write(exp: &Experiment, tokens: bool, w: &mut impl Write) -> std::io::Result<()> {
    for run in &exp.runs {
        write_run(&run.record, tokens, w)?;
    }
    Ok(())
}
