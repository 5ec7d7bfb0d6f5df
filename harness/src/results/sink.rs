//! The run's data files written as the run goes: `requests.csv`, `trace.jsonl`, `memory.csv`
//! and `trace.perfetto.json`, fed by the engine's sink calls (the streaming path) or by
//! [`crate::engine::sink::replay`] of a collected record (the collect path) — one writer, so both
//! paths give the same bytes.
//!
//! What is held: requests.csv's reorder buffer (rows that resolved while an earlier stream was
//! still in flight), one instant of trace lines, the mode's timeline (bounded by its
//! resolution) and the first [`super::perfetto::MAX_REQUEST_TRACKS`] streams' tracks.
//! `memory.csv` and the Perfetto file are written when each mode ends.
//!
//! The sink's calls cannot fail, so the first write error is kept and returned by
//! [`FileSink::end_mode`] / [`FileSink::finish`]; the folder is a staged temporary, so a failed
//! run leaves nothing half-written in place.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::perfetto::PerfettoWriter;
use super::tables::{self, RequestsWriter};
use super::trace::TraceWriter;
use super::ResultsError;
use crate::engine::{RunSink, RunStart, StepSample, StreamRecord, TokenEvent, TraceEvent};
use crate::metrics::timeline::{Resolution, Timeline};

/// How one mode's rows came out (stated in `summary.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeFiles {
    /// Interval of a `memory.csv` row in ns; `None`: a row per step.
    pub memory_resolution_ns: Option<u64>,
    pub memory_rows: u64,
    /// Streams with a Perfetto request track, and streams in all.
    pub request_tracks: u64,
    pub streams: u64,
}

/// How `record`'s rows come out at `resolution` (what [`FileSink::end_mode`] returns for it).
pub fn mode_files(record: &crate::engine::RunRecord, resolution: Resolution) -> ModeFiles {
    let mut t = Timeline::new(resolution, &record.start());
    for s in &record.steps {
        t.push(s);
    }
    let streams = record.streams.len() as u64;
    ModeFiles {
        memory_resolution_ns: t.resolution_ns(),
        memory_rows: t.rows().len() as u64,
        request_tracks: streams.min(super::perfetto::MAX_REQUEST_TRACKS as u64),
        streams,
    }
}

struct Out {
    path: PathBuf,
    w: BufWriter<File>,
}

impl Out {
    fn create(dir: &Path, name: &str) -> Result<Out, ResultsError> {
        let path = dir.join(name);
        let file = File::create(&path).map_err(super::io(&path))?;
        Ok(Out {
            path,
            w: BufWriter::with_capacity(1 << 20, file),
        })
    }
}

/// Keep the first write error (later ones follow from it).
fn keep(error: &mut Option<ResultsError>, r: std::io::Result<()>, path: &Path) {
    if let (Err(err), None) = (r, &*error) {
        *error = Some(ResultsError::Io {
            path: path.to_path_buf(),
            err,
        });
    }
}

struct Mode {
    cache: &'static str,
    start: RunStart,
    timeline: Timeline,
}

pub struct FileSink {
    resolution: Resolution,
    requests: (Out, RequestsWriter),
    trace: (Out, TraceWriter),
    memory: Out,
    perfetto: (Out, PerfettoWriter),
    mode: Option<Mode>,
    /// The first write error, with the file it happened in.
    error: Option<ResultsError>,
}

impl FileSink {
    /// Create the four files in `dir` (a staged folder) and write their headers.
    pub fn create(
        dir: &Path,
        trace_tokens: bool,
        resolution: Resolution,
    ) -> Result<FileSink, ResultsError> {
        let mut requests = Out::create(dir, "requests.csv")?;
        let rw = RequestsWriter::new(&mut requests.w).map_err(super::io(&requests.path))?;
        let trace = Out::create(dir, "trace.jsonl")?;
        let mut memory = Out::create(dir, "memory.csv")?;
        writeln!(memory.w, "{}", tables::MEMORY_HEADER).map_err(super::io(&memory.path))?;
        let mut perfetto = Out::create(dir, "trace.perfetto.json")?;
        let pw = PerfettoWriter::new(&mut perfetto.w).map_err(super::io(&perfetto.path))?;
        Ok(FileSink {
            resolution,
            requests: (requests, rw),
            trace: (trace, TraceWriter::new(trace_tokens)),
            memory,
            perfetto: (perfetto, pw),
            mode: None,
            error: None,
        })
    }

