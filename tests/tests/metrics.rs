//! `GET /metrics` scraped by a real Prometheus (Debian's `prometheus`): the daemon's
//! decisions, recorded through its socket, are answered by a PromQL query; the scrape carries
//! the web token (`authorization.credentials_file`), as the loopback API asks of every reader.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolwall_tests::{Daemon, http_get, http_unix};

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The value of a PromQL query's first sample, once Prometheus has one.
fn query(addr: &str, promql: &str) -> Option<String> {
    let q: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, body) = http_get(addr, &format!("/api/v1/query?query={q}"), None);
    if status != 200 {
        return None;
    }
    let answer: Value = serde_json::from_str(&body).ok()?;
    answer["data"]["result"][0]["value"][1]
        .as_str()
        .map(str::to_owned)
}

#[test]
#[ignore = "privileged: needs Debian's prometheus, which `cargo xtask peers` installs as root"]
fn privileged_prometheus_scrapes_the_daemons_decisions() {
    assert!(
        std::path::Path::new("/usr/bin/prometheus").exists(),
        "install prometheus: `cargo xtask peers` as root"
    );
    let daemon = Daemon::start("");
    let token_file = daemon.socket.with_file_name("web-token");
    let token = std::fs::read_to_string(&token_file).expect("web token");

    // Without the token, nothing; with it, the exposition.
    assert_eq!(http_get(&daemon.api, "/metrics", None).0, 401);
    let (status, text) = http_get(&daemon.api, "/metrics", Some(token.trim()));
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("# TYPE toolwall_store_writing gauge"),
        "{text}"
    );
    assert!(text.contains("toolwall_store_writing 1"), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");

    // Decisions of two layers, recorded through the socket.
    let now = chrono_now();
    let event = |kind: &str, fields: Value| {
        let mut e =
            json!({"type": kind, "timestamp": now, "session_id": "m", "server_id": "everything"});
        e.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        e.to_string()
    };
    let body = [
        event(
            "mcp_tool_call_intercepted",
            json!({"request_id": "r1", "dialect": "anthropic", "tool_name": "mcp__everything__echo",
                "server_tool": "echo", "tool_call_id": "t1", "server_type": "stdio", "server_addr": "",
                "tool_hash": "", "action": "allow", "reason": ""}),
        ),
        event(
            "mcp_tool_call_intercepted",
            json!({"request_id": "r1", "dialect": "anthropic", "tool_name": "mcp__everything__get-sum",
                "server_tool": "get-sum", "tool_call_id": "t2", "server_type": "stdio", "server_addr": "",
                "tool_hash": "", "action": "block", "reason": "denied"}),
        ),
        event(
            "mcp_tool_called",
            json!({"server_type": "stdio", "tool_name": "echo", "jsonrpc_id": 1,
                "action": "allow", "reason": "", "layer": "shim"}),
        ),
        // A name a server chose, written to break the exposition or forge a series: the
        // scrape must stay whole (`up` 1) and the echo count one.
        event(
            "mcp_tool_called",
            json!({"server_type": "stdio", "tool_name": "x\",layer=\"shim\",tool=\"echo\"} 9\n\u{1b}", "jsonrpc_id": 2,
                "action": "block", "reason": "", "layer": "shim"}),
        ),
    ]
    .join("\n");
    let (status, answer) = http_unix(&daemon.socket, "POST", "/api/events", &body).unwrap();
    assert_eq!(status, 202, "{answer}");

    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: toolwall\n    authorization:\n      credentials_file: {}\n    static_configs:\n      - targets: [\"{}\"]\n",
            token_file.display(),
            daemon.api
        ),
    )
    .expect("prometheus.yml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let _prometheus = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = (None, None, None);
    while Instant::now() < deadline {
        seen = (
            query(&addr, r#"up{job="toolwall"}"#),
            query(
                &addr,
                r#"sum(toolwall_decisions_total{server="everything",decision="block",layer="llm"})"#,
            ),
            query(
                &addr,
                r#"sum(toolwall_decisions_total{layer="shim",tool="echo"})"#,
            ),
        );
        if seen.0.as_deref() == Some("1") && seen.1.is_some() && seen.2.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        seen,
        (Some("1".into()), Some("1".into()), Some("1".into())),
        "Prometheus scraped the daemon and counts its decisions"
    );
}

fn chrono_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.%3NZ"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
