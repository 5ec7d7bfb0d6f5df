//! Trace replay: real request traces (Azure LLM inference, BurstGPT, Mooncake, a plain CSV)
//! read row by row into a request list, and their statistics (`kvbench trace stats`).
//!
//! `read_rows` streams rows to a visitor (`lines.rs` bounds each line and hashes every byte;
//! `columns.rs` and `mooncake.rs` parse rows; `time.rs` keeps times exact): no whole-file buffer
//! and no row is kept unless the visitor keeps it. `replay.rs` keeps compact rows and turns them
//! into requests whose prompts are recipes (`hash_block.rs` reads a Mooncake trace's tokens per
//! id from its rows); `reuse.rs` computes the ideal prefix reuse an infinite cache would reach;
//! `bounds.rs` (with the policies of `evict.rs`) what `lru`, `lfu` and the offline optimum reach
//! at a finite capacity; `stats.rs` folds rows into `kvbench trace stats`.

mod bounds;
mod columns;
pub mod evict;
mod hash_block;
mod lines;
mod mooncake;
mod replay;
mod reuse;
mod session_chain;
mod stats;
mod time;

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

pub use crate::workload::hash_block_tokens;
pub use bounds::{
    access_string, capacity_blocks, eviction_bounds, AccessString, EvictionBounds, PolicyHits,
};
pub use hash_block::HashBlock;
pub use lines::MAX_LINE_BYTES;
pub use replay::{replay, ReplayLimits, Replayed};
pub use reuse::{ideal_prefix_reuse, IdealReuse};
pub use stats::{trace_stats, trace_stats_with, TraceStats};
pub use time::{azure_timestamp_ns, decimal_scaled};

use crate::scenario::{check_trace_file, TraceFormat};

/// One data row, in the trace's own units, borrowing its labels from the line.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRow<'a> {
    /// The row's time in ns on the trace's clock (epoch for Azure, its own origin otherwise).
    pub time_ns: u64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// BurstGPT `Model` and `Log Type`.
    pub model: Option<&'a str>,
    pub log_type: Option<&'a str>,
    /// Plain CSV `session_id`, `tenant`, `prefix_group`.
    pub session: Option<&'a str>,
    pub tenant: Option<u32>,
    pub prefix_group: Option<u32>,
    /// Mooncake content ids, one per block of prompt.
    pub hash_ids: Vec<u64>,
}

/// A row problem; the reader adds the file and line.
#[derive(Debug, Clone, PartialEq)]
pub struct RowError {
    pub col: usize,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Nothing to replay: an empty or header-only trace, or a window that leaves no row.
    #[error("{}: {message}", path.display())]
    Nothing { path: PathBuf, message: String },
    /// `FILE:LINE:COL: message` (add `skip_bad_rows` / `--skip-bad-rows` to skip such rows).
    #[error("{}:{line}:{col}: {message}", path.display())]
    Row {
        path: PathBuf,
        line: u64,
        col: usize,
        message: String,
    },
}

/// What reading a whole trace found (its rows went to the visitor).
#[derive(Debug, Clone)]
pub struct TraceRead {
    pub path: PathBuf,
    pub format: TraceFormat,
    /// Data rows seen (header and blank lines excluded), good or bad.
    pub data_rows: u64,
    pub skipped_bad_rows: u64,
    /// The first skipped row's error, to show what was skipped.
    pub first_bad_row: Option<String>,
    pub blake3: String,
    /// Rows identify content (Mooncake hash ids; CSV sessions or prefix groups).
    pub has_content_ids: bool,
}

/// Read a trace row by row, handing each good row (with the format and its 1-based line) to
/// `on_row`: the format from `format` or, for `auto`, from the header line. A bad row is an
/// error naming file, line and column unless `skip_bad_rows`, which skips and counts it.
/// Memory: one line.
pub fn read_rows(
    path: &Path,
    format: TraceFormat,
    skip_bad_rows: bool,
    mut on_row: impl FnMut(TraceFormat, u64, TraceRow<'_>),
) -> Result<TraceRead, TraceError> {
    let io = |source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let row_err = |line: u64, col: usize, message: String| TraceError::Row {
        path: path.to_path_buf(),
        line,
        col,
        message,
    };
    check_trace_file(path).map_err(|message| TraceError::Nothing {
        path: path.to_path_buf(),
        message: message
            .strip_prefix(&format!("{}: ", path.display()))
            .unwrap_or(&message)
            .to_string(),
    })?;
    let file = File::open(path).map_err(io)?;
    let mut lines = lines::Lines::new(BufReader::with_capacity(1 << 16, file));
    let mut out = TraceRead {
        path: path.to_path_buf(),
        format,
        data_rows: 0,
        skipped_bad_rows: 0,
        first_bad_row: None,
        blake3: String::new(),
        has_content_ids: false,
    };
    let mut layout: Option<columns::Layout> = None;
    let mut resolved = format != TraceFormat::Auto;
    while let Some(line) = lines.next_line().map_err(io)? {
        let (no, text) = match line {
            lines::Line::Text(no, t) => (no, t),
            lines::Line::TooLong(no) => {
                let e = row_err(no, 1, format!("line longer than {MAX_LINE_BYTES} bytes"));
                if !resolved || !skip_bad_rows {
                    return Err(e);
                }
                out.data_rows += 1;
                out.note_bad(e);
                continue;
            }
            lines::Line::NotUtf8(no, col) => {
                let e = row_err(no, col, "not UTF-8 text".into());
                if !resolved || !skip_bad_rows {
                    return Err(e);
                }
                out.data_rows += 1;
                out.note_bad(e);
                continue;
            }
        };
        let text = if no == 1 {
            text.strip_prefix('\u{feff}').unwrap_or(text)
        } else {
            text
        };
        if text.trim().is_empty() {
            continue;
        }
        if !resolved {
            out.format = columns::detect(text).ok_or_else(|| {
                row_err(
                    no,
                    1,
                    format!(
                        "unknown trace header `{}`; expected Azure (TIMESTAMP,ContextTokens,\
                         GeneratedTokens), BurstGPT (Timestamp,Model,Request tokens,Response \
                         tokens,...), Mooncake JSONL or arrival_ms,prompt_tokens,output_tokens; \
                         or name the format (--trace-format)",
                        text.chars().take(120).collect::<String>()
                    ),
                )
            })?;
            resolved = true;
        }
        if out.format != TraceFormat::Mooncake && layout.is_none() {
            let l = columns::Layout::new(out.format, text).map_err(|m| row_err(no, 1, m))?;
            out.has_content_ids = l.has_content_ids();
            layout = Some(l);
            continue;
        }
        out.data_rows += 1;
        let parsed = match &layout {
            Some(l) => l.parse(text),
            None => mooncake::parse(text),
        };
        match parsed {
            Ok(row) => {
                if !row.hash_ids.is_empty() {
                    out.has_content_ids = true;
                }
                on_row(out.format, no, row);
            }
            Err(e) if skip_bad_rows => out.note_bad(row_err(no, e.col, e.message)),
            Err(e) => return Err(row_err(no, e.col, e.message)),
        }
    }
    out.blake3 = lines.hash_hex();
    Ok(out)
}

impl TraceRead {
    fn note_bad(&mut self, e: TraceError) {
        self.skipped_bad_rows += 1;
        if self.first_bad_row.is_none() {
            self.first_bad_row = Some(e.to_string());
        }
    }
}
