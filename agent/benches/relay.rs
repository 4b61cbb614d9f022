//! The LLM proxy as a relay, out of process, next to nginx: the release binary
//! (`toolwall run`) and nginx (Debian's package; `cargo xtask bench` installs it) each in front
//! of the same loopback source, read by the same raw client, each relay's CPU time read from
//! `/proc/PID/stat`.
//!
//! Two framings of one text-heavy Anthropic stream: *event-framed*, one HTTP chunk per SSE
//! event with ~125-byte text deltas (how the LLM APIs send), and *64 KiB chunks*. The source
//! and the client are plain blocking threads of this process, so the relay is the only thing
//! measured in its own process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::{Proc, free_port, start_listening};

/// One relay under test: where to send requests, and the process whose CPU time counts.
pub struct Relay {
    pub name: &'static str,
    pub addr: SocketAddr,
    /// The request path (toolwall inspects `/v1/messages`, relays `/v1/files` uninspected: the
    /// bench's configuration lists it in `proxy.pass_through`).
    pub path: &'static str,
    pub pid: Option<u32>,
}

/// The bytes the source sends: the SSE payload, and that payload chunked two ways.
pub struct Bodies {
    pub payload: Vec<u8>,
    pub events: Vec<u8>,
    pub bulk: Vec<u8>,
}

impl Bodies {
    /// A text-heavy stream of about `target` bytes.
    pub fn new(target: usize) -> Bodies {
        let text = "The quick brown fox jumps over the lazy dog; the dog, unimpressed, goes back to sleep while the fox runs. ";
        let text = &format!("{text}{}", &text[..125 - text.len()]);
        let mut events: Vec<String> = vec![
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n".into(),
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".into(),
        ];
        let delta = format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\n\n"
        );
        let mut len: usize = events.iter().map(String::len).sum();
        while len < target {
            len += delta.len();
            events.push(delta.clone());
        }
        events.push(
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
                .into(),
        );
        events.push("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":99}}\n\n".into());
        events.push("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".into());
        let payload = events.concat().into_bytes();
        let chunked = |pieces: &mut dyn Iterator<Item = &[u8]>| {
            let mut out = Vec::with_capacity(payload.len() * 11 / 10);
            for piece in pieces {
                out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                out.extend_from_slice(piece);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
            out
        };
        let events = chunked(&mut events.iter().map(|e| e.as_bytes()));
        let bulk = chunked(&mut payload.chunks(64 * 1024));
        Bodies {
            payload,
            events,
            bulk,
        }
    }
}

/// What the source does for the one paced request at a time: writes event `i + 1` only after
/// the client saw event `i`, and says when it wrote each.
struct Pacing {
    sent: mpsc::Sender<Instant>,
    acks: mpsc::Receiver<()>,
}

/// The loopback source: `?events` and `?bulk` answer the whole stream as fast as the socket
/// takes it; `?paced` answers `paced_events` deltas one at a time.
pub struct Source {
    pub addr: SocketAddr,
    pacing: Arc<Mutex<Pacing>>,
    sent: mpsc::Receiver<Instant>,
    acks: mpsc::Sender<()>,
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";

impl Source {
    pub fn start(bodies: Arc<Bodies>) -> std::io::Result<Source> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let (sent_tx, sent_rx) = mpsc::channel();
        let (ack_tx, ack_rx) = mpsc::channel();
        let pacing = Arc::new(Mutex::new(Pacing {
            sent: sent_tx,
            acks: ack_rx,
        }));
        let shared = pacing.clone();
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(sock) = sock else { continue };
                let (bodies, pacing) = (bodies.clone(), shared.clone());
                std::thread::spawn(move || serve(sock, &bodies, &pacing));
            }
        });
        Ok(Source {
            addr,
            pacing,
            sent: sent_rx,
            acks: ack_tx,
        })
    }
}

