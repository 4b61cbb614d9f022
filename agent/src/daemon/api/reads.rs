//! The API's reading routes: records, the registry, health, live streams.

use super::*;
use crate::events::PAGE_BUDGET;

pub(super) fn tools(state: &DaemonState) -> Response<Body> {
    let tools: Vec<_> = state
        .policy
        .registry()
        .tools()
        .iter()
        .map(|t| (**t).clone())
        .collect();
    json_response(StatusCode::OK, &tools)
}

/// This daemon process, told apart from the next one on the same socket (`toolwall exec`
/// notices a restart between two of its checks by it; agent/src/exec.rs).
static INSTANCE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}-{now}", std::process::id())
});

/// `peer_session`: the session the asking process runs in, when it asked through the socket
/// from inside one (a shim started with a scrubbed environment in its own cgroup namespace
/// learns here that it is in a session; agent/src/mcp/enforce.rs).
pub(super) fn health(state: &DaemonState, peer_session: Option<&str>) -> Response<Body> {
    let counters = state.netmon.as_ref().and_then(|n| n.counters().ok());
    let store = state.committer.health();
    let failing = store.failing();
    let reads_failing = store.reads_failing();
    let checked = store.checked();
    let set_aside = matches!(checked, Some(crate::events::Checked::SetAside { .. }));
    let degraded = failing.is_some() || reads_failing.is_some() || set_aside;
    let mut report = json!({
            "status": if degraded { "degraded" } else { "ok" },
            "peer_session": peer_session,
            "store": {
                "writing": failing.is_none(),
                "error": failing,
                "reading": reads_failing.is_none(),
                "read_error": reads_failing,
                "checked_at_start": checked.map(|c| c.describe()),
            },
            // Waiting for the writer; layers stop reading their peers past the bound.
            "queued_event_bytes": state.sink.queued(),
            "queued_event_bytes_max": crate::events::MAX_QUEUED_BYTES,
            "instance": &*INSTANCE,
            "layers": state.layers,
            "database": state.db_path,
            "sessions": state.session_names(),
            "policy": policy_report(state),
            // Whether sessions' Unix socket connects are confined, and why not.
            "unix_sockets": state.netmon.as_ref().map(|n| match n.unix_missing() {
                None => json!({ "confined": true }),
                Some(why) => json!({ "confined": false, "why": why }),
            }),
            "kernel_counters": counters.map(|c| json!({
                "connects": c.connects, "unmatched": c.unmatched, "flagged": c.flagged,
                "denied": c.denied, "ring_drops": c.ring_drops, "summarised": c.summarised,
                "egress_drops": c.egress_drops, "binds": c.binds, "own_port": c.own_port,
                "unix_connects": c.unix_connects,
            })),
    });
    // Inside a session: nothing of other sessions (the kernel's counters are the host's, every
    // session's connections in them), nor where the record lies.
    if peer_session.is_some()
        && let Some(fields) = report.as_object_mut()
    {
        fields.remove("database");
        fields.remove("sessions");
        fields.remove("kernel_counters");
        fields.remove("queued_event_bytes");
    }
    json_response(StatusCode::OK, &report)
}

/// The revision in force and the bundle's status, read under the status's lock (the applier
/// changes both under it: `daemon/bundle.rs`).
fn policy_report(state: &DaemonState) -> serde_json::Value {
    match &state.bundle {
        Some(bundle) => {
            let status = bundle.lock().unwrap_or_else(|e| e.into_inner());
            json!({ "revision": state.policy.now().revision, "bundle": *status })
        }
        None => json!({ "revision": state.policy.now().revision, "bundle": null }),
    }
}

