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
use tokio::sync::{mpsc, oneshot};

use super::{LlmProxy, LlmProxySettings};
use crate::events::{Event, EventSink};
use crate::llm::anthropic::tests::stream as anthropic_stream;
use crate::llm::testing::{data_values, gate};

/// What the fake upstream does on its one connection.
enum Step {
    Send(Vec<u8>),
    /// Wait until the test says go.
    Wait(oneshot::Receiver<()>),
}

/// Serves one request; returns the upstream address and the request head it received.
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
        let head = String::from_utf8_lossy(&req[..head_end]).to_string();
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
        let _ = head_tx.send(head);
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
) -> (
    SocketAddr,
    mpsc::UnboundedReceiver<Event>,
    oneshot::Sender<()>,
) {
    let settings = LlmProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        anthropic_upstream: format!("http://{upstream}"),
        openai_upstream: format!("http://{upstream}"),
        session_id: "s1".into(),
        ..LlmProxySettings::default()
    };
    let (sink, rx) = EventSink::channel();
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

fn post(addr: SocketAddr, path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header("x-api-key", "sk-test")
        .header("anthropic-version", "2023-06-01")
        .header("accept-encoding", "gzip, br")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request")
}

fn intercepted(rx: &mut mpsc::UnboundedReceiver<Event>) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if let Event::McpToolCallIntercepted(e) = ev {
            out.push((e.tool_name, e.action.as_str().to_owned(), e.session_id));
        }
    }
    out
}

#[tokio::test]
async fn streamed_anthropic_blocking_end_to_end() {
    let stream = anthropic_stream(&["mcp__fs__read", "mcp__fs__delete"]);
    let mut steps = vec![Step::Send(sse_head(""))];
    for piece in stream.chunks(37) {
        steps.push(Step::Send(chunk(piece)));
    }
    steps.push(Step::Send(b"0\r\n\r\n".to_vec()));
    let (upstream, head) = fake_upstream(steps).await;
    let (proxy, mut events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;

    let resp = client()
        .request(post(proxy, "/v1/messages?beta=true", r#"{"stream":true}"#))
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(
        !text.contains("SECRET_2"),
        "blocked arguments reached the client"
    );
    assert!(text.contains("SECRET_1"), "allowed arguments missing");
    assert!(text.contains("[toolwall] Tool 'mcp__fs__delete' blocked by policy"));
    // 17 events, the blocked block's 5 replaced by 3.
    assert_eq!(data_values(&body).len(), 15);

    let head = head.await.expect("upstream saw the request");
    assert!(
        head.starts_with("POST /v1/messages?beta=true HTTP/1.1"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("accept-encoding: identity"),
        "{head}"
    );
    assert!(head.contains("sk-test"), "auth header must pass: {head}");

    let got = intercepted(&mut events);
    assert!(
        got.contains(&("mcp__fs__delete".into(), "block".into(), "s1".into())),
        "{got:?}"
    );
    assert!(
        got.contains(&("mcp__fs__read".into(), "allow".into(), "s1".into())),
        "{got:?}"
    );
}

#[tokio::test]
async fn streaming_is_not_buffered() {
    let stream = anthropic_stream(&[]);
    let first_end = memchr::memmem::find(&stream, b"\n\n").expect("an event") + 2;
    let (go_tx, go_rx) = oneshot::channel();
    let steps = vec![
        Step::Send(sse_head("")),
        Step::Send(chunk(&stream[..first_end])),
        Step::Wait(go_rx),
        Step::Send(chunk(&stream[first_end..])),
        Step::Send(b"0\r\n\r\n".to_vec()),
    ];
    let (upstream, _head) = fake_upstream(steps).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &[]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let mut body = resp.into_body();
    // The first event must arrive while upstream is still holding back the rest.
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first event arrived before upstream finished")
        .expect("a frame")
        .expect("ok frame");
    let first = frame.into_data().expect("data");
    assert_eq!(&first[..], &stream[..first_end]);
    go_tx.send(()).expect("upstream waiting");
    let rest = body.collect().await.expect("rest").to_bytes();
    let mut all = first.to_vec();
    all.extend_from_slice(&rest);
    assert_eq!(all, stream, "nothing blocked: byte-identical");
}

#[tokio::test]
async fn gzip_from_upstream_is_decoded_and_inspected() {
    let stream = anthropic_stream(&["mcp__fs__delete"]);
    let mut gz = Vec::new();
    async_compression::tokio::bufread::GzipEncoder::new(&stream[..])
        .read_to_end(&mut gz)
        .await
        .expect("gzip");
    let mut steps = vec![Step::Send(sse_head("content-encoding: gzip\r\n"))];
    for piece in gz.chunks(50) {
        steps.push(Step::Send(chunk(piece)));
    }
    steps.push(Step::Send(b"0\r\n\r\n".to_vec()));
    let (upstream, _head) = fake_upstream(steps).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    assert!(resp.headers().get("content-encoding").is_none());
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(!text.contains("SECRET_1"));
    assert!(text.contains("blocked by policy"));
    let stop = data_values(&body)
        .into_iter()
        .find(|v| v["type"] == "message_delta")
        .expect("message_delta");
    assert_eq!(stop["delta"]["stop_reason"], "end_turn");
}

#[tokio::test]
async fn buffered_json_is_rewritten_with_its_length() {
    let body = r#"{"id":"msg_1","content":[{"type":"tool_use","id":"t","name":"mcp__fs__delete","input":{"SECRET":1}}],"stop_reason":"tool_use"}"#;
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (upstream, _head) = fake_upstream(vec![Step::Send(resp.into_bytes())]).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let len: usize = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("content-length");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body.len(), len);
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["content"][0]["type"], "text");
}

#[tokio::test]
async fn passthrough_error_status_and_websocket_refusal() {
    // Error status on an inspected route: passed through as is.
    let err = r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#;
    let resp = format!(
        "HTTP/1.1 529 Overloaded\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{err}",
        err.len()
    );
    let (upstream, _head) = fake_upstream(vec![Step::Send(resp.into_bytes())]).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &[]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    assert_eq!(resp.status().as_u16(), 529);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], err.as_bytes());

    // HEAD / goes through untouched.
    let (upstream, head) = fake_upstream(vec![Step::Send(
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
    )])
    .await;
    let (proxy, _events, _stop2) = start_proxy(upstream, &[]).await;
    let req = Request::head(format!("http://{proxy}/"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = client().request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        head.await
            .expect("forwarded")
            .starts_with("HEAD / HTTP/1.1")
    );

    // A WebSocket upgrade is refused without touching upstream.
    let req = Request::get(format!("http://{proxy}/v1/responses"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = client().request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::UPGRADE_REQUIRED);
}

#[tokio::test]
async fn upstream_drop_mid_stream_does_not_hang_or_panic() {
    let stream = anthropic_stream(&["mcp__fs__delete"]);
    // Cut inside the blocked block's arguments, without the chunked terminator.
    let cut = memchr::memmem::find(&stream, b"SECRET_1").expect("secret") - 5;
    let steps = vec![Step::Send(sse_head("")), Step::Send(chunk(&stream[..cut]))];
    let (upstream, _head) = fake_upstream(steps).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => got.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
                Err(_) => return false,
            }
        }
        true
    })
    .await
    .expect("the response ended");
    let _ = outcome;
    assert!(!String::from_utf8_lossy(&got).contains("SECRET"));
}

