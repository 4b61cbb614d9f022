//! The oracle for the JSON-RPC framing and filter, shared by the randomised test below and
//! the `cargo fuzz` target (`agent/fuzz`): whatever bytes come in, in whatever pieces,
//! no denied tool is in any output and nothing but denied calls (and messages the filter
//! must refuse) is changed.
//!
//! The oracle judges with `serde_json::Value` (what a typical peer would parse), not with the
//! filter's own borrowed parser, so a disagreement between the two is a finding. What goes to
//! the server is read the way servers read it: split at every line break some server's reader
//! splits at (Python's universal newlines, `str.splitlines`, Node's `\n`), and each piece
//! parsed on its own; a forwarded message must be one piece that means what the client sent.

use std::borrow::Cow;
use std::collections::HashSet;

use serde_json::Value;

use super::enforce::Enforcement;
use super::filter::{Filter, FilterContext};
use super::framing::{LineFramer, strip_newline};

/// Tools whose names start with this are denied in oracle runs.
pub(crate) const DENIED_PREFIX: &str = "deny";

fn denied(name: &str) -> bool {
    name.starts_with(DENIED_PREFIX)
}

/// JSON without duplicate keys, or `None`: a message with duplicate keys means different things
/// to different parsers (first wins, last wins, error), so the filter refuses it and the oracle
/// counts it as unreadable.
fn parse_strict(bytes: &[u8]) -> Option<Value> {
    struct Strict;
    impl<'de> serde::de::DeserializeSeed<'de> for Strict {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> serde::de::Visitor<'de> for Strict {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("JSON without duplicate keys")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(Strict)?.is_some() {}
            Ok(())
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut keys = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if !keys.insert(key) {
                    return Err(serde::de::Error::custom("duplicate key"));
                }
                map.next_value_seed(Strict)?;
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde::de::DeserializeSeed::deserialize(Strict, &mut de).ok()?;
    de.end().ok()?;
    serde_json::from_slice(bytes).ok()
}

/// Every JSON-RPC object in a message (the message, or a batch's elements).
fn objects(value: &Value) -> Vec<&Value> {
    match value {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    }
}

/// Not JSON-RPC (a batch element that is not an object, an empty batch, a scalar): the filter
/// refuses or drops it rather than guess what a peer would make of it.
fn malformed(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.is_empty() || items.iter().any(|i| !i.is_object()),
        Value::Object(_) => false,
        _ => true,
    }
}

fn has_denied_call(value: &Value) -> bool {
    objects(value).iter().any(|m| {
        m.get("method").and_then(Value::as_str) == Some("tools/call")
            && m.pointer("/params/name")
                .and_then(Value::as_str)
                .is_none_or(denied)
    })
}

fn has_denied_tool(value: &Value) -> bool {
    objects(value).iter().any(|m| {
        m.pointer("/result/tools")
            .and_then(Value::as_array)
            .is_some_and(|tools| {
                tools
                    .iter()
                    .any(|t| t.get("name").and_then(Value::as_str).is_none_or(denied))
            })
    })
}

/// Drives a filter over two byte streams fed in arbitrary pieces and checks every output.
pub(crate) struct Harness {
    filter: Filter,
    framers: [LineFramer; 2],
    listed: Listed,
}

/// What the oracle knows of the tools the session may call (the filter refuses calls of
/// tools no judged listing let through).
enum Listed {
    /// No listing yet: calls are judged by name alone.
    Open,
    /// These names, from the listings so far.
    Known(HashSet<String>),
    /// A listing the oracle could not read strictly: which calls pass is not known.
    Unknown,
}

impl Listed {
    /// Server messages change what may be called.
    fn update(&mut self, input: Option<&Value>) {
        let Some(value) = input else {
            *self = Listed::Unknown;
            return;
        };
        for m in objects(value) {
            if let Some(tools) = m.pointer("/result/tools").and_then(Value::as_array) {
                let mut names = match std::mem::replace(self, Listed::Open) {
                    Listed::Known(names) => names,
                    _ => HashSet::new(),
                };
                names.extend(
                    tools
                        .iter()
                        .filter_map(|t| t.get("name").and_then(Value::as_str))
                        .filter(|n| !denied(n))
                        .map(str::to_owned),
                );
                *self = Listed::Known(names);
            }
        }
    }

    /// Whether a call of `name` may pass; `None`: cannot tell.
    fn allows(&self, name: &str) -> Option<bool> {
        match self {
            Listed::Open => Some(true),
            Listed::Known(names) => Some(names.contains(name)),
            Listed::Unknown => None,
        }
    }
}

