//! Ids through the filter: a request may not borrow an outstanding request's id (in any
//! spelling the peers read as the same), a response is matched to the one request it answers,
//! and the bound on outstanding requests refuses rather than forgets.

use super::super::{Filter, FilterContext, Outcome};
use super::{IdKey, MAX_PENDING};
use crate::mcp::enforce::Enforcement;

/// A filter whose policy redacts secrets in results, except those of the tool `presign`.
fn filter(dir: &std::path::Path) -> Filter {
    let config = dir.join("toolwall.yaml");
    std::fs::write(
        &config,
        "sandbox:\n  mcp:\n    result_inspection:\n      secrets: redact\n      exempt:\n        - tool: presign\n",
    )
    .expect("config");
    Filter::new(FilterContext {
        gate: Enforcement::new(Some(&config), None, &[])
            .expect("config")
            .gate,
        server_id: "srv".into(),
        server_type: "stdio".into(),
        layer: "shim",
        session_id: "sess".into(),
        events: None,
        approvals: None,
    })
}

fn call(id: &str, tool: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#).into_bytes()
}

fn list(f: &mut Filter) {
    let out = f.on_client(br#"{"jsonrpc":"2.0","id":"l","method":"tools/list"}"#);
    assert!(out.forward.is_some());
    let tools =
        br#"{"jsonrpc":"2.0","id":"l","result":{"tools":[{"name":"presign"},{"name":"get_env"}]}}"#;
    assert!(f.on_server(tools).forward.is_some());
}

fn refused(out: &Outcome<'_>) -> String {
    assert!(out.forward.is_none(), "not forwarded");
    let reply: serde_json::Value = serde_json::from_slice(&out.replies[0]).expect("a reply");
    reply["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A fake AWS access key id (gitleaks' `aws-access-token`).
const AWS: &str = "AKIAQYLPMN5HHHFPZAM2";

/// The server's answer to `id`, a result holding [`AWS`]; what the client gets of it.
fn answer_with_secret(f: &mut Filter, id: &str) -> String {
    let answer = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{AWS}"}}]}}}}"#
    );
    let out = f.on_server(answer.as_bytes());
    String::from_utf8_lossy(out.forward.as_deref().expect("forwarded")).into_owned()
}

#[test]
fn a_call_may_not_borrow_the_id_of_an_exempt_call_still_running() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut f = filter(dir.path());
    list(&mut f);
    assert!(f.on_client(&call("7", "presign")).forward.is_some());
    // `"7"` too: the Python SDK's server routes responses by the id's text.
    for borrowed in ["7", "7.0", "7e0", "70e-1", r#""7""#, r#""7.0""#] {
        let why = refused(&f.on_client(&call(borrowed, "get_env")));
        assert!(why.contains("already used"), "{borrowed}: {why}");
    }
    // Other ids are other requests.
    assert!(f.on_client(&call(r#""7a""#, "get_env")).forward.is_some());
    // A server's answer to `"7a"` is get_env's, inspected: the secret goes.
    let text = answer_with_secret(&mut f, r#""7a""#);
    assert!(!text.contains(AWS), "{text}");
    // The answer to 7 is presign's, exempt: left alone. Then 7 is free again.
    let text = answer_with_secret(&mut f, "7.0");
    assert!(
        text.contains(AWS),
        "an exempt tool's result is left alone: {text}"
    );
    assert!(f.on_client(&call("7", "get_env")).forward.is_some());
}

#[test]
fn two_requests_of_one_batch_may_not_share_an_id() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut f = filter(dir.path());
    list(&mut f);
    let batch = br#"[{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"presign","arguments":{}}},{"jsonrpc":"2.0","id":8.0,"method":"tools/call","params":{"name":"get_env","arguments":{}}}]"#;
    let out = f.on_client(batch);
    let kept: serde_json::Value =
        serde_json::from_slice(out.forward.as_deref().expect("the first goes")).expect("json");
    assert_eq!(kept.as_array().map(Vec::len), Some(1), "{kept}");
    assert_eq!(kept[0]["params"]["name"], "presign");
    assert_eq!(out.replies.len(), 1);
    assert!(String::from_utf8_lossy(&out.replies[0]).contains("already used"));
}

#[test]
fn a_cancelled_call_keeps_its_id_and_its_late_answer_is_no_tools() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut f = filter(dir.path());
    list(&mut f);
    // get_env, cancelled at once, then an exempt call under its id: were the id free, the
    // server's late answer to get_env would be taken for presign's, exempt.
    assert!(f.on_client(&call("9", "get_env")).forward.is_some());
    let cancel =
        br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9}}"#;
    assert!(f.on_client(cancel).forward.is_some());
    let why = refused(&f.on_client(&call("9", "presign")));
    assert!(why.contains("already used"), "{why}");
    // Server requests and notifications have ids of their own, or none: not matched.
    let ping = br#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
    assert!(f.on_server(ping).forward.is_some());
    let text = answer_with_secret(&mut f, "9");
    assert!(!text.contains(AWS), "the late answer is inspected: {text}");
    // Answered: the id is free.
    assert!(f.on_client(&call("9", "presign")).forward.is_some());
}

#[test]
fn past_the_bound_new_requests_are_refused_not_old_ones_forgotten() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut f = filter(dir.path());
    list(&mut f);
    for i in 0..MAX_PENDING {
        let ping = format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#);
        assert!(f.on_client(ping.as_bytes()).forward.is_some(), "{i}");
    }
    let why = refused(&f.on_client(&call("\"one more\"", "presign")));
    assert!(why.contains("waiting for the server"), "{why}");
    // The first is still known: its id is still refused.
    assert!(
        f.on_server(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#)
            .forward
            .is_some()
    );
    assert!(
        f.on_client(&call("0", "presign")).replies[0]
            .starts_with(br#"{"jsonrpc":"2.0","id":0,"error""#)
    );
    assert!(f.on_client(&call("1", "presign")).forward.is_some());
}

#[test]
fn ids_are_keyed_as_the_peers_read_them() {
    let key = |raw: &str| IdKey::of(raw);
    assert_eq!(key("8"), key("8.0"));
    assert_eq!(key("8"), key("0.8e1"));
    assert_eq!(key("-0"), key("0.0"));
    // The Python SDK's server routes responses by the id's text: `7` and `"7"` are one id.
    assert_eq!(key("8"), key("\"8\""));
    assert_eq!(key("8"), key("\"8.0\""));
    assert_ne!(key("\"8\""), key("\"8a\""));
    assert_ne!(key("\"inf\""), key("\"nan\""));
    assert_ne!(key("8"), key("8.5"));
    // A JavaScript peer reads every number as a double: the same double is the same key.
    assert_eq!(key("9007199254740993"), key("9007199254740992"));
    assert_eq!(key("18446744073709551615"), key("18446744073709551616.0"));
    assert_eq!(key("null"), Some(IdKey::Null));
    assert_eq!(key("[1]"), None);
    assert_eq!(key("{}"), None);
    assert_eq!(key("true"), None);
}

#[test]
fn an_id_json_rpc_does_not_allow_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut f = filter(dir.path());
    let out = f.on_client(br#"{"jsonrpc":"2.0","id":[7],"method":"ping"}"#);
    assert!(refused(&out).contains("an id is a string or a number"));
}
