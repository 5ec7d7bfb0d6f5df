//! `trace.perfetto.json`: Chrome trace-event JSON that opens in Perfetto (ui.perfetto.dev) or
//! chrome://tracing. One process per cache mode; a track per request (queued, prefill, decode
//! slices), a track for steps, counters for KV memory. The steps track and counters have
//! `memory.csv`'s rows (every step, or the stated resolution's intervals); request tracks are
//! bounded by [`MAX_REQUEST_TRACKS`] per mode.

use std::io::Write;

use crate::engine::StreamRecord;
use crate::metrics::timeline::Bucket;

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

/// Request tracks written per cache mode: the first this many streams get a track; the rest
/// are in `requests.csv` (the file says so with a note on the steps track).
pub const MAX_REQUEST_TRACKS: usize = 20_000;

/// What a request track needs of a stream.
#[derive(Debug, Clone)]
struct Track {
    label: String,
    arrival_ns: u64,
    admitted_ns: Option<u64>,
    first_token_ns: Option<u64>,
    finish_ns: u64,
}

/// `trace.perfetto.json` built mode by mode: the steps track and KV counters come from the
/// mode's timeline (a slice and a counter per row: per step, or per interval of the stated
/// resolution with the interval's maxima), the request tracks from the first
/// [`MAX_REQUEST_TRACKS`] streams, held until the mode ends.
pub struct PerfettoWriter {
    first: bool,
    pid: usize,
    tracks: Vec<Option<Track>>,
    streams: u64,
}

impl PerfettoWriter {
    pub fn new(w: &mut impl Write) -> std::io::Result<PerfettoWriter> {
        writeln!(w, "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
        Ok(PerfettoWriter {
            first: true,
            pid: 0,
            tracks: Vec::new(),
            streams: 0,
        })
    }

    pub fn begin_mode(&mut self) {
        self.pid += 1;
        self.tracks.clear();
        self.streams = 0;
    }

    pub fn stream(&mut self, index: u32, st: &StreamRecord) {
        self.streams += 1;
        let i = index as usize;
        if i >= MAX_REQUEST_TRACKS {
            return;
        }
        if self.tracks.len() <= i {
            self.tracks.resize(i + 1, None);
        }
        self.tracks[i] = Some(Track {
            label: st.request_label(),
            arrival_ns: st.arrival_ns,
            admitted_ns: st.admitted_ns,
            first_token_ns: st.first_token_ns(),
            finish_ns: st.finish_ns,
        });
    }

    /// Streams this mode handed over.
    pub fn streams(&self) -> u64 {
        self.streams
    }

    /// Request tracks this mode got (the rest of its streams only in `requests.csv`).
    pub fn request_tracks(&self) -> u64 {
        self.streams.min(MAX_REQUEST_TRACKS as u64)
    }

    /// Write the mode: its process, the steps track with counters, the request tracks.
    pub fn end_mode(
        &mut self,
        cache: &str,
        rows: &[Bucket],
        kvb: u64,
        w: &mut impl Write,
    ) -> std::io::Result<()> {
        let (pid, first) = (self.pid, &mut self.first);
        sep(w, first)?;
        write!(
            w,
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":\"{cache}\"}}}}"
        )?;
        sep(w, first)?;
        write!(w, "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":\"steps\"}}}}")?;
        for b in rows {
            sep(w, first)?;
            let steps = if b.steps > 1 {
                format!(",\"steps\":{}", b.steps)
            } else {
                String::new()
            };
            write!(
                w,
                "{{\"name\":\"step\",\"ph\":\"X\",\"pid\":{pid},\"tid\":0,\"ts\":{},\"dur\":{},\"args\":{{\"seqs\":{},\"tokens\":{}{steps}}}}}",
                us(b.start_ns),
                us(b.end_ns - b.start_ns),
                b.batch_seqs,
                b.batch_tokens
            )?;
            sep(w, first)?;
            write!(
                w,
                "{{\"name\":\"kv_bytes\",\"ph\":\"C\",\"pid\":{pid},\"ts\":{},\"args\":{{\"live\":{},\"allocated_unfilled\":{},\"cached_free\":{}}}}}",
                us(b.end_ns),
                b.live_slots * kvb,
                b.allocated_unfilled_slots * kvb,
                b.cached_free_slots * kvb
            )?;
        }
        for (i, st) in self.tracks.iter().enumerate() {
            let Some(st) = st else { continue };
            let tid = i as u64 + 1;
            sep(w, first)?;
            write!(
                w,
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":\"request {}\"}}}}",
                st.label
            )?;
            let admitted = st.admitted_ns.unwrap_or(st.finish_ns);
            slice(w, first, pid, tid, "queued", st.arrival_ns, admitted)?;
            if let Some(ft) = st.first_token_ns {
                slice(w, first, pid, tid, "prefill", admitted, ft)?;
                slice(w, first, pid, tid, "decode", ft, st.finish_ns)?;
            }
        }
        if self.streams > MAX_REQUEST_TRACKS as u64 {
            sep(w, first)?;
            write!(
                w,
                "{{\"name\":\"request tracks: the first {MAX_REQUEST_TRACKS} of {} streams (every stream is in requests.csv)\",\"ph\":\"i\",\"s\":\"p\",\"pid\":{pid},\"tid\":0,\"ts\":0}}",
                self.streams
            )?;
        }
        self.tracks.clear();
        Ok(())
    }

    pub fn finish(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        writeln!(w, "\n]}}")
    }
}
