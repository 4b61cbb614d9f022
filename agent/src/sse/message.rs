//! Server-sent events as messages: the decoder the MCP layer reads upstream streams with and
//! the encoder for ours.
//!
//! Both MCP HTTP transports carry JSON-RPC messages as SSE `data`. The decoder has the
//! framer's shape: bytes in, complete events out, "incomplete" is the normal state. Lines end
//! in `\r\n`, `\n` or a lone `\r`, as the SSE spec says and as the SDKs' clients split them: a
//! message hidden behind a lone `\r` inside another event's line is a message here too, and is
//! filtered (if only `\n` ended lines, such a message would pass unfiltered).

use super::framer::Line;

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SseEvent {
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
    pub(crate) fn is_message(&self) -> bool {
        matches!(self.event.as_deref(), None | Some("") | Some("message"))
    }
}

/// The events of a stream as an SSE client dispatches them: the one framer
/// (`sse/framer.rs`) splits the stream where the SDKs' parsers do, and each event's fields
/// are read from its lines.
#[derive(Debug)]
pub(crate) struct SseDecoder {
    framer: super::framer::SseDecoder,
    /// The last `id:` seen; it stays in force for later events, as in the SSE spec.
    last_id: Option<String>,
    overflowed: bool,
}

impl SseDecoder {
    /// A decoder holding at most `limit` bytes of one event: a server cannot make us buffer
    /// without end (a stream with no line end, or one endless event).
    pub(crate) fn with_limit(limit: usize) -> Self {
        SseDecoder {
            framer: super::framer::SseDecoder::new(limit),
            last_id: None,
            overflowed: false,
        }
    }

    /// Appends received bytes (nothing more once an event went past the limit).
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if !self.overflowed {
            self.framer.feed(bytes::Bytes::copy_from_slice(chunk));
        }
    }

    /// Whether an event grew past the limit: the stream must be given up (what is left of it
    /// cannot be framed).
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The next complete event, or `None` until more bytes arrive. An event with neither data
    /// nor a type only sets the last event id.
    pub(crate) fn next_event(&mut self) -> Option<SseEvent> {
        while !self.overflowed {
            let raw = match self.framer.next_event() {
                Ok(Some(raw)) => raw,
                Ok(None) => return None,
                Err(_) => {
                    self.overflowed = true;
                    return None;
                }
            };
            let mut event = SseEvent::default();
            let mut has_data = false;
            for (line, _) in super::framer::SseEvent::new(&raw).lines() {
                match line {
                    Line::Field(b"data", value) => {
                        if has_data {
                            event.data.push(b'\n');
                        }
                        event.data.extend_from_slice(value);
                        has_data = true;
                    }
                    Line::Field(b"event", value) => {
                        event.event = Some(String::from_utf8_lossy(value).into_owned())
                    }
                    Line::Field(b"id", value) => {
                        self.last_id = Some(String::from_utf8_lossy(value).into_owned())
                    }
                    _ => {}
                }
            }
            if has_data || event.event.is_some() {
                event.id.clone_from(&self.last_id);
                return Some(event);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::writer::encode_event;

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
            let mut d = SseDecoder::with_limit(1 << 20);
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

    /// A message behind lone `\r`s inside a `note` event's line, hidden from a decoder that
    /// ends lines only at `\n`. The
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
            assert!(d.next_event().is_none());
        }
        assert!(d.overflowed());
        d.feed(b"\n");
        assert!(d.next_event().is_none(), "nothing after an overflow");
    }

    #[test]
    fn encoding_round_trips_and_cannot_inject() {
        let encoded = encode_event(
            Some("message"),
            Some("4\nevent: x"),
            b"{\"a\":1}\r\nevent: evil",
        );
        let mut d = SseDecoder::with_limit(1 << 20);
        d.feed(&encoded);
        let e = d.next_event().expect("one event");
        assert_eq!(e.event.as_deref(), Some("message"));
        assert_eq!(e.id.as_deref(), Some("4"));
        assert_eq!(e.data, b"{\"a\":1}\nevent: evil");
        assert!(d.next_event().is_none());
    }
}
