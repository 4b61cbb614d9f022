//! An inspected request's body: read whole within bounds of size, time and the proxy's memory
//! budget, then the tool results in it judged (off the threads that serve connections) before
//! it goes upstream.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::StatusCode;
use hyper::body::Incoming;
use hyper::header;

use super::Inner;
use super::budget::OverBudget;
use crate::llm::request;
use crate::llm::upstream::OutBody;

/// Time a client has to send an inspected request's body.
const REQUEST_BODY_TIME: std::time::Duration = std::time::Duration::from_secs(120);

/// Why a request was not sent on, and the status that says so.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    why: String,
}

impl Refusal {
    fn bad(why: String) -> Self {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            why,
        }
    }

    /// Ours, not the client's: it may retry.
    fn busy(why: String) -> Self {
        Refusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            why,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl From<OverBudget> for Refusal {
    fn from(over: OverBudget) -> Self {
        Refusal::busy(over.to_string())
    }
}

/// Reads an inspected route's request body whole (bounded in bytes, time and the memory
/// budget) and judges the tool results in it; the records go to the sink. Refused, with why: a
/// compressed body (toolwall reads only what it can judge), one over
/// [`request::MAX_REQUEST_BYTES`], one that does not arrive in time (400); one the memory
/// budget cannot hold (503).
pub(super) async fn read_request(
    inner: &Arc<Inner>,
    route: request::Route,
    headers: &hyper::HeaderMap,
    body: Incoming,
    session: &str,
    client: &super::budget::ClientBytes,
) -> Result<OutBody, Refusal> {
    // Every value of every such header (a second `content-encoding: gzip` line counts too).
    if let Some(coding) = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .find(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return Err(Refusal::bad(format!(
            "a request body in content-encoding {coding:?} is not inspected; send it uncompressed"
        )));
    }
    // A body that says it is too large is refused before a byte of it is read.
    if usize::try_from(hyper::body::Body::size_hint(&body).lower())
        .map_or(true, |n| n > request::MAX_REQUEST_BYTES)
    {
        return Err(too_large());
    }
    // The bytes held while the body arrives count against the budget from the first one.
    let mut held = inner.budget.reserve(client);
    let read = async {
        let mut body = body;
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Refusal::bad(format!("the request body broke: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers: nothing to judge or send on
            };
            let len = buf.len() + data.len();
            if len > request::MAX_REQUEST_BYTES {
                return Err(too_large());
            }
            held.resize(len)?;
            buf.extend_from_slice(&data);
        }
        Ok(buf.freeze())
    };
    let bytes: Bytes = match tokio::time::timeout(REQUEST_BODY_TIME, read).await {
        Ok(read) => read?,
        Err(_) => {
            return Err(Refusal::bad(format!(
                "the request body did not arrive within {} s",
                REQUEST_BODY_TIME.as_secs()
            )));
        }
    };
    // A few at a time, and only once whole: a body parsed takes several times its size, and a
    // client that sends its body slowly must not keep other clients' bodies from being judged.
    let Ok(_permit) = inner.reading.acquire().await else {
        return Err(Refusal::busy("the proxy is stopping".to_owned()));
    };
    // Parsing and scanning megabytes is CPU work: off the threads that serve connections.
    let job = {
        let (inner, bytes, session) = (inner.clone(), bytes.clone(), session.to_owned());
        tokio::task::spawn_blocking(move || {
            request::inspect(&*inner.gate, route, &bytes, &session, &inner.recorded)
        })
    };
    let inspected = match job.await {
        Ok(Ok(inspected)) => inspected,
        Ok(Err(refused)) => {
            let why = refused.to_string();
            for record in refused.into_records() {
                inner.sink.emit(record);
            }
            return Err(Refusal::bad(why));
        }
        Err(e) => return Err(Refusal::bad(format!("inspecting the request failed: {e}"))),
    };
    for record in inspected.records {
        inner.sink.emit(record);
    }
    Ok(OutBody::Full(inspected.body.map_or(bytes, Bytes::from)))
}

fn too_large() -> Refusal {
    Refusal::bad(format!(
        "the request body is larger than {} bytes (no provider takes one that large)",
        request::MAX_REQUEST_BYTES
    ))
}
