use super::*;

#[test]
fn every_embedded_rule_compiles() {
    builtin()
        .expect("the embedded rule set parses")
        .compile_all()
        .expect("every rule compiles");
}

fn found(text: &str) -> Vec<(String, String)> {
    let scanner = builtin().expect("the embedded rule set compiles");
    let mut out = Vec::new();
    scanner.scan(text, &scanner.woken(text.as_bytes()), &mut out, usize::MAX);
    out.into_iter()
        .map(|f| (f.rule.to_owned(), text[f.range].to_owned()))
        .collect()
}

/// Samples shaped like real credentials (none is live), each with the rule that must find it
/// and the part that is the secret.
const SAMPLES: &[(&str, &str, &str)] = &[
    (
        "aws-access-token",
        "aws_access_key_id = AKIAQYLPMN5HHHFPZAM2",
        "AKIAQYLPMN5HHHFPZAM2",
    ),
    (
        "github-pat",
        "export GITHUB_TOKEN=ghp_4N8mKq2ZxTYvB7wLpR5sD9fJ3hG6cE1aU0iO",
        "ghp_4N8mKq2ZxTYvB7wLpR5sD9fJ3hG6cE1aU0iO",
    ),
    (
        "jwt",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    ),
    (
        "generic-api-key",
        "config: api_key = \"x8Kd93LmQz7Vw2Pr5Tn1Ys4Bc6\"",
        "x8Kd93LmQz7Vw2Pr5Tn1Ys4Bc6",
    ),
    (
        "slack-bot-token",
        "SLACK=xoxb-263594206564-2343594206574-FGqddMF8t08v8N7Oq4i57vs1",
        "xoxb-263594206564-2343594206574-FGqddMF8t08v8N7Oq4i57vs1",
    ),
];

#[test]
fn the_embedded_rule_set_compiles_whole() {
    let scanner = builtin().expect("compiles");
    // 222 rules published, 5 of them need a file path.
    assert_eq!(scanner.rules(), 217);
}

#[test]
fn well_known_key_formats_are_found_with_their_secret() {
    for (rule, text, secret) in SAMPLES {
        let found = found(text);
        assert!(
            found.iter().any(|(r, s)| r == rule && s == secret),
            "{rule} not found in {text:?}: {found:?}"
        );
        // The secret is found inside longer text, after a multi-byte character, too.
        let embedded = format!("résumé ünïcode\nline two {text} and more\n");
        assert!(
            self::found(&embedded)
                .iter()
                .any(|(r, s)| r == rule && s == secret),
            "{rule} not found in {embedded:?}"
        );
    }
}

#[test]
fn a_private_key_block_is_found() {
    let key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx7zJ2m9QmYVb3kz8Hq4pWcT6nR1sLd0fGhJ5vKuXyE2oNiPa\nQwErTyUiOpAsDfGhJkLzXcVbNm1234567890q7Wm2Lx9Pz4Rt8Yk3Vn6Bc1Hs5Jd0\n-----END RSA PRIVATE KEY-----";
    let found = found(&format!("here is the file:\n{key}\n"));
    assert!(
        found
            .iter()
            .any(|(r, s)| r == "private-key" && s.starts_with("-----BEGIN RSA PRIVATE KEY-----")),
        "{found:?}"
    );
}

#[test]
fn ordinary_text_and_known_non_secrets_are_not_findings() {
    for text in [
        "The key to success is a token of appreciation and a secret handshake.",
        "password: changeme",
        "api_key = ${API_KEY}",
        "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
        "token: {{ secrets.GITHUB_TOKEN }}",
        "fn main() { let key = map.get(&id); }",
        "",
    ] {
        assert_eq!(found(text), Vec::<(String, String)>::new(), "{text:?}");
    }
}

#[test]
fn keywords_are_a_prefilter_the_scan_agrees_with() {
    let scanner = builtin().expect("compiles");
    for (_, text, _) in SAMPLES {
        assert!(!scanner.woken(text.as_bytes()).is_empty());
    }
    assert!(
        scanner
            .woken(b"plain words, nothing here at all")
            .is_empty()
    );
}

#[test]
fn re2_classes_are_written_as_ascii() {
    assert_eq!(
        ascii_classes(r"\w+\s\d"),
        r"[0-9A-Za-z_]+[\t\n\x0C\r ][0-9]"
    );
    assert_eq!(ascii_classes(r"[\w.-]{0,50}"), r"[0-9A-Za-z_.-]{0,50}");
    assert_eq!(ascii_classes(r"\bA\b"), r"(?-u:\b)A(?-u:\b)");
    assert_eq!(ascii_classes(r"[[:alnum:]]\\w"), r"[[:alnum:]]\\w");
    assert_eq!(ascii_classes(r"[]\w]"), r"[]0-9A-Za-z_]");
    assert_eq!(ascii_classes(r"\x60"), r"\x60");
    assert_eq!(
        ascii_classes(r"^\${x}$a{2}b{1,}c{1,3}"),
        r"^\$\{x}$a{2}b{1,}c{1,3}"
    );
    // A Unicode letter is no RE2 word character.
    let re = compile("t", r"^\w+$").expect("compiles");
    assert!(re.is_match("abc_9") && !re.is_match("é"));
}

#[test]
fn entropy_is_gitleaks_shannon_entropy() {
    assert_eq!(shannon_entropy(""), 0.0);
    assert_eq!(shannon_entropy("aaaa"), 0.0);
    assert!((shannon_entropy("abcd") - 2.0).abs() < 1e-9);
}

#[test]
fn a_scan_stops_at_its_limit_and_says_so() {
    let scanner = builtin().expect("compiles");
    let text = "AKIAQYLPMN5HHHFPZAM2 ".repeat(50);
    let mut out = Vec::new();
    let woken = scanner.woken(text.as_bytes());
    assert!(!scanner.scan(&text, &woken, &mut out, 10));
    assert_eq!(out.len(), 10);
    let mut all = Vec::new();
    assert!(scanner.scan(&text, &woken, &mut all, usize::MAX));
    assert_eq!(all.len(), 50);
}