fn serve(mut sock: TcpStream, bodies: &Bodies, pacing: &Mutex<Pacing>) {
    let _ = sock.set_nodelay(true);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        if let Some(p) = memchr::memmem::find(&seen, b"\r\n\r\n") {
            break p;
        }
    };
    let head = &seen[..head_end];
    let has = |q: &[u8]| memchr::memmem::find(head, q).is_some();
    if sock.write_all(HEAD).is_err() {
        return;
    }
    if has(b"?paced") {
        let Ok(pacing) = pacing.lock() else { return };
        // Stale acknowledgements of an earlier request must not pace this one.
        while pacing.acks.try_recv().is_ok() {}
        let event = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"The quick brown fox jumps over the lazy dog; the dog, unimpressed, goes back to sleep while the fox runs away.\"}}\n\n";
        let chunk = [format!("{:x}\r\n", event.len()).as_bytes(), event, b"\r\n"].concat();
        let n = paced_count(head);
        for _ in 0..n {
            let _ = pacing.sent.send(Instant::now());
            if sock.write_all(&chunk).is_err() {
                return;
            }
            if pacing.acks.recv_timeout(Duration::from_secs(10)).is_err() {
                return;
            }
        }
        let _ = sock.write_all(b"0\r\n\r\n");
    } else {
        let body = if has(b"?bulk") {
            &bodies.bulk
        } else {
            &bodies.events
        };
        let _ = sock.write_all(body);
    }
    // Close only after the peer did: closing with its request body unread would send a reset,
    // which may discard the end of the response on its way.
    let _ = sock.shutdown(std::net::Shutdown::Write);
    let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = sock.read_to_end(&mut Vec::new());
}

/// `?paced=N` in the request head.
fn paced_count(head: &[u8]) -> usize {
    let Some(at) = memchr::memmem::find(head, b"?paced=") else {
        return 0;
    };
    head[at + 7..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0, |n, b| n * 10 + usize::from(b - b'0'))
}

fn request(relay: &Relay, query: &str) -> std::io::Result<TcpStream> {
    let mut sock = TcpStream::connect(relay.addr)?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = b"{\"stream\":true}";
    let head = format!(
        "POST {}?{query} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        relay.path,
        relay.addr,
        body.len()
    );
    sock.write_all(head.as_bytes())?;
    sock.write_all(body)?;
    Ok(sock)
}

/// Decodes a chunked HTTP/1.1 response (head included) into its body.
fn dechunk(raw: &[u8]) -> Result<Vec<u8>, String> {
    let start = memchr::memmem::find(raw, b"\r\n\r\n").ok_or("no response head")? + 4;
    let head = String::from_utf8_lossy(&raw[..start]).to_ascii_lowercase();
    if !head.starts_with("http/1.1 200") {
        return Err(format!("not a 200: {}", head.lines().next().unwrap_or("")));
    }
    if !head.contains("transfer-encoding: chunked") {
        return Ok(raw[start..].to_vec());
    }
    let (mut at, mut body) = (start, Vec::new());
    loop {
        let line_end = memchr::memmem::find(&raw[at..], b"\r\n").ok_or("cut-off chunk size")? + at;
        let size_text = std::str::from_utf8(&raw[at..line_end]).map_err(|e| e.to_string())?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("chunk size {size_text:?}: {e}"))?;
        at = line_end + 2;
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(raw.get(at..at + size).ok_or("cut-off chunk")?);
        at += size + 2;
    }
}

/// Reads one response whole through `relay` and checks that its body is the source's payload,
/// byte for byte.
pub fn verify(relay: &Relay, query: &str, payload: &[u8]) -> Result<(), String> {
    let mut sock = request(relay, query).map_err(|e| format!("{}: {e}", relay.name))?;
    let mut raw = Vec::new();
    sock.read_to_end(&mut raw)
        .map_err(|e| format!("{}: {e}", relay.name))?;
    let body = dechunk(&raw).map_err(|e| format!("{}: {e}", relay.name))?;
    if body != payload {
        return Err(format!(
            "{}: the body differs from what the source sent ({} bytes, {} expected)",
            relay.name,
            body.len(),
            payload.len()
        ));
    }
    Ok(())
}

/// A process's user + system CPU time so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos(
        (utime + stime) * 1_000_000_000 / ticks,
    ))
}

/// One whole response read as fast as possible: (wall time, relay CPU time).
pub fn read_through(relay: &Relay, query: &str) -> Result<(Duration, Duration), String> {
    let cpu0 = relay.pid.and_then(cpu_time).unwrap_or_default();
    let start = Instant::now();
    let mut sock = request(relay, query).map_err(|e| format!("{}: {e}", relay.name))?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut tail = [0u8; 5];
    let mut total = 0usize;
    loop {
        let n = sock
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", relay.name))?;
        if n == 0 {
            break;
        }
        total += n;
        if n >= 5 {
            tail.copy_from_slice(&buf[n - 5..n]);
        } else {
            tail.rotate_left(n);
            tail[5 - n..].copy_from_slice(&buf[..n]);
        }
    }
    let wall = start.elapsed();
    if &tail != b"0\r\n\r\n" || total < 1000 {
        return Err(format!("{}: cut-off response ({total} bytes)", relay.name));
    }
    let cpu1 = relay.pid.and_then(cpu_time).unwrap_or_default();
    Ok((wall, cpu1.saturating_sub(cpu0)))
}

