//! An incremental Server-Sent Events parser: feed it TCP reads of any size, get each event's `data`.
//!
//! Events end at a blank line; `data:` lines of one event are joined with `\n`
//! (one optional space after the colon is dropped); `\n`, `\r\n` and `\r` end
//! lines; comments (`:`…) and other fields (`event:`, `id:`, `retry:`) are
//! ignored. Lines may be split anywhere, including inside a UTF-8 character.

/// Incremental SSE parser.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Option<String>,
    /// A `\r` ended the last line; a `\n` right after it belongs to it.
    after_cr: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; returns the `data` of every event completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.buf);
                    self.line(&line, &mut events);
                }
                _ => self.buf.push(b),
            }
        }
        events
    }

    /// The stream ended: the data of an event not closed by a blank line, if any.
    pub fn finish(&mut self) -> Option<String> {
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            let mut events = Vec::new();
            self.line(&line, &mut events);
        }
        self.data.take()
    }

    /// Bytes still buffered (an incomplete line).
    pub fn pending(&self) -> &[u8] {
        &self.buf
    }

    fn line(&mut self, line: &[u8], events: &mut Vec<String>) {
        if line.is_empty() {
            if let Some(d) = self.data.take() {
                events.push(d);
            }
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "data: {\"a\":1}\n\n: keep-alive comment\n\nevent: x\ndata: {\"b\":\"é\"}\r\n\r\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n";

    fn expected() -> Vec<String> {
        vec![
            "{\"a\":1}".into(),
            "{\"b\":\"é\"}".into(),
            "line1\nline2".into(),
            "[DONE]".into(),
        ]
    }

    #[test]
    fn whole_stream() {
        let mut p = SseParser::new();
        assert_eq!(p.feed(STREAM.as_bytes()), expected());
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn split_at_every_byte_and_every_pair() {
        let bytes = STREAM.as_bytes();
        // One byte at a time.
        let mut p = SseParser::new();
        let got: Vec<String> = bytes
            .iter()
            .flat_map(|b| p.feed(std::slice::from_ref(b)))
            .collect();
        assert_eq!(got, expected());
        // Every split point (including inside the two-byte 'é' and inside \r\n).
        for cut in 0..bytes.len() {
            let mut p = SseParser::new();
            let mut got = p.feed(&bytes[..cut]);
            got.extend(p.feed(&bytes[cut..]));
            assert_eq!(got, expected(), "cut at {cut}");
        }
    }

    #[test]
    fn unterminated_last_event_is_flushed_at_finish() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data:{\"x\":2}").is_empty());
        assert_eq!(p.pending(), b"data:{\"x\":2}");
        assert_eq!(p.finish(), Some("{\"x\":2}".into()));
    }
}
