//! The demo's MCP server: newline-delimited JSON-RPC on stdio, two tools.
//!
//! `echo` answers with its `message`; `delete_files` only says what it would have deleted (it
//! touches nothing), so a demo whose guard failed does no harm — the stage reports the failure.

use std::io::{BufRead, Read as _, Write};
use std::process::ExitCode;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::{ALLOWED_TOOL, DENIED_TOOL};

/// The longest request line the server reads; a longer one ends it (the shim in front of it
/// already refuses anything near this size).
const MAX_LINE: u64 = 1 << 20;

/// Serves stdin until it closes.
pub(super) fn run() -> anyhow::Result<ExitCode> {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut input = stdin.lock();
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut input)
            .take(MAX_LINE)
            .read_line(&mut line)
            .context("read a request from stdin")?;
        if n == 0 {
            return Ok(ExitCode::SUCCESS);
        }
        if !line.ends_with('\n') && n as u64 == MAX_LINE {
            anyhow::bail!("a request longer than {MAX_LINE} bytes");
        }
        let Ok(request) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        // Notifications (no id) need no answer.
        let Some(id) = request.get("id").cloned() else {
            continue;
        };
        let method = request["method"].as_str().unwrap_or_default();
        let response = match answer(method, &request["params"]) {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(message) => json!({
                "jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": message},
            }),
        };
        serde_json::to_writer(&mut stdout, &response).context("write a response")?;
        stdout.write_all(b"\n").context("write a response")?;
        stdout.flush().context("write a response")?;
    }
}

/// The result of one request, or an error message.
fn answer(method: &str, params: &Value) -> Result<Value, String> {
    match method {
        "initialize" => Ok(json!({
            "protocolVersion": params["protocolVersion"].as_str().unwrap_or("2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "toolwall-demo", "version": env!("CARGO_PKG_VERSION")},
        })),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": [
            {
                "name": ALLOWED_TOOL,
                "description": "Echoes a message back.",
                "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
            },
            {
                "name": DENIED_TOOL,
                "description": "Deletes the files under a path (in this demo it only says so).",
                "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        ]})),
        "tools/call" => {
            let arguments = &params["arguments"];
            let text = match params["name"].as_str() {
                Some(ALLOWED_TOOL) => arguments["message"].as_str().unwrap_or_default().to_owned(),
                Some(DENIED_TOOL) => format!(
                    "would have deleted everything under {}",
                    arguments["path"].as_str().unwrap_or("/")
                ),
                other => return Err(format!("Unknown tool: {}", other.unwrap_or_default())),
            };
            Ok(json!({"content": [{"type": "text", "text": text}]}))
        }
        other => Err(format!("Method not found: {other}")),
    }
}
