//! MCP authorization through the proxy (spec 2025-11-25): a client authenticates to the
//! upstream's authorization server itself, and the proxy only points it there.
//!
//! - The upstream's 401 (or 403 with a challenge) reaches the client with its
//!   `resource_metadata` naming the proxy's own protected-resource metadata, because the SDKs
//!   require the metadata's `resource` to be the URL they connected to.
//! - That metadata ([`protected_resource`]) is the upstream's, fetched without credentials, with
//!   `resource` set to the proxy's URL and nothing else changed (its authorization servers stay
//!   the upstream's). Metadata whose `resource` is not the upstream is refused, never rewritten.
//! - A client's own `Authorization` goes to the upstream and nowhere else; the operator's
//!   `--upstream-header`s go with a client's requests only with `--lend-upstream-headers`, and
//!   never beside a client's own credentials (`routes.rs`, `merge_headers`).
//!
//! Nothing here reads a token: the upstream judges each one. The tokens a client gets are
//! issued for the proxy's URL, so the upstream must accept that audience (docs/mcp.md).

use std::time::Duration;

use super::*;

/// The well-known prefix of protected-resource metadata (RFC 9728 §3).
pub(super) const METADATA_PREFIX: &str = "/.well-known/oauth-protected-resource";
/// Most bytes of the upstream's metadata, and of a refusal's body passed on.
const MAX_METADATA_BYTES: usize = 64 << 10;
const MAX_REFUSAL_BODY: usize = 4 << 10;
/// How long the upstream's metadata may take to arrive.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// What the proxy learned of the upstream's authorization.
#[derive(Default)]
pub(super) struct AuthState {
    /// The `resource_metadata` of the upstream's last challenge: where its metadata is, first.
    metadata_url: Mutex<Option<String>>,
}

impl AuthState {
    /// Notes where a challenge says the upstream's metadata is.
    pub(super) fn challenged(&self, challenge: &str) {
        if let Some(url) = metadata_param(challenge)
            && let Ok(mut slot) = self.metadata_url.lock()
        {
            *slot = Some(url);
        }
    }
}

/// The proxy's own origin as the client reached it (`http://HOST:PORT` from its `Host`), when
/// that names the address the proxy listens on: the SDKs compare the metadata's `resource`
/// with the URL they connected to, byte for byte in the host. A `Host` naming anything else
/// (a rebinding page's domain) gets no metadata of ours.
pub(super) fn own_origin(shared: &Shared, headers: &HeaderMap) -> Option<String> {
    let listen = shared.listen?;
    let host = headers.get(http::header::HOST)?.to_str().ok()?;
    // No user part: it would be reflected into the metadata's `resource`.
    if host.contains('@') {
        return None;
    }
    let authority: http::uri::Authority = host.parse().ok()?;
    if authority.port_u16() != Some(listen.port()) {
        return None;
    }
    let name = authority.host();
    let local = matches!(name, "localhost" | "127.0.0.1" | "[::1]")
        || name.trim_start_matches('[').trim_end_matches(']') == listen.ip().to_string();
    local.then(|| format!("http://{host}"))
}

/// The proxy's metadata URL for a client path (`/mcp`, `/sse`, `/message`).
fn own_metadata_url(origin: &str, path: &str) -> String {
    let resource_path = match path {
        "/message" => "/sse",
        other => other,
    };
    format!("{origin}{METADATA_PREFIX}{resource_path}")
}

/// The `resource_metadata` parameter of a challenge, read as the SDKs read it (the first
/// match, quoted or bare).
fn metadata_param(challenge: &str) -> Option<String> {
    let at = find_param(challenge, 0)?;
    let (value, _) = param_value(&challenge[at..]);
    Some(value.to_owned())
}

/// Where the next `resource_metadata=` begins (after its `=`), at or after `from`.
fn find_param(challenge: &str, from: usize) -> Option<usize> {
    const NAME: &str = "resource_metadata=";
    let lower = challenge.to_ascii_lowercase();
    lower[from..].find(NAME).map(|i| from + i + NAME.len())
}

