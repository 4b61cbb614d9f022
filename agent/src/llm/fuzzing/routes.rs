//! The oracle for the route table and whole-document judging (the `llm_sse` target's inputs
//! whose control byte has bit 4 set): the first line is `METHOD PATH`, the next lines up to an
//! empty one are headers, the rest is the upstream's answer.
//!
//! - The route table never relays a request of an API toolwall refuses by default (Managed
//!   Agents sessions, Assistants threads and assistants, Batches, ChatKit, files, Gemini's
//!   cached contents), nor a Gemini key to another provider, nor an Anthropic key to the
//!   openai or gemini provider, nor an OpenAI key to gemini.
//! - A document the call-shape judge accepts holds no call of a blocked tool and no call of a
//!   type it does not know, read every way a client reads it: one JSON document, JSON lines
//!   split at LF, CR or CRLF, SSE events. The oracle walks `serde_json::Value`s on its own; it
//!   shares only the SSE framer with the judge (the one framer the SDKs are matched against).

use bytes::Bytes;
use hyper::{HeaderMap, Method};
use serde_json::Value;

use super::{BLOCKED, FuzzGate};
use crate::llm::backstop;
use crate::llm::routes::{self, Reading};

/// Path segments of the APIs refused by default.
const REFUSED: &[&str] = &[
    "sessions",
    "threads",
    "assistants",
    "batches",
    "chatkit",
    "files",
    "cachedContents",
];

pub(crate) fn check(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let Some((method, path)) = lines.next().and_then(|l| l.split_once(' ')) else {
        return;
    };
    let (Ok(method), true) = (Method::from_bytes(method.as_bytes()), path.starts_with('/')) else {
        return;
    };
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Some((k, v)) = line.split_once(':')
            && let (Ok(k), Ok(v)) = (
                hyper::header::HeaderName::from_bytes(k.trim().as_bytes()),
                hyper::header::HeaderValue::from_str(v.trim()),
            )
        {
            headers.append(k, v);
        }
    }
    let routed = routes::route(&method, path, &headers, &[]);
    let bare = path.split_once('?').map_or(path, |(p, _)| p);
    if let Ok(routed) = &routed {
        let dialect = crate::llm::Dialect::from_path(bare).is_some();
        assert!(
            dialect || !bare.split('/').any(|s| REFUSED.contains(&s)),
            "{method} {path} of a refused API was routed: {routed:?}"
        );
        let gemini = routed.provider == crate::config::Provider::Gemini;
        assert!(
            gemini
                || (!headers.contains_key("x-goog-api-key")
                    && !path
                        .split_once('?')
                        .is_some_and(|(_, q)| q.split('&').any(|p| p.starts_with("key=")))),
            "{method} {path}: a Gemini key was routed to {routed:?}"
        );
        assert!(
            routed.provider == crate::config::Provider::Anthropic
                || !headers.contains_key("x-api-key"),
            "{method} {path}: an Anthropic key was routed to {routed:?}"
        );
        assert!(
            !gemini
                || !headers.get_all("authorization").iter().any(|v| {
                    v.to_str()
                        .is_ok_and(|v| v.to_ascii_lowercase().contains("bearer sk-"))
                }),
            "{method} {path}: an sk- key was routed to gemini"
        );
        if routed.reading == Reading::Document {
            document(body.as_bytes());
        }
    }
}

/// The document oracle: if the judge accepts `body`, no reading of it holds a forbidden call.
fn document(body: &[u8]) {
    if backstop::scan_body(body, &FuzzGate).is_some() {
        return;
    }
    let mut readings: Vec<Value> = Vec::new();
    let text = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    readings.extend(serde_json::from_slice::<Value>(text).ok());
    for line in text.split(|&b| b == b'\n' || b == b'\r') {
        readings.extend(serde_json::from_slice::<Value>(line).ok());
    }
    let mut framer = crate::sse::SseDecoder::new(usize::MAX);
    framer.feed(Bytes::copy_from_slice(body));
    let mut events = Vec::new();
    while let Ok(Some(raw)) = framer.next_event() {
        events.push(raw);
    }
    events.push(framer.finish());
    for raw in events {
        if let Some(data) = crate::sse::SseEvent::new(&raw).data() {
            readings.extend(serde_json::from_slice::<Value>(&data).ok());
        }
    }
    for value in &readings {
        if let Some(bad) = forbidden(value, None) {
            panic!(
                "the document judge passed {bad}\nbody: {:?}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

/// A call the SDKs would act on: a blocked name in a call shape, or any named call of a type
/// the judge does not know.
fn forbidden(value: &Value, key: Option<&str>) -> Option<String> {
    match value {
        Value::Array(items) => items.iter().find_map(|v| forbidden(v, key)),
        Value::Object(map) => {
            let s = |k: &str| map.get(k).and_then(Value::as_str);
            let name = s("name").or_else(|| s("tool_name"));
            if let (Some(kind), Some(name)) = (s("type"), name) {
                let lower = kind.to_ascii_lowercase();
                let call = lower.contains("tool_use")
                    || lower.contains("tool_call")
                    || lower.ends_with("_call")
                    || lower.contains("approval_request");
                if call && (BLOCKED.contains(&name) || !KNOWN.contains(&kind)) {
                    return Some(format!("a {kind} call of {name}"));
                }
            }
            if matches!(key, Some("tool_calls" | "function_call")) {
                let inner = ["function", "custom"]
                    .iter()
                    .filter_map(|k| map.get(*k).and_then(|f| f.get("name")))
                    .filter_map(Value::as_str)
                    .chain(name);
                for n in inner {
                    if BLOCKED.contains(&n) {
                        return Some(format!("a tool_calls entry of {n}"));
                    }
                }
            }
            map.iter()
                .filter(|(k, _)| k.as_str() != "delta")
                .find_map(|(k, v)| forbidden(v, Some(k)))
        }
        _ => None,
    }
}

/// The call types the judge reads by name.
const KNOWN: &[&str] = &[
    "tool_use",
    "server_tool_use",
    "mcp_tool_use",
    "function_call",
    "custom_tool_call",
    "mcp_call",
    "mcp_approval_request",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_oracle_holds_on_the_refused_apis_and_documents() {
        for input in [
            "GET /v1/sessions/s/events/stream\n\n",
            "POST /v1/messages\nx-goog-api-key: k\n\n",
            "POST /v1/chat/completions\nx-api-key: k\n\n",
            "GET /v1/models\nanthropic-version: 1\n\n{\"data\":[{\"type\":\"agent.custom_tool_use\",\"name\":\"x\"}]}",
            "GET /v1/models\n\n{\"a\":1}\r{\"type\":\"tool_use\",\"name\":\"Bash\"}",
            "GET /v1/conversations/c/items\n\n{\"data\":[{\"type\":\"function_call\",\"name\":\"Bash\"}]}",
            "GET /v1/models\n\ndata: {\"type\":\"mcp_approval_request\",\n data: \"name\":\"mcp__fs__delete\"}\n\n",
        ] {
            check(input.as_bytes());
        }
    }

    #[test]
    #[should_panic(expected = "the document judge passed")]
    fn the_document_oracle_sees_what_the_sdks_would_run() {
        // Not through the judge: the oracle alone, on a body it must flag.
        let value: Value =
            serde_json::from_str(r#"{"data":[{"type":"agent.custom_tool_use","name":"x"}]}"#)
                .expect("json");
        if let Some(bad) = forbidden(&value, None) {
            panic!("the document judge passed {bad}");
        }
    }
}
