//! `approval.webhook`: every question put to a person is also POSTed, as JSON, to a URL the
//! owner chose (a chat bridge, a pager). The receiver cannot answer in its reply — answers
//! come back through `toolwall approve|deny ID --digest D` or the API, where the caller is
//! known — so a webhook that is down costs a notification, never a decision (the call waits or
//! times out as without it). Each post has [`POST_TIMEOUT`]; one that fails is logged.
//!
//! The post carries the question as JSON (exact, as `GET /api/approvals` lists it), a `text`
//! line for a person (hidden characters escaped as every view escapes them, `hidden.rs`, so a
//! chat shows `read\u{2060}_file`, never `read_file`), and the commands that answer exactly
//! this question (its id and digest).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tokio::sync::mpsc;

use crate::approval::Question;
use crate::config::WebhookConfig;

/// Longest one post may take, connection included.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// Questions queued for the webhook; more are logged and not posted (`approval.rs`).
pub(super) const QUEUE: usize = 256;

/// Posts each question `rx` yields to `config.url` until the daemon stops.
pub(super) async fn run(
    config: WebhookConfig,
    mut rx: mpsc::Receiver<Question>,
) -> anyhow::Result<()> {
    let client = crate::mcp::client::http_client()
        .map_err(|e| anyhow::anyhow!("the approval webhook's HTTP client: {e}"))?;
    while let Some(question) = rx.recv().await {
        let id = question.id.clone();
        let digest = &question.digest;
        let body = json!({
            "type": "toolwall.approval",
            "text": format!("toolwall: a call waits for a person: {}", question.describe()),
            "approve": format!("toolwall approve {id} --digest {digest}"),
            "deny": format!("toolwall deny {id} --digest {digest}"),
            "question": question,
        });
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(&config.url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(
                header::USER_AGENT,
                concat!("toolwall/", env!("CARGO_PKG_VERSION")),
            );
        for (name, value) in &config.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = match request.body(Full::new(Bytes::from(body.to_string()))) {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(%id, %error, "approval webhook: cannot build the request");
                continue;
            }
        };
        let post = async {
            let response = client.request(request).await?;
            let status = response.status();
            // Read (and drop) the reply so the connection can be reused.
            let _ = response.into_body().collect().await;
            Ok::<_, hyper_util::client::legacy::Error>(status)
        };
        match tokio::time::timeout(POST_TIMEOUT, post).await {
            Ok(Ok(status)) if status.is_success() => {
                tracing::debug!(%id, %status, "approval webhook posted")
            }
            Ok(Ok(status)) => {
                tracing::warn!(%id, %status, url = %config.url, "approval webhook refused the question")
            }
            Ok(Err(error)) => {
                tracing::warn!(%id, %error, url = %config.url, "approval webhook unreachable")
            }
            Err(_) => {
                tracing::warn!(%id, url = %config.url, "approval webhook took over {} s", POST_TIMEOUT.as_secs())
            }
        }
    }
    Ok(())
}
