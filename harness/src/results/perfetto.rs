//! `trace.perfetto.json`: Chrome trace-event JSON that opens in Perfetto (ui.perfetto.dev) or
//! chrome://tracing. One process per cache mode; a track per request (queued, prefill, decode
//! slices), a track for steps, counters for KV memory. Runs of more than [`MAX_STEPS_PER_RUN`]
//! steps keep every n-th step on the steps track (memory.csv keeps them all).

use std::io::Write;

use super::experiment::Experiment;
use crate::engine::RunRecord;

/// Nanoseconds as trace-event microseconds with three decimals (exact).
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn slice(
    w: &mut impl Write,
    first: &mut bool,
    pid: usize,
    tid: u64,
    name: &str,
    from: u64,
    to: u64,
) -> std::io::Result<()> {
    if to < from {
        return Ok(());
    }
    sep(w, first)?;
    write!(
        w,
        "{{\"name\":\"{name}\",\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"dur\":{}}}",
        us(from),
        us(to - from)
    )
}

fn sep(w: &mut impl Write, first: &mut bool) -> std::io::Result<()> {
    if !*first {
        writeln!(w, ",")?;
    }
    *first = false;
    Ok(())
}

/// Steps (and memory counters) written per cache mode before sampling kicks in.
pub const MAX_STEPS_PER_RUN: usize = 100_000;

fn write_run(
    r: &RunRecord,
    pid: usize,
    kvb: u64,
    w: &mut impl Write,
    first: &mut bool,
) -> std::io::Result<()> {
    sep(w, first)?;
    write!(
        w,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":\"{}\"}}}}",
        r.mode.name()
    )?;
    sep(w, first)?;
    write!(w, "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":\"steps\"}}}}")?;
    // Very long runs keep every stride-th step so the file stays loadable (~100k steps a mode).
    let stride = r.steps.len() / MAX_STEPS_PER_RUN + 1;
    for s in r.steps.iter().step_by(stride) {
        sep(w, first)?;
        write!(
            w,
            "{{\"name\":\"step\",\"ph\":\"X\",\"pid\":{pid},\"tid\":0,\"ts\":{},\"dur\":{},\"args\":{{\"seqs\":{},\"tokens\":{}}}}}",
            us(s.start_ns),
            us(s.end_ns - s.start_ns),
            s.batch_seqs,
            s.batch_tokens
        )?;
        let a = &s.accounting;
        sep(w, first)?;
        write!(
            w,
            "{{\"name\":\"kv_bytes\",\"ph\":\"C\",\"pid\":{pid},\"ts\":{},\"args\":{{\"live\":{},\"allocated_unfilled\":{},\"cached_free\":{}}}}}",
            us(s.end_ns),
            a.live_slots * kvb,
            a.allocated_unfilled_slots * kvb,
            a.cached_free_slots * kvb
        )?;
    }
    for (i, st) in r.streams.iter().enumerate() {
        let tid = i as u64 + 1;
        sep(w, first)?;
        write!(
            w,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":\"request {}\"}}}}",
            st.request_label()
        )?;
        let admitted = st.admitted_ns.unwrap_or(st.finish_ns);
        slice(w, first, pid, tid, "queued", st.arrival_ns, admitted)?;
        if let Some(ft) = st.first_token_ns() {
            slice(w, first, pid, tid, "prefill", admitted, ft)?;
            slice(w, first, pid, tid, "decode", ft, st.finish_ns)?;
        }
    }
    Ok(())
}

pub fn write(exp: &Experiment, w: &mut impl Write) -> std::io::Result<()> {
    writeln!(w, "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
    let mut first = true;
    for (i, run) in exp.runs.iter().enumerate() {
        write_run(&run.record, i + 1, exp.kv_bytes_per_token, w, &mut first)?;
    }
    writeln!(w, "\n]}}")
}
