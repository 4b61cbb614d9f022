//! Test helpers: a tiny gate and stream utilities shared by the dialect tests.

use std::sync::Arc;

use bytes::Bytes;

use super::{Dialect, Flow, OnMalformed, Record, StreamInterceptor};
use crate::decision::{Action, CallQuery, Decision, Gate, ToolIdentity};

/// Blocks the names in `blocked`; names starting with `mcp__` (after joining a namespace as
/// `ns__name`) are MCP tools, everything else is a native tool. A name ending in `guarded` has
/// argument rules: arguments holding `SECRET_2` are blocked, `/a` is redacted from the record
/// when they hold `SECRET_1`.
pub(crate) struct TestGate {
    pub blocked: Vec<&'static str>,
}

impl Gate for TestGate {
    fn needs_arguments(&self, call: &CallQuery<'_>) -> bool {
        call.name.ends_with("guarded")
    }

    fn dispatched(&self, _: &str, _: &serde_json::Value) -> Option<(String, serde_json::Value)> {
        None
    }

    fn declared_url(&self, _: &str) -> Option<String> {
        None
    }

    /// The default result rules (gitleaks' set, redact), as a daemon without config has.
    fn inspect_result(
        &self,
        server: &str,
        tool: Option<&str>,
        message: &[u8],
    ) -> Option<crate::decision::ResultVerdict> {
        static RULES: std::sync::OnceLock<Option<crate::policy::ResultRules>> =
            std::sync::OnceLock::new();
        RULES
            .get_or_init(|| crate::policy::ResultRules::new(&Default::default()).ok())
            .as_ref()?
            .inspect(server, tool, message)
    }

    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let name = match call.namespace {
            Some(ns) => format!("{ns}__{}", call.name),
            None => call.name.to_owned(),
        };
        let tool = name.starts_with("mcp__").then(|| ToolIdentity {
            server_id: "srv".into(),
            server_type: "stdio".into(),
            server_addr: String::new(),
            tool: name.rsplit("__").next().unwrap_or_default().to_owned(),
            tool_hash: String::new(),
        });
        let arguments = call.arguments.map(|a| a.to_string()).unwrap_or_default();
        if name.ends_with("guarded") && arguments.contains("SECRET_2") {
            return Decision {
                action: Action::Block,
                reason: "argument rule of the test".into(),
                tool,
                redact: Vec::new(),
                ask: None,
            };
        }
        if self.blocked.iter().any(|b| *b == name) {
            Decision {
                action: Action::Block,
                reason: "denied by test".into(),
                tool,
                redact: Vec::new(),
                ask: None,
            }
        } else {
            Decision {
                action: Action::Allow,
                reason: String::new(),
                tool,
                redact: if name.ends_with("guarded") && arguments.contains("SECRET_1") {
                    vec!["/a".into()]
                } else {
                    Vec::new()
                },
                ask: None,
            }
        }
    }

    fn check_listed(&self, _: &str, _: &str, _: &serde_json::Value) -> Decision {
        Decision::not_mcp()
    }
}

pub(crate) fn gate(blocked: &[&'static str]) -> Arc<dyn Gate> {
    Arc::new(TestGate {
        blocked: blocked.to_vec(),
    })
}

/// Runs `input` through an interceptor in the given chunks; output bytes and records.
pub(crate) fn run_chunks(
    dialect: Dialect,
    blocked: &[&'static str],
    chunks: &[&[u8]],
    limit: usize,
) -> (Vec<u8>, Vec<Record>, bool) {
    let mut i = StreamInterceptor::new(dialect, gate(blocked), OnMalformed::FailClosed, limit);
    let mut out = super::Output::default();
    let mut records = Vec::new();
    let mut closed = false;
    for c in chunks {
        if i.feed(Bytes::copy_from_slice(c), &mut out) == Flow::Closed {
            closed = true;
            break;
        }
        records.extend(i.drain_records());
    }
    if !closed {
        i.finish(&mut out);
    }
    records.extend(i.drain_records());
    (out.take_all(), records, closed)
}

/// Runs `input` whole through an interceptor set to `fail_open`; the output as text.
pub(crate) fn run_failing_open(
    dialect: Dialect,
    blocked: &[&'static str],
    input: Vec<u8>,
) -> String {
    let mut i = StreamInterceptor::new(dialect, gate(blocked), OnMalformed::FailOpen, 1 << 20);
    let mut out = super::Output::default();
    if i.feed(Bytes::from(input), &mut out) == Flow::Continue {
        i.finish(&mut out);
    }
    String::from_utf8_lossy(&out.take_all()).into_owned()
}

/// Runs `input` whole.
pub(crate) fn run(
    dialect: Dialect,
    blocked: &[&'static str],
    input: &[u8],
) -> (Vec<u8>, Vec<Record>) {
    let (out, records, _) = run_chunks(dialect, blocked, &[input], 1 << 20);
    (out, records)
}

/// Asserts that every split of `input` into two reads and a sample of three-read splits gives
/// the same output as the whole.
pub(crate) fn assert_split_invariant(
    dialect: Dialect,
    blocked: &[&'static str],
    input: &[u8],
) -> Vec<u8> {
    let (whole, whole_records) = run(dialect, blocked, input);
    for i in 0..=input.len() {
        let (out, records, _) = run_chunks(dialect, blocked, &[&input[..i], &input[i..]], 1 << 20);
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&whole),
            "split at {i}"
        );
        assert_eq!(records, whole_records, "records, split at {i}");
    }
    for i in (0..=input.len()).step_by(7) {
        for j in (i..=input.len()).step_by(13) {
            let (out, _, _) = run_chunks(
                dialect,
                blocked,
                &[&input[..i], &input[i..j], &input[j..]],
                1 << 20,
            );
            assert_eq!(out, whole, "split at {i},{j}");
        }
    }
    whole
}

/// The `data` payloads of an SSE byte stream, parsed as JSON (`[DONE]` skipped); panics on a
/// malformed stream.
pub(crate) fn data_values(stream: &[u8]) -> Vec<serde_json::Value> {
    let mut d = super::SseDecoder::new(usize::MAX);
    d.feed(Bytes::copy_from_slice(stream));
    let mut values = Vec::new();
    while let Some(ev) = d.next_event().expect("no limit") {
        if let Some(data) = super::SseEvent::new(&ev).data() {
            if data.as_ref() == b"[DONE]" {
                continue;
            }
            values.push(serde_json::from_slice(&data).expect("valid JSON data"));
        }
    }
    assert!(d.finish().is_empty(), "stream ends on an event boundary");
    values
}

/// Joins SSE events written as one `data:` line each (with an optional `event:` line).
pub(crate) fn sse(events: &[(&str, &str)]) -> Vec<u8> {
    let mut out = String::new();
    for (name, data) in events {
        if !name.is_empty() {
            out.push_str(&format!("event: {name}\n"));
        }
        out.push_str(&format!("data: {data}\n\n"));
    }
    out.into_bytes()
}
