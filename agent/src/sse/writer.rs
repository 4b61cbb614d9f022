//! The one SSE writer: our own events (the filter proxy's and the daemon's streams), and an
//! upstream event rewritten with new data (the LLM layer's replacements). Every line end a
//! client splits on in the data starts a new `data:` line, so nothing in it can end the event
//! or start a field.

use bytes::{BufMut, BytesMut};

use super::framer::{Line, SseEvent};

/// One SSE event for our clients. Multi-line data becomes several `data:` lines, so a message
/// containing a newline cannot end the event early or inject fields.
pub(crate) fn encode_event(event: Option<&str>, id: Option<&str>, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 32);
    encode_event_into(&mut out, event, id, data);
    out
}

/// [`encode_event`] appended to `out` (the filter proxy's response buffer: no copy between).
pub(crate) fn encode_event_into(
    out: &mut impl BufMut,
    event: Option<&str>,
    id: Option<&str>,
    data: &[u8],
) {
    if let Some(event) = event {
        out.put_slice(b"event: ");
        out.put_slice(single_line(event).as_bytes());
        out.put_u8(b'\n');
    }
    if let Some(id) = id {
        out.put_slice(b"id: ");
        out.put_slice(single_line(id).as_bytes());
        out.put_u8(b'\n');
    }
    put_data_lines(out, data);
    out.put_u8(b'\n');
}

/// `data` as `data:` lines. Every line terminator a client splits on (`\n`, `\r\n`, a lone
/// `\r`) starts a new `data:` line: nothing in the data can end the event or start a field.
pub(crate) fn put_data_lines(out: &mut impl BufMut, data: &[u8]) {
    // A JSON-RPC message is nearly always one line: one scan says so.
    if memchr::memchr2(b'\n', b'\r', data).is_none() {
        out.put_slice(b"data: ");
        out.put_slice(data);
        out.put_u8(b'\n');
        return;
    }
    for line in data.split(|b| *b == b'\n') {
        for piece in line
            .strip_suffix(b"\r")
            .unwrap_or(line)
            .split(|b| *b == b'\r')
        {
            out.put_slice(b"data: ");
            out.put_slice(piece);
            out.put_u8(b'\n');
        }
    }
}

fn single_line(s: &str) -> &str {
    s.split(['\r', '\n']).next().unwrap_or("")
}

/// Writes an event made of `raw`'s non-data lines (kept verbatim, in order) and `data` as its
/// data (one `data:` line per line of `data`), at the position of the first original data line.
pub(crate) fn write_with_data(out: &mut BytesMut, raw: &[u8], data: &[u8]) {
    let mut wrote = false;
    for (line, text) in SseEvent::new(raw).lines() {
        match line {
            Line::Field(b"data", _) => {
                if !wrote {
                    put_data_lines(out, data);
                    wrote = true;
                }
            }
            _ => {
                out.extend_from_slice(text);
                out.extend_from_slice(b"\n");
            }
        }
    }
    if !wrote {
        put_data_lines(out, data);
    }
    out.extend_from_slice(b"\n");
}

/// Writes a whole new event: an optional `event:` line and the data.
pub(crate) fn write_event(out: &mut BytesMut, event: Option<&str>, data: &[u8]) {
    encode_event_into(out, event, None, data);
}
