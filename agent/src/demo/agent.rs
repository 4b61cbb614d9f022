//! The demo's scripted agent, run by the stage under `toolwall exec`.
//!
//! It does what a misled agent would, once at each layer, and prints one JSON report of what
//! each attempt got back: it asks the model (through `ANTHROPIC_BASE_URL`, which `exec` points
//! at the LLM proxy) offering both tools; it runs the MCP server through `toolwall shim`, lists
//! its tools and calls both — the denied one directly, as code that never asked the model would;
//! and it connects straight to the network server the policy denies.

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use super::{ALLOWED_TOOL, DENIED_TOOL, SERVER_ID, mcp_name};

/// How long any one step may take.
const STEP: Duration = Duration::from_secs(20);
/// The largest answer the agent reads from the model or the server.
const MAX_ANSWER: usize = 1 << 20;

/// Arguments of the scripted agent.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The demo's configuration (for `toolwall shim`).
    #[arg(long)]
    config: PathBuf,
    /// The `toolwall` binary to run the shim and the server with.
    #[arg(long)]
    toolwall: PathBuf,
    /// The denied network server's address.
    #[arg(long)]
    net: std::net::SocketAddr,
}

/// Runs the three attempts and prints the report.
pub(super) fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
    let report = runtime.block_on(async {
        let llm = tokio::time::timeout(STEP, ask_model())
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer in {STEP:?}")));
        // Like a real agent, it runs the calls the model asked for, with the model's arguments.
        let echo = llm
            .as_ref()
            .ok()
            .and_then(|llm| llm["inputs"].get(mcp_name(ALLOWED_TOOL)).cloned());
        let mcp = tokio::time::timeout(STEP, through_shim(&args, echo))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer in {STEP:?}")));
        json!({
            "llm": outcome(llm),
            "mcp": outcome(mcp),
            "kernel": connect(args.net),
        })
    });
    println!("{report}");
    Ok(ExitCode::SUCCESS)
}

fn outcome(result: anyhow::Result<Value>) -> Value {
    result.unwrap_or_else(|error| json!({"error": format!("{error:#}")}))
}

/// One Messages API request offering both tools; what the agent was given back.
async fn ask_model() -> anyhow::Result<Value> {
    let base = std::env::var("ANTHROPIC_BASE_URL")
        .context("ANTHROPIC_BASE_URL is not set: the agent runs under `toolwall exec`")?;
    let uri: http::Uri = format!("{}/v1/messages", base.trim_end_matches('/'))
        .parse()
        .with_context(|| format!("ANTHROPIC_BASE_URL {base:?} is not a URL"))?;
    let authority = uri
        .authority()
        .context("ANTHROPIC_BASE_URL names no host")?
        .clone();
    let stream = tokio::net::TcpStream::connect(authority.as_str())
        .await
        .with_context(|| format!("connect to the LLM proxy at {authority}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake with the LLM proxy")?;
    tokio::spawn(conn);
    let tool = |name: &str, property: &str| {
        json!({
            "name": mcp_name(name),
            "description": format!("MCP tool {name} of server {SERVER_ID}"),
            "input_schema": {"type": "object", "properties": {property: {"type": "string"}}},
        })
    };
    let body = json!({
        "model": "toolwall-demo",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Say hello, then clean up my home directory."}],
        "tools": [tool(ALLOWED_TOOL, "message"), tool(DENIED_TOOL, "path")],
    });
    let request = hyper::Request::post(uri.path())
        .header(http::header::HOST, authority.as_str())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("x-api-key", "demo-key-not-a-secret")
        .header("anthropic-version", "2023-06-01")
        .body(Full::new(Bytes::from(body.to_string())))
        .context("build the model request")?;
    let response = sender
        .send_request(request)
        .await
        .context("send the model request")?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("read the model's answer: {e}"))?
        .to_bytes();
    if !status.is_success() {
        bail!(
            "the LLM proxy answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let message: Value = serde_json::from_slice(&body).context("the model's answer is not JSON")?;
    let blocks = message["content"].as_array().cloned().unwrap_or_default();
    let of_type = |kind: &str, field: &str| -> Vec<Value> {
        blocks
            .iter()
            .filter(|b| b["type"] == kind)
            .map(|b| b[field].clone())
            .collect()
    };
    let inputs: serde_json::Map<String, Value> = blocks
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .filter_map(|b| Some((b["name"].as_str()?.to_owned(), b["input"].clone())))
        .collect();
    Ok(json!({
        "tool_uses": of_type("tool_use", "name"),
        "texts": of_type("text", "text"),
        "inputs": inputs,
    }))
}

/// The server through `toolwall shim`: its listing, then a call of each tool — the allowed one
/// with the arguments the model gave (when it gave any), the denied one regardless.
async fn through_shim(args: &AgentArgs, echo: Option<Value>) -> anyhow::Result<Value> {
    let mut child = tokio::process::Command::new(&args.toolwall)
        .arg("shim")
        .arg("--config")
        .arg(&args.config)
        .args(["--server-id", SERVER_ID, "--"])
        .arg(&args.toolwall)
        .args(["demo", "mcp-server"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {} shim", args.toolwall.display()))?;
    let mut stdin = child.stdin.take().context("the shim's stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("the shim's stdout")?).lines();
    let mut next_id = 0;
    let mut ask = async |method: &str, params: Value| -> anyhow::Result<Value> {
        next_id += 1;
        let request = json!({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params});
        stdin.write_all(format!("{request}\n").as_bytes()).await?;
        while let Some(line) = lines.next_line().await? {
            if line.len() > MAX_ANSWER {
                bail!("an answer over {MAX_ANSWER} bytes");
            }
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if message["id"] == next_id {
                return Ok(message);
            }
        }
        bail!("the shim closed its output before answering {method}")
    };
    ask(
        "initialize",
        json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "toolwall-demo-agent", "version": env!("CARGO_PKG_VERSION")},
        }),
    )
    .await?;
    let listed = ask("tools/list", json!({})).await?;
    let call = |tool: &str, arguments: Value| json!({"name": tool, "arguments": arguments});
    let echo = echo.unwrap_or_else(|| json!({"message": "hello"}));
    let echo = ask("tools/call", call(ALLOWED_TOOL, echo)).await?;
    let delete = ask("tools/call", call(DENIED_TOOL, json!({"path": "/home"}))).await?;
    let names: Vec<Value> = listed["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["name"].clone())
        .collect();
    Ok(json!({"listed": names, "allowed": summary(&echo), "denied": summary(&delete)}))
}

/// A `tools/call` answer as `{"ok": text}` or `{"error": message}`.
fn summary(answer: &Value) -> Value {
    let result = &answer["result"];
    let text: Vec<&str> = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect();
    if let Some(message) = answer["error"]["message"].as_str() {
        json!({"error": message})
    } else if result["isError"] == true {
        json!({"error": text.join(" ")})
    } else {
        json!({"ok": text.join(" ")})
    }
}

/// A direct TCP connection to the denied network server.
fn connect(addr: std::net::SocketAddr) -> Value {
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(_) => json!({"connected": true}),
        Err(error) => json!({
            "connected": false,
            "refused_by_kernel": error.kind() == std::io::ErrorKind::PermissionDenied,
            "error": error.to_string(),
        }),
    }
}
