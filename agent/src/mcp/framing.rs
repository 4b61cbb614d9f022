//! Newline-delimited JSON-RPC framing (the stdio transport), mini-redis style.
//!
//! The reader appends whatever the pipe gave into [`LineFramer::buffer_mut`]; each complete
//! line is split off the front without copying (`BytesMut::split_to` shares the allocation).
//! There is no line-length cap: MCP messages (a `tools/call` result with an image, a huge
//! `tools/list`) can be many megabytes, and a cap would either break them or, worse, tempt a
//! "pass the rest through unfiltered" fallback.

use bytes::{Bytes, BytesMut};

/// Splits a byte stream into lines, each including its `\n`.
#[derive(Debug, Default)]
pub struct LineFramer {
    buf: BytesMut,
    /// Bytes of `buf` already known to hold no `\n`, so a huge line arriving in many small
    /// reads is scanned once in total, not once per read.
    scanned: usize,
}

impl LineFramer {
    /// An empty framer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The buffer to read into (`AsyncReadExt::read_buf`), so bytes land in place.
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Appends bytes (for callers that already hold them, and for tests).
    pub fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete line, `\n` included; `None` when the rest is incomplete — an expected
    /// state, not an error: the caller reads more.
    pub fn next_line(&mut self) -> Option<Bytes> {
        match memchr::memchr(b'\n', &self.buf[self.scanned..]) {
            Some(pos) => {
                let end = self.scanned + pos + 1;
                self.scanned = 0;
                Some(self.buf.split_to(end).freeze())
            }
            None => {
                self.scanned = self.buf.len();
                None
            }
        }
    }

    /// At end of stream: the unterminated last message, if the peer sent one without a final
    /// `\n` (treated as a message, not dropped, so nothing escapes the filter by omitting it).
    /// Whitespace-only leftovers are no message.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.scanned = 0;
        let rest = self.buf.split().freeze();
        if rest.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(rest)
        }
    }
}

/// The message inside a framed line: the line without its `\n`. A `\r` before it is kept
/// (JSON treats it as whitespace), so forwarding the message and a `\n` restores the line
/// byte for byte.
pub fn strip_newline(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_at_every_split(stream: &[u8]) {
        let expected: Vec<&[u8]> = stream.split_inclusive(|b| *b == b'\n').collect();
        for cut in 0..=stream.len() {
            let mut framer = LineFramer::new();
            let mut got = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                framer.extend(part);
                while let Some(line) = framer.next_line() {
                    got.push(line);
                }
            }
            if let Some(rest) = framer.finish() {
                got.push(rest);
            }
            let got: Vec<&[u8]> = got.iter().map(|b| b.as_ref()).collect();
            assert_eq!(got, expected, "split at {cut}");
        }
    }

    #[test]
    fn splits_lines_at_every_cut() {
        lines_at_every_split(b"{\"a\":1}\n{\"b\":2}\r\n\n{\"c\":3}\n");
        lines_at_every_split(b"{\"a\":1}\n{\"unterminated\":true}");
    }

    #[test]
    fn huge_line_byte_by_byte() {
        let mut big = vec![b' '; 3 * 1024 * 1024];
        big[0] = b'{';
        big[1] = b'}';
        big.push(b'\n');
        let mut framer = LineFramer::new();
        let mut count = 0;
        for chunk in big.chunks(4096) {
            framer.extend(chunk);
            while let Some(line) = framer.next_line() {
                assert_eq!(line.len(), big.len());
                count += 1;
            }
        }
        assert_eq!(count, 1);
        assert!(framer.finish().is_none());
    }

    #[test]
    fn strip_keeps_carriage_return() {
        assert_eq!(strip_newline(b"{}\r\n"), b"{}\r");
        assert_eq!(strip_newline(b"{}"), b"{}");
    }
}
