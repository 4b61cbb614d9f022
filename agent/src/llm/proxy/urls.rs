//! Provider URLs in answers: an absolute URL at a configured upstream's host (a batch's
//! `results_url`, a file's download link) is one an SDK fetches directly, around the proxy and
//! its judging, so an answer that holds one is refused rather than relayed.

use serde_json::Value;

/// The first string of `body` that is an http(s) URL at one of `hosts` (lower-case), if any.
/// A body that is not JSON is searched as text.
pub(super) fn provider_url(body: &[u8], hosts: &[String]) -> Option<String> {
    let text = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    match serde_json::from_slice::<Value>(text) {
        Ok(value) => first_in(&value, hosts),
        Err(_) => {
            let text = String::from_utf8_lossy(text);
            text.split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>'))
                .find(|word| at_host(word, hosts))
                .map(str::to_owned)
        }
    }
}

fn first_in(value: &Value, hosts: &[String]) -> Option<String> {
    match value {
        Value::String(s) => at_host(s, hosts).then(|| s.clone()),
        Value::Array(items) => items.iter().find_map(|v| first_in(v, hosts)),
        Value::Object(map) => map.values().find_map(|v| first_in(v, hosts)),
        _ => None,
    }
}

/// Whether `text` is an http(s) URL whose host is one of `hosts`.
fn at_host(text: &str, hosts: &[String]) -> bool {
    let lower = text.trim().to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    let host = host.trim_end_matches('.');
    hosts.iter().any(|h| h == host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        vec!["api.anthropic.com".into(), "api.openai.com".into()]
    }

    #[test]
    fn a_url_at_a_provider_host_is_found_however_written() {
        for body in [
            r#"{"id":"b","results_url":"https://api.anthropic.com/v1/messages/batches/b/results"}"#,
            r#"{"x":[{"url":"HTTPS://API.OPENAI.COM./v1/files/f/content"}]}"#,
            r#"{"u":"https:\/\/api.anthropic.com\/v1\/x"}"#,
            r#"{"u":"https://user@api.anthropic.com:443/x"}"#,
            "see https://api.openai.com/v1/files/f",
        ] {
            assert!(provider_url(body.as_bytes(), &hosts()).is_some(), "{body}");
        }
    }

    #[test]
    fn other_urls_and_mentions_are_not() {
        for body in [
            r#"{"url":"https://example.com/api.anthropic.com"}"#,
            r#"{"text":"api.anthropic.com is the host"}"#,
            r#"{"url":"https://api.anthropic.com.evil.example/x"}"#,
            r#"{"data":[]}"#,
        ] {
            assert_eq!(provider_url(body.as_bytes(), &hosts()), None, "{body}");
        }
    }
}
