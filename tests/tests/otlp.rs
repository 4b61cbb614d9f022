//! OTLP export checked by a collector that decodes the wire with the official
//! `opentelemetry-proto` package (`tests/peers/otlp_collector.py`): events leave as log
//! records and correlated calls as spans, over OTLP/HTTP and OTLP/gRPC; a collector that is
//! down and then refuses loses nothing and gets nothing twice; a restart resumes at the
//! cursor.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolwall_tests::{Daemon, OtlpCollector as Collector, free_port, http_get, http_unix};

fn now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.%6NZ"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One call seen by the LLM layer and run by the shim (one span), and a listing (a log only).
fn call_events(session: &str, tool: &str, n: u64) -> Vec<String> {
    call_events_with(session, tool, n, json!({"n": n}))
}

/// [`call_events`] with these arguments.
fn call_events_with(session: &str, tool: &str, n: u64, input: Value) -> Vec<String> {
    let at = now();
    let base = json!({"timestamp": at, "session_id": session, "server_id": "everything"});
    let with = |kind: &str, fields: Value| {
        let mut e = base.clone();
        e["type"] = kind.into();
        e.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        e.to_string()
    };
    vec![
        with(
            "mcp_tool_call_intercepted",
            json!({"request_id": "r", "dialect": "anthropic", "tool_name": format!("mcp__everything__{tool}"),
                "server_tool": tool, "tool_call_id": format!("toolu_{n}"), "input": input,
                "server_type": "stdio", "server_addr": "", "tool_hash": "", "action": "allow", "reason": ""}),
        ),
        with(
            "mcp_tool_called",
            json!({"server_type": "stdio", "tool_name": tool, "jsonrpc_id": n, "input": input,
                "action": "allow", "reason": "", "layer": "shim"}),
        ),
        with(
            "mcp_tool_seen",
            json!({"server_type": "stdio", "tool_name": tool, "tool_hash": "h", "action": "allow", "reason": ""}),
        ),
    ]
}

fn post(daemon: &Daemon, events: &[String]) {
    let (status, answer) =
        http_unix(&daemon.socket, "POST", "/api/events", &events.join("\n")).expect("post");
    assert_eq!(status, 202, "{answer}");
}

