//! A hosted MCP call's result and the exemptions of the declared server its label names.

use std::sync::Arc;

use serde_json::{Value, json};

use super::super::tests::{AWS, run};
use crate::config::Config;
use crate::llm::Dialect;
use crate::llm::request::Recorded;
use crate::policy::Policy;
use crate::registry::Registry;

/// A provider-hosted MCP call's result is its server's tool's: the exemption of a declared
/// server's `read` (a tool the registry knows) does not pass an undeclared hosted server's
/// `read` (Anthropic `mcp_tool_use` with `server_name`, Responses `mcp_call` with
/// `server_label`), nor a label the request does not define at the declared server's URL; the
/// declared server's own hosted `read`, defined at its URL, is exempt.
#[test]
fn a_hosted_mcp_result_is_exempt_only_as_its_own_servers_tool() {
    let config = Config::parse(
        "sandbox:\n  mcp:\n    servers:\n      - id: files\n        type: http\n        url: http://127.0.0.1:9/mcp\n    result_inspection:\n      exempt:\n        - server: files\n          tool: 'read*'\n",
        "test.yaml",
    )
    .expect("config");
    let registry = Arc::new(Registry::in_memory().expect("registry"));
    registry
        .register(
            "files",
            "http",
            "http://127.0.0.1:9/mcp",
            &[json!({"name": "read", "inputSchema": {"type": "object"}})],
        )
        .expect("register");
    let gate = Policy::new(&config, registry, &[]).expect("policy");
    hosted_results_are_their_servers(&gate);
}

fn hosted_results_are_their_servers(gate: &Policy) {
    const AT: &str = "http://127.0.0.1:9/mcp";
    // Each dialect's request: a hosted call of `name` on server `label` and its result, and
    // the hosted servers it defines, (label, URL).
    let anthropic = |label: &str, name: &str, defined: &[(&str, Option<&str>)]| {
        json!({
            "model": "claude", "max_tokens": 10,
            "mcp_servers": defined.iter().map(|(l, url)| json!({"type": "url", "name": l, "url": url, "tool_configuration": {"allowed_tools": ["read"]}})).collect::<Vec<_>>(),
            "messages": [
                {"role": "assistant", "content": [
                    {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": name, "server_name": label, "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "content": [{"type": "text", "text": AWS}]}
                ]}
            ]
        })
    };
    let responses = |label: &str, name: &str, defined: &[(&str, Option<&str>)]| {
        let tools: Vec<Value> = defined
            .iter()
            .map(|(l, url)| match url {
                Some(url) => json!({"type": "mcp", "server_label": l, "server_url": url, "allowed_tools": ["read"]}),
                None => json!({"type": "mcp", "server_label": l, "connector_id": "connector_files", "allowed_tools": ["read"]}),
            })
            .collect();
        json!({
            "model": "gpt",
            "tools": [{"type": "namespace", "name": "ns", "tools": tools}],
            "input": [
                {"type": "mcp_call", "id": "mcp_1", "name": name, "server_label": label, "arguments": "{}", "output": AWS}
            ]
        })
    };
    type Build<'a> = &'a dyn Fn(&str, &str, &[(&str, Option<&str>)]) -> Value;
    for (dialect, request) in [
        (Dialect::Anthropic, &anthropic as Build<'_>),
        (Dialect::OpenAiResponses, &responses),
    ] {
        let here = [("files", Some(AT))];
        for (label, name, defined, why) in [
            ("elsewhere", "read", &here[..], "another server"),
            (
                "files__read_x",
                "y",
                &here[..],
                "a label holding `__` that reads as files' read_x__y",
            ),
            (
                "files",
                "read",
                &[][..],
                "a label the request does not define",
            ),
            (
                "files",
                "read",
                &[("files", Some("http://127.0.0.1:10/mcp"))][..],
                "a label at another URL",
            ),
            (
                "files",
                "read",
                &[("files", Some("https://127.0.0.1:9/mcp"))][..],
                "a label at another scheme",
            ),
            (
                "files",
                "read",
                &[("files", None)][..],
                "a label with no URL (a connector)",
            ),
            (
                "files",
                "read",
                &[("files", Some("http://127.0.0.1:65545/mcp"))][..],
                "a port past 16 bits",
            ),
            (
                "files",
                "read",
                &[
                    ("files", Some(AT)),
                    ("files", Some("http://evil.example/mcp")),
                ][..],
                "a label at two URLs",
            ),
            (
                "FILES",
                "read",
                &[("FILES", Some(AT))][..],
                "a label in another case than the id",
            ),
        ] {
            let (body, _) = run(
                gate,
                dialect,
                &request(label, name, defined),
                &Recorded::default(),
            );
            assert!(body.is_some(), "{dialect:?}: {why} passed as files' read");
        }
        // The declared server at its URL, written as the same server's URL may be.
        for url in [AT, "HTTP://127.0.0.1:9/mcp/", "http://127.0.0.1:9/mcp"] {
            let (body, records) = run(
                gate,
                dialect,
                &request("files", "read", &[("files", Some(url))]),
                &Recorded::default(),
            );
            assert!(
                body.is_none() && records.is_empty(),
                "{dialect:?} at {url}: {body:?} {records:?}"
            );
        }
    }
    // A hosted result answering the agent's own call, and a Gemini response naming another
    // tool than its call's id did: no exemption.
    let crossed = json!({
        "model": "claude", "max_tokens": 10,
        "messages": [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "mcp__files__read", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "mcp_tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": AWS}]}
            ]}
        ]
    });
    let (body, _) = run(gate, Dialect::Anthropic, &crossed, &Recorded::default());
    assert!(
        body.is_some(),
        "a hosted result took a local call's exemption"
    );
    let gemini = json!({
        "contents": [
            {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "other", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "mcp__files__read", "response": {"text": AWS}}}]}
        ]
    });
    let (body, _) = run(gate, Dialect::Gemini, &gemini, &Recorded::default());
    assert!(
        body.is_some(),
        "a Gemini response took another tool's exemption"
    );
}
