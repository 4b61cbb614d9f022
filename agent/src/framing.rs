//! Newline-delimited JSON-RPC framing (the stdio transport), mini-redis style.
//!
//! A crate-wide module, not MCP's own: the approval client (`approval/asker.rs`), a lower
//! layer than MCP, reads the daemon's JSON-lines answers with it as well.
//!
//! The reader appends whatever the pipe gave into [`LineFramer::buffer_mut`]; each complete
//! line is split off the front without copying (`BytesMut::split_to` shares the allocation).
//! MCP messages (a `tools/call` result with an image, a huge `tools/list`) can be many
//! megabytes, so the per-message limit is generous ([`DEFAULT_MAX_MESSAGE_BYTES`], configurable),
//! but there is one: without it a peer that never sends `\n` grows the buffer until the process
//! dies. A message over the limit is never passed on, not even in part: the framer reports
//! [`TooLong`] once, drops the message's bytes (including any that arrive later, up to its
//! `\n`) and goes on with the next one; the caller decides whether to answer or stop.

use bytes::{Bytes, BytesMut};

/// The default most bytes of one JSON-RPC message (without its `\n`): 16 MiB.
pub(crate) const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;

/// A message longer than the framer's limit; its bytes were dropped, never passed on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a JSON-RPC message is larger than {limit} bytes (the limit; raise it with --max-message-bytes); it was not forwarded"
)]
pub(crate) struct TooLong {
    /// The limit in force.
    pub limit: usize,
    /// The message's top-level `id` (raw JSON, a number or a string) when it came before the
    /// limit, so a request can be answered with an error instead of left hanging.
    pub id: Option<String>,
}

/// Splits a byte stream into lines, each including its `\n`, of at most a set length.
#[derive(Debug)]
pub(crate) struct LineFramer {
    buf: BytesMut,
    /// Bytes of `buf` already known to hold no `\n`, so a huge line arriving in many small
    /// reads is scanned once in total, not once per read.
    scanned: usize,
    /// Most bytes of one message, its `\n` not counted.
    max: usize,
    /// Inside a message already reported as too long: drop bytes up to its `\n`.
    discarding: bool,
}

impl Default for LineFramer {
    fn default() -> Self {
        Self::with_limit(DEFAULT_MAX_MESSAGE_BYTES)
    }
}

impl LineFramer {
    /// An empty framer with the default limit.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// An empty framer taking messages of at most `max` bytes.
    pub(crate) fn with_limit(max: usize) -> Self {
        LineFramer {
            buf: BytesMut::new(),
            scanned: 0,
            max,
            discarding: false,
        }
    }

    /// The buffer to read into (`AsyncReadExt::read_buf`), so bytes land in place.
    pub(crate) fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Appends bytes (for callers that already hold them, and for tests).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete line, `\n` included; `Ok(None)` when the rest is incomplete — an
    /// expected state, not an error: the caller reads more. `Err` once per message over the
    /// limit (whichever way it was split into reads); the framer is still usable after it.
    pub(crate) fn next_line(&mut self) -> Result<Option<Bytes>, TooLong> {
        loop {
            let found = memchr::memchr(b'\n', &self.buf[self.scanned..]);
            if self.discarding {
                match found {
                    Some(pos) => {
                        // The end of the dropped message: go on after it.
                        let _ = self.buf.split_to(self.scanned + pos + 1);
                        self.scanned = 0;
                        self.discarding = false;
                        continue;
                    }
                    None => {
                        self.buf.clear();
                        self.scanned = 0;
                        return Ok(None);
                    }
                }
            }
            return match found {
                Some(pos) if self.scanned + pos > self.max => {
                    let line = self.buf.split_to(self.scanned + pos + 1);
                    self.scanned = 0;
                    Err(self.too_long(&line))
                }
                Some(pos) => {
                    let end = self.scanned + pos + 1;
                    self.scanned = 0;
                    Ok(Some(self.buf.split_to(end).freeze()))
                }
                None if self.buf.len() > self.max => {
                    let err = self.too_long(&self.buf);
                    self.buf.clear();
                    self.scanned = 0;
                    self.discarding = true;
                    Err(err)
                }
                None => {
                    self.scanned = self.buf.len();
                    Ok(None)
                }
            };
        }
    }

    /// At end of stream: the unterminated last message, if the peer sent one without a final
    /// `\n` (treated as a message, not dropped, so nothing escapes the filter by omitting it).
    /// Whitespace-only leftovers, and the rest of a message already reported, are no message.
    pub(crate) fn finish(&mut self) -> Result<Option<Bytes>, TooLong> {
        self.scanned = 0;
        let rest = self.buf.split().freeze();
        if std::mem::take(&mut self.discarding) || rest.iter().all(u8::is_ascii_whitespace) {
            Ok(None)
        } else if rest.len() > self.max {
            Err(self.too_long(&rest))
        } else {
            Ok(Some(rest))
        }
    }

    fn too_long(&self, start: &[u8]) -> TooLong {
        TooLong {
            limit: self.max,
            id: leading_id(start).map(str::to_owned),
        }
    }
}

