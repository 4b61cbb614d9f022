//! The 2026-07-28 routing headers (`Mcp-Method`, `Mcp-Name`, `MCP-Protocol-Version`) of a
//! Streamable HTTP POST, checked against the body toolwall forwards.
//!
//! A server or a gateway in front of it may route on the headers while toolwall judges the
//! body: `Mcp-Name: add` on the POST of a denied `echo` call. The filter already judges and
//! forwards the body; here a request whose headers say something else is refused (HTTP 400,
//! JSON-RPC -32020, as the reference Python server answers), and so is a header given twice.
//! Checks follow the spec's order (notes in `mcp/proxy.rs`); `Mcp-Param-*` headers mirror
//! arguments, which toolwall does not judge by value, and go through as they are.

use std::borrow::Cow;
use std::sync::LazyLock;

use base64::Engine as _;
use http::{HeaderMap, HeaderName};
use serde::Deserialize;
use serde_json::value::RawValue;

/// JSON-RPC code of the 2026-07-28 "HeaderMismatch" error.
pub(crate) const HEADER_MISMATCH: i64 = -32020;

/// The protocol revisions that negotiate with `initialize` (no routing headers required).
const HANDSHAKE_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

const VERSION: &str = "mcp-protocol-version";
const METHOD: &str = "mcp-method";
const NAME: &str = "mcp-name";
// The same as header names: looked up on every POST without parsing the name each time.
const VERSION_HEADER: HeaderName = HeaderName::from_static(VERSION);
const METHOD_HEADER: HeaderName = HeaderName::from_static(METHOD);
const NAME_HEADER: HeaderName = HeaderName::from_static(NAME);

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<Meta<'a>>,
}

/// The `_meta` key of a request's protocol version, and its searcher (made once: making one
/// costs more than searching a call's text with it).
const BODY_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
static BODY_VERSION_FINDER: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(BODY_VERSION));

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    version: Option<Cow<'a, str>>,
}

/// Why the headers of a request do not match its body.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Mismatch(pub String);

/// Checks a POST's routing headers against its body: the canonical text the filter forwards
/// (`mcp/canonical.rs`), a JSON object or a batch, in which no key is written with escapes.
pub(crate) fn check(headers: &HeaderMap, body: &[u8]) -> Result<(), Mismatch> {
    for (name, header) in [
        (VERSION, &VERSION_HEADER),
        (METHOD, &METHOD_HEADER),
        (NAME, &NAME_HEADER),
    ] {
        if headers.get_all(header).iter().nth(1).is_some() {
            return Err(Mismatch(format!(
                "the {name} header appears more than once"
            )));
        }
    }
    let text = |name: &'static str, header: &HeaderName| {
        headers
            .get(header)
            .map(|v| v.to_str().map_err(|_| not_text(name)))
            .transpose()
    };
    let header_version = text(VERSION, &VERSION_HEADER)?;
    let header_method = text(METHOD, &METHOD_HEADER)?;
    let header_name = text(NAME, &NAME_HEADER)?;
    // No routing header to compare, and no version header that makes the request modern:
    // only a protocol version in the body's `_meta` could require the headers. The canonical
    // text writes that key as its plain characters, so a body without them needs no parse.
    if header_method.is_none()
        && header_name.is_none()
        && header_version.is_none_or(|v| HANDSHAKE_VERSIONS.contains(&v))
        && BODY_VERSION_FINDER.find(body).is_none()
    {
        return Ok(());
    }
    if body.first() == Some(&b'[') {
        return match header_method.or(header_name) {
            Some(_) => Err(Mismatch(
                "routing headers (mcp-method, mcp-name) on a batch".to_owned(),
            )),
            None => Ok(()),
        };
    }
    let message: Message<'_> = serde_json::from_slice(body)
        .map_err(|e| Mismatch(format!("the body is not a JSON-RPC message: {e}")))?;
    let Some(method) = message.method.as_deref() else {
        // A response: no routing headers are defined for it.
        return Ok(());
    };
    let params = match message.params {
        Some(p) => serde_json::from_str::<Params<'_>>(p.get()).ok(),
        None => None,
    };
    let body_version = params
        .as_ref()
        .and_then(|p| p.meta.as_ref())
        .and_then(|m| m.version.as_deref());
    if let (Some(header), Some(body)) = (header_version, body_version)
        && header != body
    {
        return Err(Mismatch(format!(
            "the mcp-protocol-version header ({header}) does not match the request's protocol version ({body})"
        )));
    }
    // Modern: the request says so in its body, or its version header names no handshake
    // revision. Then the headers are required, as the spec and the servers require them.
    let modern =
        body_version.is_some() || header_version.is_some_and(|v| !HANDSHAKE_VERSIONS.contains(&v));
    match header_method {
        Some(h) if h != method => {
            return Err(Mismatch(format!(
                "the mcp-method header ({h}) does not match the request's method ({method})"
            )));
        }
        None if modern => {
            return Err(Mismatch(format!(
                "a 2026-07-28 request without the mcp-method header ({method})"
            )));
        }
        _ => {}
    }
    let (field, value) = match method {
        "tools/call" | "prompts/get" => ("name", params.as_ref().and_then(|p| p.name.as_deref())),
        "resources/read" => ("uri", params.as_ref().and_then(|p| p.uri.as_deref())),
        _ => return Ok(()),
    };
    match header_name.map(decode) {
        Some(Some(h)) if Some(h.as_str()) == value => Ok(()),
        Some(_) => Err(Mismatch(format!(
            "the mcp-name header does not match the request's {field:?} parameter"
        ))),
        None if modern => Err(Mismatch(format!(
            "a 2026-07-28 {method} request without the mcp-name header"
        ))),
        None => Ok(()),
    }
}

