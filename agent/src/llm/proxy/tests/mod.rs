//! The proxy in process, against a fake upstream written with raw TCP so the test controls
//! exactly when each byte leaves.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::{LlmProxy, LlmProxySettings};
use crate::decision::Action;
use crate::events::{Event, EventSink};
use crate::llm::anthropic::tests::stream as anthropic_stream;
use crate::llm::testing::{data_values, gate};

mod encoding;
mod http;
mod inspection;

/// What the fake upstream does on its one connection.
enum Step {
    Send(Vec<u8>),
    /// Wait until the test says go.
    Wait(oneshot::Receiver<()>),
}

/// Serves one request; returns the upstream address and the request it received.
async fn fake_upstream(steps: Vec<Step>) -> (SocketAddr, oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (head_tx, head_rx) = oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            let Ok(n) = sock.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            req.extend_from_slice(&buf[..n]);
            if let Some(p) = memchr::memmem::find(&req, b"\r\n\r\n") {
                break p + 4;
            }
        };
        let head = String::from_utf8_lossy(&req[..head_end]).into_owned();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while req.len() < head_end + len {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => req.extend_from_slice(&buf[..n]),
            }
        }
        // The whole request as the upstream got it (head, then body).
        let _ = head_tx.send(String::from_utf8_lossy(&req).into_owned());
        for step in steps {
            match step {
                Step::Send(bytes) => {
                    if sock.write_all(&bytes).await.is_err() {
                        return;
                    }
                    let _ = sock.flush().await;
                }
                Step::Wait(rx) => {
                    let _ = rx.await;
                }
            }
        }
        let _ = sock.shutdown().await;
    });
    (addr, head_rx)
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

fn sse_head(extra: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n{extra}\r\n").into_bytes()
}

async fn start_proxy(
    upstream: SocketAddr,
    blocked: &[&'static str],
) -> (SocketAddr, crate::events::EventQueue, oneshot::Sender<()>) {
    start_proxy_with(upstream, blocked, EventSink::channel()).await
}

/// [`start_proxy`] recording into the given sink and queue.
async fn start_proxy_with(
    upstream: SocketAddr,
    blocked: &[&'static str],
    events: (EventSink, crate::events::EventQueue),
) -> (SocketAddr, crate::events::EventQueue, oneshot::Sender<()>) {
    start_proxy_to(&format!("http://{upstream}"), blocked, events).await
}

/// [`start_proxy_with`] whose providers are both at the base URL `upstream`.
async fn start_proxy_to(
    upstream: &str,
    blocked: &[&'static str],
    events: (EventSink, crate::events::EventQueue),
) -> (SocketAddr, crate::events::EventQueue, oneshot::Sender<()>) {
    start_proxy_passing(upstream, blocked, events, &[]).await
}

/// [`start_proxy_to`] with `proxy.pass_through` routes (`METHOD /path` of the openai provider).
async fn start_proxy_passing(
    upstream: &str,
    blocked: &[&'static str],
    (sink, rx): (EventSink, crate::events::EventQueue),
    pass_through: &[&str],
) -> (SocketAddr, crate::events::EventQueue, oneshot::Sender<()>) {
    let settings = LlmProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        anthropic_upstream: upstream.to_owned(),
        openai_upstream: upstream.to_owned(),
        gemini_upstream: upstream.to_owned(),
        session_id: "s1".into(),
        pass_through: pass_through
            .iter()
            .map(|r| {
                crate::config::PassThrough::parse(crate::config::Provider::Openai, r)
                    .expect("route")
            })
            .collect(),
        ..LlmProxySettings::default()
    };
    let proxy = LlmProxy::bind(settings, gate(blocked), sink)
        .await
        .expect("bind proxy");
    let addr = proxy.local_addr().expect("addr");
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    tokio::spawn(proxy.run(async {
        let _ = stop_rx.await;
    }));
    (addr, rx, stop_tx)
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A POST with the headers of the SDK of the path's provider (an Anthropic key on an OpenAI
/// route is refused).
fn post(addr: SocketAddr, path: &str, body: &str) -> Request<Full<Bytes>> {
    let request = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header("accept-encoding", "gzip, br");
    let request = if path.starts_with("/v1/messages") {
        request
            .header("x-api-key", "sk-test")
            .header("anthropic-version", "2023-06-01")
    } else {
        request.header("authorization", "Bearer sk-test")
    };
    request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request")
}

fn intercepted(rx: &mut crate::events::EventQueue) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if let Event::McpToolCallIntercepted(e) = ev {
            out.push((e.tool_name, e.action.as_str().to_owned(), e.session_id));
        }
    }
    out
}

/// A response body read until its end or its first error: the data, and whether it broke.
async fn read_until_break(mut body: hyper::body::Incoming) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => got.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

/// `bytes` chunked `size` bytes per HTTP chunk (an event split anywhere).
fn chunked_every(bytes: &[u8], size: usize) -> Vec<u8> {
    let mut out: Vec<u8> = bytes.chunks(size).flat_map(chunk).collect();
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// An upstream serving any number of requests per connection (keep-alive), each answered with
/// `body` by content-length; counts the connections it accepted. A `close_idle` upstream
/// closes each connection right after its first response (as a server whose idle time-out ran
/// out would).
async fn keep_alive_upstream(
    body: &'static str,
    close_idle: bool,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    keep_alive_upstream_with(body, close_idle, "").await
}

async fn keep_alive_upstream_with(
    body: &'static str,
    close_idle: bool,
    extra_headers: &'static str,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Some(end) = memchr::memmem::find(&seen, b"\r\n\r\n") else {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while seen.len() < end + 4 + len {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.drain(..end + 4 + len);
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra_headers}content-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if sock.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                    if close_idle {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}
