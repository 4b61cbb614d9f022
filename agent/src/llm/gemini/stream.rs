//! The Gemini stream machine (`streamGenerateContent?alt=sse`): each chunk is a whole response,
//! judged as it comes; nothing is held but the lines of a chunk Python's SDK is still reading.
//!
//! Google's SDKs do not read the stream as SSE (verified against `google-genai` 3.6.1 and
//! `@google/genai` 2.32.0, whose readers [`PythonReader`] follows):
//! - Python's reads lines: consecutive `data: ` lines (with the space) joined by LF are one
//!   chunk at a blank line; **every other line**, across events, goes to a buffer that yields a
//!   chunk whenever its braces balance outside strings (how the API sends a mid-stream error).
//!   Such lines join without a separator, so a key split over two of them is whole there.
//! - Node's takes an event that starts with `data:` as one JSON text, its later lines
//!   included, and drops an event that starts with anything else.
//!
//! So no line leaves as upstream wrote it: every chunk Python's reader would yield, from data
//! lines or from other lines, is judged and leaves as toolwall's own event, one `data: ` line
//! of the JSON judged with its whitespace between tokens removed; every other line is dropped.
//! Both readers then get exactly the responses toolwall judged. A chunk of other lines that is
//! not JSON (Python's SDK would fail on it) ends the stream; data that is not JSON follows
//! `interceptor.on_malformed`, its line breaks kept (Python joins them as toolwall did).

use bytes::{Bytes, BytesMut};

use super::{TOOL_KEYS, Unpassable, record_unreadable, rewrite_document};
use crate::llm::json::quote;
use crate::llm::{Cx, Fatal, Keys, Machine};
use crate::sse::framer::SseEvent;
use crate::sse::write_event;

/// Python's buffer of lines that are not `data: ` lines (`_RawJsonLineBuffer`): joined without
/// a separator until the braces outside strings balance.
#[derive(Default)]
struct PythonReader {
    buffer: Vec<u8>,
    depth: i64,
    in_string: bool,
    escaped: bool,
}

impl PythonReader {
    /// Adds one line; the chunk it completes, if any. Byte by byte as Python goes character by
    /// character: the bytes it counts are ASCII, which no other UTF-8 character contains.
    fn add_line(&mut self, line: &[u8]) -> Option<Vec<u8>> {
        for &c in line {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if c == b'\\' {
                    self.escaped = true;
                } else if c == b'"' {
                    self.in_string = false;
                }
            } else if c == b'"' {
                self.in_string = true;
            } else if c == b'{' {
                self.depth += 1;
            } else if c == b'}' {
                self.depth -= 1;
            }
        }
        self.buffer.extend_from_slice(line);
        (self.depth == 0).then(|| {
            self.in_string = false;
            self.escaped = false;
            std::mem::take(&mut self.buffer)
        })
    }
}

/// Streaming state of one Gemini response.
pub(crate) struct Gemini {
    max_buffer: usize,
    reader: PythonReader,
}

impl Gemini {
    pub(crate) fn new(max_buffer: usize) -> Self {
        Gemini {
            max_buffer,
            reader: PythonReader::default(),
        }
    }

    /// One event, read as Python's SDK reads its lines.
    fn on_lines(&mut self, cx: &mut Cx, raw: &Bytes, out: &mut BytesMut) -> Result<(), Fatal> {
        let mut data: Vec<&[u8]> = Vec::new();
        for (_, line) in SseEvent::new(raw).lines() {
            if let Some(value) = line.strip_prefix(b"data: ") {
                data.push(value);
                continue;
            }
            if let Some(chunk) = self.reader.add_line(line) {
                judge_chunk(cx, &chunk, out, Strict::Yes)?;
            } else if self.reader.buffer.len() > self.max_buffer {
                return Err(Fatal::new(format!(
                    "lines outside data that the Python SDK would join into one chunk exceed {} bytes (interceptor.max_stream_buffer_bytes)",
                    self.max_buffer
                )));
            }
        }
        if data.is_empty() {
            return Ok(());
        }
        let joined = data.join(&b'\n');
        judge_chunk(cx, &joined, out, Strict::No)
    }
}

/// Whether a chunk that is not JSON ends the stream whatever `on_malformed` says.
#[derive(PartialEq, Eq)]
enum Strict {
    Yes,
    No,
}

