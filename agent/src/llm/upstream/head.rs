//! Response heads and request heads: reading a head off the connection, parsing it with
//! `httparse`, how its body is framed, and whether the connection may be kept.

use std::pin::Pin;
use std::time::Duration;

use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Response, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::chunked::Chunked;
use super::{
    IDLE_TIMEOUT, MAX_HEAD, MAX_HEADERS, MAX_INTERIM, Origin, READ_SIZE, UpstreamBody,
    UpstreamError,
};

/// Whether a response lets its connection be kept: no `close` token in `Connection`.
pub(super) fn keep_alive(headers: &HeaderMap) -> bool {
    !headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
}

/// How long a connection may wait idle for its next request: [`IDLE_TIMEOUT`], or less when
/// the server says it closes sooner (`Keep-Alive: timeout=N`, one second of margin; zero: do not
/// reuse it).
pub(super) fn idle_for(headers: &HeaderMap) -> Duration {
    let server = headers
        .get_all("keep-alive")
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .find_map(|param| {
            let param = std::str::from_utf8(param).ok()?.trim();
            let (key, value) = param.split_once('=')?;
            key.trim()
                .eq_ignore_ascii_case("timeout")
                .then(|| value.trim().parse::<u64>().ok())?
        });
    match server {
        Some(secs) => IDLE_TIMEOUT.min(Duration::from_secs(secs.saturating_sub(1))),
        None => IDLE_TIMEOUT,
    }
}

/// Reads until a final (non-1xx) response head; parses only once a blank line has arrived.
pub(super) async fn read_head<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    method: &Method,
) -> Result<(Response<UpstreamBody>, Framed), UpstreamError> {
    let mut interim = 0;
    let mut scanned = 0usize;
    loop {
        let complete = memchr::memmem::find(&buf[scanned.saturating_sub(3)..], b"\r\n\r\n")
            .is_some()
            || memchr::memmem::find(&buf[scanned.saturating_sub(1)..], b"\n\n").is_some();
        scanned = buf.len();
        if complete && let Some((response, framing, used)) = parse_head(buf, method)? {
            let _ = buf.split_to(used);
            scanned = 0;
            // Interim responses (100 Continue, 103 Early Hints) are read and dropped.
            if response.status().is_informational() {
                if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                    return Err(UpstreamError::Head("upstream switched protocols".into()));
                }
                interim += 1;
                if interim > MAX_INTERIM {
                    return Err(UpstreamError::Head(format!(
                        "over {MAX_INTERIM} interim responses"
                    )));
                }
                continue;
            }
            return Ok((response, framing));
        }
        if buf.len() >= MAX_HEAD {
            return Err(UpstreamError::Head(format!("over {MAX_HEAD} bytes")));
        }
        buf.reserve(READ_SIZE);
        let n =
            std::future::poll_fn(|cx| tokio_util::io::poll_read_buf(Pin::new(&mut *rd), cx, buf))
                .await
                .map_err(UpstreamError::Read)?;
        if n == 0 {
            return Err(UpstreamError::Closed);
        }
    }
}

/// A request body on its way upstream: the agent's, streamed as it comes, or one toolwall read
/// whole (an inspected route's request, `llm/request.rs`).
#[derive(Debug)]
pub(crate) enum OutBody {
    /// Streamed.
    Stream(Incoming),
    /// Whole.
    Full(bytes::Bytes),
}

