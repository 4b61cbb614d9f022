//! Answers that name their question, through the real binary: an id listed before a daemon
//! restart answers nothing after it (the new daemon's question of the same count has another
//! id), and an answer naming another digest than the waiting question's, or none, is refused
//! with 409 and the question shown, its hidden characters escaped as every view escapes them.

mod approval_common;
mod mcp_common;

use approval_common::*;
use serde_json::{Value, json};
use toolwall_tests::Daemon;

/// The daemon restarts between a person's listing and their answer: the id they listed is
/// refused by the new daemon, saying it did not ask it, and never taken for the new daemon's
/// question of the same count, which has another id.
#[test]
fn an_id_listed_before_a_restart_answers_nothing_after_it() {
    let mut daemon = Daemon::start(&config(60, ""));
    let client = shim_client(&daemon, &json!([["get-sum", {"a": 500, "b": 1}]]));
    let listed = next_question(&daemon);
    let (old_id, old_digest) = id_and_digest(&listed);
    daemon.kill9();
    let report = finished(client);
    assert!(
        report["calls"][0]["error"]["message"].is_string(),
        "a question dies with its daemon, and its call is not run: {report}"
    );

    daemon.relaunch("stderr-after");
    let client = shim_client(&daemon, &json!([["get-sum", {"a": 9999, "b": 1}]]));
    let asked = next_question(&daemon);
    assert_eq!(asked["arguments"], json!({"a": 9999, "b": 1}));
    let (new_id, new_digest) = id_and_digest(&asked);
    assert_ne!(new_id, old_id);
    assert_eq!(
        new_id.split_once('-').map(|p| p.1),
        old_id.split_once('-').map(|p| p.1),
        "the new run counts from 1 too"
    );
    for answer in [
        vec!["approve", old_id.as_str()],
        vec!["approve", old_id.as_str(), "--digest", old_digest.as_str()],
    ] {
        let out = daemon.toolwall(&answer);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && said.contains(&format!("approval {old_id} was not asked by this daemon")),
            "{answer:?}: {said}"
        );
    }
    let (status, body) = web_answer(
        &daemon,
        &old_id,
        &json!({"approve": true, "digest": old_digest}),
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        daemon.json_lines(&["approvals", "--json"]),
        [asked],
        "the new question still waits"
    );

    assert!(
        daemon
            .toolwall(&["deny", &new_id, "--digest", &new_digest])
            .status
            .success()
    );
    let report = finished(client);
    assert!(
        report["calls"][0]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("denied by uid 0 (cli) (approval {new_id};")),
        "{report}"
    );
}

/// An answer names the digest of what its person was shown: one naming another (a listing
/// gone stale, a mistyped digest) or none answers nothing, and the 409 shows the call that
/// waits — its hidden characters escaped, as `toolwall approvals` shows them.
#[test]
fn an_answer_naming_another_digest_is_refused_with_the_call_that_waits() {
    let daemon = Daemon::start(&config(60, ""));
    let client = shim_client(
        &daemon,
        &json!([["get-sum", {"a": 700, "b": 1, "note": "read\u{2060}_file"}]]),
    );
    let asked = next_question(&daemon);
    let (id, digest) = id_and_digest(&asked);
    let stale = if digest == "0123456789abcdef" {
        "fedcba9876543210"
    } else {
        "0123456789abcdef"
    };

    let (status, body) = web_answer(&daemon, &id, &json!({"approve": true, "digest": stale}));
    assert_eq!(status, 409, "{body}");
    let refused: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(refused["question"], asked, "{refused}");
    let error = refused["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("not the one digest {stale} names"))
            && error.contains(&format!(
                r#"approval {id} (digest {digest}): get-sum on everything (session -) with {{"a":700,"b":1,"note":"read\u{{2060}}_file"}}"#
            )),
        "{error}"
    );
    let (status, body) = web_answer(&daemon, &id, &json!({"approve": true}));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("names none"), "{body}");

    let out = daemon.toolwall(&["approve", &id, "--digest", stale]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("409") && said.contains(r"read\u{2060}_file"),
        "{said}"
    );
    let listed = daemon.toolwall(&["approvals"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&digest) && listed.contains(r"read\u{2060}_file"),
        "{listed}"
    );

    let out = daemon.toolwall(&["approve", &id, "--digest", &digest]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(r"read\u{2060}_file"),
        "{out:?}"
    );
    let report = finished(client);
    assert_eq!(
        report["calls"][0]["result"]["content"][0]["text"], "The sum of 700 and 1 is 701.",
        "{report}"
    );
}
