//! Requests toolwall does not inspect: relayed as they are on a `proxy.pass_through` route, or
//! refused for their route; each is recorded as an `llm_route` event.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::{Inner, ProxyBody, Upstream, full};
use crate::config::Provider;
use crate::decision::Action;
use crate::events::{Event, LlmRoute};
use crate::llm::relay::{Plain, Relay};
use crate::llm::upstream::OutBody;

/// Relays a request on a `proxy.pass_through` route and its answer as they are (the client's
/// own encodings included): the host owner accepted them uninspected.
pub(super) async fn relay_uninspected(
    inner: &Arc<Inner>,
    upstream: &Upstream,
    uri: &hyper::Uri,
    req: Request<Incoming>,
    request_id: &str,
) -> Response<ProxyBody> {
    let (mut parts, body) = req.into_parts();
    crate::edge::strip_hop_by_hop(&mut parts.headers);
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    match inner
        .upstreams
        .send(
            &upstream.origin,
            &parts.method,
            target,
            &parts.headers,
            OutBody::Stream(body),
        )
        .await
    {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            crate::edge::strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(
                parts,
                Relay::new(Plain(body)).counted(&inner.stats).boxed_unsync(),
            )
        }
        Err(e) => {
            tracing::warn!(%request_id, error = %e, "upstream request failed");
            full(
                StatusCode::BAD_GATEWAY,
                format!("toolwall: upstream request failed: {e}"),
            )
        }
    }
}

/// Most bytes of a path an `llm_route` event keeps (a request line may be far longer).
const MAX_RECORDED_PATH: usize = 1024;

/// `text` up to `max` bytes, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A request as the `llm_route` record names it, for the places that refuse it or relay it
/// uninspected. The query string is left out: it may carry a key.
pub(super) struct Seen<'a> {
    pub(super) inner: &'a Inner,
    pub(super) session: &'a str,
    pub(super) request_id: &'a str,
    pub(super) method: hyper::Method,
    pub(super) path_and_query: &'a str,
}

impl Seen<'_> {
    /// Records it (`llm_route`): relayed uninspected (`allow`) or refused (`block`), with why.
    pub(super) fn record(&self, provider: Option<Provider>, action: Action, reason: String) {
        let path = self
            .path_and_query
            .split_once('?')
            .map_or(self.path_and_query, |(p, _)| p);
        self.inner.sink.emit(Event::LlmRoute(LlmRoute {
            timestamp: chrono::Utc::now(),
            session_id: self.session.to_owned(),
            request_id: self.request_id.to_owned(),
            provider: provider.map_or("", Provider::as_str).to_owned(),
            route: format!("{} {}", self.method, cut(path, MAX_RECORDED_PATH)),
            action,
            reason,
        }));
    }
}
