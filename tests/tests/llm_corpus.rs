//! The hostile-upstream corpus (`tests/corpus/llm/*.json`) replayed through the real
//! `toolwall run` to the official SDKs — Python (`tests/peers/llm_corpus.py`: `anthropic`,
//! `openai`, `google-genai`) and TypeScript (`tests/peers/llm_corpus.mjs`: `@anthropic-ai/sdk`,
//! `openai`, `@google/genai`), whose
//! response parsers differ: for every case and peer, no call of a denied tool may reach what the
//! SDK assembles; a case's `expect`ed (allowed) calls must. Each case also runs direct (no proxy),
//! where a hostile one must yield a denied call in that peer's SDK, so a case that stopped being
//! an attack (an SDK change) fails loudly. The policy denies `echo` in every spelling:
//! `deny: ["(^|__)echo$"]`, nothing declared. The routes the proxy does not relay (Managed
//! Agents sessions, Message Batches, Assistants, ChatKit) are in the corpus too, with the
//! status the proxy must refuse them with (`refused`).

use std::{path::PathBuf, process::Command};

use serde_json::Value;
use toolwall_tests::{Daemon, peers_dir, python, workspace_root};

fn denied(name: &str) -> bool {
    name == "echo" || name.ends_with("__echo")
}

#[test]
fn no_denied_call_of_the_hostile_corpus_reaches_the_official_sdks() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let root = workspace_root();
    let mut cases: Vec<_> = std::fs::read_dir(root.join("tests/corpus/llm"))
        .expect("corpus directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 5, "the corpus is checked in");
    let node_sdks = peers_dir().join("node/node_modules/openai");
    assert!(
        node_sdks.exists(),
        "{} does not exist: run `cargo xtask peers` (or `cargo xtask test`)",
        node_sdks.display()
    );
    // Each peer binds the fake upstream's port itself, so they run one after the other.
    let peers: [(&str, PathBuf, &str); 2] = [
        ("Python", python(), "llm_corpus.py"),
        ("TypeScript", PathBuf::from("node"), "llm_corpus.mjs"),
    ];
    let mut failures = Vec::new();
    // Both settings of `interceptor.on_malformed`: fail_open may pass only what cannot carry a
    // call (valid JSON its strict reading refuses, a repeated key say, may hide one).
    for on_malformed in ["fail_closed", "fail_open"] {
        let daemon = Daemon::start(&format!(
            "sandbox:\n  mcp:\n    deny: [\"(^|__)echo$\"]\nproxy:\n  listen: 127.0.0.1:0\n  providers:\n    anthropic: http://127.0.0.1:{port}\n    openai: http://127.0.0.1:{port}\n    gemini: http://127.0.0.1:{port}\nnetmon:\n  enabled: false\ninterceptor:\n  on_malformed: {on_malformed}\n"
        ));
        let proxy = daemon.proxy.clone().expect("the LLM proxy is on");
        for (peer, interpreter, script) in &peers {
            let peer = format!("{peer} ({on_malformed})");
            let peer_name = peer.split(' ').next().unwrap_or_default().to_owned();
            let out = Command::new(interpreter)
                .arg(root.join("tests/peers").join(script))
                .arg(port.to_string())
                .arg(&proxy)
                .args(&cases)
                .env("TOOLWALL_PEERS_DIR", peers_dir())
                .output()
                .expect("run the SDK peer");
            assert!(
                out.status.success(),
                "{script} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let report: Value = serde_json::from_slice(&out.stdout).expect("the peer prints JSON");
            for case in &cases {
                let spec: Value =
                    serde_json::from_str(&std::fs::read_to_string(case).expect("read case"))
                        .expect("case");
                let both = &report[case.display().to_string()];
                let calls_of = |label: &str| -> Vec<String> {
                    both[label]["calls"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let (direct, calls) = (calls_of("direct"), calls_of("proxied"));
                let got = &both["proxied"];
                let name = case.file_name().unwrap_or_default().to_string_lossy();
                // A hostile case must be one this SDK acts on without toolwall: a denied call direct.
                // `attacks`: the peers a case is an attack on (the SDKs' parsers differ), all if absent.
                let attacks = spec["attacks"]
                    .as_array()
                    .is_none_or(|a| a.iter().any(|p| p.as_str() == Some(peer_name.as_str())));
                if spec["expect"].is_null() && attacks && !direct.iter().any(|c| denied(c)) {
                    failures.push(format!(
                    "{peer} {name}: not an attack: direct, the SDK assembled no denied call: {}",
                    both["direct"]
                ));
                }
                if calls.iter().any(|c| denied(c)) {
                    failures.push(format!(
                        "{peer} {name}: a denied call reached the SDK: {calls:?}"
                    ));
                }
                // `refused`: the status the proxy must answer the SDK's request with (a route
                // it does not relay), so the case is held by that refusal and not by chance.
                if let Some(status) = spec["refused"].as_u64()
                    && got["status"].as_u64() != Some(status)
                {
                    failures.push(format!(
                        "{peer} {name}: the proxy did not refuse with {status}: {got}"
                    ));
                }
                for want in spec["expect"].as_array().into_iter().flatten() {
                    let want = want.as_str().unwrap_or_default();
                    if !calls.iter().any(|c| c == want) {
                        failures.push(format!(
                            "{peer} {name}: allowed call {want:?} did not arrive: {got}"
                        ));
                    }
                }
            }
        }
        if !failures.is_empty() {
            failures.push(format!(
                "daemon ({on_malformed}) stderr:\n{}",
                daemon.stderr()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