#[tokio::test]
async fn every_content_coding_is_decoded_before_inspection() {
    use async_compression::tokio::bufread::{BrotliEncoder, GzipEncoder, ZlibEncoder, ZstdEncoder};
    let body = r#"{"id":"msg_1","content":[{"type":"tool_use","id":"t","name":"mcp__fs__delete","input":{"SECRET":1}}],"stop_reason":"tool_use"}"#;
    for coding in ["gzip", "deflate", "br", "zstd"] {
        let mut enc = Vec::new();
        let src = body.as_bytes();
        match coding {
            "gzip" => GzipEncoder::new(src).read_to_end(&mut enc).await,
            "deflate" => ZlibEncoder::new(src).read_to_end(&mut enc).await,
            "br" => BrotliEncoder::new(src).read_to_end(&mut enc).await,
            _ => ZstdEncoder::new(src).read_to_end(&mut enc).await,
        }
        .expect("encode");
        let mut resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: {coding}\r\ncontent-length: {}\r\n\r\n",
            enc.len()
        )
        .into_bytes();
        resp.extend_from_slice(&enc);
        let (upstream, _head) = fake_upstream(vec![Step::Send(resp)]).await;
        let (proxy, _events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
        let resp = client()
            .request(post(proxy, "/v1/messages", "{}"))
            .await
            .expect("response");
        assert!(resp.headers().get("content-encoding").is_none(), "{coding}");
        let out = resp.into_body().collect().await.expect("body").to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&out).expect("identity JSON");
        assert_eq!(v["content"][0]["type"], "text", "{coding}");
        assert!(
            !String::from_utf8_lossy(&out).contains("SECRET"),
            "{coding}"
        );
    }
    // An encoding we cannot undo is refused, never passed uninspected.
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: compress\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (upstream, _head) = fake_upstream(vec![Step::Send(resp.into_bytes())]).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn block_event_recorded_mid_stream_and_client_disconnect_is_survived() {
    let stream = anthropic_stream(&["mcp__fs__delete"]);
    // Up to and including the blocked tool_use start, then upstream pauses.
    let start = memchr::memmem::find(&stream, b"\"tool_use\"").expect("tool_use");
    let cut = start + memchr::memmem::find(&stream[start..], b"\n\n").expect("end") + 2;
    let (go_tx, go_rx) = oneshot::channel();
    let steps = vec![
        Step::Send(sse_head("")),
        Step::Send(chunk(&stream[..cut])),
        Step::Wait(go_rx),
        Step::Send(chunk(&stream[cut..])),
        Step::Send(b"0\r\n\r\n".to_vec()),
    ];
    let (upstream, _head) = fake_upstream(steps).await;
    let (proxy, mut events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("blocked by policy") {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("replacement arrives while upstream is paused")
            .expect("frame")
            .expect("ok");
        got.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..]));
    }
    // The decision is in the store already, before the stream is over.
    let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("event emitted mid-stream")
        .expect("event");
    match ev {
        Event::McpToolCallIntercepted(e) => {
            assert_eq!(e.tool_name, "mcp__fs__delete");
            assert_eq!(e.input, None);
        }
        other => panic!("unexpected event {other:?}"),
    }
    // The client goes away; upstream then sends the rest into a closed response.
    drop(body);
    let _ = go_tx.send(());
    // The proxy keeps serving.
    let resp = client()
        .request(post(proxy, "/v1/models", ""))
        .await
        .expect("first proxy still answers");
    // Its upstream served its one connection: a 502, not a hang or a crash.
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
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