/// Filters shared by `/api/events` and `/api/calls`.
pub(crate) fn parse_query(query: &str) -> anyhow::Result<EventQuery> {
    let mut q = EventQuery::default();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let value = value.into_owned();
        match key.as_ref() {
            "type" => {
                anyhow::ensure!(
                    Event::KINDS.contains(&value.as_str()),
                    "unknown event type {value:?}; one of {}",
                    Event::KINDS.join(", ")
                );
                q.types.push(value)
            }
            "session" => q.session = Some(value),
            "server" => q.server = Some(value),
            "tool" => q.tool = Some(value),
            "action" => {
                anyhow::ensure!(
                    value == "allow" || value == "block",
                    "action is allow or block, not {value:?}"
                );
                q.action = Some(value)
            }
            "since" => q.since_ns = Some(value.parse().context("since: unix time in nanoseconds")?),
            "after" => q.after_id = Some(value.parse().context("after: an event id")?),
            "before" => q.before_id = Some(value.parse().context("before: an event id")?),
            "until" => q.until_ns = Some(value.parse().context("until: unix time in nanoseconds")?),
            "limit" => q.limit = Some(value.parse().context("limit: a count")?),
            other => anyhow::bail!("unknown query parameter {other:?}"),
        }
    }
    Ok(q)
}

pub(super) async fn read_store<T: Send + 'static>(
    state: &DaemonState,
    f: impl FnOnce(&Store) -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let path = state.db_path.clone();
    let read = tokio::task::spawn_blocking(move || f(&Store::open(&path)?))
        .await
        .context("store reader task")?;
    // `/health` is degraded while reads fail (a store damaged after start).
    let health = state.committer.health();
    match &read {
        Ok(_) => health.set_read(None),
        Err(error) if error.downcast_ref::<crate::events::StoreError>().is_some() => {
            health.set_read(Some(format!("{error:#}")))
        }
        Err(_) => {}
    }
    read
}

/// Events a page of `/api/events` holds unless `limit` says otherwise, and at most.
const EVENTS_PAGE: usize = 1000;
const EVENTS_MAX: usize = 10_000;

/// `/api/events`: one page of stored events, oldest first. The latest events unless `since`
/// or `after` (an event id) says where to start; `before` (an event id) pages back.
/// `Link: <...>; rel="next"` goes on the same way.
pub(super) async fn events(state: &DaemonState, query: &str) -> anyhow::Result<Response<Body>> {
    let mut q = parse_query(query)?;
    let limit = q.limit.unwrap_or(EVENTS_PAGE);
    anyhow::ensure!(
        (1..=EVENTS_MAX).contains(&limit),
        "limit: 1 to {EVENTS_MAX} events a page"
    );
    anyhow::ensure!(
        q.after_id.is_none() || q.before_id.is_none(),
        "before and after: one direction a page"
    );
    anyhow::ensure!(
        q.since_ns.is_none() || q.before_id.is_none(),
        "since pages forward and before pages back: one direction a page (since with after, or until with before)"
    );
    q.limit = Some(limit);
    q.newest_first = q.after_id.is_none() && q.since_ns.is_none();
    let newest_first = q.newest_first;
    let mut page = read_store(state, move |s| Ok(s.events_page(&q, PAGE_BUDGET)?)).await?;
    if newest_first {
        page.events.reverse();
    }
    let mut response = json_response(StatusCode::OK, &page.events);
    if page.partial {
        let why =
            format!("read {PAGE_BUDGET} events without filling the page; the next page goes on");
        if let Ok(value) = http::HeaderValue::from_str(&why) {
            response.headers_mut().insert("toolwall-partial", value);
        }
    }
    if let Some(id) = page.next {
        let way = if newest_first { "before" } else { "after" };
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            if key != "before" && key != "after" {
                out.append_pair(&key, &value);
            }
        }
        out.append_pair(way, &id.to_string());
        let link = format!("</api/events?{}>; rel=\"next\"", out.finish());
        if let Ok(value) = http::HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    Ok(response)
}

/// Records a page of `/api/calls` holds unless `limit` says otherwise.
const CALLS_PAGE: usize = 500;

