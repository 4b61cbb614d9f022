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
use std::collections::BTreeMap;
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

/// An object's members by key (keys unescaped; the canonical text has no duplicate keys), each
/// value as written: a member of an unexpected type still counts as present.
type Members<'a> = BTreeMap<Cow<'a, str>, &'a RawValue>;

/// The `_meta` key of a request's protocol version, and its searcher (made once: making one
/// costs more than searching a call's text with it).
const BODY_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
static BODY_VERSION_FINDER: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(BODY_VERSION));

/// Why the headers of a request do not match its body.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Mismatch(pub String);

/// Checks a POST's routing headers against its body: the canonical text the filter forwards
/// (`mcp/canonical.rs`), a JSON object or a batch, in which no key is written with escapes.
pub(crate) fn check(headers: &HeaderMap, body: &[u8]) -> Result<(), Mismatch> {
    // A routing header spelled with `_` for `-` (`Mcp_Name`): a CGI-style gateway reads it as
    // that header (`HTTP_MCP_NAME`) and would route on a name no one checked.
    if let Some(name) = headers.keys().find(|n| spelled_like_routing(n.as_str())) {
        return Err(Mismatch(format!(
            "the {name} header is spelled like a routing header (a gateway may read it as one)"
        )));
    }
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
        // No routing header can say what a batch's requests are, nor can a 2026-07-28
        // request (which needs them) be one of them.
        return match header_method.or(header_name) {
            Some(_) => Err(Mismatch(
                "routing headers (mcp-method, mcp-name) on a batch".to_owned(),
            )),
            None if BODY_VERSION_FINDER.find(body).is_some() => Err(Mismatch(
                "a batch that names a protocol version in a _meta: a 2026-07-28 request is sent alone, with its routing headers".to_owned(),
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
    // `params` and its `_meta` as objects (anything else has neither a name nor a version).
    let params = members(message.params);
    let meta = members(params.get("_meta").copied());
    let body_version = meta.get(BODY_VERSION).map(|v| string(v));
    if let (Some(header), Some(body)) = (header_version, &body_version)
        && body.as_deref() != Some(header)
    {
        return Err(Mismatch(match body {
            Some(body) => format!(
                "the mcp-protocol-version header ({header}) does not match the request's protocol version ({body})"
            ),
            None => format!(
                "the mcp-protocol-version header ({header}) does not match the request's protocol version, which is no string"
            ),
        }));
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
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return Ok(()),
    };
    let value = params.get(field).and_then(|v| string(v));
    match header_name.map(decode) {
        Some(Some(h)) if Some(h.as_str()) == value.as_deref() => Ok(()),
        Some(_) => Err(Mismatch(format!(
            "the mcp-name header does not match the request's {field:?} parameter"
        ))),
        None if modern => Err(Mismatch(format!(
            "a 2026-07-28 {method} request without the mcp-name header"
        ))),
        None => Ok(()),
    }
}

/// `raw` read as an object's members; none when it is absent or no object.
fn members(raw: Option<&RawValue>) -> Members<'_> {
    raw.and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default()
}

/// A member's text when it is a string; `None` for any other value (a number, `null`), which
/// no header can match.
fn string(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str(raw.get()).ok()
}

/// Whether a header name is a routing header's with `_` in place of one or more `-`.
fn spelled_like_routing(name: &str) -> bool {
    name.contains('_')
        && [VERSION, METHOD, NAME].iter().any(|routing| {
            routing.len() == name.len()
                && routing
                    .bytes()
                    .zip(name.bytes())
                    .all(|(r, n)| r == n || (r == b'-' && n == b'_'))
        })
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
            // A member of another type beside the version: the request is modern all the same.
            (
                &[(VERSION, "2025-06-18")][..],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","uri":7,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            ),
            (
                &[],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"name":1,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            ),
            (
                &[(METHOD, "tools/call")],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","uri":true,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            ),
            // A version that is no string still makes the request modern.
            (
                &[],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","_meta":{"io.modelcontextprotocol/protocolVersion":null}}}"#,
            ),
            (
                &[(VERSION, "2026-07-28"), (METHOD, "tools/call"), (NAME, "echo")],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","_meta":{"io.modelcontextprotocol/protocolVersion":20260728}}}"#,
            ),
            // A name that is no string matches no header.
            (
                &[(VERSION, "2026-07-28"), (METHOD, "tools/call"), (NAME, "1")],
                br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":1,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            ),
            // A modern request in a batch.
            (
                &[],
                br#"[{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}]"#,
            ),
            // A routing header spelled with `_`.
            (&[("mcp_name", "echo")], br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add"}}"#),
            (&[("mcp_method", "ping")], br#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#),
            (&[("mcp-protocol_version", "2025-06-18")], br#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#),
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
