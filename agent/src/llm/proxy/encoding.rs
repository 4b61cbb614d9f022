//! Response content codings the proxy undoes before inspection (`proxy.rs`).

use std::io;
use std::pin::Pin;

use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZlibDecoder, ZstdDecoder};
use futures_util::TryStreamExt;
use http_body_util::BodyDataStream;
use hyper::header::{self, HeaderMap};
use tokio::io::AsyncRead;
use tokio_util::io::{ReaderStream, StreamReader};

use super::{READ_CHUNK, Reads};
use crate::llm::upstream::UpstreamBody;

/// The character set a response's `Content-Type` names when it is not UTF-8: a client that
/// decodes the body by it (Python's `google-genai` does, UTF-7 and UTF-16 included) reads other
/// text than toolwall reads, so such a body is refused. A type that is not text counts too, and
/// so does a charset in any other spelling a reader may take (RFC 2231's `charset*=utf-8''…`,
/// `charset*0=…`).
pub(super) fn foreign_charset(headers: &HeaderMap) -> Option<String> {
    for value in headers.get_all(header::CONTENT_TYPE) {
        let Ok(text) = value.to_str() else {
            return Some("(a Content-Type that is not text)".to_owned());
        };
        for param in text.split(';').skip(1) {
            let (name, charset) = param.split_once('=').unwrap_or((param, ""));
            let name = name.trim().to_ascii_lowercase();
            if !name.starts_with("charset") {
                continue;
            }
            if name != "charset" {
                return Some(format!("{name}={}", charset.trim()));
            }
            let charset = charset.trim().trim_matches('"').to_ascii_lowercase();
            if charset != "utf-8" && charset != "utf8" {
                return Some(charset);
            }
        }
    }
    None
}

/// A response content coding we can undo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Encoding {
    Identity,
    Gzip,
    Deflate,
    Brotli,
    Zstd,
}

impl Encoding {
    /// The coding of a response; `Err` with the name for one we cannot decode (stacked codings
    /// included: they are never sent in practice and would need care to undo in order).
    /// Every `Content-Encoding` field counts (a second one must not hide behind a first
    /// `identity`), read before hop-by-hop headers are stripped (a `Connection` header naming
    /// it must not make it vanish).
    pub(super) fn of(headers: &HeaderMap) -> Result<Encoding, String> {
        let mut codings = Vec::new();
        for value in headers.get_all(header::CONTENT_ENCODING) {
            let text = value.to_str().map_err(|_| "(not text)".to_owned())?;
            codings.extend(
                text.split(',')
                    .map(|c| c.trim().to_ascii_lowercase())
                    .filter(|c| !c.is_empty() && c != "identity"),
            );
        }
        match codings.as_slice() {
            [] => Ok(Encoding::Identity),
            [one] => match one.as_str() {
                "gzip" | "x-gzip" => Ok(Encoding::Gzip),
                "deflate" => Ok(Encoding::Deflate),
                "br" => Ok(Encoding::Brotli),
                "zstd" => Ok(Encoding::Zstd),
                other => Err(other.to_owned()),
            },
            many => Err(many.join(", ")),
        }
    }

    /// The decoded body as a reader that yields bytes as soon as they can be decoded.
    fn reader(self, body: UpstreamBody) -> Pin<Box<dyn AsyncRead + Send>> {
        let stream = BodyDataStream::new(body).map_err(io::Error::other);
        let raw = StreamReader::new(stream);
        match self {
            Encoding::Identity => Box::pin(raw),
            Encoding::Gzip => {
                let mut d = GzipDecoder::new(raw);
                d.multiple_members(true);
                Box::pin(d)
            }
            Encoding::Deflate => Box::pin(ZlibDecoder::new(raw)),
            Encoding::Brotli => Box::pin(BrotliDecoder::new(raw)),
            Encoding::Zstd => Box::pin(ZstdDecoder::new(raw)),
        }
    }

    /// The decoded body as the reads to inspect: an identity body's frames as hyper read them
    /// (shared, not copied), a compressed one's bytes as soon as they can be decoded.
    pub(super) fn reads(self, body: UpstreamBody) -> Reads {
        match self {
            Encoding::Identity => Box::pin(BodyDataStream::new(body).map_err(io::Error::other)),
            coded => Box::pin(ReaderStream::with_capacity(coded.reader(body), READ_CHUNK)),
        }
    }
}

#[cfg(test)]
#[test]
fn only_utf8_or_no_charset_is_read() {
    let of = |value: &'static str| {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, value.parse().expect("value"));
        foreign_charset(&h)
    };
    for ok in [
        "application/json",
        "application/json; charset=utf-8",
        "text/event-stream;charset=\"UTF-8\"",
        "application/json; charset=utf8; x=1",
    ] {
        assert_eq!(of(ok), None, "{ok}");
    }
    for refused in [
        "application/json; charset=utf-7",
        "application/json; charset=utf-16",
        "application/json; charset*=utf-8''utf-7",
        "application/json; charset*0=utf-; charset*1=7",
        "application/json; CHARSET*=x",
        "application/json; charset",
    ] {
        assert!(of(refused).is_some(), "{refused}");
    }
}