/// Per-event delay through `relay`, µs: `n` events, each written by the source only after the
/// client saw the one before.
pub fn paced(source: &Source, relay: &Relay, n: usize, out: &mut Vec<f64>) -> Result<(), String> {
    while source.sent.try_recv().is_ok() {}
    let mut sock =
        request(relay, &format!("paced={n}")).map_err(|e| format!("{}: {e}", relay.name))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut last = 0u8;
    let mut seen = 0;
    while seen < n {
        let got = sock
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", relay.name))?;
        if got == 0 {
            return Err(format!(
                "{}: cut off after {seen} of {n} events",
                relay.name
            ));
        }
        let now = Instant::now();
        let mut events = memchr::memmem::find_iter(&buf[..got], b"\n\n").count();
        if last == b'\n' && buf[0] == b'\n' {
            events += 1;
        }
        last = buf[got - 1];
        for _ in 0..events {
            if let Ok(at) = source.sent.recv_timeout(Duration::from_secs(10)) {
                out.push(now.duration_since(at).as_secs_f64() * 1e6);
            }
            seen += 1;
            let _ = source.acks.send(());
        }
    }
    // Let the source finish and the relay see the end of the response.
    let _ = sock.read_to_end(&mut Vec::new());
    let _ = &source.pacing;
    Ok(())
}

/// The release binary as a daemon in front of `source`: no kernel layer, its own database and
/// socket in `dir`.
pub fn start_toolwall(bin: &Path, dir: &Path, source: SocketAddr) -> Result<(Proc, u16), String> {
    let port = free_port();
    let api = free_port();
    let config = dir.join("toolwall.yaml");
    std::fs::write(
        &config,
        format!(
            "proxy:\n  listen: 127.0.0.1:{port}\n  providers:\n    anthropic: http://{source}\n    openai: http://{source}\n  pass_through:\n    - provider: openai\n      route: \"* /v1/files\"\nstore:\n  path: {}\nnetmon:\n  enabled: false\napi:\n  listen: 127.0.0.1:{api}\n  socket: {}\n",
            dir.join("events.db").display(),
            dir.join("api.sock").display()
        ),
    )
    .map_err(|e| format!("write {}: {e}", config.display()))?;
    let proc = start_listening(
        Command::new(bin)
            .args(["run", "--config"])
            .arg(&config)
            .env("TOOLWALL_LOG", "warn"),
        port,
        "toolwall run",
    )?;
    Ok((proc, port))
}

/// nginx in front of `source`, one process (no master), on two ports: its default proxy
/// settings (buffering on) and `proxy_buffering off`. HTTP/1.1 to the source in both, since
/// the source answers chunked.
pub fn start_nginx(dir: &Path, source: SocketAddr) -> Result<(Proc, u16, u16), String> {
    let (buffered, unbuffered) = (free_port(), free_port());
    let proc = run_nginx(
        dir,
        &format!(
            "server {{ listen 127.0.0.1:{buffered}; location / {{ proxy_pass http://{source}; proxy_http_version 1.1; }} }}\n\
             server {{ listen 127.0.0.1:{unbuffered}; location / {{ proxy_pass http://{source}; proxy_http_version 1.1; proxy_buffering off; }} }}\n"
        ),
        unbuffered,
    )?;
    Ok((proc, buffered, unbuffered))
}

/// One nginx process (no master, files under `dir`) with `http` inside its `http {}` block,
/// once it listens on `port`.
pub fn run_nginx(dir: &Path, http: &str, port: u16) -> Result<Proc, String> {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or("nginx is not installed (cargo xtask bench installs Debian's nginx as root)")?;
    let d = dir.display();
    let config = dir.join("nginx.conf");
    std::fs::write(
        &config,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n{http}}}\n"
        ),
    )
    .map_err(|e| format!("write {}: {e}", config.display()))?;
    start_listening(
        Command::new(nginx)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&config),
        port,
        "nginx",
    )
}
