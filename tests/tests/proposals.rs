//! Every call a model proposes that is an MCP tool's is in the record, allowed or not, whether
//! or not any registry or configuration knows its server; a native tool's is not. Through the
//! real binary, for a streamed Anthropic answer and a buffered OpenAI one.

use std::io::{Read, Write};

use serde_json::{Value, json};
use toolwall_tests::{Daemon, fake_model};

/// What the record must say of a proposal: its `server_id/tool` and action, or `None` for a
/// native tool nobody records.
type Recorded = Option<(&'static str, &'static str)>;

/// What the fake model proposes, and what the record must say of each: (name, arguments,
/// what is recorded).
fn proposals() -> Vec<(&'static str, Value, Recorded)> {
    vec![
        // A declared server's tool, allowed, and one the deny rule refuses.
        (
            "mcp__everything__echo",
            json!({"message": "hi"}),
            Some(("everything/echo", "allow")),
        ),
        (
            "mcp__everything__get-sum",
            json!({"a": 1, "b": 2}),
            Some(("everything/get-sum", "block")),
        ),
        // A server nobody declared or registered: its tool all the same.
        (
            "mcp__github__delete_repo",
            json!({"repo": "x"}),
            Some(("github/delete_repo", "allow")),
        ),
        // A bare name an argument rule for any server names: asked (nobody answers), and let
        // through where the rule does not ask.
        (
            "transfer",
            json!({"amount": 9999}),
            Some(("/transfer", "block")),
        ),
        (
            "transfer",
            json!({"amount": 5}),
            Some(("/transfer", "allow")),
        ),
        // A native tool.
        ("read_file", json!({"path": "notes.txt"}), None),
    ]
}

/// POSTs `body` to the proxy at `path`; the answer's body.
fn post(proxy: &str, path: &str, body: &Value) -> String {
    let addr = proxy.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the proxy");
    let body = body.to_string();
    let key = if path == "/v1/messages" {
        "x-api-key: sk-ant-test\r\nanthropic-version: 2023-06-01"
    } else {
        "authorization: Bearer sk-test"
    };
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\ncontent-type: application/json\r\n{key}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let (status, body) = toolwall_tests::status_and_body(&answer);
    assert_eq!(status, 200, "{answer}");
    body
}

#[test]
fn every_proposed_mcp_call_is_recorded_allowed_or_not() {
    let llm = fake_model::start(|_, _| {
        proposals()
            .into_iter()
            .map(|(name, args, _)| (name.to_owned(), args))
            .collect()
    });
    let daemon = Daemon::start(&format!(
        r#"proxy:
  listen: 127.0.0.1:0
  providers:
    anthropic: {llm}
    openai: {llm}
sandbox:
  mcp:
    deny: ["^get-sum$"]
    servers:
      - id: everything
        type: stdio
        command: /bin/false
    argument_rules:
      - tool: transfer
        action: ask
        when:
          - pointer: /amount
            range: {{ min: 1000 }}
    approval:
      timeout_secs: 1
netmon:
  enabled: false
"#
    ));
    let proxy = daemon.proxy.clone().expect("the LLM proxy's URL");
    let ask = |dialect: &str| {
        json!({"model": "m", "max_tokens": 100, "stream": dialect == "anthropic",
        "messages": [{"role": "user", "content": "go"}]})
    };
    let streamed = post(&proxy, "/v1/messages", &ask("anthropic"));
    let buffered = post(&proxy, "/v1/chat/completions", &ask("openai"));
    // What reached the client: the native tool and the allowed calls, not the refused ones.
    for (dialect, answer) in [("anthropic", &streamed), ("openai", &buffered)] {
        for (name, args, expected) in proposals() {
            let reached = answer.contains(&format!("\"{name}\"")) && {
                let text = args.to_string().replace('"', "\\\"");
                answer.contains(&text) || answer.contains(&args.to_string())
            };
            let allowed = expected.is_none_or(|(_, action)| action == "allow");
            assert_eq!(reached, allowed, "{dialect}: {name} {args}: {answer}");
        }
    }

    std::thread::sleep(std::time::Duration::from_millis(2500)); // past the correlation window
    let records = daemon.json_lines(&["mcp", "calls", "--json"]);
    let mut seen: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            (
                r["intercept"]["layer"].as_str().unwrap_or("").to_owned(),
                format!(
                    "{}/{}",
                    r["server_id"].as_str().unwrap_or(""),
                    r["tool"].as_str().unwrap_or("")
                ),
                r["action"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    seen.sort();
    let mut want: Vec<(String, String, String)> = ["llm/anthropic", "llm/openai-chat"]
        .iter()
        .flat_map(|layer| {
            proposals().into_iter().filter_map(move |(_, _, expected)| {
                let (call, action) = expected?;
                Some((layer.to_string(), call.to_owned(), action.to_owned()))
            })
        })
        .collect();
    want.sort();
    assert_eq!(seen, want, "{records:#?}");
}
