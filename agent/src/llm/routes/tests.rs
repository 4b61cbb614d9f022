use hyper::{HeaderMap, Method};

use super::*;

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, v.parse().expect("header value"));
    }
    h
}

fn routed(
    method: Method,
    path: &str,
    h: &[(&'static str, &'static str)],
) -> Result<Routed, Refused> {
    route(&method, path, &headers(h), &[])
}

#[test]
fn the_dialect_routes_go_to_their_provider() {
    for (method, path, provider, dialect) in [
        (
            Method::POST,
            "/v1/messages?beta=true",
            Provider::Anthropic,
            Dialect::Anthropic,
        ),
        (
            Method::POST,
            "/v1/chat/completions",
            Provider::Openai,
            Dialect::OpenAiChat,
        ),
        (
            Method::POST,
            "/v1/responses",
            Provider::Openai,
            Dialect::OpenAiResponses,
        ),
        (
            Method::GET,
            "/v1/responses/resp_1",
            Provider::Openai,
            Dialect::OpenAiResponses,
        ),
        (
            Method::POST,
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
            Provider::Gemini,
            Dialect::Gemini,
        ),
        (
            Method::POST,
            "/v1/models/gemini-3-pro-preview:generateContent",
            Provider::Gemini,
            Dialect::Gemini,
        ),
    ] {
        let r = routed(method, path, &[]).expect(path);
        assert_eq!(r.provider, provider, "{path}");
        assert_eq!(r.reading, Reading::Dialect(dialect), "{path}");
    }
    let r = routed(Method::POST, "/v1/messages", &[]).expect("messages");
    assert_eq!(r.request, Some(request::Route::Dialect(Dialect::Anthropic)));
}

#[test]
fn routes_without_calls_are_read_as_documents_and_shared_ones_follow_the_vendor_named() {
    let r = routed(
        Method::GET,
        "/v1/models",
        &[("anthropic-version", "2023-06-01")],
    )
    .expect("models");
    assert_eq!(
        (r.provider, r.reading),
        (Provider::Anthropic, Reading::Document)
    );
    let r = routed(Method::GET, "/v1/models", &[("authorization", "Bearer x")]).expect("models");
    assert_eq!(
        (r.provider, r.reading),
        (Provider::Openai, Reading::Document)
    );
    let r = routed(Method::HEAD, "/", &[]).expect("probe");
    assert_eq!(r.provider, Provider::Anthropic);
    let r = routed(Method::POST, "/v1/messages/count_tokens", &[]).expect("count");
    assert_eq!(r.request, Some(request::Route::Dialect(Dialect::Anthropic)));
    let r = routed(Method::POST, "/v1/conversations/c1/items", &[]).expect("items");
    assert_eq!(r.request, Some(request::Route::ConversationItems));
    // Gemini's models list shares the path; its key names the vendor.
    let r = routed(Method::GET, "/v1beta/models", &[("x-goog-api-key", "k")]).expect("models");
    assert_eq!(
        (r.provider, r.reading),
        (Provider::Gemini, Reading::Document)
    );
    let r = routed(Method::GET, "/v1/models?key=k", &[]).expect("models");
    assert_eq!(r.provider, Provider::Gemini);
    let r = routed(
        Method::POST,
        "/v1beta/models/gemini-2.5-flash:countTokens",
        &[("x-goog-api-key", "k")],
    )
    .expect("countTokens");
    assert_eq!(r.request, Some(request::Route::Dialect(Dialect::Gemini)));
}

#[test]
fn every_other_route_is_refused_naming_the_route_and_the_setting() {
    for (method, path) in [
        // Managed Agents, Assistants, Batches, ChatKit, files, and what does not exist yet.
        (Method::GET, "/v1/sessions/s1/events/stream"),
        (Method::GET, "/v1/sessions/s1/events"),
        (Method::GET, "/v1/threads/t1/runs/r1"),
        (Method::POST, "/v1/threads/t1/runs/r1/submit_tool_outputs"),
        (Method::POST, "/v1/messages/batches"),
        (Method::GET, "/v1/messages/batches/b1/results"),
        (Method::GET, "/v1/chatkit/threads/t/items"),
        (Method::GET, "/v1/files/f1/content"),
        (Method::GET, "/v1/models/a/b"),
        // Dialect routes by whole path and method: no suffix, no other method.
        (Method::GET, "/v1/files/f/content/v1/messages"),
        (Method::GET, "/v1/sessions/v1/messages"),
        (Method::GET, "/v1beta/models/gemini/responses"),
        (Method::GET, "/v1/files/chat/completions/x"),
        (Method::PUT, "/v1/messages"),
        (Method::GET, "/v1/messages"),
        (Method::PATCH, "/v1/responses"),
        (Method::POST, "/v1/models"),
        (Method::GET, "/"),
        // Gemini's APIs that carry calls or contents no dialect reads, and shapes of its
        // routes that are not its routes.
        (Method::POST, "/v1beta/cachedContents"),
        (Method::POST, "/v1beta/models/gemini:batchGenerateContent"),
        (Method::GET, "/v1beta/batches/b1"),
        (Method::POST, "/v1beta/models/a:b:generateContent"),
        (Method::POST, "/v1beta/models/:generateContent"),
        (Method::POST, "/v2/models/gemini:generateContent"),
        (Method::POST, "/v1beta/tunedModels/t:generateContent"),
        (Method::GET, "/v1beta/models/gemini:streamGenerateContent"),
        (Method::POST, "/v1beta/models/gemini/streamGenerateContent"),
    ] {
        let err = routed(method.clone(), path, &[]).expect_err(path);
        let text = err.to_string();
        assert!(
            text.contains(path) && text.contains("proxy.pass_through"),
            "{text}"
        );
    }
}

