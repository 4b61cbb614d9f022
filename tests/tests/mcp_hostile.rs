//! The hostile-client corpus (`tests/corpus/mcp/*.json`): raw bytes a hostile MCP client sends
//! after a normal handshake, judged from the *server's* side. The servers are the official SDKs
//! (`tests/peers/mcp_marker_server.py`: Python `mcp`; `tests/peers/mcp_marker_server.mjs`:
//! TypeScript `@modelcontextprotocol/sdk`), over stdio and Streamable HTTP; every tool they run
//! is appended to a marker file, so what counts is what a server *ran*, not what toolwall or a
//! log says.
//!
//! For every case and transport:
//! - direct (no toolwall), each server must run `secret` exactly when the case lists it in
//!   `attacks` (so a case that stops being an attack, or starts being one, after an SDK change
//!   fails loudly);
//! - through `toolwall shim --deny '^secret$'` (stdio) and `toolwall mcp-proxy --deny
//!   '^secret$'` (HTTP), no server may ever run `secret`.
//!
//! Every case ends with a control: a well-formed `tools/call` of `harmless` that must be
//! answered and appear in the marker (a dead server or a dead toolwall cannot pass), and
//! toolwall must still be running at the end. The cases of one server and path run one after
//! the other in one session; a session whose control fails is replaced for the next case. The eight server/path
//! combinations run in parallel.
//!
//! Case files: `{"name", "why", "transports": ["stdio", "http"], "payload": TEXT |
//! "payload_b64": BASE64, "attacks": ["python-stdio", "python-http", "typescript-stdio",
//! "typescript-http"], "headers": {NAME: VALUE}, "pad": N}`; with `pad`, the payload's `@PAD@` stands for
//! N bytes `a` (very long lines). Over stdio the payload is written after
//! `initialize` and `notifications/initialized` (with a final `\n` added when it has none); over
//! HTTP it is one POST body, sent with the session's `Mcp-Session-Id`, `MCP-Protocol-Version:
//! 2025-11-25`, `Content-Type: application/json` and the SSE/JSON `Accept`, any of which the
//! case's optional `headers` replace (an empty value drops the header).
//!
//! `TOOLWALL_MCP_HOSTILE_CASE=SUBSTRING` runs only the cases whose file name contains it.

mod mcp_common;

use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcp_common::{Proc, start_listening};
use serde_json::{Value, json};
use toolwall_tests::{peers_dir, python, toolwall_bin, workspace_root};

const DENY: &str = "^secret$";
const PROTOCOL: &str = "2025-11-25";
/// How long a server (or toolwall in front of it) may take to start and answer `initialize`.
const START: Duration = Duration::from_secs(30);
/// How long the control call may take.
const CONTROL: Duration = Duration::from_secs(10);
/// How long the answer to a hostile HTTP body is read before the control goes on regardless.
const PAYLOAD: Duration = Duration::from_secs(3);

struct Case {
    file: String,
    transports: Vec<String>,
    payload: Vec<u8>,
    attacks: Vec<String>,
    headers: Vec<(String, String)>,
}