fn not_text(name: &str) -> Mismatch {
    Mismatch(format!("the {name} header is not visible ASCII"))
}

/// A header value as the spec encodes it: plain, or `=?base64?...?=` around UTF-8; `None` when
/// the encoded form does not decode.
fn decode(value: &str) -> Option<String> {
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        None => Some(value.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().expect("header value"));
        }
        map
    }

    const MODERN_CALL: &[u8] = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;

    #[test]
    fn matching_headers_pass() {
        let h = headers(&[
            (VERSION, "2026-07-28"),
            (METHOD, "tools/call"),
            (NAME, "echo"),
        ]);
        assert_eq!(check(&h, MODERN_CALL), Ok(()));
        let encoded = headers(&[
            (VERSION, "2026-07-28"),
            (METHOD, "tools/call"),
            (NAME, "=?base64?ZWNobw==?="),
        ]);
        assert_eq!(check(&encoded, MODERN_CALL), Ok(()));
        // A 2025 request carries none of them.
        let old = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}"#;
        assert_eq!(check(&headers(&[(VERSION, "2025-06-18")]), old), Ok(()));
        assert_eq!(check(&HeaderMap::new(), old), Ok(()));
    }

    #[test]
    fn headers_that_say_something_else_are_refused() {
        for (pairs, body) in [
            (
                &[(VERSION, "2026-07-28"), (METHOD, "tools/call"), (NAME, "add")][..],
                MODERN_CALL,
            ),
            (
                &[(VERSION, "2026-07-28"), (METHOD, "tools/call"), (NAME, "=?base64?YWRk?=")],
                MODERN_CALL,
            ),
            (&[(VERSION, "2026-07-28"), (METHOD, "tools/list"), (NAME, "echo")], MODERN_CALL),
            (&[(VERSION, "2026-07-28"), (METHOD, "tools/call")], MODERN_CALL),
            (&[(VERSION, "2026-07-28"), (NAME, "echo")], MODERN_CALL),
            (&[(VERSION, "2099-01-01"), (METHOD, "tools/call"), (NAME, "echo")], MODERN_CALL),
            (
                &[(VERSION, "2026-07-28"), (METHOD, "tools/call"), (NAME, "echo"), (NAME, "echo")],
                MODERN_CALL,
            ),
            // An old-style body with a modern header: a server routes it as modern.
            (
                &[(VERSION, "2026-07-28"), (METHOD, "tools/call")],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}"#,
            ),
            // Headers on a 2025 request still must not disagree with it.
            (
                &[(METHOD, "ping")],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}"#,
            ),
            (
                &[(NAME, "add")],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}"#,
            ),
            (
                &[(METHOD, "tools/call")],
                br#"[{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}]"#,
            ),
            (
                &[(VERSION, "2026-07-28"), (METHOD, "resources/read"), (NAME, "file:///b")],
                br#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///a","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            ),
        ] {
            let h = headers(pairs);
            assert!(
                check(&h, body).is_err(),
                "passed: {pairs:?} {}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_version_in_the_body_is_found_however_the_client_spelled_its_key() {
        // The check reads the canonical text: a key the client escaped is written plainly
        // there, and a modern request without its headers is refused all the same.
        let escaped = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","_meta":{"io.modelcontextprotocol\/protocol\u0056ersion":"2026-07-28"}}}"#;
        let text = crate::mcp::canonical::canonical(escaped)
            .expect("well-formed")
            .expect("rewritten");
        for pairs in [&[][..], &[(VERSION, "2025-06-18")][..]] {
            assert!(
                check(&headers(pairs), &text).is_err(),
                "passed without its headers: {pairs:?}"
            );
        }
        // Without one, a request with no routing headers passes unparsed, as before.
        let plain = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}"#;
        assert_eq!(check(&headers(&[(VERSION, "2025-06-18")]), plain), Ok(()));
    }
}