/// Waits until `done` holds for the collector's lines.
fn wait_for(collector: &Collector, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lines = collector.lines();
        if done(&lines) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the collector got {lines:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn of(lines: &[Value], signal: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l["signal"] == signal)
        .cloned()
        .collect()
}

fn config(endpoint: &str, protocol: &str, extra: &str) -> String {
    format!(
        "correlator:\n  window_ms: 300\ntelemetry:\n  otlp:\n    endpoint: {endpoint}\n    protocol: {protocol}\n    interval_ms: 100\n{extra}"
    )
}

#[test]
fn otlp_http_exports_events_as_logs_and_calls_as_spans() {
    let dir = tempfile::tempdir().expect("dir");
    let collector = Collector::start(
        "http",
        0,
        &dir.path().join("got.jsonl"),
        &["--header", "x-api-key=s3cret"],
    );
    let daemon = Daemon::start(&config(
        &format!("http://127.0.0.1:{}", collector.port),
        "http/protobuf",
        "    headers:\n      x-api-key: s3cret\n",
    ));
    post(&daemon, &call_events("sess-1", "echo", 7));
    let lines = wait_for(&collector, "3 logs and 1 span", |l| {
        of(l, "log").len() >= 3 && !of(l, "span").is_empty()
    });
    assert!(
        lines.iter().all(|l| l.get("refused").is_none()),
        "every export carried the header: {lines:#?}"
    );
    let logs = of(&lines, "log");
    let spans = of(&lines, "span");
    assert_eq!((logs.len(), spans.len()), (3, 1), "{lines:#?}");

    let span = &spans[0];
    assert_eq!(span["name"], "tools/call echo");
    assert_eq!(span["resource"]["service.name"], "toolwall");
    assert_eq!(span["scope"], "toolwall");
    let attrs = &span["attributes"];
    assert_eq!(attrs["mcp.method.name"], "tools/call");
    assert_eq!(attrs["gen_ai.tool.name"], "echo");
    assert_eq!(attrs["gen_ai.operation.name"], "execute_tool");
    assert_eq!(attrs["gen_ai.tool.call.id"], "toolu_7");
    assert_eq!(attrs["jsonrpc.request.id"], "7");
    assert_eq!(attrs["toolwall.session.id"], "sess-1");
    assert_eq!(attrs["toolwall.server.id"], "everything");
    assert_eq!(attrs["toolwall.layer"], "llm/anthropic,shim");
    assert_eq!(attrs["toolwall.decision"], "allow");
    assert_eq!(attrs["toolwall.record.kind"], "joined");
    assert_eq!(span["events"].as_array().map(Vec::len), Some(2));
    assert_eq!(span["trace_id"].as_str().map(str::len), Some(32));

    // The call's two events carry its span; the listing none.
    let by_type: BTreeMap<String, &Value> = logs
        .iter()
        .map(|l| (l["event_name"].as_str().unwrap_or("").to_owned(), l))
        .collect();
    for kind in ["mcp_tool_call_intercepted", "mcp_tool_called"] {
        let log = by_type[kind];
        assert_eq!(
            (&log["trace_id"], &log["span_id"]),
            (&span["trace_id"], &span["span_id"]),
            "{kind} shares the call's span"
        );
        assert_eq!(log["attributes"]["gen_ai.tool.name"], "echo");
        assert!(log["attributes"]["toolwall.event.id"].is_i64(), "{log}");
        let body: Value =
            serde_json::from_str(log["body"].as_str().expect("body")).expect("JSON body");
        assert_eq!(body["type"], kind);
    }
    assert_eq!(by_type["mcp_tool_seen"]["trace_id"], "");
    assert_eq!(
        by_type["mcp_tool_called"]["attributes"]["toolwall.layer"],
        "shim"
    );
}

/// The event ids the collector got as log records, with how often each came.
fn log_ids(lines: &[Value]) -> BTreeMap<i64, usize> {
    let mut ids = BTreeMap::new();
    for log in of(lines, "log") {
        let id = log["attributes"]["toolwall.event.id"]
            .as_i64()
            .expect("toolwall.event.id");
        *ids.entry(id).or_default() += 1;
    }
    ids
}

#[test]
fn otlp_grpc_collector_down_then_back_loses_nothing_and_sends_nothing_twice() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut daemon = Daemon::start(&config(&format!("http://127.0.0.1:{port}"), "grpc", ""));
    // 20 calls while no collector listens.
    for n in 0..20 {
        post(
            &daemon,
            &call_events("down", if n % 2 == 0 { "echo" } else { "add" }, n),
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    // It comes back, and refuses its first two exports.
    let out = dir.path().join("got.jsonl");
    let collector = Collector::start("grpc", port, &out, &["--refuse", "2"]);
    let lines = wait_for(&collector, "60 logs and 20 spans", |l| {
        of(l, "log").len() >= 60 && of(l, "span").len() >= 20
    });
    let ids = log_ids(&lines);
    assert_eq!(ids.len(), 60, "every event once: {ids:?}");
    assert!(ids.values().all(|n| *n == 1), "nothing twice: {ids:?}");
    let spans = of(&lines, "span");
    assert_eq!(spans.len(), 20);
    let span_ids: BTreeSet<&str> = spans.iter().filter_map(|s| s["span_id"].as_str()).collect();
    assert_eq!(span_ids.len(), 20, "one span a call");
    assert!(
        lines.iter().filter(|l| l["refused"] == "forced").count() >= 2,
        "the collector refused first: {lines:#?}"
    );
    assert!(
        daemon.stderr().contains("OTLP export failed"),
        "the failure is reported: {}",
        daemon.stderr()
    );

    // Stopped once the collector took everything, started again: it resumes at the cursor.
    let before = wait_cursor_saved(&daemon);
    assert!(before >= 60, "cursor at {before}");
    assert!(daemon.stop().success());
    daemon.relaunch("stderr-2");
    post(&daemon, &call_events("after", "echo", 99));
    let lines = wait_for(&collector, "3 more logs and 1 more span", |l| {
        of(l, "log").len() >= 63 && of(l, "span").len() >= 21
    });
    std::thread::sleep(Duration::from_secs(1));
    let lines_now = collector.lines();
    assert_eq!(lines.len(), lines_now.len(), "nothing more came");
    let ids = log_ids(&lines_now);
    assert_eq!(ids.len(), 63);
    assert!(
        ids.values().all(|n| *n == 1),
        "nothing twice after the restart: {ids:?}"
    );
}

/// The cursor as `/metrics` shows it, once the exporter has no lag.
fn wait_cursor_saved(daemon: &Daemon) -> i64 {
    let token = std::fs::read_to_string(daemon.socket.with_file_name("web-token")).expect("token");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = http_get(&daemon.api, "/metrics", Some(token.trim()));
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("toolwall_otlp_export{{counter=\"{name}\"}}")))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<i64>().ok())
        };
        if value("lag_events") == Some(0) {
            return value("logs").unwrap_or(0);
        }
        assert!(
            Instant::now() < deadline,
            "the export lag never reached 0:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A CA and a certificate it signed for 127.0.0.1 (openssl), in `dir`: (ca.pem, cert, key).
fn certificates(dir: &std::path::Path) -> (String, String, String) {
    let path = |name: &str| dir.join(name).display().to_string();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "1",
                "-subj",
                "/CN=toolwall test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("san.ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    ]);
    (path("ca.pem"), path("server.pem"), path("server.key"))
}