fn load_cases() -> Vec<Case> {
    let dir = workspace_root().join("tests/corpus/mcp");
    let only = std::env::var("TOOLWALL_MCP_HOSTILE_CASE").unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/corpus/mcp")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for path in files {
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let spec: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let strings = |key: &str| -> Vec<String> {
            spec[key]
                .as_array()
                .unwrap_or_else(|| panic!("{file}: `{key}` must be a list"))
                .iter()
                .map(|v| {
                    v.as_str()
                        .unwrap_or_else(|| panic!("{file}: `{key}` holds strings"))
                        .to_owned()
                })
                .collect()
        };
        assert!(
            spec["name"].is_string() && spec["why"].is_string(),
            "{file}: `name` and `why` are required"
        );
        let payload = match (&spec["payload"], &spec["payload_b64"]) {
            (Value::String(s), Value::Null) => s.clone().into_bytes(),
            (Value::Null, Value::String(b)) => {
                base64_decode(b).unwrap_or_else(|| panic!("{file}: bad payload_b64"))
            }
            _ => panic!("{file}: exactly one of `payload` and `payload_b64`"),
        };
        let payload = match spec["pad"].as_u64() {
            Some(n) => replace_pad(&payload, n as usize),
            None => payload,
        };
        let transports = strings("transports");
        let attacks = strings("attacks");
        for t in &transports {
            assert!(t == "stdio" || t == "http", "{file}: transport {t:?}");
        }
        for a in &attacks {
            let (sdk, t) = a.split_once('-').unwrap_or_default();
            assert!(
                ["python", "typescript"].contains(&sdk) && transports.iter().any(|x| x == t),
                "{file}: attacks {a:?} names no server this case runs on"
            );
        }
        let headers = spec["headers"]
            .as_object()
            .map(|h| {
                h.iter()
                    .map(|(k, v)| {
                        let v = v.as_str().unwrap_or_else(|| panic!("{file}: header {k}"));
                        (k.to_ascii_lowercase(), v.to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        if file.contains(&only) {
            cases.push(Case {
                file,
                transports,
                payload,
                attacks,
                headers,
            });
        }
    }
    cases
}

/// `@PAD@` in the payload replaced by `n` bytes `a` (so very long lines need not be checked in).
fn replace_pad(payload: &[u8], n: usize) -> Vec<u8> {
    let at = payload
        .windows(5)
        .position(|w| w == b"@PAD@")
        .expect("`pad` needs @PAD@ in the payload");
    let mut out = payload[..at].to_vec();
    out.resize(at + n, b'a');
    out.extend_from_slice(&payload[at + 5..]);
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
    {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    Some(out)
}

#[derive(Clone, Copy, PartialEq)]
enum Sdk {
    Python,
    TypeScript,
}

impl Sdk {
    fn label(self) -> &'static str {
        match self {
            Sdk::Python => "python",
            Sdk::TypeScript => "typescript",
        }
    }

    /// The server's argv for `args` (`stdio` or `http PORT`).
    fn argv(self, args: &[String]) -> Vec<OsString> {
        let peers = workspace_root().join("tests/peers");
        let mut argv: Vec<OsString> = match self {
            Sdk::Python => vec![python().into(), peers.join("mcp_marker_server.py").into()],
            Sdk::TypeScript => vec!["node".into(), peers.join("mcp_marker_server.mjs").into()],
        };
        argv.extend(args.iter().map(OsString::from));
        argv
    }
}

/// One server and path: a server SDK, a transport, and direct or through toolwall.
struct Stream {
    sdk: Sdk,
    transport: &'static str,
    toolwall: bool,
    dir: PathBuf,
}

impl Stream {
    fn server(&self) -> String {
        format!("{}-{}", self.sdk.label(), self.transport)
    }

    fn label(&self) -> String {
        let via = if !self.toolwall {
            "direct"
        } else if self.transport == "stdio" {
            "through toolwall shim"
        } else {
            "through toolwall mcp-proxy"
        };
        format!("{} {via}", self.server())
    }

    fn marker(&self) -> PathBuf {
        self.dir.join("marker")
    }

    fn stderr_file(&self, what: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{what}.stderr")))
            .expect("stderr file")
    }

    fn stderr_tail(&self, what: &str) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{what}.stderr"))).unwrap_or_default();
        let start = text.len().saturating_sub(1500);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text[start..].to_owned()
    }

    fn command(&self, argv: &[OsString]) -> Command {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env("TOOLWALL_MARKER", self.marker())
            .env("TOOLWALL_PEERS_DIR", peers_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cmd
    }
}

/// With `TOOLWALL_MCP_HOSTILE_TRACE` set, says on stderr which case each stream is at.
fn trace(stream: &Stream, case: &Case) {
    if std::env::var_os("TOOLWALL_MCP_HOSTILE_TRACE").is_some() {
        eprintln!("{}: {}", stream.label(), case.file);
    }
}

/// What one case did on one stream.
struct Outcome {
    case: usize,
    /// `secret` lines the marker gained during the case.
    secret_runs: usize,
    /// The control's failure, if it failed.
    control: Option<String>,
}

fn marker_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn control_request(n: usize) -> (Value, Value) {
    let id = json!(format!("toolwall-control-{n}"));
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "harmless", "arguments": {}}});
    (id, request)
}

/// Whether `message` is a successful answer from `harmless`.
fn harmless_answer(message: &Value) -> bool {
    message["result"]["isError"] != json!(true)
        && message["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("harmless ran"))
}

fn initialize_request() -> Value {
    json!({"jsonrpc": "2.0", "id": "toolwall-init", "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {},
        "clientInfo": {"name": "toolwall-hostile-corpus", "version": "1"}}})
}

// ---------------------------------------------------------------------------------------------
// stdio

struct StdioSession {
    proc: Proc,
    /// Writes go through a thread, so a server that stops reading cannot block the test.
    stdin: mpsc::Sender<Vec<u8>>,
    lines: mpsc::Receiver<Vec<u8>>,
}

impl StdioSession {
    fn start(stream: &Stream) -> Result<StdioSession, String> {
        let mut argv: Vec<OsString> = Vec::new();
        if stream.toolwall {
            argv.push(toolwall_bin().into());
            argv.extend(["shim", "--deny", DENY, "--"].map(OsString::from));
        }
        argv.extend(stream.sdk.argv(&["stdio".to_owned()]));
        let what = if stream.toolwall { "shim" } else { "server" };
        let mut child = stream
            .command(&argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stream.stderr_file(what))
            .spawn()
            .map_err(|e| format!("cannot start {argv:?}: {e}"))?;
        let mut pipe: ChildStdin = child.stdin.take().expect("stdin");
        let (stdin, writes) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for bytes in writes {
                if pipe.write_all(&bytes).and_then(|()| pipe.flush()).is_err() {
                    break;
                }
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut session = StdioSession {
            proc: Proc(child),
            stdin,
            lines,
        };
        let init = initialize_request();
        session.send(format!("{init}\n").as_bytes())?;
        let answer = session.wait_for(&init["id"], START)?;
        if answer["result"]["protocolVersion"].is_null() {
            return Err(format!("initialize was answered with {answer}"));
        }
        session.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")?;
        Ok(session)
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stdin
            .send(bytes.to_vec())
            .map_err(|_| "its stdin is closed".to_owned())
    }

    /// The next message with this id (other lines are skipped).
    fn wait_for(&self, id: &Value, within: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Ok(message) = serde_json::from_slice::<Value>(&line)
                        && message["id"] == *id
                    {
                        return Ok(message);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("no answer to id {id} within {within:?}"));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!("stdout closed before an answer to id {id}"));
                }
            }
        }
    }

    /// Sends the case and the control; the control's failure, if any.
    fn case(&mut self, payload: &[u8], n: usize) -> Result<(), String> {
        let mut bytes = payload.to_vec();
        if bytes.last() != Some(&b'\n') {
            bytes.push(b'\n');
        }
        let (id, control) = control_request(n);
        bytes.extend_from_slice(format!("{control}\n").as_bytes());
        self.send(&bytes)?;
        let answer = self.wait_for(&id, CONTROL)?;
        if harmless_answer(&answer) {
            Ok(())
        } else {
            Err(format!("the control was answered with {answer}"))
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.proc.0.try_wait(), Ok(None))
    }
}

