//! The endpoint run's files: `requests.csv` (the run's header and time format; the columns a
//! client cannot know — admission, queueing, preemptions, swaps, tiers, the TTFT split — are
//! empty, and `cached_prompt_tokens` is the server's own report or empty) and `trace.jsonl`
//! (the run's trace writer; the cache column says `endpoint`), then `endpoint.csv` (what only a
//! client has: schedule, lag, HTTP status, chunks, flags). No `memory.csv` or Perfetto file: a
//! client sees no memory ledger and no steps.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::drive::Done;
use super::record::CACHE;
use crate::engine::{RunSink, RunStart, StreamRecord, TokenEvent, TraceEvent};
use crate::results::tables::{fmt_ms, REQUESTS_HEADER};
use crate::results::trace::TraceWriter;

fn create(dir: &Path, name: &str) -> std::io::Result<BufWriter<File>> {
    Ok(BufWriter::with_capacity(
        1 << 20,
        File::create(dir.join(name))?,
    ))
}

/// `requests.csv` and `trace.jsonl` fed by the engine's sink calls (a replayed record).
pub struct RunFiles {
    requests: BufWriter<File>,
    /// Per stream, whether the server reported its prompt's cached tokens.
    cached_known: Vec<bool>,
    trace: (BufWriter<File>, TraceWriter),
    error: Option<std::io::Error>,
}

impl RunFiles {
    /// `done` as [`super::record::record`] turned it into streams (request order, ranks
    /// consecutive).
    pub fn create(dir: &Path, trace_tokens: bool, done: &[Done]) -> std::io::Result<RunFiles> {
        let mut requests = create(dir, "requests.csv")?;
        writeln!(requests, "{REQUESTS_HEADER}")?;
        let cached_known = done
            .iter()
            .flat_map(|d| {
                let known = d.answer.cached_prompt_tokens.is_some();
                (0..d.answer.choices.len()).map(move |rank| known && rank == 0)
            })
            .collect();
        Ok(RunFiles {
            requests,
            cached_known,
            trace: (create(dir, "trace.jsonl")?, TraceWriter::new(trace_tokens)),
            error: None,
        })
    }

    fn keep(&mut self, r: std::io::Result<()>) {
        if let (Err(e), None) = (r, &self.error) {
            self.error = Some(e);
        }
    }

    pub fn finish(mut self) -> std::io::Result<()> {
        let r = self.trace.1.flush(&mut self.trace.0);
        self.keep(r);
        if let Some(e) = self.error {
            return Err(e);
        }
        self.requests.flush()?;
        self.trace.0.flush()
    }
}

impl RunSink for RunFiles {
    fn begin(&mut self, _start: &RunStart) {
        let r = self.trace.1.begin_mode(CACHE, &mut self.trace.0);
        self.keep(r);
    }
    fn event(&mut self, e: &TraceEvent) {
        let r = self.trace.1.event(e, &mut self.trace.0);
        self.keep(r);
    }
    fn token(&mut self, t: &TokenEvent) {
        let r = self.trace.1.token(t, &mut self.trace.0);
        self.keep(r);
    }
    fn stream_done(&mut self, index: u32, s: &StreamRecord) {
        let known = self
            .cached_known
            .get(index as usize)
            .copied()
            .unwrap_or(false);
        let parent = if s.rank == 0 {
            String::new()
        } else {
            s.request.to_string()
        };
        // Columns as `results::tables` writes them; what a client cannot know stays empty.
        let r = writeln!(
            self.requests,
            "{CACHE},{},{parent},{},{},,{},{},{},{},{},{},,{},,,,,,,,,,,,",
            s.request_label(),
            s.tenant,
            fmt_ms(s.arrival_ns),
            s.first_token_ns().map(fmt_ms).unwrap_or_default(),
            fmt_ms(s.finish_ns),
            s.prompt_tokens,
            if known {
                s.cached_prompt_tokens.to_string()
            } else {
                String::new()
            },
            s.token_ns.len(),
            s.status.name(),
            fmt_ms(s.intended_arrival_ns),
        );
        self.keep(r);
    }
}

pub const ENDPOINT_HEADER: &str = "request_id,scheduled_ms,sent_ms,lag_ms,http_status,outcome,max_tokens,output_tokens,chunks,flags,detail";

/// `endpoint.csv`: a row per stream (choice), in `requests.csv`'s order. `scheduled_ms` is the
/// intended send time, `lag_ms` = sent − scheduled; `chunks` the arrivals that carried its
/// tokens; `flags` the kinds of what was wrong (`;`-separated), `detail` the first sentence.
pub fn write_endpoint_csv(dir: &Path, done: &[Done]) -> std::io::Result<()> {
    let mut w = csv::Writer::from_writer(create(dir, "endpoint.csv")?);
    w.write_record(ENDPOINT_HEADER.split(','))?;
    for d in done {
        let a = &d.answer;
        let outcome = match a.outcome {
            super::client::Outcome::Completed => "completed",
            super::client::Outcome::Cancelled { .. } => "cancelled",
            super::client::Outcome::Rejected => "rejected",
            super::client::Outcome::Failed => "failed",
        };
        let flags: Vec<&str> = a.flags.iter().map(|f| f.kind).collect();
        let detail = a
            .flags
            .first()
            .map(|f| f.detail.clone())
            .or_else(|| a.reject_reason.clone())
            .unwrap_or_default();
        for (rank, c) in a.choices.iter().enumerate() {
            let label = if rank == 0 {
                d.id.to_string()
            } else {
                format!("{}.{rank}", d.id)
            };
            w.write_record([
                label,
                fmt_ms(d.intended_ns),
                fmt_ms(a.arrival_ns),
                fmt_ms(a.arrival_ns.saturating_sub(d.intended_ns)),
                a.http_status.map(|s| s.to_string()).unwrap_or_default(),
                outcome.to_string(),
                d.max_tokens.to_string(),
                c.token_ns.len().to_string(),
                c.chunk_tokens.len().to_string(),
                flags.join(";"),
                detail.clone(),
            ])?;
        }
    }
    w.flush()
}
