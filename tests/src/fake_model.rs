//! A fake model API on loopback for the tests that run scripted agents: it answers each request
//! with tool calls, in the wire form of the dialect the request's path names.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    sync::Arc,
};

use serde_json::{Value, json};

/// One tool call a fake model asks for: the tool's name and its arguments.
pub type ToolCall = (String, Value);

/// Starts a fake model API answering every request (one per connection) with the calls
/// `calls(path, body)` chooses: an Anthropic Messages stream for `/v1/messages`, an OpenAI chat
/// completion (buffered) for anything else. Returns its base URL.
pub fn start(calls: impl Fn(&str, &Value) -> Vec<ToolCall> + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake model");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    let calls = Arc::new(calls);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let calls = calls.clone();
            std::thread::spawn(move || answer(stream, &*calls));
        }
    });
    url
}

fn answer(mut stream: TcpStream, calls: &dyn Fn(&str, &Value) -> Vec<ToolCall>) {
    let Some((path, body)) = read_request(&mut stream) else {
        return;
    };
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let asked = calls(&path, &request);
    let (content_type, body) = if path.ends_with("/messages") {
        ("text/event-stream", anthropic_stream(&asked))
    } else {
        ("application/json", openai_completion(&asked))
    };
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The request's path and body (by `content-length`); None when the peer went away first.
fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut request = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        let n = stream.read(&mut buf).ok().filter(|n| *n > 0)?;
        request.extend_from_slice(&buf[..n]);
        if let Some(p) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&request[..head_end]).to_lowercase();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while request.len() < head_end + len {
        let n = stream.read(&mut buf).ok().filter(|n| *n > 0)?;
        request.extend_from_slice(&buf[..n]);
    }
    Some((path, request.split_off(head_end)))
}

/// The text of a request's last message (`messages[-1].content`, a string), in either dialect.
pub fn last_message(request: &Value) -> &str {
    request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
}

/// A streamed Anthropic Messages answer asking for `calls`, each call's arguments in one
/// `input_json_delta`.
pub fn anthropic_stream(calls: &[ToolCall]) -> String {
    let mut events = vec![json!({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "model": "claude-sonnet-4-5", "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 5, "output_tokens": 1}}})];
    for (i, (name, input)) in calls.iter().enumerate() {
        events.push(
            json!({"type": "content_block_start", "index": i, "content_block": {
            "type": "tool_use", "id": format!("toolu_{i}"), "name": name, "input": {}}}),
        );
        events.push(json!({"type": "content_block_delta", "index": i, "delta": {
            "type": "input_json_delta", "partial_json": input.to_string()}}));
        events.push(json!({"type": "content_block_stop", "index": i}));
    }
    events.push(json!({"type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": null},
        "usage": {"output_tokens": 30}}));
    events.push(json!({"type": "message_stop"}));
    events
        .iter()
        .map(|data| {
            format!(
                "event: {}\ndata: {data}\n\n",
                data["type"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// A buffered OpenAI chat completion asking for `calls`.
pub fn openai_completion(calls: &[ToolCall]) -> String {
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, input))| {
            json!({"id": format!("call_{i}"), "type": "function",
                "function": {"name": name, "arguments": input.to_string()}})
        })
        .collect();
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": tool_calls}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 30, "total_tokens": 35}})
    .to_string()
}