    /// The mode's run ended: write what was held (memory rows, Perfetto's mode) and say how the
    /// rows came out.
    pub fn end_mode(&mut self) -> Result<ModeFiles, ResultsError> {
        let Some(m) = self.mode.take() else {
            return Err(ResultsError::Io {
                path: self.requests.0.path.clone(),
                err: std::io::Error::other("end of a cache mode that never began"),
            });
        };
        let r = self.requests.1.end_mode(&mut self.requests.0.w);
        keep(&mut self.error, r, &self.requests.0.path);
        let r = self.trace.1.flush(&mut self.trace.0.w);
        keep(&mut self.error, r, &self.trace.0.path);
        let rows = m.timeline.rows();
        let r = tables::write_memory_rows(
            m.cache,
            rows,
            m.start.slot_bytes,
            m.start.block_size,
            &m.start.memory,
            &mut self.memory.w,
        );
        keep(&mut self.error, r, &self.memory.path);
        let r = self
            .perfetto
            .1
            .end_mode(m.cache, rows, m.start.slot_bytes, &mut self.perfetto.0.w);
        keep(&mut self.error, r, &self.perfetto.0.path);
        let files = ModeFiles {
            memory_resolution_ns: m.timeline.resolution_ns(),
            memory_rows: rows.len() as u64,
            request_tracks: self.perfetto.1.request_tracks(),
            streams: self.perfetto.1.streams(),
        };
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(files),
        }
    }

    /// Close the files (Perfetto's footer, every buffer flushed).
    pub fn finish(mut self) -> Result<(), ResultsError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let r = self.perfetto.1.finish(&mut self.perfetto.0.w);
        r.map_err(super::io(&self.perfetto.0.path))?;
        for out in [
            &mut self.requests.0,
            &mut self.trace.0,
            &mut self.memory,
            &mut self.perfetto.0,
        ] {
            out.w.flush().map_err(super::io(&out.path))?;
        }
        Ok(())
    }
}

impl RunSink for FileSink {
    fn begin(&mut self, start: &RunStart) {
        let cache = start.mode.name();
        self.requests.1.begin_mode();
        let r = self.trace.1.begin_mode(cache, &mut self.trace.0.w);
        keep(&mut self.error, r, &self.trace.0.path);
        self.perfetto.1.begin_mode();
        self.mode = Some(Mode {
            cache,
            start: *start,
            timeline: Timeline::new(self.resolution, start),
        });
    }

    fn event(&mut self, e: &TraceEvent) {
        if self.error.is_none() {
            let r = self.trace.1.event(e, &mut self.trace.0.w);
            keep(&mut self.error, r, &self.trace.0.path);
        }
    }

    fn token(&mut self, t: &TokenEvent) {
        if self.error.is_none() {
            let r = self.trace.1.token(t, &mut self.trace.0.w);
            if r.is_err() {
                keep(&mut self.error, r, &self.trace.0.path);
            }
        }
    }

    fn step(&mut self, s: &StepSample) {
        if let Some(m) = &mut self.mode {
            m.timeline.push(s);
        }
    }

    fn stream_done(&mut self, index: u32, record: &StreamRecord) {
        let cache = self.mode.as_ref().map_or("", |m| m.cache);
        if self.error.is_none() {
            let r = self
                .requests
                .1
                .stream(cache, index, record, &mut self.requests.0.w);
            if r.is_err() {
                keep(&mut self.error, r, &self.requests.0.path);
            }
        }
        self.perfetto.1.stream(index, record);
    }
}
