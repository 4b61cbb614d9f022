//! Content codings: every one decoded before inspection, none missed.

use super::*;

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