fn call_names(value: &Value) -> impl Iterator<Item = &str> {
    objects(value)
        .into_iter()
        .filter(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"))
        .map(|m| {
            m.pointer("/params/name")
                .and_then(Value::as_str)
                .unwrap_or("")
        })
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// A filter denying `^deny`.
    pub(crate) fn new() -> Self {
        let gate = Enforcement::new(None, None, &[format!("^{DENIED_PREFIX}")])
            .unwrap_or_else(|e| panic!("oracle pattern: {e:#}"))
            .gate;
        let ctx = FilterContext {
            gate,
            server_id: "fuzz".into(),
            server_type: "stdio".into(),
            layer: "shim",
            session_id: String::new(),
            events: None,
            approvals: None,
        };
        Self {
            filter: Filter::new(ctx),
            framers: [LineFramer::new(), LineFramer::new()],
            listed: Listed::Open,
        }
    }

    /// Feeds a piece of the client (`on_client`) or server stream.
    pub(crate) fn feed(&mut self, on_client: bool, piece: &[u8]) {
        let i = usize::from(!on_client);
        self.framers[i].extend(piece);
        loop {
            match self.framers[i].next_line() {
                Ok(Some(line)) => self.check(on_client, strip_newline(&line)),
                Ok(None) => break,
                // Dropped whole by the framer: nothing of it is forwarded.
                Err(_) => continue,
            }
        }
    }

    /// Ends both streams (unterminated last messages count).
    pub(crate) fn finish(&mut self) {
        for (i, on_client) in [(0, true), (1, false)] {
            if let Ok(Some(rest)) = self.framers[i].finish() {
                self.check(on_client, &rest);
            }
        }
    }

    fn check(&mut self, on_client: bool, msg: &[u8]) {
        let input = parse_strict(msg);
        if on_client {
            let out = self.filter.on_client(msg);
            check_replies(&out.replies);
            check_to_server(
                msg,
                input.as_ref(),
                out.forward.as_deref(),
                &out.replies,
                &self.listed,
            );
            return;
        }
        let out = self.filter.on_server(msg);
        if out.forward.is_some() {
            self.listed.update(input.as_ref());
        }
        let same = matches!(&out.forward, Some(Cow::Borrowed(b)) if b.as_ptr() == msg.as_ptr() && b.len() == msg.len());
        if let Some(forwarded) = &out.forward
            && !forwarded.iter().all(u8::is_ascii_whitespace)
        {
            let value: Value = serde_json::from_slice(forwarded).unwrap_or_else(|e| {
                panic!(
                    "forwarded a message that is not JSON ({e}): {}",
                    String::from_utf8_lossy(forwarded)
                )
            });
            assert!(!has_denied_tool(&value), "denied tool listed: {value}");
        }
        check_replies(&out.replies);
        if !same {
            // Changed or dropped: only denied tools and messages the filter cannot read (which
            // it must not pass on) may be.
            let explained = match &input {
                None => true,
                Some(v) if malformed(v) => true,
                Some(v) => has_denied_tool(v) || out.forward.is_none(),
            };
            assert!(
                explained,
                "changed a message it had no reason to: {}",
                String::from_utf8_lossy(msg)
            );
        }
    }
}

fn check_replies(replies: &[Vec<u8>]) {
    for reply in replies {
        let value: Value = serde_json::from_slice(reply).unwrap_or_else(|e| {
            panic!(
                "reply is not JSON ({e}): {}",
                String::from_utf8_lossy(reply)
            )
        });
        assert!(
            value.get("error").is_some(),
            "reply is not an error: {value}"
        );
    }
}

/// Where some server's line reader ends a line: `\n` (Node), `\r` (Python's universal
/// newlines), and what `str.splitlines` adds.
fn splits_lines(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\u{b}'
            | '\u{c}'
            | '\u{1c}'
            | '\u{1d}'
            | '\u{1e}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// What a client message becomes on the server's side.
fn check_to_server(
    msg: &[u8],
    input: Option<&Value>,
    forwarded: Option<&[u8]>,
    replies: &[Vec<u8>],
    listed: &Listed,
) {
    let Some(forwarded) = forwarded else {
        return;
    };
    let text = std::str::from_utf8(forwarded)
        .unwrap_or_else(|e| panic!("forwarded bytes that are not UTF-8 ({e})"));
    assert!(
        !text.contains(splits_lines) && !text.contains('\u{feff}'),
        "forwarded a message some server reads as several lines: {text:?}"
    );
    // The server's parse (duplicates: last wins, as in Python and JavaScript) and a strict
    // one agree: the forwarded text has no duplicate keys.
    // Numbers are read by their text (`1e400`, which Python and JavaScript read as infinity,
    // included), as the filter reads them.
    let value: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("forwarded a message that is not JSON ({e}): {text}"));
    assert_eq!(
        parse_strict(forwarded).as_ref(),
        Some(&value),
        "forwarded a message that parsers read differently: {text}"
    );
    assert!(!has_denied_call(&value), "denied call forwarded: {value}");
    assert!(
        call_names(&value).all(|n| listed.allows(n) != Some(false)),
        "a call of a tool no judged listing let through was forwarded: {value}"
    );
    let refusable =
        |v: &Value| has_denied_call(v) || call_names(v).any(|n| listed.allows(n) != Some(true));
    match input {
        // The client's message, as the server reads it, unless calls were refused.
        Some(v) if !malformed(v) && !refusable(v) && replies.is_empty() => assert_eq!(
            &value,
            v,
            "forwarded something other than what the client sent: {}",
            String::from_utf8_lossy(msg)
        ),
        Some(_) => {}
        None => panic!(
            "forwarded a message the oracle cannot read strictly: {}",
            String::from_utf8_lossy(msg)
        ),
    }
}

/// The fuzz entry point: the input is a series of pieces, each introduced by one control
/// byte (low bit: 0 client, 1 server; the other bits: the piece's length).
pub fn run(input: &[u8]) {
    let mut harness = Harness::new();
    let mut rest = input;
    while let Some((&control, tail)) = rest.split_first() {
        let len = usize::from(control >> 1).min(tail.len());
        harness.feed(control & 1 == 0, &tail[..len]);
        rest = &tail[len..];
    }
    harness.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic, so a failure reproduces from its seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn pick<'a>(&mut self, options: &[&'a str]) -> &'a str {
            options[(self.next() % options.len() as u64) as usize]
        }
    }

    const NAMES: &[&str] = &[
        r#""deny_a""#,
        r#""ok""#,
        r#""den\u0079_b""#,
        r#""ok\"q""#,
        r#""\u0064eny""#,
        r#""denial""#,
    ];
    const IDS: &[&str] = &["1", r#""a""#, "1.0", "null", "-3", r#""\u0031""#];
    const WS: &[&str] = &["", " ", "\t", "\r", " \r"];

    fn message(rng: &mut Rng, on_client: bool) -> String {
        let id = rng.pick(IDS);
        let name = rng.pick(NAMES);
        let ws = rng.pick(WS);
        if on_client {
            match rng.next() % 9 {
                0 => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":{name},"arguments":{{}}}}}}"#
                ),
                1 => format!(
                    r#"{ws}{{"method":"tools\/call","id":{id},"params":{{"arguments":{{"x":[1,2]}},"name":{name}}}}}"#
                ),
                2 => format!(
                    r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":{name}}}}}{ws}"#
                ),
                3 => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#),
                4 => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"name":{name}}}}}"#
                ),
                5 => {
                    let n = 1 + rng.next() % 3;
                    let items: Vec<String> = (0..n).map(|_| message(rng, true)).collect();
                    format!("[{}]", items.join(","))
                }
                6 => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","method":"ping","params":{{"name":{name}}}}}"#
                ),
                7 => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":{name}"#
                ),
                _ => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":{name},"name":"ok"}}}}"#
                ),
            }
        } else {
            match rng.next() % 6 {
                0..=2 => {
                    let n = rng.next() % 4;
                    let tools: Vec<String> = (0..n)
                        .map(|_| {
                            format!(
                                r#"{{"name":{},"inputSchema":{{"type":"object"}}}}"#,
                                rng.pick(NAMES)
                            )
                        })
                        .collect();
                    let cursor = if rng.next().is_multiple_of(2) {
                        r#","nextCursor":"c""#
                    } else {
                        ""
                    };
                    format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{}]{cursor}}}}}{ws}"#,
                        tools.join(",")
                    )
                }
                3 => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"sampling/createMessage","params":{{"name":{name}}}}}"#
                ),
                4 => format!(r#"[{},{}]"#, message(rng, false), message(rng, false)),
                _ => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":{name}}}]}}}}"#
                ),
            }
        }
    }

    #[test]
    fn random_streams_in_random_pieces_keep_the_oracle() {
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut input = Vec::new();
            for _ in 0..12 {
                let on_client = rng.next().is_multiple_of(2);
                let mut text = message(&mut rng, on_client);
                text.push_str(if rng.next().is_multiple_of(3) {
                    "\r\n"
                } else {
                    "\n"
                });
                // Cut the message into random pieces, each with its control byte.
                let mut bytes = text.as_bytes();
                while !bytes.is_empty() {
                    let len = (1 + rng.next() % 127).min(bytes.len() as u64) as usize;
                    input.push(((len as u8) << 1) | u8::from(!on_client));
                    input.extend_from_slice(&bytes[..len]);
                    bytes = &bytes[len..];
                }
            }
            run(&input);
        }
    }

    #[test]
    fn arbitrary_bytes_keep_the_oracle() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for _ in 0..2000 {
            let len = (rng.next() % 200) as usize;
            let alphabet = b"{}[]\",:\\ \n\r0123456789abcdeilmnorstuy/_.-";
            let input: Vec<u8> = (0..len)
                .map(|_| alphabet[(rng.next() % alphabet.len() as u64) as usize])
                .collect();
            run(&input);
        }
    }
}