#[test]
fn a_key_is_never_sent_to_another_vendor() {
    let err = routed(
        Method::POST,
        "/v1/messages",
        &[("x-goog-api-key", "AIza"), ("anthropic-version", "1")],
    )
    .expect_err("gemini key");
    assert!(
        matches!(
            err,
            Refused::ForeignKey {
                provider: "anthropic",
                ..
            }
        ),
        "{err}"
    );
    // The same key in the query of a Gemini route is that route's credential.
    let ok = routed(
        Method::POST,
        "/v1beta/models/g:generateContent?alt=sse&key=AIza",
        &[],
    )
    .expect("gemini key in the query of a gemini route");
    assert_eq!(ok.provider, Provider::Gemini);
    for query in ["KEY=AIza", "%6bey=x", "x=1;key=x", "key%3Dx", "a=AIzaSyX"] {
        let path = format!("/v1/chat/completions?{query}");
        assert!(
            matches!(
                routed(Method::POST, &path, &[]),
                Err(Refused::ForeignKey { .. })
            ),
            "{path}"
        );
        // On a route of no provider, the key is what the refusal names.
        let path = format!("/v1/files/f?{query}");
        assert!(
            matches!(
                routed(Method::GET, &path, &[]),
                Err(Refused::ForeignKey { provider: "no", .. })
            ),
            "{path}"
        );
    }
    let err = routed(
        Method::POST,
        "/v1/responses",
        &[("authorization", "Bearer AIzaSyX")],
    )
    .expect_err("a Google key as a bearer token");
    assert!(matches!(err, Refused::ForeignKey { .. }), "{err}");
    // Anthropic's and OpenAI's keys never go to Gemini; Google's own OAuth tokens do.
    let gemini = "/v1beta/models/g:streamGenerateContent?alt=sse";
    for (header, value) in [
        ("x-api-key", "sk-ant-api03-x"),
        ("authorization", "Bearer sk-ant-oat01-x"),
        ("authorization", "Bearer sk-proj-x"),
        ("authorization", "bearer SK-x"),
    ] {
        let err = routed(Method::POST, gemini, &[(header, value)]).expect_err(value);
        assert!(matches!(err, Refused::KeyToGemini { .. }), "{value}: {err}");
    }
    let ok = routed(Method::POST, gemini, &[("authorization", "Bearer ya29.x")]).expect("oauth");
    assert_eq!(ok.provider, Provider::Gemini);
    let err = routed(
        Method::POST,
        "/v1/chat/completions",
        &[("x-api-key", "sk-ant")],
    )
    .expect_err("anthropic key to openai");
    assert_eq!(err, Refused::AnthropicKeyToOpenai);
    for token in ["Bearer sk-ant-api03-x", "Bearer sk-ant-oat01-x"] {
        let err = routed(Method::GET, "/v1/models", &[("authorization", token)])
            .expect_err("an Anthropic key as a bearer token, to openai");
        assert_eq!(err, Refused::AnthropicKeyToOpenai, "{token}");
    }
    // With the vendor named, the same token goes where it belongs.
    let ok = routed(
        Method::GET,
        "/v1/models",
        &[
            ("authorization", "Bearer sk-ant-oat01-x"),
            ("anthropic-version", "1"),
        ],
    )
    .expect("anthropic");
    assert_eq!(ok.provider, Provider::Anthropic);
}

#[test]
fn pass_through_entries_relay_uninspected_what_they_list() {
    let list = [
        PassThrough::parse(Provider::Openai, "GET /v1/files/*/content").expect("parse"),
        PassThrough::parse(Provider::Anthropic, "* /v1/messages/batches/**").expect("parse"),
    ];
    let r = route(
        &Method::GET,
        "/v1/files/f1/content",
        &HeaderMap::new(),
        &list,
    )
    .expect("listed");
    assert_eq!(
        (r.provider, r.reading, r.request),
        (Provider::Openai, Reading::Uninspected, None)
    );
    let r = route(
        &Method::DELETE,
        "/v1/messages/batches/b/x",
        &HeaderMap::new(),
        &list,
    )
    .expect("listed");
    assert_eq!(r.provider, Provider::Anthropic);
    // Another method, a longer path, a shorter one: not listed.
    for (m, p) in [
        (Method::POST, "/v1/files/f1/content"),
        (Method::GET, "/v1/files/f1/content/x"),
        (Method::GET, "/v1/files/f1"),
    ] {
        assert!(route(&m, p, &HeaderMap::new(), &list).is_err(), "{m} {p}");
    }
    // A listed route is still a dialect route when it is one: the dialect reads it.
    let all = [PassThrough::parse(Provider::Openai, "* /**").expect("parse")];
    let r = route(&Method::POST, "/v1/messages", &HeaderMap::new(), &all).expect("messages");
    assert_eq!(r.reading, Reading::Dialect(Dialect::Anthropic));
}

#[test]
fn pass_through_entries_that_cannot_be_read_say_why() {
    for bad in [
        "/v1/files",
        "get /v1/files",
        "GET v1/files",
        "GET /v1//files",
        "GET /v1/../files",
        "GET /v1/**/x",
        "GET /v1/fi*",
        "GET /v1/files?x=1",
        "GET /v1/%66iles",
    ] {
        assert!(PassThrough::parse(Provider::Openai, bad).is_err(), "{bad}");
    }
}