/// Judges one chunk and writes it as toolwall's own event.
fn judge_chunk(cx: &mut Cx, chunk: &[u8], out: &mut BytesMut, strict: Strict) -> Result<(), Fatal> {
    let text = std::str::from_utf8(chunk).map_err(|_| Fatal::new("a chunk is not UTF-8"))?;
    if !TOOL_KEYS.any_in(chunk) {
        // No call can be in it: only its form is toolwall's.
        match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => write_event(out, None, minified(text).as_bytes()),
            Err(_) if strict == Strict::Yes => {
                return Err(Fatal::new(
                    "a line outside data that the Python SDK would read as a chunk is not JSON",
                ));
            }
            Err(_) => write_event(out, None, chunk),
        }
        return Ok(());
    }
    match rewrite_document(cx, text) {
        Ok(new) => {
            let judged = new.as_deref().unwrap_or(text);
            write_event(out, None, minified(judged).as_bytes());
            Ok(())
        }
        Err(Unpassable::Json(e)) => {
            record_unreadable(cx, text, &e.to_string());
            if strict == Strict::Yes {
                return Err(Fatal::new(format!(
                    "a line outside data that the Python SDK would read as a chunk cannot be read ({e})"
                )));
            }
            // It mentions a call: fail closed, or (fail_open) pass it when it is no JSON at
            // all; the backstop still refuses what a lenient parser could read a blocked call
            // from.
            cx.malformed(&e, true)?;
            write_event(out, None, chunk);
            Ok(())
        }
        Err(Unpassable::Unjudgeable(why)) => {
            record_unreadable(cx, text, &why);
            Err(Fatal::new(why))
        }
    }
}

impl Machine for Gemini {
    fn on_data(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        _body: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        self.on_lines(cx, raw, out)
    }

    /// Lines of an event without data are Python's chunks too; nothing else of it leaves.
    fn on_dataless(&mut self, cx: &mut Cx, raw: &Bytes, out: &mut BytesMut) -> Result<(), Fatal> {
        self.on_lines(cx, raw, out)
    }

    fn on_end(&mut self, cx: &mut Cx, out: &mut BytesMut) {
        // What Python's reader still holds, it yields at the end.
        let rest = std::mem::take(&mut self.reader.buffer);
        if !rest.is_empty() && judge_chunk(cx, &rest, out, Strict::Yes).is_err() {
            self.write_error(
                out,
                "[toolwall] response stopped: the stream ended inside lines that cannot be judged",
            );
        }
    }

    /// The error the API itself streams (`{"error": {code, message, status}}`, `error` first
    /// and `code` a number: what both SDKs raise as an API error).
    fn write_error(&self, out: &mut BytesMut, message: &str) {
        let data = format!(
            r#"{{"error":{{"code":500,"message":{},"status":"INTERNAL"}}}}"#,
            quote(message)
        );
        write_event(out, None, data.as_bytes());
    }

    /// None: no run of upstream's bytes passes unread (see the module's comment).
    fn quiet_keys(&self) -> Option<&'static Keys> {
        None
    }

    fn held_bytes(&self) -> usize {
        self.reader.buffer.len()
    }
}

/// `json` without whitespace between tokens (strings kept as they are): one line, whatever
/// line breaks upstream put between its tokens.
fn minified(json: &str) -> std::borrow::Cow<'_, str> {
    if !json.contains([' ', '\t', '\n', '\r']) {
        return json.into();
    }
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out.into()
}

#[cfg(test)]
#[test]
fn minifying_keeps_strings_and_drops_line_breaks() {
    let json = "{\"a\" :\n [1,\r\n \"x \\\" \\n y\"]}";
    assert_eq!(minified(json), "{\"a\":[1,\"x \\\" \\n y\"]}");
    assert_eq!(minified("{\"a\": 1}"), "{\"a\":1}");
    assert!(matches!(
        minified("{\"a\":1}"),
        std::borrow::Cow::Borrowed(_)
    ));
}

#[cfg(test)]
#[test]
fn the_python_reader_joins_other_lines_until_braces_balance() {
    let mut r = PythonReader::default();
    assert_eq!(r.add_line(b"{\"a\":\"}\""), None);
    assert_eq!(r.add_line(b",\"function"), None);
    assert_eq!(
        r.add_line(b"Call\":1}").as_deref(),
        Some(&b"{\"a\":\"}\",\"functionCall\":1}"[..])
    );
    // A line without braces is a chunk of its own (Python yields it, and fails on it).
    assert_eq!(r.add_line(b"event: x").as_deref(), Some(&b"event: x"[..]));
}