/// A parameter's value at the start of `rest` (quoted or a token) and its length in `rest`.
fn param_value(rest: &str) -> (&str, usize) {
    match rest.strip_prefix('"') {
        Some(quoted) => match quoted.find('"') {
            Some(end) => (&quoted[..end], end + 2),
            None => (quoted, rest.len()),
        },
        None => {
            let end = rest
                .find(|c: char| c.is_ascii_whitespace() || c == ',')
                .unwrap_or(rest.len());
            (&rest[..end], end)
        }
    }
}

/// A challenge with every `resource_metadata` naming `ours` (whichever match a client's
/// first-match reading takes, it is the proxy's), or `ours` added to a `Bearer` challenge that
/// named none. Everything else (scope, error, realm, other schemes) is kept.
pub(super) fn rewrite_challenge(challenge: &str, ours: &str) -> String {
    let mut out = String::with_capacity(challenge.len() + ours.len());
    let mut copied = 0;
    let mut found = false;
    while let Some(at) = find_param(challenge, copied) {
        let (_, len) = param_value(&challenge[at..]);
        out.push_str(&challenge[copied..at]);
        out.push('"');
        out.push_str(ours);
        out.push('"');
        copied = at + len;
        found = true;
    }
    out.push_str(&challenge[copied..]);
    let bearer = challenge
        .trim_start()
        .get(..6)
        .is_some_and(|s| s.eq_ignore_ascii_case("bearer"));
    if !found && bearer {
        let sep = match challenge.trim_start().len() {
            6 => " ",
            _ => ", ",
        };
        out.push_str(&format!("{sep}resource_metadata=\"{ours}\""));
    }
    out
}