/// The request head; whether the body goes chunked.
pub(super) fn request_head(
    origin: &Origin,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    body: &OutBody,
) -> Result<(Vec<u8>, bool), UpstreamError> {
    if matches!(*method, Method::CONNECT | Method::TRACE) {
        return Err(UpstreamError::Method(method.clone()));
    }
    let mut head = Vec::with_capacity(1024);
    head.extend_from_slice(method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(origin.authority().as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        // Framing is this hop's (set below); `expect` is not, since the body follows at once.
        if [
            header::HOST,
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::EXPECT,
            header::CONNECTION,
        ]
        .contains(name)
        {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    let bodiless = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let size = match body {
        OutBody::Stream(body) => body.size_hint().exact(),
        OutBody::Full(bytes) => Some(bytes.len() as u64),
    };
    let chunked = match size {
        Some(0) if bodiless => false,
        Some(n) => {
            head.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
            false
        }
        // A server that ignores such a body would read its chunks as a second request.
        None if bodiless => return Err(UpstreamError::Method(method.clone())),
        None => {
            head.extend_from_slice(b"transfer-encoding: chunked\r\n");
            true
        }
    };
    head.extend_from_slice(b"\r\n");
    Ok((head, chunked))
}

/// Writes the head and the body, gathered into writes of up to [`READ_SIZE`] (a small request
/// leaves in one segment, as from any HTTP client).
pub(super) async fn write_request<W: AsyncWrite + Unpin>(
    conn: &mut W,
    mut out: Vec<u8>,
    body: OutBody,
    chunked: bool,
) -> Result<(), UpstreamError> {
    let mut body = match body {
        OutBody::Stream(body) => body,
        // Read and judged whole (`llm/request.rs`): sent with its length, in one go.
        OutBody::Full(bytes) => {
            out.extend_from_slice(&bytes);
            conn.write_all(&out).await.map_err(UpstreamError::Write)?;
            return conn.flush().await.map_err(UpstreamError::Write);
        }
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(UpstreamError::RequestBody)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if chunked {
            out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        }
        out.extend_from_slice(&data);
        if chunked {
            out.extend_from_slice(b"\r\n");
        }
        if out.len() >= READ_SIZE {
            conn.write_all(&out).await.map_err(UpstreamError::Write)?;
            out.clear();
        }
    }
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    conn.write_all(&out).await.map_err(UpstreamError::Write)?;
    conn.flush().await.map_err(UpstreamError::Write)
}

/// How a response body ends (RFC 9112 §6.3).
#[derive(Debug)]
pub(super) enum Framing {
    Length(u64),
    Chunked(Chunked),
    /// Until the server closes the connection (never reused).
    Close,
}

/// A body's framing, and whether the connection may carry another exchange after it (not
/// when the head framed the body ambiguously: leftover bytes must never become the next
/// response).
pub(super) struct Framed {
    pub(super) framing: Framing,
    pub(super) reusable: bool,
}

/// A response head, its body's framing and the bytes it took; `None` while incomplete.
pub(super) fn parse_head(
    buf: &[u8],
    method: &Method,
) -> Result<Option<(Response<UpstreamBody>, Framed, usize)>, UpstreamError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    let used = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(UpstreamError::Head(e.to_string())),
    };
    if parsed.version != Some(1) {
        return Err(UpstreamError::Head("not HTTP/1.1".into()));
    }
    let status = StatusCode::from_u16(parsed.code.unwrap_or(0))
        .map_err(|e| UpstreamError::Head(e.to_string()))?;
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|e| UpstreamError::Head(format!("header name {:?}: {e}", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|e| UpstreamError::Head(format!("header {:?}: {e}", h.name)))?;
        headers.append(name, value);
    }
    let framing = framing(&headers, status, method)?;
    let mut response = Response::new(UpstreamBody::empty());
    *response.status_mut() = status;
    *response.version_mut() = Version::HTTP_11;
    *response.headers_mut() = headers;
    Ok(Some((response, framing, used)))
}

pub(super) fn framing(
    headers: &HeaderMap,
    status: StatusCode,
    method: &Method,
) -> Result<Framed, UpstreamError> {
    let has_te = headers.contains_key(header::TRANSFER_ENCODING);
    let has_cl = headers.contains_key(header::CONTENT_LENGTH);
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        // A body after such a head would be read as the next response: not reused if the
        // head announced one.
        let announced = has_te
            || (status != StatusCode::NOT_MODIFIED
                && *method != Method::HEAD
                && headers
                    .get(header::CONTENT_LENGTH)
                    .is_some_and(|v| v.as_bytes() != b"0"));
        return Ok(Framed {
            framing: Framing::Length(0),
            reusable: !announced,
        });
    }
    let codings: Vec<String> = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("\u{0}").split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect();
    if has_te {
        // Chunked must be the last coding, and we undo no other transfer coding.
        return if codings == ["chunked"] {
            Ok(Framed {
                framing: Framing::Chunked(Chunked::default()),
                // Both framings announced: read as chunked (RFC 9112 §6.3), never reused.
                reusable: !has_cl,
            })
        } else {
            Err(UpstreamError::Head(format!(
                "transfer-encoding {codings:?} is not handled"
            )))
        };
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            // Digits only (`u64::from_str` would take a leading `+`).
            let n = (!part.is_empty() && part.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(part).ok()?.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| UpstreamError::Head(format!("content-length {value:?}")))?;
            if length.is_some_and(|l| l != n) {
                return Err(UpstreamError::Head(
                    "conflicting content-length values".into(),
                ));
            }
            length = Some(n);
        }
    }
    Ok(Framed {
        framing: length.map_or(Framing::Close, Framing::Length),
        reusable: length.is_some(),
    })
}