/// The marker's lines once a case ran. The server may answer the control before its handler
/// of the call ahead of it wrote the marker (the Python SDK runs requests concurrently): a
/// direct attack the case expects gets a moment to show (under load the marker can otherwise
/// be read too early).
fn marker_after_case(stream: &Stream, case: &Case, seen: usize) -> Vec<String> {
    let mut lines = marker_lines(&stream.marker());
    let expected = !stream.toolwall && case.attacks.contains(&stream.server());
    let late = Instant::now() + Duration::from_secs(3);
    while expected
        && !lines[seen.min(lines.len())..].iter().any(|l| l == "secret")
        && Instant::now() < late
    {
        std::thread::sleep(Duration::from_millis(50));
        lines = marker_lines(&stream.marker());
    }
    lines
}

fn run_stdio(stream: &Stream, cases: &[(usize, &Case)]) -> (Vec<Outcome>, Vec<String>) {
    let mut outcomes = Vec::new();
    let mut problems = Vec::new();
    let mut session: Option<StdioSession> = None;
    let what = if stream.toolwall { "shim" } else { "server" };
    let mut seen = marker_lines(&stream.marker()).len();
    for &(i, case) in cases {
        trace(stream, case);
        if session.is_none() {
            match StdioSession::start(stream) {
                Ok(s) => session = Some(s),
                Err(e) => {
                    problems.push(format!(
                        "{}: could not start a session before {}: {e}\n{}",
                        stream.label(),
                        case.file,
                        stream.stderr_tail(what)
                    ));
                    return (outcomes, problems);
                }
            }
        }
        let s = session.as_mut().expect("a session");
        let control = s.case(&case.payload, i).err();
        if control.is_some() {
            session = None;
        }
        let lines = marker_after_case(stream, case, seen);
        let new = &lines[seen.min(lines.len())..];
        seen = lines.len();
        let control = control.or_else(|| {
            (!new.iter().any(|l| l == "harmless"))
                .then(|| "the control was answered but `harmless` is not in the marker".into())
        });
        let control = control.map(|e| format!("{e}\n{}", stream.stderr_tail(what)));
        outcomes.push(Outcome {
            case: i,
            secret_runs: new.iter().filter(|l| *l == "secret").count(),
            control,
        });
    }
    if let Some(s) = session.as_mut()
        && !s.running()
    {
        problems.push(format!(
            "{}: not running after the last case",
            stream.label()
        ));
    }
    (outcomes, problems)
}

