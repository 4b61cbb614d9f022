//! Who a client request speaks for, as the upstream can tell: what a server lists and runs may
//! depend on any header that reaches it (an `Authorization`, a cookie, an `X-Api-Key`) and, at
//! the 2026-07-28 revision, on the `_meta` envelope each request carries (its capabilities).
//! A tool list is kept per identity (`listing.rs`), and a bridged session, which holds the
//! upstream credentials it was opened with, takes requests only from its opener's identity.
//!
//! Every header counts except those that describe one request rather than its sender: its
//! body and framing (`Content-*`, hop-by-hop), what it accepts, MCP's own per-message headers
//! (the session id is keyed apart), caching, W3C trace context and a browser's fetch metadata.
//! A header not named here counts, so a server's own credential header is never missed; a
//! client whose other headers change per request only costs a listing per request. Repeated
//! headers count in the order they came (a server reads the first, or all).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};

use http::HeaderMap;
use serde_json::{Map, Value};

/// Headers that say what one request is or how it travels, not who sends it. Only names MCP,
/// HTTP and browsers give that meaning: a server's own header (`Mcp-Api-Key`, `Sec-Api-Key`)
/// counts, whatever its prefix.
fn describes_request(name: &str) -> bool {
    matches!(
        name,
        "host"
            | "origin"
            | "accept"
            | "accept-encoding"
            | "cache-control"
            | "pragma"
            | "last-event-id"
            | "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-connection"
            | "expect"
            | "traceparent"
            | "tracestate"
            | "baggage"
            | "mcp-session-id"
            | "mcp-protocol-version"
            | "mcp-method"
            | "mcp-name"
    ) || name.starts_with("content-")
        || name.starts_with("mcp-param-")
        || name.starts_with("sec-fetch-")
        || name.starts_with("sec-ch-")
}

/// Keys identities by a keyed hash: nothing that holds one holds a token.
#[derive(Default)]
pub(super) struct Identities {
    hasher: RandomState,
}

impl Identities {
    /// The identity of a request with these headers and (2026-07-28) `_meta` envelope.
    pub(super) fn of(&self, headers: &HeaderMap, envelope: Option<&Map<String, Value>>) -> u64 {
        let mut sent: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .filter(|(n, _)| !describes_request(n))
            .collect();
        // The order a client writes its headers in says nothing of who it is; the order of one
        // header's values may (a stable sort keeps it).
        sent.sort_by_key(|(name, _)| *name);
        let mut h = self.hasher.build_hasher();
        sent.hash(&mut h);
        // serde_json's map is ordered by key: one envelope has one text.
        envelope
            .map(|e| Value::Object(e.clone()).to_string())
            .hash(&mut h);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn credentials_of_any_name_tell_identities_apart() {
        let ids = Identities::default();
        let guest = ids.of(&headers(&[("x-api-key", "guest")]), None);
        let admin = ids.of(&headers(&[("x-api-key", "admin")]), None);
        let nothing = ids.of(&headers(&[]), None);
        assert_ne!(guest, admin);
        assert_ne!(guest, nothing);
        let cookie = ids.of(&headers(&[("cookie", "sid=1")]), None);
        assert_ne!(cookie, nothing);
        // A server's own header counts whatever its prefix.
        for own in ["mcp-api-key", "sec-api-key", "referer", "accept-language"] {
            let mut h = HeaderMap::new();
            h.append(own, http::HeaderValue::from_static("admin"));
            assert_ne!(ids.of(&h, None), nothing, "{own}");
        }
        // Repeated values in another order are another identity.
        assert_ne!(
            ids.of(
                &headers(&[("x-api-key", "admin"), ("x-api-key", "guest")]),
                None
            ),
            ids.of(
                &headers(&[("x-api-key", "guest"), ("x-api-key", "admin")]),
                None
            )
        );
    }

    #[test]
    fn what_describes_one_request_is_not_identity() {
        let ids = Identities::default();
        let get = headers(&[
            ("authorization", "Bearer a"),
            ("accept", "text/event-stream"),
            ("cache-control", "no-store"),
            ("user-agent", "sdk/1"),
        ]);
        let post = headers(&[
            ("user-agent", "sdk/1"),
            ("content-type", "application/json"),
            ("content-length", "42"),
            ("mcp-protocol-version", "2025-06-18"),
            ("mcp-session-id", "s1"),
            ("traceparent", "00-1-2-01"),
            ("authorization", "Bearer a"),
        ]);
        assert_eq!(ids.of(&get, None), ids.of(&post, None));
    }

    #[test]
    fn the_envelope_tells_identities_apart() {
        let ids = Identities::default();
        let h = headers(&[]);
        let sampling: Map<String, Value> = serde_json::from_str(
            r#"{"io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}"#,
        )
        .expect("json");
        let none: Map<String, Value> =
            serde_json::from_str(r#"{"io.modelcontextprotocol/clientCapabilities":{}}"#)
                .expect("json");
        assert_ne!(ids.of(&h, Some(&sampling)), ids.of(&h, Some(&none)));
        assert_ne!(ids.of(&h, Some(&none)), ids.of(&h, None));
        assert_eq!(ids.of(&h, Some(&none)), ids.of(&h, Some(&none.clone())));
    }
}