#[test]
fn otlp_over_tls_trusts_the_configured_ca_and_not_an_unknown_one() {
    let dir = tempfile::tempdir().expect("dir");
    let (ca, cert, key) = certificates(dir.path());
    for (protocol, config_protocol) in [("http", "http/protobuf"), ("grpc", "grpc")] {
        let out = dir.path().join(format!("{protocol}.jsonl"));
        let collector = Collector::start(protocol, 0, &out, &["--tls", &cert, &key]);
        let endpoint = format!("https://127.0.0.1:{}", collector.port);
        let daemon = Daemon::start(&config(
            &endpoint,
            config_protocol,
            &format!("    tls:\n      ca_file: {ca}\n"),
        ));
        post(&daemon, &call_events("tls", "echo", 1));
        wait_for(&collector, &format!("{protocol}: 3 logs over TLS"), |l| {
            of(l, "log").len() >= 3
        });
        drop(daemon);

        // The system's CAs do not know this one: nothing is sent, and the failure is said.
        let mut untrusting = Daemon::start(&config(&endpoint, config_protocol, ""));
        post(&untrusting, &call_events("untrusted", "echo", 2));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !untrusting.stderr().contains("OTLP export failed") {
            assert!(
                Instant::now() < deadline,
                "{protocol}: {}",
                untrusting.stderr()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(untrusting.stop().success());
        assert!(
            collector
                .lines()
                .iter()
                .all(|l| l["attributes"]["toolwall.session.id"] != "untrusted"),
            "{protocol}: sent to a collector whose certificate no trusted CA signed"
        );
    }
}

/// A collector that refuses requests over 4 MiB (the OpenTelemetry Collector's gRPC default)
/// must not be sent one batch of large arguments again and again, the export stopped for good
/// behind it: requests are bounded in bytes and a record's arguments past 64 KiB are sent as
/// their size and hash.
#[test]
fn otlp_large_arguments_never_stop_the_export() {
    let dir = tempfile::tempdir().expect("dir");
    for (protocol, config_protocol) in [("http", "http/protobuf"), ("grpc", "grpc")] {
        let out = dir.path().join(format!("{protocol}.jsonl"));
        let collector = Collector::start(protocol, 0, &out, &["--max-bytes", "4194304"]);
        let daemon = Daemon::start(&config(
            &format!("http://127.0.0.1:{}", collector.port),
            config_protocol,
            "",
        ));
        // 200 calls with 20 KB of arguments each: 12 MB of log bodies in all.
        let padding = "x".repeat(20_000);
        for chunk in 0..10 {
            let events: Vec<String> = (0..20)
                .flat_map(|i| {
                    let n = chunk * 20 + i;
                    call_events_with("big", "echo", n, json!({"n": n, "pad": padding}))
                })
                .collect();
            post(&daemon, &events);
        }
        // One call with 200 KB of arguments (the store keeps up to 256 KiB), then an ordinary
        // one.
        post(
            &daemon,
            &call_events_with("huge", "echo", 1000, json!({"pad": "y".repeat(200_000)})),
        );
        // A tool named with 1 MB (a name is the agent's or server's to choose) would make a
        // span no collector takes; attributes are cut at 4 KiB.
        post(&daemon, &call_events("named", &"n".repeat(1_000_000), 1002));
        post(&daemon, &call_events("after", "echo", 1001));
        let lines = wait_for(&collector, &format!("{protocol}: every log record"), |l| {
            of(l, "log").len() >= 609 && of(l, "span").len() >= 203
        });
        let ids = log_ids(&lines);
        assert_eq!(ids.len(), 609, "{protocol}: every event once");
        let named = lines
            .iter()
            .find(|l| l["signal"] == "span" && l["attributes"]["toolwall.session.id"] == "named")
            .expect("the long-named call's span");
        let name = named["attributes"]["gen_ai.tool.name"].as_str().unwrap();
        assert!(
            name.len() < 4200 && name.ends_with("(1000000 bytes)"),
            "{}",
            name.len()
        );
        assert!(ids.values().all(|n| *n == 1), "{protocol}: nothing twice");
        let huge: Vec<&Value> = lines
            .iter()
            .filter(|l| l["signal"] == "log" && l["attributes"]["toolwall.session.id"] == "huge")
            .collect();
        assert_eq!(huge.len(), 3);
        for log in huge.iter().filter(|l| l["event_name"] != "mcp_tool_seen") {
            assert_eq!(log["attributes"]["toolwall.body.truncated"], true, "{log}");
            let body: Value = serde_json::from_str(log["body"].as_str().unwrap()).unwrap();
            assert!(
                body["input"]["toolwall_omitted"]
                    .as_str()
                    .is_some_and(|s| s.contains("arguments of")),
                "{body}"
            );
            assert_eq!(body["input"]["sha256"].as_str().map(str::len), Some(64));
        }
    }
}
