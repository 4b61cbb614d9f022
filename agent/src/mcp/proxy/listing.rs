//! Each client session's own tool list. What a server lists depends on who asks (the
//! session's capabilities, its credentials), so no list is shared between sessions: a call is
//! judged against the list its own session was given, and a session that calls before it
//! listed is listed for first, in its own session and with its own credentials.
//!
//! The Streamable HTTP passthrough keeps one [`Listing`] per upstream session id and credential
//! ([`SessionListings`], bounded); a bridged or `--stdio` session keeps its own in its filter.

use super::*;
use crate::mcp::filter::IdKey;

/// Most pages one listing on a session's behalf follows (the registry keeps at most 2,048
/// tools of a server; a server that pages on past this is not listed further).
const MAX_LIST_PAGES: usize = 100;
/// Most sessions whose tool lists the passthrough keeps; past it the least recently used one
/// is forgotten, and its next call is listed for again first.
pub(super) const MAX_LISTINGS: usize = 4096;
/// Most listings on sessions' behalf the passthrough makes at once: each judges up to
/// `--max-message-bytes` of tools, and a client picks its own identity, so it may ask for one
/// per call; past this a call waits its turn within its listing's deadline.
pub(super) const MAX_LISTING_AT_ONCE: usize = 4;

/// Why a listing on a session's behalf did not finish.
pub(super) enum ListFailed {
    /// What the client gets instead of its request's answer (the upstream's 401 challenge).
    Answer(Response<ProxyBody>),
    /// The session's call is refused for this reason (it stays unlisted).
    Why(String),
}

/// The passthrough's tool lists, one per upstream session and identity.
#[derive(Default)]
pub(super) struct SessionListings {
    by_key: HashMap<ListingKey, (Arc<Mutex<Listing>>, u64)>,
    /// Counts uses, so the least recently used list is the one forgotten.
    clock: u64,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct ListingKey {
    /// The upstream's `Mcp-Session-Id` (none for a server without sessions).
    session: Option<String>,
    /// Who asks (`identity.rs`): a session id used with other credentials, or a server without
    /// sessions asked by another client, is judged against the list that identity was given.
    identity: u64,
}

impl SessionListings {
    /// The list of a session and identity (a new, empty one the first time).
    pub(super) fn of(&mut self, session: Option<&str>, identity: u64) -> Arc<Mutex<Listing>> {
        let key = ListingKey {
            session: session.map(str::to_owned),
            identity,
        };
        self.clock += 1;
        let now = self.clock;
        if let Some((listing, used)) = self.by_key.get_mut(&key) {
            *used = now;
            return listing.clone();
        }
        if self.by_key.len() >= MAX_LISTINGS
            && let Some(oldest) = self
                .by_key
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            self.by_key.remove(&oldest);
        }
        let listing = Arc::new(Mutex::new(Listing::required()));
        self.by_key.insert(key, (listing.clone(), now));
        listing
    }

    /// The session ended (DELETE): its lists go with it.
    pub(super) fn ended(&mut self, session: &str) {
        self.by_key
            .retain(|k, _| k.session.as_deref() != Some(session));
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }
}

/// The pages of one listing on a session's behalf, sans I/O: [`ListPages::request`] gives the
/// next `tools/list` request (its text and id) to send in the session; its response, once the
/// session's filter judged it (which is what makes its tools callable), goes to
/// [`ListPages::answered`], until that says the list is whole.
///
/// The whole listing is bounded like one request: it ends within `--timeout` and reads at most
/// `--max-message-bytes` in all, whatever number of pages it takes (each page's wait gets what
/// is left, [`ListPages::time_left`]), so a client's call is never held for page after slow
/// or huge page.
pub(super) struct ListPages {
    meta: Option<serde_json::Map<String, Value>>,
    /// An id no client request of the session holds: the response is taken by the proxy.
    nonce: String,
    page: usize,
    cursor: Option<String>,
    deadline: tokio::time::Instant,
    bytes_left: usize,
}

impl ListPages {
    /// A listing that ends within `timeout` and reads at most `max_bytes` of pages.
    pub(super) fn new(first: ListFirst, timeout: Duration, max_bytes: usize) -> Self {
        ListPages {
            meta: first.meta,
            nonce: new_session_id(),
            page: 0,
            cursor: None,
            deadline: tokio::time::Instant::now() + timeout,
            bytes_left: max_bytes,
        }
    }

    /// How long the next page may take, or why the listing is over.
    pub(super) fn time_left(&self) -> Result<Duration, String> {
        self.deadline
            .checked_duration_since(tokio::time::Instant::now())
            .filter(|left| !left.is_zero())
            .ok_or_else(too_slow)
    }

    /// Whether the listing speaks the 2026-07-28 revision (its requests carry `Mcp-Method`).
    pub(super) fn modern(&self) -> bool {
        self.meta.is_some()
    }

