use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::discovery::discover_tools;
use super::session::PROTOCOL_VERSION;
use super::transport::{parse_url, resolve_endpoint};
use super::*;

use std::convert::Infallible;

use http_body_util::combinators::BoxBody;
use hyper_util::rt::TokioIo;

type Body = BoxBody<Bytes, Infallible>;

/// The answer of a scripted server to one JSON-RPC message: three pages of tools.
fn answer(message: &Value) -> Option<Value> {
    let id = message.get("id")?.clone();
    let result = match message["method"].as_str()? {
        "initialize" => {
            json!({"protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}}, "serverInfo": {"name": "scripted", "version": "1"}})
        }
        "tools/list" => match message["params"]["cursor"].as_str() {
            None => json!({"tools": [{"name": "a"}, {"name": "b"}], "nextCursor": "p1"}),
            Some("p1") => json!({"tools": [], "nextCursor": "p2"}),
            Some("p2") => json!({"tools": [{"name": "c"}]}),
            Some(other) => {
                return Some(
                    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": format!("bad cursor {other}")}}),
                );
            }
        },
        _ => json!({}),
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap());
    r
}

/// A scripted Streamable HTTP server at `/mcp` (answers as SSE when `sse_replies`) that
/// insists on the session header after `initialize`, and a legacy SSE server at `/sse` +
/// `/messages`. Returns its base URL.
async fn scripted_server(sse_replies: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stream_tx: Arc<Mutex<Option<mpsc::Sender<Bytes>>>> = Arc::default();
    tokio::spawn(async move {
        loop {
            let (io, _) = listener.accept().await.unwrap();
            let stream_tx = stream_tx.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let stream_tx = stream_tx.clone();
                async move {
                    let path = req.uri().path().to_owned();
                    let method = req.method().clone();
                    let has_session = req.headers().get(SESSION_HEADER).is_some();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let response = match (method, path.as_str()) {
                        (Method::POST, "/mcp") => {
                            if message["method"] != "initialize" && !has_session {
                                reply(StatusCode::BAD_REQUEST, "text/plain", "no session")
                            } else {
                                match answer(&message) {
                                    None => reply(StatusCode::ACCEPTED, "text/plain", ""),
                                    Some(a) => {
                                        let mut r = if sse_replies {
                                            reply(
                                                StatusCode::OK,
                                                "text/event-stream",
                                                format!("event: message\ndata: {a}\n\n"),
                                            )
                                        } else {
                                            reply(StatusCode::OK, "application/json", a.to_string())
                                        };
                                        r.headers_mut()
                                            .insert(SESSION_HEADER, HeaderValue::from_static("s1"));
                                        r
                                    }
                                }
                            }
                        }
                        (Method::GET, "/sse") => {
                            let (tx, rx) = mpsc::channel::<Bytes>(16);
                            tx.send(Bytes::from_static(
                                b"event: endpoint\ndata: /messages?sid=1\n\n",
                            ))
                            .await
                            .unwrap();
                            *stream_tx.lock().unwrap() = Some(tx);
                            let body = http_body_util::StreamBody::new(futures_stream(rx));
                            let mut r = Response::new(body.boxed());
                            r.headers_mut().insert(
                                CONTENT_TYPE,
                                HeaderValue::from_static("text/event-stream"),
                            );
                            r
                        }
                        (Method::POST, "/messages") => {
                            if let Some(a) = answer(&message) {
                                let tx = stream_tx.lock().unwrap().clone().unwrap();
                                tx.send(Bytes::from(format!("event: message\ndata: {a}\n\n")))
                                    .await
                                    .unwrap();
                            }
                            reply(StatusCode::ACCEPTED, "text/plain", "Accepted")
                        }
                        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found"),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(io), service),
            );
        }
    });
    format!("http://{addr}")
}

/// A receiver as a body stream, without pulling in a streams crate.
fn futures_stream(
    rx: mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Result<hyper::body::Frame<Bytes>, Infallible>> {
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok(hyper::body::Frame::data(b)), rx))
    })
}

#[tokio::test]
async fn discovers_every_page_over_each_transport() {
    let names = |tools: Vec<Value>| -> Vec<String> {
        tools
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let timeout = Duration::from_secs(10);
    for sse_replies in [false, true] {
        let base = scripted_server(sse_replies).await;
        let url = format!("{base}/mcp");
        for transport in [Transport::StreamableHttp, Transport::Auto] {
            let tools = discover_tools(&url, transport, timeout).await.unwrap();
            assert_eq!(names(tools), ["a", "b", "c"], "{url} {transport:?}");
        }
        let sse = format!("{base}/sse");
        let found = discover(&sse, Transport::Auto, HeaderMap::new(), timeout)
            .await
            .unwrap();
        assert_eq!(found.transport, Transport::Sse);
        assert_eq!(names(found.tools), ["a", "b", "c"]);
    }
}

#[tokio::test]
async fn wrong_transport_is_reported_with_the_step() {
    let base = scripted_server(false).await;
    let err = discover_tools(
        &format!("{base}/nowhere"),
        Transport::Sse,
        Duration::from_secs(5),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("/nowhere") && err.contains("opening the SSE stream") && err.contains("404"),
        "{err}"
    );
}

#[test]
fn endpoint_resolution_stays_on_origin() {
    let base: Uri = "http://127.0.0.1:3001/sse".parse().unwrap();
    assert_eq!(
        resolve_endpoint(&base, "/message?sessionId=abc")
            .unwrap()
            .to_string(),
        "http://127.0.0.1:3001/message?sessionId=abc"
    );
    assert_eq!(
        resolve_endpoint(&base, "http://127.0.0.1:3001/m?x=1")
            .unwrap()
            .to_string(),
        "http://127.0.0.1:3001/m?x=1"
    );
    assert_eq!(
        resolve_endpoint(&"http://h/a/sse".parse().unwrap(), "message")
            .unwrap()
            .to_string(),
        "http://h/a/message"
    );
    assert!(resolve_endpoint(&base, "http://evil.example/message").is_err());
}

#[test]
fn urls_are_checked() {
    assert!(parse_url("ftp://x/").is_err());
    assert!(parse_url("https://x/").is_ok());
    assert!(parse_url("/mcp").is_err());
    assert!(parse_url("http://127.0.0.1:1/mcp").is_ok());
}

#[tokio::test]
async fn unreachable_server_is_named() {
    // Port 1 on loopback: nothing listens there.
    let err = discover_tools(
        "http://127.0.0.1:1/mcp",
        Transport::Auto,
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("http://127.0.0.1:1/mcp") && text.contains("cannot connect"),
        "{text}"
    );
}
