//! The Gemini stream machine (`streamGenerateContent?alt=sse`): each event is a whole
//! response, judged as it comes; nothing is held.
//!
//! The SDKs do not frame events as the SSE standard does (verified against `google-genai`
//! 3.6.1 and `@google/genai` 2.32.0): Python's reads lines, takes a line that is a bare JSON
//! object (no `data:`) as a chunk too and fails on any other field; Node's reads one `data: `
//! line per event, ended only by a blank line, and drops an event that opens with `event:`.
//! So an event that mentions a call anywhere (in any line, not only its data) leaves in
//! toolwall's own serialisation: one `data:` line of the JSON judged, its whitespace between
//! tokens removed (no line break can split it), nothing else — every reader gets exactly the
//! response toolwall judged. An event whose data does not parse as one response (two `data:`
//! lines of a response each, say) mentions a call it cannot judge, and ends the stream; an
//! event without data that mentions a call is dropped (no SSE reader takes data from it,
//! Python's could).

use bytes::{Bytes, BytesMut};

use super::{TOOL_KEYS, Unpassable, rewrite_document};
use crate::llm::json::quote;
use crate::llm::{Cx, Fatal, Keys, Machine};
use crate::sse::write_event;

/// Streaming state of one Gemini response: none (calls arrive whole per chunk).
pub(crate) struct Gemini;

impl Machine for Gemini {
    fn on_data(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        if !TOOL_KEYS.any_in(raw) {
            out.extend_from_slice(raw);
            return Ok(());
        }
        let text = match std::str::from_utf8(body) {
            Ok(text) => text,
            Err(_) => {
                return Err(Fatal::new("an event that mentions a call is not UTF-8"));
            }
        };
        match rewrite_document(cx, text) {
            Ok(new) => {
                let judged = new.as_deref().unwrap_or(text);
                write_event(out, None, minified(judged).as_bytes());
                Ok(())
            }
            Err(Unpassable::Json(e)) => {
                // Every event reaching here mentions a call: fail closed, or (fail_open) pass
                // its data when it is no JSON at all (the backstop still refuses what a
                // lenient parser could read a blocked call from), its other lines dropped.
                cx.malformed(&e, true)?;
                write_event(out, None, body);
                Ok(())
            }
            Err(Unpassable::Unjudgeable(why)) => Err(Fatal::new(why)),
        }
    }

    fn on_dataless(&mut self, raw: &Bytes, out: &mut BytesMut) {
        if TOOL_KEYS.any_in(raw) {
            tracing::warn!(
                bytes = raw.len(),
                "dropped a Gemini stream event without data that mentions a call (a reader of lines could take it for one)"
            );
            return;
        }
        out.extend_from_slice(raw);
    }

    fn on_end(&mut self, _cx: &mut Cx, _out: &mut BytesMut) {}

    /// The error the API itself streams (`{"error": {code, message, status}}`): both SDKs
    /// raise it as an API error.
    fn write_error(&self, out: &mut BytesMut, message: &str) {
        let data = format!(
            r#"{{"error":{{"code":500,"message":{},"status":"INTERNAL"}}}}"#,
            quote(message)
        );
        write_event(out, None, data.as_bytes());
    }

    fn quiet_keys(&self) -> Option<&'static Keys> {
        Some(&TOOL_KEYS)
    }

    fn held_bytes(&self) -> usize {
        0
    }
}

/// `json` without whitespace between tokens (strings kept as they are): one line, whatever
/// line breaks upstream put between its tokens.
fn minified(json: &str) -> std::borrow::Cow<'_, str> {
    if !json.contains(['\n', '\r']) {
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
    assert!(matches!(
        minified("{\"a\": 1}"),
        std::borrow::Cow::Borrowed(_)
    ));
}