    /// The next request and its id, or why there is none (too many pages).
    pub(super) fn request(&mut self) -> Result<(Bytes, String), String> {
        if self.page >= MAX_LIST_PAGES {
            return Err(format!(
                "the server's tools/list goes on past {MAX_LIST_PAGES} pages"
            ));
        }
        let mut params = serde_json::Map::new();
        if let Some(c) = &self.cursor {
            params.insert("cursor".into(), Value::String(c.clone()));
        }
        if let Some(meta) = &self.meta {
            params.insert("_meta".into(), Value::Object(meta.clone()));
        }
        let id = format!("toolwall-list-{}-{}", self.nonce, self.page);
        self.page += 1;
        let request = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "tools/list",
            "params": params,
        });
        Ok((Bytes::from(request.to_string()), id))
    }

    /// A page's (judged) response: `Ok(true)` when the list is whole, `Ok(false)` when another
    /// page is to be asked for.
    pub(super) fn answered(&mut self, answer: &[u8]) -> Result<bool, String> {
        self.bytes_left = self
            .bytes_left
            .checked_sub(answer.len())
            .ok_or("the server's tools/list pages are larger than --max-message-bytes in all")?;
        let answer: Value = serde_json::from_slice(answer)
            .map_err(|e| format!("the tools/list answer is not JSON: {e}"))?;
        if let Some(error) = answer.get("error") {
            return Err(format!(
                "the server answered tools/list with an error: {error}"
            ));
        }
        // An empty cursor ends the list, as the SDKs' clients read it (`if (nextCursor)`).
        match answer
            .pointer("/result/nextCursor")
            .and_then(Value::as_str)
            .filter(|next| !next.is_empty())
        {
            Some(next) if self.cursor.as_deref() == Some(next) => {
                Err(format!("the server repeats tools/list cursor {next:?}"))
            }
            Some(next) => {
                self.cursor = Some(next.to_owned());
                Ok(false)
            }
            None => Ok(true),
        }
    }
}

/// Why a listing ended at its deadline.
pub(super) fn too_slow() -> String {
    "the server's tools/list pages took longer than --timeout in all".into()
}

/// The id a listing request's response must carry.
pub(super) fn answers(message: &[u8], id: &str) -> bool {
    response_id(message).and_then(|r| IdKey::of(&r)) == IdKey::of(&Value::from(id).to_string())
}

/// One `tools/list` page on a passthrough session's behalf: sent with the client's headers
/// (its session, its credentials) on its connection's upstream connection; the response
/// judged by `lister`, which shares the session's [`Listing`]. An upstream 401 or 403 is the
/// client's answer (its credentials are refused; `auth.rs` says where to get others).
pub(super) async fn list_http(
    shared: &Shared,
    upstream: &UpstreamConn,
    client: &HeaderMap,
    first: ListFirst,
    mut lister: Filter,
) -> Result<(), ListFailed> {
    let mut pages = ListPages::new(first, shared.timeout, shared.max_message);
    let left = pages.time_left().map_err(ListFailed::Why)?;
    let _turn = tokio::time::timeout(left, shared.listing_turns.acquire())
        .await
        .map_err(|_| {
            ListFailed::Why(format!(
                "{MAX_LISTING_AT_ONCE} other listings took the whole of --timeout"
            ))
        })?
        .map_err(|_| ListFailed::Why("the proxy is stopping".into()))?;
    loop {
        let (body, id) = pages.request().map_err(ListFailed::Why)?;
        let left = pages.time_left().map_err(ListFailed::Why)?;
        let asked = ask_http(shared, upstream, client, pages.modern(), lister, body, &id);
        let (judged_by, answer) = tokio::time::timeout(left, asked)
            .await
            .map_err(|_| ListFailed::Why(too_slow()))??;
        lister = judged_by;
        if pages.answered(&answer).map_err(ListFailed::Why)? {
            return Ok(());
        }
    }
}

async fn ask_http(
    shared: &Shared,
    upstream: &UpstreamConn,
    client: &HeaderMap,
    modern: bool,
    lister: Filter,
    body: Bytes,
    id: &str,
) -> Result<(Filter, Bytes), ListFailed> {
    let mut headers = upstream_headers(shared, client);
    // The routing headers say what this request is, not what the client's was.
    let routing: Vec<HeaderName> = headers
        .keys()
        .filter(|n| {
            let n = n.as_str();
            n == "mcp-method" || n == "mcp-name" || n.starts_with("mcp-param-")
        })
        .cloned()
        .collect();
    for name in routing {
        headers.remove(name);
    }
    if modern {
        headers.insert(
            HeaderName::from_static("mcp-method"),
            HeaderValue::from_static("tools/list"),
        );
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    let response = forward(shared, upstream, Method::POST, headers, body)
        .await
        .map_err(|failed| ListFailed::Answer(failed.response))?;
    let status = response.status();
    if client::is_challenge(status, response.headers()) {
        return Err(ListFailed::Answer(
            refused_credentials(shared, client, "/mcp", response).await,
        ));
    }
    let is_sse = crate::edge::is_event_stream(response.headers());
    let read = tokio::time::timeout(
        shared.timeout,
        http_body_util::Limited::new(response.into_body(), shared.max_message).collect(),
    );
    let body = match read.await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => return Err(ListFailed::Why(format!("reading its answer: {e}"))),
        Err(_) => return Err(ListFailed::Why("its answer did not come in time".into())),
    };
    if !status.is_success() {
        return Err(ListFailed::Why(format!(
            "the server answered HTTP {status}"
        )));
    }
    let found = match is_sse {
        true => {
            let mut decoder = crate::sse::message::SseDecoder::with_limit(shared.max_message);
            decoder.feed(&body);
            std::iter::from_fn(|| decoder.next_event())
                .map(|e| Bytes::from(e.data))
                .find(|m| answers(m, id))
        }
        false => Some(body).filter(|m| answers(m, id)),
    };
    let Some(message) = found else {
        return Err(ListFailed::Why(
            "no answer to tools/list in the response".into(),
        ));
    };
    match super::passthrough::judge_server(lister, message).await {
        Some((lister, Some(m))) => Ok((lister, m)),
        Some((_, None)) => Err(ListFailed::Why("its tools/list answer was dropped".into())),
        None => Err(ListFailed::Why(
            "judging its tools/list answer failed".into(),
        )),
    }
}
