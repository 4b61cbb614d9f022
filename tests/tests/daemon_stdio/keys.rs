//! A session's LLM key works only from its own processes.

use super::*;

/// The session's agent: its base URL for the others, then a request to the LLM proxy without
/// the `/s/<key>` prefix (which must not be recorded as the host's), then it waits to be ended.
const KEYLESS_AGENT: &str = r#"
import json, os, sys, time, urllib.request, urllib.error
out, done = sys.argv[1], sys.argv[2]
base = os.environ["ANTHROPIC_BASE_URL"]
body = json.dumps({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"name": "mcp__everything__echo", "input_schema": {"type": "object"}}]}).encode()
def post(url):
    req = urllib.request.Request(url + "/v1/messages", data=body, method="POST", headers={"content-type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=20).status
    except urllib.error.HTTPError as e:
        return e.code
status = post(base.split("/s/")[0])
# A connection the session made, used once, handed to a process outside (the holder).
import socket
host, port = base.split("/")[2].rsplit(":", 1)
conn = socket.create_connection((host, int(port)))
conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
head = b""
while b"\r\n\r\n" not in head:
    head += conn.recv(1)
length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
while length > 0:
    length -= len(conn.recv(length))
hand = socket.socket(socket.AF_UNIX)
hand.connect(sys.argv[3])
socket.send_fds(hand, [b"x"], [conn.fileno()])
with open(out + ".tmp", "w") as f:
    f.write(json.dumps({"base": base, "keyless": status}))
os.rename(out + ".tmp", out)
deadline = time.time() + 60
while not os.path.exists(done) and time.time() < deadline:
    time.sleep(0.1)
"#;

/// Outside every session: takes a connection the session's agent made and, once the session
/// has closed, posts on it.
const HOLDER: &str = r#"
import os, socket, sys, time
path, closed, out = sys.argv[1], sys.argv[2], sys.argv[3]
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
os.chmod(path, 0o777)
listener.listen(1)
handed, _ = listener.accept()
_, fds, _, _ = socket.recv_fds(handed, 16, 1)
conn = socket.socket(fileno=fds[0])
deadline = time.time() + 60
while not os.path.exists(closed) and time.time() < deadline:
    time.sleep(0.1)
body = b'{"model":"m","max_tokens":9,"messages":[]}'
conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
conn.settimeout(20)
answer = conn.recv(65536).decode(errors="replace")
with open(out, "w") as f:
    f.write(answer)
"#;

/// Another session's agent posting with the first one's key.
const KEY_THIEF: &str = r#"
import json, sys, urllib.request, urllib.error
base = json.load(open(sys.argv[1]))["base"]
req = urllib.request.Request(base + "/v1/messages", data=b'{"model":"m","max_tokens":9,"messages":[]}', method="POST", headers={"content-type": "application/json"})
try:
    print("stolen key", urllib.request.urlopen(req, timeout=20).status)
except urllib.error.HTTPError as e:
    print("stolen key", e.code, e.read().decode())
"#;

/// A session's LLM key sits in its agent's environment, readable by
/// every process of the agent's user. The key is honoured only from the session's own
/// processes (the kernel says which cgroup made the connection): a process outside every
/// session and one of another session are refused; a session's process that leaves the key
/// out is still recorded under its session, not the host's.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_sessions_llm_key_works_only_from_its_own_processes() {
    assert!(is_root());
    let dir = shared_dir();
    // A model that asks for `echo` of server `everything`.
    let port_file = dir.path().join("llm-port");
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _llm = Killed(
        Command::new("/usr/bin/python3")
            .arg(toolwall_tests::workspace_root().join("tests/peers/fake_llm.py"))
            .arg("--log")
            .arg(dir.path().join("llm.jsonl"))
            .arg("--port-file")
            .arg(&port_file)
            .spawn()
            .expect("start fake_llm.py"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let llm_port = loop {
        if let Ok(port) = std::fs::read_to_string(&port_file) {
            break port.trim().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fake_llm.py did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (hand, closed, held) = (
        dir.path().join("hand.sock"),
        dir.path().join("closed"),
        dir.path().join("held"),
    );
    // The hand-off socket is listed (sessions reach no other Unix socket), so the connection
    // does leave the session and the proxy's own check is what is tested.
    let mut daemon = Daemon::start(&format!(
        "proxy:\n  listen: 127.0.0.1:0\n  providers:\n    anthropic: http://127.0.0.1:{llm_port}\n\
         sandbox:\n  mcp:\n    servers:\n      - id: everything\n        type: stdio\n        command: /bin/true\n\
         exec:\n  allow_unix: [{:?}]\n",
        hand.display().to_string()
    ));
    let agent = write(dir.path(), "agent.py", KEYLESS_AGENT);
    let thief = write(dir.path(), "thief.py", KEY_THIEF);
    let (said, done) = (dir.path().join("said"), dir.path().join("done"));
    let mut holder = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(HOLDER)
        .args([&hand, &closed, &held])
        .spawn()
        .expect("the holder");
    while !hand.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut victim = exec_nobody(&daemon, "victim", &agent, dir.path())
        .arg(&said)
        .arg(&done)
        .arg(&hand)
        .spawn()
        .expect("toolwall exec");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let said: serde_json::Value = loop {
        if let Ok(text) = std::fs::read_to_string(&said) {
            break serde_json::from_str(&text).expect("the agent's JSON");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent said nothing"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let base = said["base"].as_str().expect("its base URL").to_owned();
    assert!(base.contains("/s/"), "{base}");
    assert_eq!(said["keyless"], 200, "{said}");
    // From outside every session (this test, as root), with the session's key.
    let post = |url: &str| {
        use std::io::{Read as _, Write as _};
        let rest = url.strip_prefix("http://").expect("an http URL");
        let (host, path) = rest.split_once('/').expect("a path");
        let body = r#"{"model":"m","max_tokens":9,"messages":[]}"#;
        let mut stream = std::net::TcpStream::connect(host).expect("connect to the LLM proxy");
        write!(
            stream,
            "POST /{path}/v1/messages HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        let code = answer
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        (code, answer)
    };
    let (code, body) = post(&base);
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("only from its own session"), "{body}");
    // From another session, with the victim's key.
    let stolen = exec_nobody(&daemon, "thief", &thief, dir.path())
        .arg(dir.path().join("said"))
        .output()
        .expect("toolwall exec");
    let stdout = String::from_utf8_lossy(&stolen.stdout);
    assert!(stdout.contains("stolen key 403"), "{stdout}");
    std::fs::write(&done, "").expect("end the agent");
    assert!(victim.wait().expect("the agent").success());
    // The session is closed: the connection it handed out speaks for no one.
    std::fs::write(&closed, "").expect("tell the holder");
    assert!(holder.wait().expect("the holder").success());
    let held = std::fs::read_to_string(&held).expect("the holder's answer");
    assert!(
        held.starts_with("HTTP/1.1 403") && held.contains("a session that has closed"),
        "{held}"
    );
    // The session's key-less call is the session's; nothing was recorded for the others.
    let events = daemon.json_lines(&[
        "mcp",
        "events",
        "--json",
        "--type",
        "mcp_tool_call_intercepted",
    ]);
    let sessions: Vec<&str> = events
        .iter()
        .map(|e| e["session_id"].as_str().unwrap_or_default())
        .collect();
    assert!(sessions.contains(&"victim"), "{events:?}");
    assert!(sessions.iter().all(|s| *s == "victim"), "{sessions:?}");
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}
