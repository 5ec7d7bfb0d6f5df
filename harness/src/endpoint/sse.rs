//! Server-sent events parsed incrementally from a byte stream, with a bound: bytes are split into
//! lines as they come, `data:` lines are joined into an event at each blank line, and a line or
//! an event longer than the cap is an error for its request (a server that never ends a line
//! cannot grow the client's memory). Comments (`:`), `event:`, `id:` and `retry:` lines are
//! ignored, as OpenAI's streams carry none the client needs.

/// An event's payload over the cap, or bytes that are not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseError(pub String);

pub struct SseParser {
    max_event_bytes: usize,
    /// The unfinished line.
    line: Vec<u8>,
    /// `data:` lines of the unfinished event, joined by `\n`.
    data: Option<String>,
}

impl SseParser {
    pub fn new(max_event_bytes: usize) -> SseParser {
        SseParser {
            max_event_bytes,
            line: Vec::new(),
            data: None,
        }
    }

    /// Feed bytes; complete events' data go to `out` in order.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<String>) -> Result<(), SseError> {
        while let Some(i) = bytes.iter().position(|&b| b == b'\n') {
            self.take(&bytes[..i])?;
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.line_done(&line, out)?;
            line.clear();
            self.line = line;
            bytes = &bytes[i + 1..];
        }
        self.take(bytes)
    }

    /// Whether a partial line or event is held (a stream that ends here was cut).
    pub fn has_partial(&self) -> bool {
        !self.line.is_empty() || self.data.is_some()
    }

    fn take(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        let held = self.data.as_ref().map_or(0, String::len);
        if self.line.len() + bytes.len() + held > self.max_event_bytes {
            return Err(SseError(format!(
                "an event over {} bytes (the client's cap)",
                self.max_event_bytes
            )));
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<String>) -> Result<(), SseError> {
        if line.is_empty() {
            if let Some(d) = self.data.take() {
                out.push(d);
            }
            return Ok(());
        }
        let line = std::str::from_utf8(line)
            .map_err(|_| SseError("an event line that is not UTF-8".into()))?;
        if let Some(v) = line.strip_prefix("data:") {
            let v = v.strip_prefix(' ').unwrap_or(v);
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(v);
                }
                None => self.data = Some(v.to_string()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let text = b"data: {\"a\":1}\n\n: comment\ndata: x\r\ndata: y\n\ndata: [DONE]\n\n";
        for cut in 0..text.len() {
            let mut p = SseParser::new(1024);
            let mut out = Vec::new();
            p.push(&text[..cut], &mut out).unwrap();
            p.push(&text[cut..], &mut out).unwrap();
            assert_eq!(out, vec!["{\"a\":1}", "x\ny", "[DONE]"], "cut at {cut}");
            assert!(!p.has_partial());
        }
    }

    #[test]
    fn an_endless_line_is_refused_at_the_cap() {
        let mut p = SseParser::new(64);
        let mut out = Vec::new();
        let mut err = None;
        for _ in 0..100 {
            if let Err(e) = p.push(b"data: aaaaaaaaaa", &mut out) {
                err = Some(e);
                break;
            }
        }
        assert!(err.unwrap().0.contains("over 64 bytes"));
    }
}
