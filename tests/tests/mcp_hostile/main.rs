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

mod http;
#[path = "../mcp_common/mod.rs"]
mod mcp_common;
mod stdio;

use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcp_common::{Proc, try_start_listening};
use serde_json::{Value, json};
use toolwall_tests::{peers_dir, python, toolwall_bin, workspace_root};

use http::run_http;
use stdio::run_stdio;

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