#[tokio::test]
async fn small_chunks_split_anywhere_are_inspected_and_allowed_bytes_stay_identical() {
    let mixed = anthropic_stream(&["mcp__fs__read", "mcp__fs__delete"]);
    let allowed = anthropic_stream(&["mcp__fs__read"]);
    for size in [1, 3, 7, 64] {
        let mut wire = sse_head("");
        wire.extend(chunked_every(&mixed, size));
        let (upstream, _) = fake_upstream(vec![Step::Send(wire)]).await;
        let (addr, mut rx, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
        let resp = client()
            .request(post(addr, "/v1/messages", "{}"))
            .await
            .expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("\"name\":\"mcp__fs__read\""), "size {size}");
        assert!(
            !text.contains("\"name\":\"mcp__fs__delete\""),
            "size {size}"
        );
        assert!(text.contains("blocked by policy"), "size {size}");
        assert!(
            intercepted(&mut rx)
                .iter()
                .any(|(t, a, _)| t == "mcp__fs__delete" && a == "block")
        );

        let mut wire = sse_head("");
        wire.extend(chunked_every(&allowed, size));
        let (upstream, _) = fake_upstream(vec![Step::Send(wire)]).await;
        let (addr, _rx, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
        let resp = client()
            .request(post(addr, "/v1/messages", "{}"))
            .await
            .expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(
            &body[..],
            &allowed[..],
            "size {size}: allowed bytes identical"
        );
    }
}

#[tokio::test]
async fn broken_chunk_framing_from_upstream_ends_the_stream_with_an_error() {
    let mut wire = sse_head("");
    wire.extend(chunk(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"));
    wire.extend_from_slice(b"zz\r\nevent: x\n\n\r\n");
    let (upstream, _) = fake_upstream(vec![Step::Send(wire)]).await;
    let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
    let resp = client()
        .request(post(addr, "/v1/messages", "{}"))
        .await
        .expect("response");
    let (got, broke) = read_until_break(resp.into_body()).await;
    assert!(broke, "the client sees the break, not a clean end");
    assert_eq!(got, b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
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

#[tokio::test]
async fn upstream_connections_are_reused_and_closed_idle_ones_replaced() {
    use std::sync::atomic::Ordering;
    let body = r#"{"id":"x","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn"}"#;
    for close_idle in [false, true] {
        let (upstream, accepted) = keep_alive_upstream(body, close_idle).await;
        let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
        for _ in 0..3 {
            let resp = client()
                .request(post(addr, "/v1/messages", "{\"m\":1}"))
                .await
                .expect("response");
            assert_eq!(resp.status(), StatusCode::OK);
            let got = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(got, body.as_bytes());
            // Let a closing upstream's FIN arrive before the next request.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let want = if close_idle { 3 } else { 1 };
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            want,
            "close_idle {close_idle}"
        );
    }
}

#[tokio::test]
async fn a_client_body_without_a_length_goes_upstream_chunked() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    let (seen_tx, seen_rx) = oneshot::channel::<Vec<u8>>();
    tokio::spawn(async move {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.ends_with(b"0\r\n\r\n") {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await;
        let _ = seen_tx.send(seen);
    });
    let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
    let pieces = futures_util::stream::iter(
        ["{\"a\":", "1}"]
            .map(|p| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(p)))),
    );
    let req = Request::post(format!("http://{addr}/v1/files"))
        .header("x-api-key", "k")
        .body(http_body_util::StreamBody::new(pieces))
        .expect("request");
    let streaming: Client<HttpConnector, _> = Client::builder(TokioExecutor::new()).build_http();
    let resp = streaming.request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = String::from_utf8(seen_rx.await.expect("upstream saw the request")).expect("text");
    assert!(
        seen.to_ascii_lowercase()
            .contains("transfer-encoding: chunked\r\n"),
        "{seen}"
    );
    assert!(
        seen.ends_with("\r\n\r\n5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n"),
        "{seen}"
    );
}

#[tokio::test]
async fn a_redirect_never_leaves_an_inspected_route() {
    for (path, status) in [
        ("/v1/messages", "307 Temporary Redirect"),
        ("/v1/chat/completions", "302 Found"),
        ("/v1/responses", "308 Permanent Redirect"),
    ] {
        let head =
            format!("HTTP/1.1 {status}\r\nlocation: /v1/messages-x\r\ncontent-length: 0\r\n\r\n");
        let (upstream, _) = fake_upstream(vec![Step::Send(head.into_bytes())]).await;
        let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
        let resp = client()
            .request(post(addr, path, "{}"))
            .await
            .expect("response");
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "{path}");
        assert!(resp.headers().get("location").is_none(), "{path}");
    }
    // An uninspected path passes its redirect on (nothing to inspect there).
    let head =
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: /v1/files/2\r\ncontent-length: 0\r\n\r\n";
    let (upstream, _) = fake_upstream(vec![Step::Send(head.as_bytes().to_vec())]).await;
    let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
    let resp = client()
        .request(post(addr, "/v1/files", "{}"))
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::TEMPORARY_REDIRECT);
}

#[tokio::test]
async fn a_client_that_never_finishes_its_request_head_is_disconnected() {
    let settings = LlmProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        header_read_timeout: Duration::from_millis(300),
        ..LlmProxySettings::default()
    };
    let (sink, _rx) = EventSink::channel();
    let proxy = LlmProxy::bind(settings, gate(&[]), sink)
        .await
        .expect("bind proxy");
    let addr = proxy.local_addr().expect("addr");
    tokio::spawn(proxy.run(std::future::pending()));
    let mut sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
    sock.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("partial head");
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(120), sock.read(&mut buf))
        .await
        .expect("the proxy answers or closes long before two minutes")
        .unwrap_or(0);
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test]
async fn a_client_that_sends_nothing_is_disconnected() {
    // Before the first byte hyper's head time-out does not run (an attack held 20,000 idle
    // connections and with them every descriptor of the daemon).
    let settings = LlmProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        header_read_timeout: Duration::from_millis(300),
        ..LlmProxySettings::default()
    };
    let (sink, _rx) = EventSink::channel();
    let proxy = LlmProxy::bind(settings, gate(&[]), sink)
        .await
        .expect("bind proxy");
    let addr = proxy.local_addr().expect("addr");
    tokio::spawn(proxy.run(std::future::pending()));
    let mut sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(120), sock.read(&mut buf))
        .await
        .expect("the proxy closes a silent connection long before two minutes")
        .unwrap_or(0);
    assert_eq!(n, 0, "{:?}", &buf[..n]);
}

