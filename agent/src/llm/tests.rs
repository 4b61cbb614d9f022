//! Runs forwarded unparsed next to the events that matter, in every dialect.

use super::Dialect;
use super::testing::{assert_split_invariant, run};

/// Events no pre-filter stops at in any dialect: a comment, a ping, text naming no key.
const PADDING: &[u8] = b": keep-alive\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\ndata: {\"type\":\"text\",\"text\":\"a tool use, a message start\"}\n\n";

/// `stream` (LF-framed) with padding before and after each of its events.
fn padded(stream: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(stream);
    let mut out = PADDING.to_vec();
    for event in text.split_terminator("\n\n") {
        out.extend_from_slice(event.as_bytes());
        out.extend_from_slice(b"\n\n");
        out.extend_from_slice(PADDING);
    }
    out
}

fn chat_stream() -> Vec<u8> {
    super::chat::tests::chunks(&[
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"mcp__fs__delete","arguments":""}}]},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":\"SECRET\"}"}}]},"finish_reason":null}"#,
        r#"{"index":0,"delta":{},"finish_reason":"tool_calls"}"#,
    ])
}

/// A blocked call between runs of events that pass unparsed is found whatever the reads look
/// like (the runs end exactly where an event with a key begins), and an allowed stream leaves
/// byte-identical, runs and all.
#[test]
fn calls_between_unparsed_runs_are_judged_at_every_split() {
    let anthropic = super::anthropic::tests::stream(&["mcp__fs__delete"]);
    let escaped = String::from_utf8_lossy(&anthropic)
        .replace("\"tool_use\"", "\"\\u0074ool_use\"")
        .into_bytes();
    let cases = [
        (Dialect::Anthropic, anthropic, "mcp__fs__delete"),
        (Dialect::Anthropic, escaped, "mcp__fs__delete"),
        (Dialect::OpenAiChat, chat_stream(), "mcp__fs__delete"),
        (
            Dialect::OpenAiResponses,
            super::responses::tests::function_stream("mcp__everything", "get_sum"),
            "mcp__everything__get_sum",
        ),
    ];
    for (dialect, stream, name) in cases {
        let input = padded(&stream);
        let out = assert_split_invariant(dialect, &[name], &input);
        let text = String::from_utf8_lossy(&out);
        assert!(
            !text.contains("SECRET"),
            "{dialect:?}: arguments leaked:\n{text}"
        );
        assert!(
            text.contains(&format!("[toolwall] Tool '{name}' blocked by policy")),
            "{dialect:?}: no replacement:\n{text}"
        );
        let kept = |s: &str| s.matches("keep-alive").count();
        assert_eq!(
            kept(&text),
            kept(&String::from_utf8_lossy(&input)),
            "{dialect:?}: padding lost"
        );
        let (allowed, _) = run(dialect, &[], &input);
        assert_eq!(allowed, input, "{dialect:?}: allowed stream changed");
    }
}

/// What the interceptor forwards unchanged within one read is that read's memory, not a copy.
#[test]
fn unchanged_runs_leave_as_slices_of_the_read() {
    let read = bytes::Bytes::from(padded(&super::anthropic::tests::stream(&[])));
    let mut i = super::StreamInterceptor::new(
        Dialect::Anthropic,
        super::testing::gate(&[]),
        super::OnMalformed::FailClosed,
        1 << 20,
    );
    let mut out = super::Output::default();
    assert_eq!(i.feed(read.clone(), &mut out), super::Flow::Continue);
    i.finish(&mut out);
    let chunks: Vec<bytes::Bytes> = out.drain().collect();
    let span = read.as_ptr() as usize..read.as_ptr() as usize + read.len();
    let shared: usize = chunks
        .iter()
        .filter(|c| span.contains(&(c.as_ptr() as usize)))
        .map(|c| c.len())
        .sum();
    assert_eq!(chunks.concat(), read.to_vec());
    // A turn with no tool use: nothing in it is a key, all of it is the read's own memory.
    assert_eq!(shared, read.len());
}

/// What an interceptor holds is what the proxy counts against its memory budget: an
/// incomplete event grows it, a complete one passed on returns it, and a stream stopped from
/// outside ends with its dialect's error event and holds nothing more.
#[test]
fn an_interceptor_reports_what_it_holds_and_can_be_stopped() {
    use super::{Output, StreamInterceptor};
    use bytes::Bytes;
    for dialect in [
        Dialect::Anthropic,
        Dialect::OpenAiChat,
        Dialect::OpenAiResponses,
    ] {
        let mut i = StreamInterceptor::new(
            dialect,
            super::testing::gate(&[]),
            super::OnMalformed::FailClosed,
            1 << 20,
        );
        let mut out = Output::default();
        assert_eq!(i.held_bytes(), 0);
        let start =
            Bytes::from_static(b"event: x\ndata: {\"type\":\"content_block_start\",\"a\":\"");
        i.feed(start.clone(), &mut out);
        i.feed(Bytes::from(vec![b'x'; 1000]), &mut out);
        assert!(
            i.held_bytes() >= start.len() + 1000,
            "{dialect:?}: {}",
            i.held_bytes()
        );
        assert!(
            out.take_all().is_empty(),
            "an incomplete event is not passed on"
        );
        i.stop(&mut out, "over budget");
        let written = String::from_utf8(out.take_all()).expect("utf-8");
        assert!(
            written.contains("[toolwall] response stopped: over budget"),
            "{written}"
        );
        assert_eq!(i.held_bytes(), 0, "{dialect:?}");
    }
}
