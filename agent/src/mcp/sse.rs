//! Server-sent events, sans-IO: a decoder for the upstream's streams and an encoder for ours.
//!
//! Both MCP HTTP transports carry JSON-RPC messages as SSE `data`. The decoder has the
//! framer's shape: bytes in, complete events out, "incomplete" is the normal state. Lines end
//! in `\r\n`, `\n` or a lone `\r`, as the SSE spec says and as the SDKs' clients split them: a
//! message hidden behind a lone `\r` inside another event's line is a message here too, and is
//! filtered (an attack found one passing unfiltered when only `\n` ended lines).

use bytes::{Buf, BufMut, BytesMut};

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` type; `None` means the default, `message`.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: Vec<u8>,
    /// The `id:` field, for `Last-Event-ID` resumption.
    pub id: Option<String>,
}

impl SseEvent {
    /// Whether the event carries a JSON-RPC message (`message`, no type, or an empty `event:`
    /// field — which clients' SSE parsers also treat as `message`, so it must be filtered too).
    pub fn is_message(&self) -> bool {
        matches!(self.event.as_deref(), None | Some("") | Some("message"))
    }
}

/// Incremental SSE parser.
#[derive(Debug)]
pub struct SseDecoder {
    buf: BytesMut,
    scanned: usize,
    pending: SseEvent,
    has_data: bool,
    /// The last `id:` seen; it stays in force for later events, as in the SSE spec.
    last_id: Option<String>,
    /// Most bytes held for one event (its lines and data); past it the stream is refused.
    limit: usize,
    overflowed: bool,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::with_limit(super::framing::DEFAULT_MAX_MESSAGE_BYTES)
    }
}

impl SseDecoder {
    /// A decoder at the start of a stream, holding at most the default message size.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder holding at most `limit` bytes of one event: a server cannot make us buffer
    /// without end (a stream with no line end, or one endless event).
    pub fn with_limit(limit: usize) -> Self {
        SseDecoder {
            buf: BytesMut::new(),
            scanned: 0,
            pending: SseEvent::default(),
            has_data: false,
            last_id: None,
            limit,
            overflowed: false,
        }
    }

    /// Appends received bytes; past the limit nothing more is taken ([`Self::overflowed`]).
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.overflowed {
            return;
        }
        if self.buf.len() + self.pending.data.len() + chunk.len() > self.limit {
            self.overflowed = true;
            self.buf = BytesMut::new();
            self.scanned = 0;
            self.pending = SseEvent::default();
            return;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// Whether an event grew past the limit: the stream must be given up (what is left of it
    /// cannot be framed).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The next complete event, or `None` until more bytes arrive.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        if self.overflowed {
            return None;
        }
        loop {
            let pos = memchr::memchr2(b'\n', b'\r', &self.buf[self.scanned..])?;
            let end = self.scanned + pos;
            // `\r\n` is one terminator: a `\r` at the end of what arrived waits for the next byte.
            let terminator = match (self.buf[end], self.buf.get(end + 1)) {
                (b'\n', _) => 1,
                (_, Some(b'\n')) => 2,
                (_, Some(_)) => 1,
                (_, None) => {
                    self.scanned = end;
                    return None;
                }
            };
            self.scanned = 0;
            let line = &self.buf[..end];
            let dispatched = if line.is_empty() {
                self.dispatch()
            } else {
                let (field, value) = match memchr::memchr(b':', line) {
                    Some(0) => (&b""[..], &b""[..]), // comment
                    Some(i) => {
                        let v = &line[i + 1..];
                        (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                    }
                    None => (line, &b""[..]),
                };
                match field {
                    b"data" => {
                        if self.has_data {
                            self.pending.data.push(b'\n');
                        }
                        self.pending.data.extend_from_slice(value);
                        self.has_data = true;
                    }
                    b"event" => {
                        self.pending.event = Some(String::from_utf8_lossy(value).into_owned())
                    }
                    b"id" => self.last_id = Some(String::from_utf8_lossy(value).into_owned()),
                    _ => {}
                }
                None
            };
            self.buf.advance(end + terminator);
            if dispatched.is_some() {
                return dispatched;
            }
        }
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let mut event = std::mem::take(&mut self.pending);
        event.id.clone_from(&self.last_id);
        let had = std::mem::replace(&mut self.has_data, false);
        // An event without data only sets the last event id; nothing to deliver.
        (had || event.event.is_some()).then_some(event)
    }
}

/// One SSE event for our clients. Multi-line data becomes several `data:` lines, so a message
/// containing a newline cannot end the event early or inject fields.
pub fn encode_event(event: Option<&str>, id: Option<&str>, data: &[u8]) -> Vec<u8> {
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
    // Every line terminator a client splits on (`\n`, `\r\n`, a lone `\r`) starts a new
    // `data:` line: nothing in the data can end the event or start a field.
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
    out.put_u8(b'\n');
}

fn single_line(s: &str) -> &str {
    s.split(['\r', '\n']).next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_event_field_is_a_message() {
        for event in [None, Some(""), Some("message")] {
            let e = SseEvent {
                event: event.map(str::to_owned),
                data: b"{}".to_vec(),
                id: None,
            };
            assert!(e.is_message(), "{event:?}");
        }
        let e = SseEvent {
            event: Some("endpoint".into()),
            data: b"/m".to_vec(),
            id: None,
        };
        assert!(!e.is_message());
    }

    /// `stream` cut in two at every byte decodes to `expected`.
    fn decodes_the_same_at_every_split(stream: &[u8], expected: &[SseEvent]) {
        for cut in 0..=stream.len() {
            let mut d = SseDecoder::new();
            let mut got = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                d.feed(part);
                while let Some(e) = d.next_event() {
                    got.push(e);
                }
            }
            assert_eq!(got, expected, "cut {cut}");
        }
    }

    #[test]
    fn decodes_at_every_split() {
        let stream = b": comment\r\nevent: endpoint\r\ndata: /message?sessionId=1\r\n\r\nid: 7\ndata: {\"a\":\ndata: 1}\n\nid: 8\n\nevent: message\ndata\n\n";
        let expected = vec![
            SseEvent {
                event: Some("endpoint".into()),
                data: b"/message?sessionId=1".to_vec(),
                id: None,
            },
            SseEvent {
                event: None,
                data: b"{\"a\":\n1}".to_vec(),
                id: Some("7".into()),
            },
            SseEvent {
                event: Some("message".into()),
                data: Vec::new(),
                id: Some("8".into()),
            },
        ];
        decodes_the_same_at_every_split(stream, &expected);
    }

    /// The attack that passed: a message behind lone `\r`s inside a `note` event's line. The
    /// SDKs' clients split there; so does the decoder, at every split of the stream.
    #[test]
    fn a_lone_cr_ends_a_line_at_every_split() {
        let stream =
            b"event: note\ndata:\revent: message\rdata: {\"id\":5}\n\nid: 9\r\rdata: x\r\n\r\n";
        let expected = vec![
            SseEvent {
                event: Some("message".into()),
                data: b"\n{\"id\":5}".to_vec(),
                id: None,
            },
            SseEvent {
                event: None,
                data: b"x".to_vec(),
                id: Some("9".into()),
            },
        ];
        decodes_the_same_at_every_split(stream, &expected);
        let encoded = encode_event(None, None, b"a\rb\r\nc");
        assert_eq!(encoded, b"data: a\ndata: b\ndata: c\n\n");
    }

    #[test]
    fn an_event_past_the_limit_is_refused_not_buffered() {
        let mut d = SseDecoder::with_limit(64);
        d.feed(b"data: 0123456789\n\n");
        assert_eq!(d.next_event().map(|e| e.data), Some(b"0123456789".to_vec()));
        // A lone `\r` at the end waits (the scan position is kept) when the limit is passed.
        d.feed(b"data: x\r");
        assert!(d.next_event().is_none());
        for _ in 0..10 {
            d.feed(b"data: 0123456789012345678901234567890123456789\n");
        }
        assert!(d.overflowed());
        assert!(d.next_event().is_none());
    }

    #[test]
    fn encoding_round_trips_and_cannot_inject() {
        let encoded = encode_event(
            Some("message"),
            Some("4\nevent: x"),
            b"{\"a\":1}\r\nevent: evil",
        );
        let mut d = SseDecoder::new();
        d.feed(&encoded);
        let e = d.next_event().expect("one event");
        assert_eq!(e.event.as_deref(), Some("message"));
        assert_eq!(e.id.as_deref(), Some("4"));
        assert_eq!(e.data, b"{\"a\":1}\nevent: evil");
        assert!(d.next_event().is_none());
    }
}
