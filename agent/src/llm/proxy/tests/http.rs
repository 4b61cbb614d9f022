//! HTTP edges: pass-through statuses, sessions, connection reuse, request bodies, redirects,
//! slow or silent clients, methods not forwarded, early answers, keep-alive time-outs.

use super::*;

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
    let req = Request::post(format!("http://{addr}/v1/embeddings"))
        .header("authorization", "Bearer k")
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
    // A route the owner relays uninspected (`proxy.pass_through`) passes its redirect on.
    let head =
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: /v1/files/2\r\ncontent-length: 0\r\n\r\n";
    let (upstream, _) = fake_upstream(vec![Step::Send(head.as_bytes().to_vec())]).await;
    let (addr, mut rx, _stop) = start_proxy_passing(
        &format!("http://{upstream}"),
        &[],
        EventSink::channel(),
        &["POST /v1/files"],
    )
    .await;
    let resp = client()
        .request(post(addr, "/v1/files", "{}"))
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::TEMPORARY_REDIRECT);
    let recorded = rx.try_recv().expect("the uninspected request is recorded");
    match recorded {
        Event::LlmRoute(e) => {
            assert_eq!(
                (e.route.as_str(), e.action),
                ("POST /v1/files", Action::Allow)
            );
            assert_eq!(e.provider, "openai");
        }
        other => panic!("unexpected event {other:?}"),
    }
}

#[tokio::test]
async fn a_route_toolwall_does_not_read_is_refused_recorded_and_never_sent() {
    let (upstream, seen) = fake_upstream(vec![Step::Send(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
    )])
    .await;
    let (addr, mut rx, _stop) = start_proxy(upstream, &[]).await;
    for (method, path) in [
        ("GET", "/v1/sessions/s/events/stream"),
        ("POST", "/v1/threads/t/runs"),
        ("GET", "/v1/messages/batches/b/results"),
        ("POST", "/v1beta/cachedContents"),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = client().request(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{path}");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("proxy.pass_through"), "{text}");
        match rx.try_recv().expect("recorded") {
            Event::LlmRoute(e) => {
                assert_eq!(e.action, Action::Block, "{path}");
                assert!(
                    e.route.starts_with(method) && !e.route.contains('?'),
                    "{}",
                    e.route
                );
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    // A Gemini key is refused on a route that exists for another vendor too.
    let req = Request::post(format!("http://{addr}/v1/messages"))
        .header("x-goog-api-key", "AIza-secret")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let resp = client().request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // Nothing reached the upstream.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), seen)
            .await
            .is_err(),
        "a refused request reached the upstream"
    );
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
    // Before the first byte hyper's head time-out does not run (20,000 idle connections would
    // hold every descriptor of the daemon).
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
        // A route whose request streams through (inspected routes read the body whole first).
        client().request(post(addr, "/v1/embeddings", &big)),
    )
    .await
    .expect("no hang")
    .expect("response");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
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

/// The body of the 502 a proxy answers a Messages request with.
async fn bad_gateway_body(proxy: SocketAddr) -> String {
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// When the upstream cannot be reached, the agent's SDK error says why — no DNS answer for the
/// provider's name, or a refused connection — not only "upstream request failed", whose cause
/// would be in the daemon's log alone.
#[tokio::test]
async fn an_unreachable_upstream_is_answered_with_its_cause() {
    // Nothing listens on a port just freed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let (proxy, _events, _stop) = start_proxy(closed, &[]).await;
    let body = bad_gateway_body(proxy).await;
    assert!(
        body.contains(&format!("cannot connect to {closed}")) && body.contains("refused"),
        "{body}"
    );

    // A name with no DNS answer (`.invalid` never resolves).
    let (proxy, _events, _stop) =
        start_proxy_to("http://toolwall-test.invalid", &[], EventSink::channel()).await;
    let body = bad_gateway_body(proxy).await;
    assert!(
        body.contains("cannot resolve toolwall-test.invalid"),
        "{body}"
    );
}

#[tokio::test]
async fn an_http2_preface_is_refused_at_once() {
    // The SDKs speak HTTP/1.1 to an `http://` base URL; an h2c connection would be held with
    // no time-out on its head, so it is answered and closed at once (head time-out 30 s).
    let (sink, _rx) = EventSink::channel();
    let settings = LlmProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..LlmProxySettings::default()
    };
    let proxy = LlmProxy::bind(settings, gate(&[]), sink)
        .await
        .expect("bind proxy");
    let addr = proxy.local_addr().expect("addr");
    tokio::spawn(proxy.run(std::future::pending()));
    let mut sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
    sock.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("preface");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut got))
        .await
        .expect("closed long before the head time-out")
        .ok();
    let answer = String::from_utf8_lossy(&got);
    assert!(
        got.is_empty() || answer.starts_with("HTTP/1.1 "),
        "{answer}"
    );
}

#[tokio::test]
async fn a_client_past_its_connection_cap_is_closed() {
    let (sink, _rx) = EventSink::channel();
    let settings = LlmProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        max_connections_per_client: 3,
        ..LlmProxySettings::default()
    };
    let proxy = LlmProxy::bind(settings, gate(&[]), sink)
        .await
        .expect("bind proxy");
    let addr = proxy.local_addr().expect("addr");
    tokio::spawn(proxy.run(std::future::pending()));
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    // This test process is one client: its fourth connection is closed unanswered.
    let mut fourth = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), fourth.read(&mut buf))
        .await
        .expect("closed at once")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // The three are still held (silent, within the 30 s head time-out).
    for sock in &open {
        let mut one = [0u8; 1];
        assert!(
            matches!(sock.try_read(&mut one), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        );
    }
    // One closes: room again.
    drop(open.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fifth = tokio::net::TcpStream::connect(addr).await.expect("connect");
    fifth
        .write_all(b"GET /v1/messages HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n")
        .await
        .expect("write");
    let n = tokio::time::timeout(Duration::from_secs(5), fifth.read(&mut buf))
        .await
        .expect("answered")
        .unwrap_or(0);
    // Answered by the proxy itself (WebSocket is refused with 426), so no upstream is needed.
    assert!(buf[..n].starts_with(b"HTTP/1.1 426"), "{:?}", &buf[..n]);
}
