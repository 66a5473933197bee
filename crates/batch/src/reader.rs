//! Reading a JSONL file line by line with every line bounded in bytes: a line
//! over the bound is reported (with its number) and skipped without being held.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

/// A line longer than the bound (the `io::Error` payload of its item).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: longer than the limit of {limit} bytes")]
pub struct LineTooLong {
    pub line: u64,
    pub limit: usize,
}

impl LineTooLong {
    /// The `LineTooLong` inside `e`, if that is what `e` is.
    pub fn of(e: &io::Error) -> Option<LineTooLong> {
        e.get_ref()?.downcast_ref::<LineTooLong>().copied()
    }
}

/// The lines of a reader, numbered from 1, without their `\n` / `\r\n`. Blank
/// lines are counted (for the numbers) but not yielded. A line over `limit`
/// bytes yields an `InvalidData` error carrying [`LineTooLong`] and reading goes
/// on with the next line; a line that is not UTF-8 yields `InvalidData` too.
pub struct BoundedLines<R> {
    reader: R,
    limit: usize,
    line: u64,
    buf: Vec<u8>,
}

impl<R: BufRead> BoundedLines<R> {
    pub fn new(reader: R, limit: usize) -> Self {
        BoundedLines {
            reader,
            limit,
            line: 0,
            buf: Vec::new(),
        }
    }

    /// Reads one raw line into `buf` (at most `limit` bytes kept); returns
    /// (any byte read, too long), or the reader's error.
    fn read_raw(&mut self) -> io::Result<(bool, bool)> {
        self.buf.clear();
        let (mut any, mut too_long) = (false, false);
        loop {
            let avail = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if avail.is_empty() {
                return Ok((any, too_long));
            }
            any = true;
            let (chunk, used, end) = match avail.iter().position(|&b| b == b'\n') {
                Some(i) => (&avail[..i], i + 1, true),
                None => (avail, avail.len(), false),
            };
            if !too_long {
                // `\r` before the `\n` is not counted against the bound.
                if self.buf.len() + chunk.len() > self.limit.saturating_add(1) {
                    too_long = true;
                    self.buf.clear();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            self.reader.consume(used);
            if end {
                return Ok((any, too_long));
            }
        }
    }
}

impl<R: BufRead> Iterator for BoundedLines<R> {
    type Item = io::Result<(u64, String)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (any, mut too_long) = match self.read_raw() {
                Ok(r) => r,
                Err(e) => return Some(Err(e)),
            };
            if !any {
                return None;
            }
            self.line += 1;
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
            too_long |= self.buf.len() > self.limit;
            if too_long {
                let e = LineTooLong {
                    line: self.line,
                    limit: self.limit,
                };
                return Some(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let text = std::mem::take(&mut self.buf);
            return Some(match String::from_utf8(text) {
                Ok(s) => Ok((self.line, s)),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("line {}: not UTF-8 text", self.line),
                )),
            });
        }
    }
}

/// The non-blank lines of `path` with their 1-based numbers, each at most
/// `limit` bytes (see [`BoundedLines`]).
pub fn read_lines(path: &Path, limit: usize) -> io::Result<BoundedLines<BufReader<File>>> {
    Ok(BoundedLines::new(BufReader::new(File::open(path)?), limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[u8], limit: usize) -> Vec<Result<(u64, String), String>> {
        // A tiny buffer: lines span many `fill_buf` chunks.
        let r = BufReader::with_capacity(3, text);
        BoundedLines::new(r, limit)
            .map(|i| {
                i.map_err(|e| match LineTooLong::of(&e) {
                    Some(t) => format!("long {}", t.line),
                    None => e.to_string(),
                })
            })
            .collect()
    }

    #[test]
    fn lines_are_numbered_bounded_and_skipped_whole() {
        let got = lines(b"ab\r\n\n  \nabcdefghij\nabcde\nxyz", 5);
        assert_eq!(
            got,
            [
                Ok((1, "ab".into())),
                Err("long 4".into()),
                Ok((5, "abcde".into())),
                Ok((6, "xyz".into())),
            ]
        );
        assert_eq!(lines(b"abcdef\r\n", 5), [Err("long 1".to_string())]);
        assert_eq!(lines(b"abcde\r\n", 5), [Ok((1, "abcde".to_string()))]);
        assert!(lines(b"", 5).is_empty());
        assert_eq!(
            lines(b"\xff\xfe\nok", 5),
            [Err("line 1: not UTF-8 text".into()), Ok((2, "ok".into()))]
        );
    }

    #[test]
    fn a_long_line_is_never_held() {
        // 50 MB with no newline and a 1 KiB bound: the buffer stays small.
        let big = vec![b'x'; 50 << 20];
        let mut it = BoundedLines::new(BufReader::new(&big[..]), 1024);
        assert!(LineTooLong::of(&it.next().unwrap().unwrap_err()).is_some());
        assert!(it.buf.capacity() <= 64 << 10, "{}", it.buf.capacity());
        assert!(it.next().is_none());
    }
}
