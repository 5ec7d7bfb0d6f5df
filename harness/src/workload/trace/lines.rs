//! Reading a trace line by line: bounded memory per line, every byte hashed as it is read.
//!
//! A trace can hold millions of rows; nothing here holds more than one line. A line longer than
//! [`MAX_LINE_BYTES`] is a bad row (it is consumed to its end, so `skip_bad_rows` can go on).

use std::io::{BufRead, Read};

/// Longest line accepted. A Mooncake row of a 128k-token prompt in 16-token ids is ~70 KB.
pub const MAX_LINE_BYTES: usize = 1 << 20;

pub struct Lines<R> {
    reader: R,
    hasher: blake3::Hasher,
    buf: Vec<u8>,
    line_no: u64,
}

/// One line read: its 1-based number and its text (without the line ending), or why not.
pub enum Line<'a> {
    Text(u64, &'a str),
    TooLong(u64),
    NotUtf8(u64, usize),
}

impl<R: BufRead> Lines<R> {
    pub fn new(reader: R) -> Lines<R> {
        Lines {
            reader,
            hasher: blake3::Hasher::new(),
            buf: Vec::with_capacity(4096),
            line_no: 0,
        }
    }

    /// The next line, or `None` at the end of the input.
    pub fn next_line(&mut self) -> std::io::Result<Option<Line<'_>>> {
        self.buf.clear();
        let n = (&mut self.reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf)?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        self.hasher.update(&self.buf);
        if self.buf.len() > MAX_LINE_BYTES && self.buf.last() != Some(&b'\n') {
            self.discard_rest_of_line()?;
            return Ok(Some(Line::TooLong(self.line_no)));
        }
        while matches!(self.buf.last(), Some(b'\n' | b'\r')) {
            self.buf.pop();
        }
        match std::str::from_utf8(&self.buf) {
            Ok(s) => Ok(Some(Line::Text(self.line_no, s))),
            Err(e) => Ok(Some(Line::NotUtf8(self.line_no, e.valid_up_to() + 1))),
        }
    }

    fn discard_rest_of_line(&mut self) -> std::io::Result<()> {
        loop {
            let chunk = self.reader.fill_buf()?;
            if chunk.is_empty() {
                return Ok(());
            }
            let (used, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            self.hasher.update(&chunk[..used]);
            self.reader.consume(used);
            if done {
                return Ok(());
            }
        }
    }

    /// blake3 of every byte read so far (the whole file once `next_line` returned `None`).
    pub fn hash_hex(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}
