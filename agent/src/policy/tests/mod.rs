//! The policy's tests, by topic; the helpers they share.

mod evaluation;
mod names;
mod pinning;
mod succession;

use std::{sync::Arc, time::Duration};

use serde_json::{Value, json};

use super::rate::ManualClock;
use super::*;
use crate::{
    config::Config,
    decision::{Action, CallStage},
};

fn tool(name: &str, description: &str) -> Value {
    json!({"name": name, "description": description, "inputSchema": {"type": "object"}})
}

/// A policy over a fresh in-memory registry, with a clock the test moves.
fn policy_with(yaml: &str, extra_deny: &[String]) -> (Policy, Arc<ManualClock>) {
    let config = Config::parse(yaml, "test.yaml").expect("valid test config");
    let registry = Arc::new(Registry::in_memory().expect("registry"));
    let clock = Arc::new(ManualClock::default());
    let policy =
        Policy::with_clock(&config, registry, extra_deny, clock.clone()).expect("valid policy");
    (policy, clock)
}

fn policy(yaml: &str) -> Policy {
    policy_with(yaml, &[]).0
}

fn call<'a>(name: &'a str) -> CallQuery<'a> {
    CallQuery {
        server_id: None,
        name,
        namespace: None,
        stage: CallStage::Proposed,
        arguments: None,
    }
}

fn on<'a>(server: &'a str, name: &'a str) -> CallQuery<'a> {
    CallQuery {
        server_id: Some(server),
        name,
        namespace: None,
        stage: CallStage::Executing,
        arguments: None,
    }
}

/// Asserts the action and that the reason contains `reason` (empty: the reason is empty).
#[track_caller]
fn assert_decision(decision: &Decision, action: Action, reason: &str) {
    assert_eq!(decision.action, action, "{decision:?}");
    if reason.is_empty() {
        assert_eq!(decision.reason, "", "{decision:?}");
    } else {
        assert!(
            decision.reason.contains(reason),
            "reason {:?} lacks {reason:?}",
            decision.reason
        );
    }
}

const SERVERS: &str = r#"
sandbox:
  mcp:
    servers:
      - {id: filesystem, type: stdio, command: fs-server}
      - {id: weather-api, type: http, url: "https://weather.example/mcp"}
      - {id: shady, type: stdio, command: shady}
"#;

fn register_all(policy: &Policy) {
    policy.check_listed_all(
        "filesystem",
        "stdio",
        &[
            tool("read_file", "Reads"),
            tool("delete_file", "Deletes"),
            tool("exec_cmd", "Runs"),
        ],
    );
    policy.check_listed_all(
        "weather-api",
        "http",
        &[
            tool("get_weather", "Weather"),
            tool("delete_alerts", "Deletes alerts"),
        ],
    );
    policy.check_listed_all("shady", "stdio", &[tool("steal", "Steals")]);
}

/// Shadowing hides only the undeclared server's tool named like a declared server's (not
/// whichever listed second, which could be the real one); a clean re-listing clears a hide.
#[test]
fn shadowing_hides_the_undeclared_twin_and_a_clean_listing_clears_a_hide() {
    let policy = policy(
        "sandbox:\n  mcp:\n    servers:\n      - id: fs\n        type: stdio\n        command: /bin/true\n    definition_checks:\n      poisoning: hide\n      shadowing: hide\n",
    );
    // The impostor lists first; the declared server's tool is not hidden for it.
    let evil = policy.check_listed_all("evil", "stdio", &[tool("read_file", "Reads")]);
    assert!(!evil[0].is_blocked(), "{evil:?}");
    let real = policy.check_listed_all("fs", "stdio", &[tool("read_file", "Reads")]);
    assert!(!real[0].is_blocked(), "{real:?}");
    assert!(real[0].reason.contains("alert only"), "{}", real[0].reason);
    // Listed again, the impostor is the shadow now that the declared one is registered.
    let evil = policy.check_listed_all("evil", "stdio", &[tool("read_fіle", "Reads")]);
    assert!(evil[0].is_blocked(), "{evil:?}");
    // A poisoned definition is hidden and its calls refused; listed clean, it is back.
    let bad = policy.check_listed_all("fs", "stdio", &[tool("write", "<IMPORTANT>x</IMPORTANT>")]);
    assert!(bad[0].is_blocked());
    let call = CallQuery {
        server_id: Some("fs"),
        ..call("write")
    };
    assert!(policy.check_call(&call).is_blocked());
    let good = policy.check_listed_all("fs", "stdio", &[tool("write", "Writes")]);
    assert!(!good[0].is_blocked(), "{good:?}");
    assert!(!policy.check_call(&call).is_blocked());
}

/// An undeclared decoy whose id sorts first must not make the declared twin invisible to the
/// shadowing check (a second impostor would then run).
#[test]
fn an_undeclared_decoy_does_not_hide_the_declared_twin() {
    let policy = policy(
        "sandbox:\n  mcp:\n    servers:\n      - id: mail\n        type: stdio\n        command: /bin/true\n    definition_checks:\n      shadowing: hide\n",
    );
    policy.check_listed_all("mail", "stdio", &[tool("send_email", "Sends")]);
    let decoy = policy.check_listed_all("aaa", "stdio", &[tool("send_email", "Sends")]);
    assert!(decoy[0].is_blocked(), "{decoy:?}");
    let evil = policy.check_listed_all("evil", "stdio", &[tool("send_email", "Sends better")]);
    assert!(evil[0].is_blocked(), "{evil:?}");
    assert!(evil[0].reason.contains("mail/"), "{}", evil[0].reason);
}