/// The top-level `"id"` of a JSON object that may be cut off anywhere after it: the raw JSON
/// of the value when it is complete and a number or a string. A small scanner rather than a
/// parser, because the message is incomplete by definition; any surprise gives `None`.
fn leading_id(msg: &[u8]) -> Option<&str> {
    let ws = |mut i: usize| {
        while msg
            .get(i)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        {
            i += 1;
        }
        i
    };
    let mut i = ws(0);
    if msg.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = ws(i);
        let key_end = value_end(msg, i).filter(|_| msg.get(i) == Some(&b'"'))?;
        let key = &msg[i..key_end];
        i = ws(key_end);
        if msg.get(i) != Some(&b':') {
            return None;
        }
        i = ws(i + 1);
        let end = value_end(msg, i)?;
        if key == b"\"id\"" {
            let raw = std::str::from_utf8(&msg[i..end]).ok()?;
            return match serde_json::from_str::<serde_json::Value>(raw).ok()? {
                serde_json::Value::Number(_) | serde_json::Value::String(_) => Some(raw),
                _ => None,
            };
        }
        i = ws(end);
        if msg.get(i) != Some(&b',') {
            return None;
        }
        i += 1;
    }
}

/// Where the JSON value starting at `start` ends (exclusive), if it ends within `msg`.
fn value_end(msg: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (off, &b) in msg.get(start..)?.iter().enumerate() {
        let at = start + off;
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(at + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            b',' | b' ' | b'\t' | b'\r' | b'\n' if depth == 0 => return (off > 0).then_some(at),
            b':' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// The message inside a framed line: the line without its `\n`. A `\r` before it is kept
/// (JSON treats it as whitespace), so forwarding the message and a `\n` restores the line
/// byte for byte.
pub(crate) fn strip_newline(line: &[u8]) -> &[u8] {
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
                while let Some(line) = framer.next_line().expect("within the limit") {
                    got.push(line);
                }
            }
            if let Some(rest) = framer.finish().expect("within the limit") {
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
            while let Some(line) = framer.next_line().expect("within the limit") {
                assert_eq!(line.len(), big.len());
                count += 1;
            }
        }
        assert_eq!(count, 1);
        assert_eq!(framer.finish(), Ok(None));
    }

    #[test]
    fn strip_keeps_carriage_return() {
        assert_eq!(strip_newline(b"{}\r\n"), b"{}\r");
        assert_eq!(strip_newline(b"{}"), b"{}");
    }

    /// Feeds `stream` split at `cut`, then finishes: the lines and the errors, in order.
    fn frame(limit: usize, stream: &[u8], cut: usize) -> Vec<Result<Vec<u8>, TooLong>> {
        let mut framer = LineFramer::with_limit(limit);
        let mut got = Vec::new();
        for part in [&stream[..cut], &stream[cut..]] {
            framer.extend(part);
            loop {
                match framer.next_line() {
                    Ok(Some(line)) => got.push(Ok(line.to_vec())),
                    Ok(None) => break,
                    Err(e) => got.push(Err(e)),
                }
            }
        }
        match framer.finish() {
            Ok(Some(rest)) => got.push(Ok(rest.to_vec())),
            Ok(None) => {}
            Err(e) => got.push(Err(e)),
        }
        got
    }

    #[test]
    fn a_message_over_the_limit_is_reported_once_and_dropped_at_every_cut() {
        let long = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{"pad":"0123456789012345678901234567890123456789"}}}"#;
        let mut stream = b"{\"a\":1}\n".to_vec();
        stream.extend_from_slice(long);
        stream.extend_from_slice(b"\n{\"b\":2}\n");
        let want = vec![
            Ok(b"{\"a\":1}\n".to_vec()),
            Err(TooLong {
                limit: 64,
                id: Some("7".to_owned()),
            }),
            Ok(b"{\"b\":2}\n".to_vec()),
        ];
        for cut in 0..=stream.len() {
            assert_eq!(frame(64, &stream, cut), want, "split at {cut}");
        }
        // Unterminated at the end of the stream.
        let mut tail = b"{\"a\":1}\n".to_vec();
        tail.extend_from_slice(long);
        for cut in 0..=tail.len() {
            let got = frame(64, &tail, cut);
            assert_eq!(got.len(), 2, "split at {cut}");
            assert!(got[1].is_err(), "split at {cut}");
        }
        // Exactly at the limit is fine.
        assert_eq!(
            frame(7, b"{\"a\":1}\n", 3),
            vec![Ok(b"{\"a\":1}\n".to_vec())]
        );
    }

    #[test]
    fn a_buffer_never_grows_past_the_limit_without_a_newline() {
        let mut framer = LineFramer::with_limit(1024);
        let chunk = [b'x'; 512];
        let mut errors = 0;
        for _ in 0..10_000 {
            framer.extend(&chunk);
            while let Err(e) = framer.next_line() {
                assert_eq!(e.id, None);
                errors += 1;
            }
            assert!(framer.buffer_mut().len() <= 1024 + chunk.len());
        }
        assert_eq!(errors, 1);
    }

    #[test]
    fn leading_id_of_a_cut_off_message() {
        let cases: &[(&[u8], Option<&str>)] = &[
            (br#"{"jsonrpc":"2.0","id":42,"params":{"x":"#, Some("42")),
            (br#" { "id" : "abc\"d" , "params""#, Some(r#""abc\"d""#)),
            (
                br#"{"params":{"id":1,"a":[1,{"b":"}"}]},"id":-3,"x"#,
                Some("-3"),
            ),
            (br#"{"params":{"id":1,"#, None),
            (br#"{"method":"x","id":null,"#, None),
            (br#"{"id":{"a":1},"#, None),
            (br#"{"id":12"#, None),
            (b"[1,2", None),
        ];
        for (msg, want) in cases {
            assert_eq!(leading_id(msg), *want, "{}", String::from_utf8_lossy(msg));
        }
    }
}