// ---------------------------------------------------------------------------------------------
// HTTP

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC messages of a JSON or SSE body.
    fn messages(&self) -> Vec<Value> {
        let text = String::from_utf8_lossy(&self.body);
        let trimmed = text.trim_start();
        if trimmed.starts_with('{') || trimmed.starts_with('[') {
            return match serde_json::from_str::<Value>(trimmed) {
                Ok(Value::Array(items)) => items,
                Ok(v) => vec![v],
                Err(_) => vec![],
            };
        }
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    }
}

/// The body of a chunked message, and whether its last chunk came.
fn dechunk(mut body: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let Some(size) = size else {
            return (out, false);
        };
        body = &body[eol + 2..];
        if size == 0 {
            return (out, true);
        }
        let take = size.min(body.len());
        out.extend_from_slice(&body[..take]);
        if take < size {
            return (out, false);
        }
        body = &body[take..];
        body = body.strip_prefix(b"\r\n").unwrap_or(body);
    }
}

/// The response in `raw` once it is complete (by `Content-Length`, the last chunk, or `eof`).
fn parse_response(raw: &[u8], eof: bool) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut response = Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    };
    if response
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        let (body, last) = dechunk(&response.body);
        response.body = body;
        return (last || eof).then_some(response);
    }
    if let Some(length) = response.header("content-length") {
        let length: usize = length.parse().unwrap_or(0);
        return (response.body.len() >= length || eof).then(|| {
            response.body.truncate(length);
            response
        });
    }
    (eof || status == 202 || status == 204).then_some(response)
}

/// One HTTP/1.1 request (`Connection: close`) to 127.0.0.1:PORT/mcp. Reads until the server
/// closes or `within` passes (`partial` then says whether what came so far is an answer).
fn http(
    port: u16,
    method: &str,
    headers: &[(String, String)],
    body: &[u8],
    within: Duration,
    partial: bool,
) -> Result<Response, String> {
    let deadline = Instant::now() + within;
    let mut conn = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), within)
        .map_err(|e| format!("connect: {e}"))?;
    conn.set_write_timeout(Some(within)).expect("write timeout");
    let mut head = format!(
        "{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())
        .and_then(|()| conn.write_all(body))
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            if partial && let Some(r) = parse_response(&raw, true) {
                return Ok(r);
            }
            return Err(format!(
                "no complete answer within {within:?}: {:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(2000)])
            ));
        }
        conn.set_read_timeout(Some(left.min(Duration::from_millis(200))))
            .expect("read timeout");
        match conn.read(&mut buf) {
            Ok(0) => {
                return parse_response(&raw, true)
                    .ok_or_else(|| format!("no HTTP answer: {:?}", String::from_utf8_lossy(&raw)));
            }
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if let Some(r) = parse_response(&raw, false) {
                    return Ok(r);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                return parse_response(&raw, true).ok_or_else(|| format!("read: {e}"));
            }
        }
    }
}

fn base_headers() -> Vec<(String, String)> {
    vec![
        ("content-type".into(), "application/json".into()),
        (
            "accept".into(),
            "application/json, text/event-stream".into(),
        ),
    ]
}

/// `base` with `overrides` replacing (an empty value: dropping) headers of the same name.
fn with_headers(
    base: &[(String, String)],
    overrides: &[(String, String)],
) -> Vec<(String, String)> {
    let mut out: Vec<_> = base
        .iter()
        .filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k))
        .cloned()
        .collect();
    out.extend(overrides.iter().filter(|(_, v)| !v.is_empty()).cloned());
    out
}

