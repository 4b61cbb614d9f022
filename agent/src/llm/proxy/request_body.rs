//! An inspected request's body: read whole within bounds of size and time, and the tool
//! results in it judged (off the threads that serve connections) before it goes upstream.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header;

use super::Inner;
use crate::llm::request;
use crate::llm::upstream::OutBody;

/// Time a client has to send an inspected request's body.
const REQUEST_BODY_TIME: std::time::Duration = std::time::Duration::from_secs(120);

/// Reads an inspected route's request body whole (bounded in bytes and time) and judges the
/// tool results in it; the records go to the sink. Refused, with why: a compressed body
/// (toolwall reads only what it can judge), one over [`request::MAX_REQUEST_BYTES`], one that
/// does not arrive in time.
pub(super) async fn read_request(
    inner: &Arc<Inner>,
    route: request::Route,
    headers: &hyper::HeaderMap,
    body: Incoming,
    session: &str,
) -> Result<OutBody, String> {
    // Every value of every such header (a second `content-encoding: gzip` line counts too).
    if let Some(coding) = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .find(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return Err(format!(
            "a request body in content-encoding {coding:?} is not inspected; send it uncompressed"
        ));
    }
    // A few at a time: a request is held whole, and parsed it takes several times its size.
    let Ok(_permit) = inner.reading.acquire().await else {
        return Err("the proxy is stopping".to_owned());
    };
    let read = tokio::time::timeout(
        REQUEST_BODY_TIME,
        http_body_util::Limited::new(body, request::MAX_REQUEST_BYTES).collect(),
    );
    let bytes = match read.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(format!(
                "the request body is larger than {} bytes (no provider takes one that large)",
                request::MAX_REQUEST_BYTES
            ));
        }
        Ok(Err(e)) => return Err(format!("the request body broke: {e}")),
        Err(_) => {
            return Err(format!(
                "the request body did not arrive within {} s",
                REQUEST_BODY_TIME.as_secs()
            ));
        }
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
            return Err(why);
        }
        Err(e) => return Err(format!("inspecting the request failed: {e}")),
    };
    for record in inspected.records {
        inner.sink.emit(record);
    }
    Ok(OutBody::Full(inspected.body.map_or(bytes, Bytes::from)))
}