#[tokio::test]
async fn a_second_content_encoding_or_one_named_by_connection_is_not_missed() {
    for extra in [
        "content-encoding: identity\r\ncontent-encoding: gzip\r\n",
        "content-encoding: gzip, br\r\n",
    ] {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra}content-length: 2\r\n\r\n{{}}"
        );
        let (upstream, _) = fake_upstream(vec![Step::Send(head.into_bytes())]).await;
        let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
        let resp = client()
            .request(post(addr, "/v1/messages", "{}"))
            .await
            .expect("response");
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "{extra}");
    }
    // A gzip body whose content-encoding a Connection header names is still decoded.
    let mut gz = Vec::new();
    async_compression::tokio::bufread::GzipEncoder::new(
        &br#"{"id":"m","type":"message","role":"assistant","content":[],"stop_reason":"end_turn"}"#
            [..],
    )
    .read_to_end(&mut gz)
    .await
    .expect("gzip");
    let mut wire = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: content-encoding\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n\r\n",
        gz.len()
    )
    .into_bytes();
    wire.extend_from_slice(&gz);
    let (upstream, _) = fake_upstream(vec![Step::Send(wire)]).await;
    let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
    let resp = client()
        .request(post(addr, "/v1/messages", "{}"))
        .await
        .expect("response");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(body.starts_with(b"{\"id\":\"m\""), "{body:?}");
}

