use serde_json::{Value, json};

/// Per choice: content, (tool name, arguments) in index order, finish reason.
type Assembled = Vec<(String, Vec<(String, String)>, Option<String>)>;
/// A case's expectation: content, calls, finish reason.
type Want = Vec<(
    &'static str,
    Vec<(&'static str, &'static str)>,
    &'static str,
)>;
/// Calls by tool index while assembling.
type Slots = Vec<(String, Vec<(u64, String, String)>, Option<String>)>;

use crate::decision::Action;
use crate::llm::Dialect;
use crate::llm::testing::{assert_split_invariant, data_values, run, run_chunks};

mod calls;
mod sdk;
mod table;

const HEAD: &str =
    r#""id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o""#;

/// One chunk per `choices` JSON.
pub(crate) fn chunks(choices: &[&str]) -> Vec<u8> {
    let mut out = String::new();
    for c in choices {
        out.push_str(&format!("data: {{{HEAD},\"choices\":[{c}]}}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

fn first(name: &str, index: u64, choice: u64) -> String {
    format!(
        r#"{{"index":{choice},"delta":{{"tool_calls":[{{"index":{index},"id":"call_{index}","type":"function","function":{{"name":"{name}","arguments":""}}}}]}},"finish_reason":null}}"#
    )
}

fn args(index: u64, choice: u64, text: &str) -> String {
    format!(
        r#"{{"index":{choice},"delta":{{"tool_calls":[{{"index":{index},"function":{{"arguments":"{text}"}}}}]}},"finish_reason":null}}"#
    )
}

fn finish(choice: u64, reason: &str) -> String {
    format!(r#"{{"index":{choice},"delta":{{}},"finish_reason":"{reason}"}}"#)
}

const ROLE: &str =
    r#"{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}"#;

/// What an SDK would assemble per choice: (content, tool name → arguments, finish reason).
fn assemble(values: &[Value]) -> Assembled {
    let mut out: Slots = Vec::new();
    for v in values {
        assert!(v.get("error").is_none(), "unexpected error chunk {v}");
        for c in v["choices"].as_array().expect("choices") {
            let ci = c["index"].as_u64().expect("index") as usize;
            while out.len() <= ci {
                out.push((String::new(), Vec::new(), None));
            }
            let slot = &mut out[ci];
            if let Some(t) = c["delta"]["content"].as_str() {
                slot.0.push_str(t);
            }
            for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let ti = tc["index"].as_u64().expect("tool index");
                let pos = match slot.1.iter().position(|t| t.0 == ti) {
                    Some(p) => p,
                    None => {
                        slot.1.push((ti, String::new(), String::new()));
                        slot.1.len() - 1
                    }
                };
                if let Some(n) = tc["function"]["name"].as_str() {
                    slot.1[pos].1.push_str(n);
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    slot.1[pos].2.push_str(a);
                }
            }
            if let Some(f) = c["finish_reason"].as_str() {
                slot.2 = Some(f.to_owned());
            }
        }
    }
    out.into_iter()
        .map(|(c, t, f)| (c, t.into_iter().map(|(_, n, a)| (n, a)).collect(), f))
        .collect()
}

/// The calls of each choice as the official SDKs' stream accumulators build them from `values`
/// (what toolwall sent): (Python name, TypeScript name, arguments) by list position. Python
/// `openai` 2.x appends name fragments; TypeScript `openai` 6.x keeps the last non-empty one.
/// Both take `index` as a list position, and both helpers crash on an index past the end of
/// the list (Python `IndexError`, TypeScript reading `id` of `undefined`): asserted here.
fn sdk_calls(values: &[Value]) -> Vec<Vec<(String, String, String)>> {
    let mut out: Vec<Vec<(String, String, String)>> = Vec::new();
    for v in values {
        assert!(v.get("error").is_none(), "unexpected error chunk {v}");
        for c in v["choices"].as_array().into_iter().flatten() {
            let ci = c["index"].as_u64().expect("index") as usize;
            while out.len() <= ci {
                out.push(Vec::new());
            }
            let calls = &mut out[ci];
            for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let ti = tc["index"].as_u64().expect("tool index") as usize;
                assert!(
                    ti <= calls.len(),
                    "index {ti} past the end of {} calls: the SDK helpers crash",
                    calls.len()
                );
                if ti == calls.len() {
                    calls.push(Default::default());
                }
                let call = &mut calls[ti];
                if let Some(n) = tc["function"]["name"].as_str() {
                    call.0.push_str(n);
                    if !n.is_empty() {
                        call.1 = n.to_owned();
                    }
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    call.2.push_str(a);
                }
            }
        }
    }
    out
}

/// Asserts that no SDK view of `out` calls one of `blocked`, and that it never ends in an error.
fn assert_no_blocked_call(out: &[u8], blocked: &[&str]) -> Vec<Vec<(String, String, String)>> {
    let calls = sdk_calls(&data_values(out));
    for (py, ts, _) in calls.iter().flatten() {
        assert!(!blocked.contains(&py.as_str()), "Python builds {py}");
        assert!(!blocked.contains(&ts.as_str()), "TypeScript builds {ts}");
    }
    calls
}

fn entry(index: u64, id: Option<&str>, name: Option<&str>, args: Option<&str>) -> String {
    let id = id.map_or(String::new(), |i| {
        format!(r#""id":"{i}","type":"function","#)
    });
    let mut f = Vec::new();
    if let Some(n) = name {
        f.push(format!(r#""name":"{n}""#));
    }
    if let Some(a) = args {
        f.push(format!(r#""arguments":"{a}""#));
    }
    format!(
        r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{index},{id}"function":{{{}}}}}]}},"finish_reason":null}}"#,
        f.join(",")
    )
}