/// A normal session; its headers.
fn http_session(port: u16) -> Result<Vec<(String, String)>, String> {
    let init = initialize_request();
    let answer = http(
        port,
        "POST",
        &base_headers(),
        init.to_string().as_bytes(),
        START,
        false,
    )?;
    let ok = answer
        .messages()
        .iter()
        .any(|m| m["id"] == init["id"] && !m["result"]["protocolVersion"].is_null());
    let Some(session) = answer.header("mcp-session-id").filter(|_| ok) else {
        return Err(format!(
            "initialize was answered {} {:?}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ));
    };
    let mut headers = base_headers();
    headers.push(("mcp-session-id".into(), session.to_owned()));
    headers.push(("mcp-protocol-version".into(), PROTOCOL.into()));
    let note = http(
        port,
        "POST",
        &headers,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        CONTROL,
        false,
    )?;
    if note.status != 202 {
        return Err(format!(
            "notifications/initialized was answered {}",
            note.status
        ));
    }
    Ok(headers)
}

/// Sends the case on the session (opening one first if there is none), then the control; the
/// control's failure, if any (the session is then dropped).
fn http_case(
    port: u16,
    session: &mut Option<Vec<(String, String)>>,
    case: &Case,
    n: usize,
) -> Result<(), String> {
    let headers = match session.take() {
        Some(headers) => headers,
        None => http_session(port)?,
    };
    // Whatever the server makes of the hostile body; it may refuse it or never finish answering.
    let _ = http(
        port,
        "POST",
        &with_headers(&headers, &case.headers),
        &case.payload,
        PAYLOAD,
        true,
    );
    let (id, control) = control_request(n);
    let answer = http(
        port,
        "POST",
        &headers,
        control.to_string().as_bytes(),
        CONTROL,
        false,
    )?;
    if answer
        .messages()
        .iter()
        .any(|m| m["id"] == id && harmless_answer(m))
    {
        *session = Some(headers);
        Ok(())
    } else {
        Err(format!(
            "the control was answered {} {:?}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ))
    }
}

fn start_http(stream: &Stream) -> Result<(Proc, Option<Proc>, u16), String> {
    // The server's port may be taken between choosing and binding it: tried on another.
    let (server, port) = start_listening(&stream.server(), |port| {
        Proc(
            stream
                .command(&stream.sdk.argv(&["http".to_owned(), port.to_string()]))
                .stderr(stream.stderr_file("server"))
                .spawn()
                .expect("start the server"),
        )
    });
    if !stream.toolwall {
        return Ok((server, None, port));
    }
    // The proxy's port may be taken between choosing and binding it: tried on another.
    let (proxy, listen) = start_listening("toolwall mcp-proxy", |listen| {
        Proc(
            Command::new(toolwall_bin())
                .args(["mcp-proxy", "--upstream"])
                .arg(format!("http://127.0.0.1:{port}/mcp"))
                .arg("--listen")
                .arg(format!("127.0.0.1:{listen}"))
                .args(["--deny", DENY])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stream.stderr_file("proxy"))
                .spawn()
                .expect("start toolwall mcp-proxy"),
        )
    });
    Ok((server, Some(proxy), listen))
}

fn run_http(stream: &Stream, cases: &[(usize, &Case)]) -> (Vec<Outcome>, Vec<String>) {
    let mut outcomes = Vec::new();
    let mut problems = Vec::new();
    let what = if stream.toolwall { "proxy" } else { "server" };
    let (mut server, mut proxy, port) = match start_http(stream) {
        Ok(started) => started,
        Err(e) => {
            problems.push(format!("{}: {e}", stream.label()));
            return (outcomes, problems);
        }
    };
    let mut seen = marker_lines(&stream.marker()).len();
    let mut session = None;
    for &(i, case) in cases {
        trace(stream, case);
        let control = http_case(port, &mut session, case, i).err();
        let lines = marker_after_case(stream, case, seen);
        let new = &lines[seen.min(lines.len())..];
        seen = lines.len();
        let control = control.or_else(|| {
            (!new.iter().any(|l| l == "harmless"))
                .then(|| "the control was answered but `harmless` is not in the marker".into())
        });
        outcomes.push(Outcome {
            case: i,
            secret_runs: new.iter().filter(|l| *l == "secret").count(),
            control: control.map(|e| format!("{e}\n{}", stream.stderr_tail(what))),
        });
    }
    for (p, name) in [
        (Some(&mut server), "the server"),
        (proxy.as_mut(), "toolwall"),
    ] {
        if let Some(p) = p
            && !matches!(p.0.try_wait(), Ok(None))
        {
            problems.push(format!(
                "{}: {name} is not running after the last case",
                stream.label()
            ));
        }
    }
    (outcomes, problems)
}

// ---------------------------------------------------------------------------------------------

#[test]
fn no_hostile_client_message_makes_a_server_run_a_denied_tool() {
    let cases = load_cases();
    assert!(!cases.is_empty(), "the corpus is checked in");
    let node_sdk = peers_dir().join("node/node_modules/@modelcontextprotocol/sdk");
    assert!(
        node_sdk.exists(),
        "{} does not exist: run `cargo xtask peers` (or `cargo xtask test`)",
        node_sdk.display()
    );
    let _ = python();
    let _ = toolwall_bin();
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut streams = Vec::new();
    for sdk in [Sdk::Python, Sdk::TypeScript] {
        for transport in ["stdio", "http"] {
            for toolwall in [false, true] {
                let dir = tmp.path().join(format!(
                    "{}-{transport}-{}",
                    sdk.label(),
                    if toolwall { "toolwall" } else { "direct" }
                ));
                std::fs::create_dir_all(&dir).expect("stream dir");
                streams.push(Stream {
                    sdk,
                    transport,
                    toolwall,
                    dir,
                });
            }
        }
    }
    let started = Instant::now();
    let results: Vec<(Vec<Outcome>, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .iter()
            .map(|stream| {
                let mine: Vec<(usize, &Case)> = cases
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.transports.iter().any(|t| t == stream.transport))
                    .collect();
                scope.spawn(move || {
                    if stream.transport == "stdio" {
                        run_stdio(stream, &mine)
                    } else {
                        run_http(stream, &mine)
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("stream thread"))
            .collect()
    });

    let mut failures = Vec::new();
    let mut leaks = Vec::new();
    // case -> servers that ran `secret` direct
    let mut direct_attacks: Vec<Vec<String>> = vec![Vec::new(); cases.len()];
    for (stream, (outcomes, problems)) in streams.iter().zip(&results) {
        failures.extend(problems.iter().cloned());
        let server = stream.server();
        if outcomes.len()
            < cases
                .iter()
                .filter(|c| c.transports.iter().any(|t| t == stream.transport))
                .count()
        {
            failures.push(format!("{}: not every case ran", stream.label()));
        }
        for o in outcomes {
            let case = &cases[o.case];
            let listed = case.attacks.contains(&server);
            if let Some(e) = &o.control {
                failures.push(format!(
                    "{} {}: control failed: {e}",
                    stream.label(),
                    case.file
                ));
            }
            if !stream.toolwall {
                if o.secret_runs > 0 {
                    direct_attacks[o.case].push(server.clone());
                }
                if (o.secret_runs > 0) != listed {
                    failures.push(format!(
                        "{} {}: direct, the server {} `secret`, but the case {} it in `attacks`",
                        stream.label(),
                        case.file,
                        if o.secret_runs > 0 {
                            "ran"
                        } else {
                            "did not run"
                        },
                        if listed { "lists" } else { "does not list" }
                    ));
                }
            } else if o.secret_runs > 0 {
                leaks.push(format!("{} {}", case.file, stream.label()));
                failures.push(format!(
                    "{} {}: the server ran the denied tool `secret` ({} times)",
                    stream.label(),
                    case.file,
                    o.secret_runs
                ));
            }
        }
        if stream.toolwall && marker_lines(&stream.marker()).iter().any(|l| l == "secret") {
            failures.push(format!(
                "{}: the marker holds `secret`: the denied tool ran",
                stream.label()
            ));
        }
    }
    let mut table = String::new();
    for (case, servers) in cases.iter().zip(&direct_attacks) {
        table.push_str(&format!(
            "  {:<48} direct: {}\n",
            case.file,
            servers.join(" ")
        ));
    }
    eprintln!(
        "{} cases in {:?}; secret run directly by:\n{table}leaks through toolwall: {}",
        cases.len(),
        started.elapsed(),
        if leaks.is_empty() {
            "none".to_owned()
        } else {
            format!("\n  {}", leaks.join("\n  "))
        }
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
