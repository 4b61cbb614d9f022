//! Property tests whose oracle is the security property: for any stream of the shapes the
//! providers send, any set of blocked tools, any line ending and any chunking, no blocked
//! tool's call or arguments reach the client, and the output stays well-formed SSE whose data
//! is valid JSON.

use proptest::prelude::*;
use serde_json::Value;

use super::Dialect;
use super::testing::{data_values, run_chunks};

const POOL: [&str; 4] = [
    "mcp__fs__delete",
    "mcp__fs__read",
    "mcp__everything__get-sum",
    "Bash",
];

fn split(input: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in cuts {
        out.push(input[prev..c].to_vec());
        prev = c;
    }
    out.push(input[prev..].to_vec());
    out
}

fn with_line_end(input: &[u8], ending: u8) -> Vec<u8> {
    let text = String::from_utf8_lossy(input);
    match ending {
        0 => text.into_owned().into_bytes(),
        1 => text.replace('\n', "\r\n").into_bytes(),
        _ => text.replace('\n', "\r").into_bytes(),
    }
}

fn run_split(dialect: Dialect, blocked: &[&'static str], input: &[u8], cuts: &[usize]) -> Vec<u8> {
    let pieces = split(input, cuts);
    let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
    let (out, _, _) = run_chunks(dialect, blocked, &refs, 1 << 20);
    out
}

fn blocked_set(mask: u8) -> Vec<&'static str> {
    POOL.iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// Every tool name a parsed event presents as a call (any dialect).
fn called_names(v: &Value) -> Vec<String> {
    let mut names = Vec::new();
    let mut push = |x: &Value| {
        if let Some(n) = x.as_str() {
            names.push(n.to_owned());
        }
    };
    if v["content_block"]["type"] == "tool_use" {
        push(&v["content_block"]["name"]);
    }
    for c in v["choices"].as_array().into_iter().flatten() {
        for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            push(&tc["function"]["name"]);
        }
    }
    if v["item"]["type"] == "function_call" {
        let ns = v["item"]["namespace"].as_str().unwrap_or_default();
        names.push(format!(
            "{ns}__{}",
            v["item"]["name"].as_str().unwrap_or_default()
        ));
    }
    names
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn anthropic_never_leaks_a_blocked_call(
        tools in proptest::collection::vec(0usize..POOL.len(), 0..4),
        mask in 0u8..16,
        ending in 0u8..3,
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let names: Vec<&str> = tools.iter().map(|&i| POOL[i]).collect();
        let blocked = blocked_set(mask);
        let input = with_line_end(&super::anthropic::tests::stream(&names), ending);
        let out = run_split(Dialect::Anthropic, &blocked, &input, &cuts);
        let text = String::from_utf8_lossy(&out);
        for (i, name) in names.iter().enumerate() {
            if blocked.contains(name) {
                let secret = format!("SECRET_{}", i + 1);
                prop_assert!(!text.contains(&secret), "arguments of blocked {name} leaked");
            }
        }
        for v in data_values(&out) {
            for n in called_names(&v) {
                prop_assert!(!blocked.contains(&n.as_str()), "blocked call {n} passed");
            }
        }
    }

    #[test]
    fn chat_never_leaks_a_blocked_call(
        tools in proptest::collection::vec(0usize..POOL.len(), 1..4),
        mask in 0u8..16,
        split_names in any::<bool>(),
        ending in 0u8..3,
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let blocked = blocked_set(mask);
        let mut choices = Vec::new();
        for (i, &t) in tools.iter().enumerate() {
            let name = POOL[t];
            if split_names {
                let (a, b) = name.split_at(name.len() / 2);
                choices.push(format!(r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{i},"id":"call_{i}","type":"function","function":{{"name":"{a}"}}}}]}},"finish_reason":null}}"#));
                choices.push(format!(r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{i},"function":{{"name":"{b}","arguments":"{{\"SECRET_{i}\":"}}}}]}},"finish_reason":null}}"#));
            } else {
                choices.push(format!(r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{i},"id":"call_{i}","type":"function","function":{{"name":"{name}","arguments":""}}}}]}},"finish_reason":null}}"#));
                choices.push(format!(r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{i},"function":{{"arguments":"{{\"SECRET_{i}\":"}}}}]}},"finish_reason":null}}"#));
            }
        }
        for i in 0..tools.len() {
            choices.push(format!(r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{i},"function":{{"arguments":"1}}"}}}}]}},"finish_reason":null}}"#));
        }
        choices.push(r#"{"index":0,"delta":{},"finish_reason":"tool_calls"}"#.to_owned());
        let refs: Vec<&str> = choices.iter().map(String::as_str).collect();
        let input = with_line_end(&super::chat::tests::chunks(&refs), ending);
        let out = run_split(Dialect::OpenAiChat, &blocked, &input, &cuts);
        let text = String::from_utf8_lossy(&out);
        for (i, &t) in tools.iter().enumerate() {
            if blocked.contains(&POOL[t]) {
                let secret = format!("SECRET_{i}");
                prop_assert!(!text.contains(&secret), "arguments of blocked {} leaked", POOL[t]);
            }
        }
        // Assembled names per index must never be a blocked one.
        let mut assembled: Vec<(u64, String)> = Vec::new();
        for v in data_values(&out) {
            for c in v["choices"].as_array().into_iter().flatten() {
                for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                    let i = tc["index"].as_u64().unwrap_or(0);
                    let part = tc["function"]["name"].as_str().unwrap_or_default();
                    match assembled.iter_mut().find(|(j, _)| *j == i) {
                        Some((_, n)) => n.push_str(part),
                        None => assembled.push((i, part.to_owned())),
                    }
                }
            }
        }
        for (_, n) in assembled {
            prop_assert!(!blocked.contains(&n.as_str()), "blocked call {n} assembled");
        }
    }

    #[test]
    fn responses_never_leak_a_blocked_call(
        block in any::<bool>(),
        ending in 0u8..3,
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let blocked: Vec<&'static str> = if block { vec!["mcp__everything__get_sum"] } else { vec![] };
        let input = with_line_end(&super::responses::tests::function_stream("mcp__everything", "get_sum"), ending);
        let out = run_split(Dialect::OpenAiResponses, &blocked, &input, &cuts);
        let text = String::from_utf8_lossy(&out);
        prop_assert_eq!(text.contains("SECRET"), !block);
        for v in data_values(&out) {
            for n in called_names(&v) {
                prop_assert!(!blocked.contains(&n.as_str()), "blocked call {n} passed");
            }
            if v["type"] == "response.completed" {
                for item in v["response"]["output"].as_array().into_iter().flatten() {
                    prop_assert!(!(block && item["type"] == "function_call"));
                }
            }
        }
    }

    #[test]
    fn corrupted_streams_never_panic(
        dialect in 0u8..3,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..16),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let (dialect, mut input) = match dialect {
            0 => (Dialect::Anthropic, super::anthropic::tests::stream(&["mcp__fs__delete", "mcp__fs__read"])),
            1 => (Dialect::OpenAiChat, super::chat::tests::chunks(&[
                r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"mcp__fs__delete","arguments":""}}]},"finish_reason":null}"#,
                r#"{"index":0,"delta":{},"finish_reason":"tool_calls"}"#,
            ])),
            _ => (Dialect::OpenAiResponses, super::responses::tests::function_stream("mcp__fs", "delete")),
        };
        for (at, byte) in flips {
            let len = input.len();
            input[at % len] = byte;
        }
        // Any outcome but a panic is acceptable for garbage; run it at every chunking.
        let _ = run_split(dialect, &["mcp__fs__delete"], &input, &cuts);
    }
}
