//! Whose credentials a request carries, read wherever a server could find them: every header
//! value, and the query as a server decodes it (`;` separates too, names in any case, escapes
//! undone). A key goes only to its own vendor.

use hyper::HeaderMap;

/// The Gemini credential the request carries, if any: `x-goog-api-key`, a `key` query
/// parameter, a Google API key (`AIza…`) or OAuth access token (`ya29.…`) anywhere.
pub(super) fn google(query: &str, headers: &HeaderMap) -> Option<&'static str> {
    if headers.contains_key("x-goog-api-key") {
        return Some("x-goog-api-key");
    }
    let pairs = decoded(query);
    // An escaped `=` (`key%3D…`) still names `key` to a server that decodes first.
    let named = pairs.iter().any(|(name, _)| {
        name.split('=')
            .next()
            .is_some_and(|n| n.trim().eq_ignore_ascii_case("key"))
    });
    if named {
        return Some("key=");
    }
    let texts = || {
        pairs
            .iter()
            .flat_map(|(n, v)| [n.as_bytes(), v.as_bytes()])
            .chain(std::iter::once(query.as_bytes()))
            .chain(headers.values().map(|v| v.as_bytes()))
    };
    if texts().any(|t| memchr::memmem::find(t, b"AIza").is_some()) {
        return Some("a Google API key (AIza…)");
    }
    if texts().any(|t| token_at(t, b"ya29.")) {
        return Some("a Google OAuth token (ya29.…)");
    }
    None
}

/// Anthropic's key header, or one of its keys (`sk-ant-…`, API or OAuth) anywhere.
pub(super) fn anthropic(query: &str, headers: &HeaderMap) -> bool {
    headers.contains_key("x-api-key") || anywhere(query, headers, b"sk-ant-")
}

/// Another vendor's key where a Gemini request goes: Anthropic's, an OpenAI key (`sk-…`)
/// anywhere, or credentials in any form but a bearer token (`Basic`, a bare key) that Google
/// would not take for its own. The reason, if one is there.
pub(super) fn foreign_to_gemini(
    query: &str,
    headers: &HeaderMap,
) -> Option<(&'static str, &'static str)> {
    if anthropic(query, headers) {
        return Some(("Anthropic", "x-api-key, or an sk-ant- key"));
    }
    if anywhere(query, headers, b"sk-") {
        return Some(("OpenAI", "an sk- key"));
    }
    let other_scheme = headers
        .get_all(hyper::header::AUTHORIZATION)
        .iter()
        .any(|v| {
            let v = v.as_bytes();
            !(v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
        });
    other_scheme.then_some(("another", "an Authorization that is not a bearer token"))
}

/// The query's pairs as a server decodes them.
fn decoded(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.replace(';', "&").as_bytes())
        .map(|(n, v)| (n.into_owned(), v.into_owned()))
        .collect()
}

/// Whether `token` starts a token of any header value or decoded query name or value.
fn anywhere(query: &str, headers: &HeaderMap, token: &[u8]) -> bool {
    decoded(query)
        .iter()
        .flat_map(|(n, v)| [n.as_bytes(), v.as_bytes()])
        .chain(std::iter::once(query.as_bytes()))
        .chain(headers.values().map(|v| v.as_bytes()))
        .any(|t| token_at(t, token))
}

/// Whether `token` (lower-case) occurs in `text`, in any case, at the start or after a byte
/// that cannot be part of a key (`task-1` holds no `sk-` key; `Bearer sk-…`, `key=SK-…`,
/// `\tsk-…` do).
fn token_at(text: &[u8], token: &[u8]) -> bool {
    let text = text.to_ascii_lowercase();
    memchr::memmem::find_iter(&text, token)
        .any(|at| at == 0 || !text[at - 1].is_ascii_alphanumeric())
}

#[cfg(test)]
#[test]
fn keys_are_found_wherever_a_server_reads_them() {
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("value"));
        }
        h
    };
    assert_eq!(
        google("k=%41Iza", &HeaderMap::new()),
        Some("a Google API key (AIza…)")
    );
    assert!(google("", &headers(&[("authorization", "Bearer ya29.a0")])).is_some());
    assert!(google("", &headers(&[("authorization", "Bearer xya29.")])).is_none());
    assert!(anthropic(
        "",
        &headers(&[("x-goog-api-key", "sk-ant-api03-x")])
    ));
    for (query, pairs) in [
        ("", vec![("x-goog-api-key", "sk-proj-x")]),
        ("key=sk-x", vec![]),
        ("", vec![("authorization", "Bearer  sk-x")]),
        ("", vec![("authorization", "Bearer\tsk-x")]),
        ("", vec![("authorization", "sk-x")]),
        ("", vec![("authorization", "Basic dXNlcjpzay14")]),
        ("", vec![("x-other", "sk-x")]),
    ] {
        assert!(
            foreign_to_gemini(query, &headers(&pairs)).is_some(),
            "{query} {pairs:?}"
        );
    }
    assert!(
        foreign_to_gemini(
            "alt=sse",
            &headers(&[
                ("authorization", "Bearer ya29.x"),
                ("x-goog-api-key", "AIzaX"),
                ("x-task", "task-1")
            ])
        )
        .is_none()
    );
}