/// The client's answer when the upstream refused its credentials (401, or 403 with a
/// challenge): the status, each challenge pointing at the proxy's metadata, and the body only
/// when it is a small JSON object (an OAuth error); the refusal is noted for the metadata.
pub(super) async fn refused_credentials(
    shared: &Shared,
    client: &HeaderMap,
    path: &str,
    response: Response<Incoming>,
) -> Response<ProxyBody> {
    let (parts, body) = response.into_parts();
    let ours = own_origin(shared, client)
        .or_else(|| shared.listen.map(|l| format!("http://{l}")))
        .map(|origin| own_metadata_url(&origin, path));
    let mut answer = Response::new(whole(Bytes::new()));
    *answer.status_mut() = parts.status;
    for value in parts.headers.get_all(http::header::WWW_AUTHENTICATE) {
        let Ok(challenge) = value.to_str() else {
            continue;
        };
        shared.auth.challenged(challenge);
        let rewritten = match &ours {
            Some(ours) => rewrite_challenge(challenge, ours),
            None => challenge.to_owned(),
        };
        if let Ok(v) = HeaderValue::from_str(&rewritten) {
            answer
                .headers_mut()
                .append(http::header::WWW_AUTHENTICATE, v);
        }
    }
    let read = tokio::time::timeout(
        shared.timeout,
        http_body_util::Limited::new(body, MAX_REFUSAL_BODY).collect(),
    );
    if let Ok(Ok(bytes)) = read.await {
        let bytes = bytes.to_bytes();
        if serde_json::from_slice::<serde_json::Map<String, Value>>(&bytes).is_ok() {
            *answer.body_mut() = whole(bytes);
            answer
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    answer
}

/// `GET /.well-known/oauth-protected-resource[/PATH]`: the upstream's metadata with `resource`
/// the proxy's URL for PATH.
pub(super) async fn protected_resource(
    shared: &Shared,
    req: &Request<Incoming>,
) -> Response<ProxyBody> {
    let Some(origin) = own_origin(shared, req.headers()) else {
        return plain(
            StatusCode::MISDIRECTED_REQUEST,
            "this Host does not name the proxy's address",
        );
    };
    let suffix = &req.uri().path()[METADATA_PREFIX.len()..];
    let resource = format!("{origin}{suffix}");
    match upstream_metadata(shared).await {
        Ok(Some(mut metadata)) => {
            metadata.insert("resource".into(), Value::String(resource));
            // Signed claims take precedence over plain ones (RFC 9728 §2.2): its signed
            // `resource` would contradict ours.
            metadata.remove("signed_metadata");
            let mut response = full(
                StatusCode::OK,
                Some("application/json"),
                Value::Object(metadata).to_string(),
            );
            let h = response.headers_mut();
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            h.insert(
                http::header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
            response
        }
        Ok(None) => plain(
            StatusCode::NOT_FOUND,
            "the upstream MCP server publishes no protected-resource metadata",
        ),
        Err(why) => {
            tracing::warn!("refused the upstream's protected-resource metadata: {why}");
            plain(
                StatusCode::BAD_GATEWAY,
                &format!("toolwall refused the upstream's protected-resource metadata: {why}"),
            )
        }
    }
}

/// The upstream's metadata, looked for where the SDKs look: its challenge's URL, then the
/// path form, then the root form. `Ok(None)`: it has none; `Err`: it has one toolwall will
/// not vouch for.
async fn upstream_metadata(
    shared: &Shared,
) -> Result<Option<serde_json::Map<String, Value>>, String> {
    let origin = format!(
        "{}://{}",
        shared.upstream.scheme_str().unwrap_or("http"),
        shared.upstream.authority().map_or("", |a| a.as_str())
    );
    let path = shared.upstream.path().trim_end_matches('/');
    let challenged = shared
        .auth
        .metadata_url
        .lock()
        .ok()
        .and_then(|u| u.clone())
        // Only the upstream's own origin is asked: a challenge must not send the proxy
        // elsewhere.
        .filter(|u| u.starts_with(&format!("{origin}/")));
    let mut candidates: Vec<String> = challenged.into_iter().collect();
    if !path.is_empty() {
        candidates.push(format!("{origin}{METADATA_PREFIX}{path}"));
    }
    candidates.push(format!("{origin}{METADATA_PREFIX}"));
    candidates.dedup();
    for url in candidates {
        let Some(metadata) = fetch_metadata(shared, &url).await? else {
            continue;
        };
        check_metadata(&metadata, &shared.upstream)?;
        return Ok(Some(metadata));
    }
    Ok(None)
}

/// One metadata document: `Ok(None)` when the URL has none (any status but 200).
async fn fetch_metadata(
    shared: &Shared,
    url: &str,
) -> Result<Option<serde_json::Map<String, Value>>, String> {
    let uri: Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let mut request = Request::new(Full::new(Bytes::new()));
    *request.uri_mut() = uri;
    request.headers_mut().insert(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json"),
    );
    let exchange = async {
        let response = shared
            .http
            .request(request)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if response.status() != StatusCode::OK {
            return Ok(None);
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_METADATA_BYTES)
            .collect()
            .await
            .map_err(|e| format!("{url}: {e}"))?
            .to_bytes();
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| format!("{url}: not a JSON object: {e}"))
    };
    tokio::time::timeout(METADATA_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("{url}: no answer within {METADATA_TIMEOUT:?}"))?
}

/// Metadata toolwall vouches for: it names authorization servers, and its `resource` is the
/// upstream (the SDKs' own rule: the same origin, and a path the upstream's is under).
pub(super) fn check_metadata(
    metadata: &serde_json::Map<String, Value>,
    upstream: &Uri,
) -> Result<(), String> {
    let servers = metadata
        .get("authorization_servers")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty() && a.iter().all(Value::is_string));
    if servers.is_none() {
        return Err("it names no authorization_servers".into());
    }
    let resource = metadata
        .get("resource")
        .and_then(Value::as_str)
        .ok_or("it has no resource")?;
    let named: Uri = resource
        .parse()
        .map_err(|e| format!("its resource {resource:?} is no URL: {e}"))?;
    let origin = |u: &Uri| {
        let scheme = u.scheme_str().unwrap_or("").to_ascii_lowercase();
        let default = if scheme == "https" { 443 } else { 80 };
        (
            scheme,
            u.host().unwrap_or("").to_ascii_lowercase(),
            u.port_u16().unwrap_or(default),
        )
    };
    let under = |parent: &str, child: &str| {
        let (parent, child) = (parent.trim_end_matches('/'), child.trim_end_matches('/'));
        child.starts_with(parent)
            && (child.len() == parent.len() || child.as_bytes()[parent.len()] == b'/')
    };
    if origin(&named) != origin(upstream) || !under(named.path(), upstream.path()) {
        return Err(format!(
            "its resource {resource:?} is not the upstream {upstream}"
        ));
    }
    Ok(())
}
