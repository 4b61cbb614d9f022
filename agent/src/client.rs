//! A client of the daemon's local API over its Unix socket (used by `toolwall exec`, the
//! `toolwall mcp` views, and shims that report to a running daemon).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// The daemon, as reached through its socket.
#[derive(Clone, Debug)]
pub(crate) struct ApiClient {
    socket: PathBuf,
}

/// What to tell a user when no daemon answers.
pub(crate) fn no_daemon_hint(socket: &Path) -> String {
    format!(
        "no toolwall daemon is listening on {} — start one with `toolwall run` (or `cargo xtask run`) as root, \
         or point at another with `--config` (api.socket)",
        socket.display()
    )
}

impl ApiClient {
    /// A client for the daemon on `socket`; fails with a clear message when none answers.
    pub(crate) async fn connect(socket: &Path) -> anyhow::Result<Self> {
        UnixStream::connect(socket)
            .await
            .with_context(|| no_daemon_hint(socket))?;
        Ok(ApiClient {
            socket: socket.to_path_buf(),
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .with_context(|| no_daemon_hint(&self.socket))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake with the daemon")?;
        tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(%error, "API client connection ended");
            }
        });
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "toolwall")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .context("build API request")?;
        sender
            .send_request(req)
            .await
            .with_context(|| format!("API request {path}"))
    }

    /// A request whose whole response body is returned; a non-2xx status is an error carrying
    /// the daemon's message.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> anyhow::Result<Bytes> {
        let resp = self.send(method, path, body.into()).await?;
        Self::whole(resp).await
    }

    /// `GET path` of a paged route: the page, the path of the next one (its
    /// `Link: <...>; rel="next"`) if there is more, and why the page holds only part of its
    /// span, if it does (`Toolwall-Partial`).
    pub(crate) async fn get_page<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> anyhow::Result<(T, Option<String>, Option<String>)> {
        let resp = self.send(Method::GET, path, Bytes::new()).await?;
        let partial = resp
            .headers()
            .get("toolwall-partial")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let next = resp
            .headers()
            .get(http::header::LINK)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_suffix(">; rel=\"next\""))
            .and_then(|v| v.strip_prefix('<'))
            .map(str::to_owned);
        let body = Self::whole(resp).await?;
        let page = serde_json::from_slice(&body)
            .with_context(|| format!("parse the daemon's answer to {path}"))?;
        Ok((page, next, partial))
    }

    /// The body of a response; a non-2xx status is an error carrying the daemon's message.
    async fn whole(resp: hyper::Response<hyper::body::Incoming>) -> anyhow::Result<Bytes> {
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .context("read API response")?
            .to_bytes();
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            bail!("the daemon answered {status}: {message}");
        }
        Ok(body)
    }

    /// `POST path` whose answer comes in pieces: the body, once the status said yes.
    pub(crate) async fn post_streaming(
        &self,
        path: &str,
        body: impl Into<Bytes>,
    ) -> anyhow::Result<hyper::body::Incoming> {
        let resp = self.send(Method::POST, path, body.into()).await?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.into_body().collect().await.map(|b| b.to_bytes());
            let message = body
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_default();
            bail!("the daemon answered {status}: {message}");
        }
        Ok(resp.into_body())
    }

    /// `GET path`, parsed as JSON.
    pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> anyhow::Result<T> {
        let body = self.call(Method::GET, path, Bytes::new()).await?;
        serde_json::from_slice(&body)
            .with_context(|| format!("parse the daemon's answer to {path}"))
    }

    /// Follows a server-sent-event stream, calling `on_data` with each event's `data` (a
    /// `lagged` notice is reported on stderr: the follower missed that many).
    pub(crate) async fn follow(
        &self,
        path: &str,
        mut on_data: impl FnMut(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let resp = self.send(Method::GET, path, Bytes::new()).await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "the daemon answered {} to {path}",
            resp.status()
        );
        let mut body = resp.into_body();
        // A record is one event; 64 MiB bounds what a broken stream can make us hold.
        let mut events = crate::sse::message::SseDecoder::with_limit(64 << 20);
        while let Some(frame) = body.frame().await {
            let frame = frame.context("read the live stream")?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            events.feed(data);
            while let Some(event) = events.next_event() {
                let payload = String::from_utf8_lossy(&event.data);
                match event.event.as_deref() {
                    Some("lagged") => eprintln!(
                        "toolwall: the live stream skipped {payload} records (this follower fell behind)"
                    ),
                    Some("error") => {
                        eprintln!("toolwall: the daemon could not send a record: {payload}")
                    }
                    _ if !payload.is_empty() => on_data(&payload)?,
                    _ => {}
                }
            }
            anyhow::ensure!(
                !events.overflowed(),
                "the live stream sent an event over 64 MiB"
            );
        }
        bail!("the daemon closed the live stream (it stopped?)")
    }
}
