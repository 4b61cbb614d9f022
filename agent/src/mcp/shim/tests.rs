use super::*;

/// A tiny stdio MCP server: logs every line it receives to `$LOG`, answers `tools/list` with
/// two tools and `tools/call` with the tool's name, and exits with 3 at EOF.
const SERVER: &str = r#"
import json, os, sys
log = open(os.environ["LOG"], "a")
for line in sys.stdin:
    log.write(line); log.flush()
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "tools/list":
        result = {"tools": [{"name": "echo", "inputSchema": {}}, {"name": "add", "inputSchema": {}}]}
    elif msg["method"] == "tools/call":
        result = {"content": [{"type": "text", "text": "called " + msg["params"]["name"]}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
    sys.stdout.flush()
sys.exit(3)
"#;

#[tokio::test]
async fn denied_call_never_reaches_the_child() {
    let dir = std::env::temp_dir().join(format!("toolwall-shim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let log = dir.join("received.log");
    let _ = std::fs::remove_file(&log);

    let (sink, mut events) = crate::events::EventSink::channel();
    let ctx = FilterContext {
        gate: crate::mcp::enforce::Enforcement::new(None, None, &["^echo$".into()])
            .expect("pattern")
            .gate,
        server_id: "py".into(),
        server_type: "stdio".into(),
        layer: "shim",
        session_id: "sess-1".into(),
        events: Some(sink),
        approvals: None,
    };
    let (mut client, shim_side) = tokio::io::duplex(1 << 16);
    let (shim_in, shim_out) = tokio::io::split(shim_side);
    let mut command = Command::new("python3");
    command.arg("-c").arg(SERVER).env("LOG", &log);
    let shim = tokio::spawn(async move {
        serve(
            &mut command,
            ctx,
            shim_in,
            shim_out,
            DEFAULT_MAX_MESSAGE_BYTES,
        )
        .await
    });

    client
        .write_all(concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#, "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"add","arguments":{}}}"#, "\n",
        ).as_bytes())
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.iter().filter(|b| **b == b'\n').count() < 3 {
        let n = tokio::time::timeout(Duration::from_secs(20), client.read(&mut buf))
            .await
            .expect("shim answers in time")
            .expect("read");
        assert!(
            n > 0,
            "shim closed early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    // Close the client's side: the shim closes the child's stdin and exits with its code.
    drop(client);
    let code = tokio::time::timeout(Duration::from_secs(20), shim)
        .await
        .expect("shim exits")
        .expect("join")
        .expect("shim ok");
    assert_eq!(code, ExitCode::from(3));

    let lines: Vec<serde_json::Value> = got
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("JSON line"))
        .collect();
    let by_id = |id: i64| {
        lines
            .iter()
            .find(|l| l["id"] == id)
            .unwrap_or_else(|| panic!("no answer for {id}: {lines:?}"))
    };
    assert_eq!(
        by_id(1)["result"]["tools"],
        serde_json::json!([{"name": "add", "inputSchema": {}}])
    );
    assert_eq!(
        by_id(2)["error"],
        serde_json::json!({"code": -32602, "message": "Unknown tool: echo"})
    );
    assert_eq!(by_id(3)["result"]["content"][0]["text"], "called add");

    // What the event store gets: both tools seen (one hidden), both calls with decisions.
    let mut recorded = Vec::new();
    while let Ok(event) = events.try_recv() {
        recorded.push(match event {
            crate::events::Event::McpToolSeen(e) => {
                assert_eq!(
                    (e.server_id.as_str(), e.session_id.as_str()),
                    ("py", "sess-1")
                );
                format!("seen {} {}", e.tool_name, e.action.as_str())
            }
            crate::events::Event::McpToolCalled(e) => {
                assert_eq!(
                    (e.layer.as_str(), e.server_type.as_str()),
                    ("shim", "stdio")
                );
                format!("called {} {}", e.tool_name, e.action.as_str())
            }
            other => panic!("unexpected event {other:?}"),
        });
    }
    // The two directions interleave as they will; compare as sets.
    recorded.sort();
    assert_eq!(
        recorded,
        [
            "called add allow",
            "called echo block",
            "seen add allow",
            "seen echo block"
        ]
    );

    let received = std::fs::read_to_string(&log).expect("server log");
    assert_eq!(received.lines().count(), 2, "{received}");
    assert!(
        !received.contains("\"echo\""),
        "the server saw the denied call: {received}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn server_ids_from_command_lines() {
    let id =
        |cmd: &[&str]| default_server_id(&cmd.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(
        id(&[
            "npx",
            "-y",
            "@modelcontextprotocol/server-everything@2025.1"
        ]),
        "server-everything"
    );
    assert_eq!(
        id(&["/usr/bin/python3", "-m", "mcp_server_git"]),
        "mcp_server_git"
    );
    assert_eq!(id(&["uvx", "mcp-server-fetch"]), "mcp-server-fetch");
    assert_eq!(id(&["uv", "run", "server.py"]), "server");
    assert_eq!(id(&["node", "/srv/dist/index.js"]), "index");
    assert_eq!(id(&["/opt/bin/my-server", "--port", "1"]), "my-server");
    assert_eq!(id(&["npx"]), "npx");
    assert_eq!(id(&[]), "");
}

fn plain_ctx() -> FilterContext {
    FilterContext {
        gate: crate::mcp::enforce::Enforcement::new(None, None, &[])
            .expect("no patterns")
            .gate,
        server_id: "py".into(),
        server_type: "stdio".into(),
        layer: "shim",
        session_id: String::new(),
        events: None,
        approvals: None,
    }
}

#[tokio::test]
async fn a_client_message_over_the_limit_is_answered_and_never_forwarded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("received.log");
    let (mut client, shim_side) = tokio::io::duplex(1 << 16);
    let (shim_in, shim_out) = tokio::io::split(shim_side);
    let mut command = Command::new("python3");
    command.arg("-c").arg(SERVER).env("LOG", &log);
    let shim =
        tokio::spawn(async move { serve(&mut command, plain_ctx(), shim_in, shim_out, 256).await });
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"add","arguments":{{"pad":"{}"}}}}}}"#,
        "SECRET".repeat(100)
    );
    // Sent without its newline first (the line-length bound must hold while it is open).
    client.write_all(big.as_bytes()).await.expect("write");
    client
        .write_all(b"\n{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"tools/list\"}\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.iter().filter(|b| **b == b'\n').count() < 2 {
        let n = tokio::time::timeout(Duration::from_secs(20), client.read(&mut buf))
            .await
            .expect("shim answers in time")
            .expect("read");
        assert!(
            n > 0,
            "shim closed early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    drop(client);
    let code = tokio::time::timeout(Duration::from_secs(20), shim)
        .await
        .expect("shim exits")
        .expect("join")
        .expect("shim ok");
    assert_eq!(code, ExitCode::from(3));
    let replies: Vec<serde_json::Value> = got
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("json"))
        .collect();
    assert_eq!(replies[0]["id"], 9);
    assert_eq!(replies[0]["error"]["code"], -32600);
    assert_eq!(replies[1]["id"], 10);
    let received = std::fs::read_to_string(&log).expect("log");
    assert!(!received.contains("SECRET"), "forwarded: {received}");
    assert!(received.contains("tools/list"));
}

#[tokio::test]
async fn a_server_message_over_the_limit_stops_the_shim() {
    // A server that writes one endless line (no newline), then waits.
    let script = "import sys, time\nsys.stdout.write('{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"x\":\"' + 'SECRET' * 1000)\nsys.stdout.flush()\ntime.sleep(30)\n";
    let (mut client, shim_side) = tokio::io::duplex(1 << 16);
    let (shim_in, shim_out) = tokio::io::split(shim_side);
    let mut command = Command::new("python3");
    command.arg("-c").arg(script);
    let shim =
        tokio::spawn(
            async move { serve(&mut command, plain_ctx(), shim_in, shim_out, 1024).await },
        );
    let result = tokio::time::timeout(Duration::from_secs(20), shim)
        .await
        .expect("the shim stops at once, not when the server exits")
        .expect("join");
    let error = result.expect_err("an error, so the command exits non-zero");
    assert!(
        format!("{error:#}").contains("larger than 1024 bytes"),
        "{error:#}"
    );
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), client.read_to_end(&mut got)).await;
    assert!(!String::from_utf8_lossy(&got).contains("SECRET"));
}
