//! The Gemini stream machine (`streamGenerateContent?alt=sse`): each event is a whole
//! response, judged as it comes; nothing is held.
//!
//! The SDKs do not frame events as the SSE standard does: Python's `google-genai` reads each
//! `data:` line as a chunk of its own, `@google/genai` one `data:` line per event. So an event
//! that mentions a call leaves in toolwall's own serialisation: one `data:` line of the JSON
//! judged, its whitespace between tokens removed (no line break can split it), so every reader
//! gets exactly the response toolwall judged. An event whose data does not parse as one
//! response (two `data:` lines of a response each, say) mentions a call it cannot judge, and
//! ends the stream.

use bytes::{Bytes, BytesMut};

use super::{TOOL_KEYS, Unpassable, rewrite_document};
use crate::llm::json::quote;
use crate::llm::{Cx, Fatal, Keys, Machine};
use crate::sse::{write_event, write_with_data};

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
        if !TOOL_KEYS.any_in(body) {
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
                write_with_data(out, raw, minified(judged).as_bytes());
                Ok(())
            }
            Err(Unpassable::Json(e)) => {
                // Every event reaching here mentions a call: fail closed, or (fail_open) pass
                // it when it is no JSON at all (no SDK reads a call from it).
                cx.malformed(&e, true)?;
                out.extend_from_slice(raw);
                Ok(())
            }
            Err(Unpassable::Unjudgeable(why)) => Err(Fatal::new(why)),
        }
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
