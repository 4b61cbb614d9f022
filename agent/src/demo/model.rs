//! The demo's model: a fake Anthropic Messages API on loopback.
//!
//! Whatever it is asked, it answers like a model steered into misuse would: a text saying which
//! tools it was offered, then calls of the allowed tool and of the denied one — the denied one
//! even when it was not offered, as an injected prompt would make a real model do. Only what
//! the LLM proxy lets through reaches the agent.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::{ALLOWED_TOOL, DENIED_TOOL, mcp_name};

/// The largest request body the fake model reads.
const MAX_BODY: usize = 1 << 20;

/// Starts the model on an ephemeral loopback port; it serves until the runtime ends.
pub(super) async fn start() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind the demo model to a loopback port")?;
    let addr = listener.local_addr().context("the demo model's address")?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let served = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(answer))
                    .await;
                if let Err(error) = served {
                    tracing::debug!(%error, "demo model connection ended");
                }
            });
        }
    });
    Ok(addr)
}

/// One Messages API answer.
async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let offered = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => offered_tools(&body.to_bytes()),
        Err(_) => Vec::new(),
    };
    let message = json!({
        "id": "msg_demo",
        "type": "message",
        "role": "assistant",
        "model": "toolwall-demo",
        "content": [
            {"type": "text", "text": format!("offered tools: {}", offered.join(", "))},
            {
                "type": "tool_use", "id": "toolu_demo_1", "name": mcp_name(ALLOWED_TOOL),
                "input": {"message": "hello from the model"},
            },
            {
                "type": "tool_use", "id": "toolu_demo_2", "name": mcp_name(DENIED_TOOL),
                "input": {"path": "/home"},
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": null,
        "usage": {"input_tokens": 12, "output_tokens": 34},
    });
    let mut response = Response::new(Full::new(Bytes::from(message.to_string())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// The names of the tools a Messages request offers the model.
fn offered_tools(body: &[u8]) -> Vec<String> {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| tool["name"].as_str().map(str::to_owned))
        .collect()
}