#[tokio::test]
async fn connect_trace_and_bodies_on_get_are_not_forwarded() {
    let (upstream, accepted) = keep_alive_upstream("{}", false).await;
    let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
    for method in ["TRACE", "CONNECT"] {
        let mut sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = if method == "CONNECT" {
            "CONNECT 127.0.0.1:1 HTTP/1.1\r\nhost: 127.0.0.1:1\r\n\r\n".to_owned()
        } else {
            format!("{method} /v1/messages HTTP/1.1\r\nhost: x\r\n\r\n")
        };
        sock.write_all(req.as_bytes()).await.expect("write");
        let mut buf = [0u8; 64];
        let n = sock.read(&mut buf).await.unwrap_or(0);
        let answer = String::from_utf8_lossy(&buf[..n]);
        assert!(!answer.starts_with("HTTP/1.1 200"), "{method}: {answer}");
    }
    let mut sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
    sock.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 64];
    let n = sock.read(&mut buf).await.unwrap_or(0);
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 502"));
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing reached upstream"
    );
}

#[tokio::test]
async fn an_early_answer_to_a_large_request_reaches_the_client() {
    // The upstream answers 413 at once and never reads the body (which outgrows the socket
    // buffers): the answer must reach the client, not a 502, and nothing may hang.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while memchr::memmem::find(&seen, b"\r\n\r\n").is_none() {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let body = r#"{"type":"error","error":{"type":"request_too_large","message":"too large"}}"#;
        let _ = sock
            .write_all(
                format!(
                    "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
    let big = "x".repeat(16 << 20);
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client().request(post(addr, "/v1/messages", &big)),
    )
    .await
    .expect("no hang")
    .expect("response");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn batch_results_are_relayed_behind_the_backstop() {
    // Issue 12, class 8: message batch results (JSON lines of messages) were never inspected.
    let line = |name: &str| {
        format!(
            "{{\"custom_id\":\"r\",\"result\":{{\"type\":\"succeeded\",\"message\":{{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"{name}\",\"input\":{{}}}}],\"stop_reason\":\"tool_use\"}}}}}}\n"
        )
    };
    let allowed = format!("{}{}", line("mcp__fs__read"), line("mcp__fs__list"));
    let denied = format!("{}{}", line("mcp__fs__read"), line("mcp__fs__delete"));
    for (body, blocked) in [(allowed, false), (denied, true)] {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/binary\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let (upstream, _) = fake_upstream(vec![Step::Send(
            [head.as_bytes(), body.as_bytes()].concat(),
        )])
        .await;
        let (addr, mut rx, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
        let req = Request::get(format!("http://{addr}/v1/messages/batches/b1/results"))
            .header("x-api-key", "k")
            .header("anthropic-version", "2023-06-01")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = client().request(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK);
        let (got, broke) = read_until_break(resp.into_body()).await;
        let got = String::from_utf8_lossy(&got).into_owned();
        if blocked {
            assert!(broke, "the response is cut");
            assert!(!got.contains("mcp__fs__delete"), "{got}");
            assert!(
                intercepted(&mut rx)
                    .iter()
                    .any(|(t, a, _)| t == "mcp__fs__delete" && a == "block")
            );
        } else {
            assert!(!broke);
            assert_eq!(got, body, "allowed lines pass byte for byte");
        }
    }
}

#[tokio::test]
async fn a_server_keep_alive_timeout_shorter_than_our_margin_is_never_reused() {
    use std::sync::atomic::Ordering;
    let body =
        r#"{"id":"x","type":"message","role":"assistant","content":[],"stop_reason":"end_turn"}"#;
    for (header, want) in [
        ("keep-alive: timeout=1, max=100\r\n", 3),
        ("keep-alive: timeout=30\r\n", 1),
    ] {
        let (upstream, accepted) = keep_alive_upstream_with(body, false, header).await;
        let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
        for _ in 0..3 {
            let resp = client()
                .request(post(addr, "/v1/messages", "{}"))
                .await
                .expect("response");
            assert_eq!(resp.status(), StatusCode::OK);
            resp.into_body().collect().await.expect("body");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), want, "{header}");
    }
}