/// `/api/calls`: one page of correlated records, oldest first, read in time and memory that do
/// not grow with the store (`correlate/page.rs`). The latest calls unless `since` (without
/// `until`) or a cursor says otherwise; `Link: <...>; rel="next"` goes on the same way.
pub(super) async fn calls(state: &DaemonState, query: &str) -> anyhow::Result<Response<Body>> {
    let page = parse_calls(query)?;
    let window = Duration::from_millis(state.config.correlator.window_ms);
    let asked = page.clone();
    let found = read_store(state, move |s| Ok(read_page(s, &asked, window)?)).await?;
    let mut response = json_response(StatusCode::OK, &found.records);
    if let Some(why) = found.partial
        && let Ok(value) = http::HeaderValue::from_str(&why)
    {
        response.headers_mut().insert("toolwall-partial", value);
    }
    if let Some(next) = found.next {
        let link = format!(
            "</api/calls?{}>; rel=\"next\"",
            next_query(query, &page, next)
        );
        if let Ok(value) = http::HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    Ok(response)
}

/// `/api/calls`'s parameters: the filters, `since`/`until` (unix ns, on a record's first
/// sighting), `limit`, and `before`/`after` (a page's `next`).
pub(crate) fn parse_calls(query: &str) -> anyhow::Result<PageQuery> {
    let mut rest = form_urlencoded::Serializer::new(String::new());
    let (mut limit, mut before, mut after) = (CALLS_PAGE, None, None);
    let mut until = None;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "limit" => {
                limit = value.parse().context("limit: a count")?;
                anyhow::ensure!(
                    (1..=MAX_LIMIT).contains(&limit),
                    "limit: 1 to {MAX_LIMIT} records a page"
                );
            }
            "before" => before = Some(value.parse::<Key>()?),
            "after" => after = Some(value.parse::<Key>()?),
            "until" => until = Some(value.parse().context("until: unix time in nanoseconds")?),
            "type" => anyhow::bail!("/api/calls takes no type (that is /api/events)"),
            _ => {
                rest.append_pair(&key, &value);
            }
        }
    }
    let mut filters = parse_query(&rest.finish())?;
    anyhow::ensure!(
        filters.after_id.is_none(),
        "after: a page cursor (NS_ID), not an event id"
    );
    filters.until_ns = until;
    let (direction, cursor) = match (before, after) {
        (Some(_), Some(_)) => anyhow::bail!("before and after: one direction a page"),
        (Some(key), None) => (Direction::Older, Some(key)),
        (None, Some(key)) => (Direction::Newer, Some(key)),
        (None, None) if filters.since_ns.is_some() && until.is_none() => (Direction::Newer, None),
        (None, None) => (Direction::Older, None),
    };
    Ok(PageQuery {
        filters,
        limit,
        direction,
        cursor,
    })
}

/// The query of the page after this one: the same one, its cursor moved on.
fn next_query(query: &str, page: &PageQuery, next: Key) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if key != "before" && key != "after" {
            out.append_pair(&key, &value);
        }
    }
    let way = match page.direction {
        Direction::Older => "before",
        Direction::Newer => "after",
    };
    out.append_pair(way, &next.to_string());
    out.finish()
}

/// A live stream as server-sent events; a follower that falls behind is told how many it
/// missed (an `event: lagged`), never silently skipped.
pub(super) fn stream<T: Serialize + Clone + Send + 'static>(
    rx: broadcast::Receiver<T>,
) -> Response<Body> {
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = match rx.recv().await {
            Ok(item) => match serde_json::to_vec(&item) {
                Ok(json) => encode_event(None, None, &json),
                Err(e) => encode_event(Some("error"), None, e.to_string().as_bytes()),
            },
            Err(broadcast::error::RecvError::Lagged(n)) => {
                encode_event(Some("lagged"), None, n.to_string().as_bytes())
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .expect("static response parts are valid")
}
