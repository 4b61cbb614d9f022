//! One client must not stall or bloat the LLM proxy for the others, through the real
//! `toolwall run` against a local fake upstream:
//! - thousands of connections that send only the HTTP/2 (h2c) preface are closed at once, and
//!   thousands that send nothing fill only their own client's connection cap
//!   (`proxy.max_connections_per_client`; the flood runs as `nobody`, the good request as
//!   root), while a normal request is answered;
//! - requests that announce a large body and send one byte hold no body-reading place, and a
//!   body the memory budget cannot hold is refused with a 503 that names the setting;
//! - one client holds at most a quarter of the budget: another client's 1 MiB request is
//!   answered while the first one's slow bodies hold all they may;
//! - dozens of streams each holding an unfinished 8 MiB `tool_use` start stay within
//!   `proxy.memory_budget_bytes` (the daemon's peak RSS is measured), the streams past it end
//!   with the clear error, and a normal request is still answered.
//!
//! The floods need descriptors: the test raises its `RLIMIT_NOFILE` (root may raise the hard
//! limit too), which the flooding child inherits.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use toolwall_tests::{Daemon, is_root};

/// An answer the SDKs take for a non-streamed `/v1/messages`.
const MESSAGE: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}"#;

/// The start of a `tool_use` block whose input never ends.
const STALLED_START: &str = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"x\",\"input\":{\"a\":\"";

/// Bytes of `x` after [`STALLED_START`]: just under the per-response bound (8 MiB by default),
/// so only the shared budget can stop them.
const STALLED_BYTES: usize = 8 * 1024 * 1024 - 4096;

/// A fake Anthropic upstream: a request whose body says `stall` gets a stream that stops inside
/// an 8 MiB `tool_use` start and never ends; any other gets [`MESSAGE`].
struct Upstream {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake upstream");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                let stopping = stopping.clone();
                std::thread::spawn(move || answer(conn, &stopping));
            }
        });
        Upstream { port, stop }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads one request (head and `content-length` body) and answers it.
fn answer(mut conn: TcpStream, stop: &AtomicBool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = &buf[head_end..];
    if !body.windows(5).any(|w| w == b"stall") {
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{MESSAGE}",
            MESSAGE.len()
        );
        return;
    }
    let started = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n";
    let ok = conn
        .write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        )
        .is_ok()
        && send(&mut conn, started.as_bytes())
        && send(&mut conn, STALLED_START.as_bytes());
    if !ok {
        return;
    }
    let xs = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < STALLED_BYTES {
        let n = xs.len().min(STALLED_BYTES - sent);
        if !send(&mut conn, &xs[..n]) {
            return;
        }
        sent += n;
    }
    // Never finishes: held until the proxy closes or the test ends.
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut chunk) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return,
        }
    }
}

/// One chunk of a chunked body.
fn send(conn: &mut TcpStream, data: &[u8]) -> bool {
    conn.write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .and_then(|()| conn.write_all(data))
        .and_then(|()| conn.write_all(b"\r\n"))
        .is_ok()
}

fn daemon(upstream: &Upstream, proxy_extra: &str) -> Daemon {
    Daemon::start(&format!(
        "proxy:\n  listen: 127.0.0.1:0\n  providers:\n    anthropic: http://127.0.0.1:{port}\n    openai: http://127.0.0.1:{port}\n{proxy_extra}netmon:\n  enabled: false\n",
        port = upstream.port
    ))
}

fn proxy_addr(daemon: &Daemon) -> String {
    daemon
        .proxy
        .as_deref()
        .expect("the LLM proxy is on")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// A `/v1/messages` request as the SDKs send it (HTTP/1.1, JSON body); returns the status, the
/// body, and how long the answer took.
fn post_message(addr: &str, content: &str, timeout: Duration) -> (u16, String, Duration) {
    let started = Instant::now();
    let body = format!(
        r#"{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":"{content}"}}]}}"#
    );
    let mut conn = TcpStream::connect(addr).expect("connect to the proxy");
    conn.set_read_timeout(Some(timeout)).expect("timeout");
    write!(
        conn,
        "POST /v1/messages HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\nx-api-key: k\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body, started.elapsed())
}

/// Raises this process's descriptor limit (its children inherit it).
fn raise_nofile(want: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        if limit.rlim_cur < want {
            limit.rlim_cur = want;
            limit.rlim_max = limit.rlim_max.max(want);
            assert_eq!(
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit),
                0,
                "raise RLIMIT_NOFILE to {want}"
            );
        }
    }
}

/// Opens `count` connections to `addr` as user `nobody`, sends each `send` (hex), waits 3 s,
/// and prints how many the proxy has closed and how many it keeps open; holds them until its
/// standard input closes.
const FLOOD: &str = r#"
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
count, send = int(sys.argv[2]), bytes.fromhex(sys.argv[3])
socks, failed = [], 0
for _ in range(count):
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect((host, int(port)))
        if send:
            s.sendall(send)
        socks.append(s)
    except OSError:
        failed += 1
        s.close()
print("connected", len(socks), "failed", failed, flush=True)
time.sleep(3)
closed = 0
for s in socks:
    s.setblocking(False)
    try:
        while s.recv(65536):
            pass
        closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
print("closed", closed, "open", len(socks) - closed, flush=True)
sys.stdin.read()
"#;

struct Flood {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Flood {
    fn start(addr: &str, count: usize, send: &[u8]) -> Flood {
        use std::io::BufRead;
        let hex: String = send.iter().map(|b| format!("{b:02x}")).collect();
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", FLOOD, addr, &count.to_string(), &hex])
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the flood as nobody");
        let lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        Flood { child, lines }
    }

    /// The numbers of the next line the flood prints (`word n word n`).
    fn numbers(&mut self) -> Vec<usize> {
        let line = self
            .lines
            .next()
            .expect("the flood prints a line")
            .expect("read");
        line.split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "privileged: the flood runs as nobody; `cargo xtask test` runs it as root"]
fn floods_of_idle_and_h2c_connections_leave_other_clients_answered() {
    assert!(is_root(), "needs root to run the flood as nobody");
    raise_nofile(16384);
    let upstream = Upstream::start();
    let daemon = daemon(&upstream, "");
    let addr = proxy_addr(&daemon);

    // h2c prefaces: answered and closed at once (HTTP/1.1 only), none held.
    let mut flood = Flood::start(&addr, 5000, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    let connected = flood.numbers();
    assert_eq!(
        connected[0], 5000,
        "every connection was made: {connected:?}"
    );
    let (status, body, took) = post_message(&addr, "hi", Duration::from_secs(20));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("hello"), "{body}");
    let held = flood.numbers();
    eprintln!("h2c flood: {held:?} (closed, open); good request answered in {took:?}");
    assert_eq!(held[1], 0, "no h2c connection is held: {held:?}");
    drop(flood);

    // Connections that send nothing: held (until the head time-out) only up to the client's
    // cap; the rest are closed, and another client is answered. Three times the cap, so the
    // flood is over well within the 30 s head time-out even where each refusal is slow (a
    // debug build identifies each connection's client): past it, the held ones would be
    // closed and the client admitted again, a new burst.
    let mut flood = Flood::start(&addr, 1536, b"");
    let connected = flood.numbers();
    assert_eq!(
        connected[0], 1536,
        "every connection was made: {connected:?}"
    );
    let (status, body, took) = post_message(&addr, "hi", Duration::from_secs(20));
    assert_eq!(status, 200, "{body}");
    let held = flood.numbers();
    eprintln!("idle flood: {held:?} (closed, open); good request answered in {took:?}");
    assert_eq!(held[1], 512, "the flooding client keeps its cap: {held:?}");
    let warned = daemon
        .stderr()
        .matches("proxy.max_connections_per_client")
        .count();
    assert_eq!(warned, 1, "one warning for the burst:\n{}", daemon.stderr());
}

#[test]
fn slow_bodies_hold_no_reading_place_and_the_budget_refuses_what_it_cannot_hold() {
    raise_nofile(4096);
    let upstream = Upstream::start();
    let daemon = daemon(&upstream, "  memory_budget_bytes: 16777216\n");
    let addr = proxy_addr(&daemon);
    // 64 bodies that announce 10 MB and send one byte.
    let slow: Vec<TcpStream> = (0..64)
        .map(|_| {
            let mut conn = TcpStream::connect(&addr).expect("connect");
            write!(
                conn,
                "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 10000000\r\n\r\n{{"
            )
            .expect("send");
            conn
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (status, body, took) = post_message(&addr, "hi", Duration::from_secs(30));
    eprintln!("with 64 slow bodies, a normal request took {took:?}");
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(10), "answered in {took:?}");

    // A body larger than the budget (16 MiB) is refused once the budget cannot take more.
    let big = vec![b'a'; 20 * 1024 * 1024];
    let mut conn = TcpStream::connect(&addr).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        conn,
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        big.len()
    )
    .expect("send");
    // The proxy may answer (and close) before it has read everything.
    let _ = conn.write_all(&big);
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        text.contains("toolwall: the proxy's memory budget")
            && text.contains("proxy.memory_budget_bytes"),
        "{text}"
    );
    // What it held is free again.
    let (status, body, _) = post_message(&addr, "hi", Duration::from_secs(30));
    assert_eq!(status, 200, "{body}");
    drop(slow);
}

#[test]
#[ignore = "privileged: the second client runs as nobody; `cargo xtask test` runs it as root"]
fn one_client_holds_a_quarter_of_the_budget_and_another_client_still_gets_room() {
    assert!(
        is_root(),
        "needs root to send the second client's request as nobody"
    );
    let upstream = Upstream::start();
    // A budget of 16 MiB: each client may hold 4 MiB.
    let daemon = daemon(&upstream, "  memory_budget_bytes: 16777216\n");
    let addr = proxy_addr(&daemon);
    // This client (root) sends six bodies of 3 MiB each, all but the last byte, and stops:
    // 18 MiB would take the whole budget; past its 4 MiB share they are refused (an answer
    // that arrives before the connection is reset is the share's 503).
    let mut held = Vec::new();
    for _ in 0..6 {
        let mut conn = TcpStream::connect(&addr).expect("connect");
        conn.set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        conn.set_write_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let len = 3 * 1024 * 1024;
        write!(
            conn,
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
        .expect("send");
        let _ = conn.write_all(&vec![b' '; len - 1]);
        let mut got = [0u8; 512];
        if let Ok(n) = conn.read(&mut got)
            && n > 0
        {
            let text = String::from_utf8_lossy(&got[..n]);
            assert!(
                text.starts_with("HTTP/1.1 503") && text.contains("its share"),
                "{text}"
            );
        }
        held.push(conn);
    }
    // Another client (nobody) sends a 1 MiB body: answered.
    let body = format!(
        "{{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}]}}",
        "a".repeat(1024 * 1024)
    );
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), body).expect("write body");
    std::fs::set_permissions(
        file.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("readable by nobody");
    let out = Command::new("runuser")
        .args([
            "-u",
            "nobody",
            "--",
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(["-H", "content-type: application/json", "--data-binary"])
        .arg(format!("@{}", file.path().display()))
        .arg(format!("http://{addr}/v1/messages"))
        .output()
        .expect("run curl as nobody");
    let status = String::from_utf8_lossy(&out.stdout);
    assert_eq!(status, "200", "{}", String::from_utf8_lossy(&out.stderr));
    drop(held);
}

/// The daemon's resident memory now and at its peak, in KiB (`/proc/PID/status`).
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn stalled_tool_use_streams_stay_within_the_memory_budget() {
    const STREAMS: usize = 64;
    const BUDGET: u64 = 64 * 1024 * 1024;
    raise_nofile(4096);
    let upstream = Upstream::start();
    let daemon = daemon(&upstream, &format!("  memory_budget_bytes: {BUDGET}\n"));
    let addr = proxy_addr(&daemon);
    let pid = daemon.child.id();
    // Warm up the paths a request takes, then measure where the daemon starts.
    let (status, body, _) = post_message(&addr, "hi", Duration::from_secs(30));
    assert_eq!(status, 200, "{body}");
    let (baseline, _) = rss_kib(pid);

    let streams: Vec<_> = (0..STREAMS)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let body = r#"{"model":"m","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"stall"}]}"#;
                let mut conn = TcpStream::connect(&addr).expect("connect");
                conn.set_read_timeout(Some(Duration::from_secs(25)))
                    .expect("timeout");
                write!(
                    conn,
                    "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .expect("send");
                let mut got = Vec::new();
                let mut buf = [0u8; 65536];
                // Until the proxy ends the response (a stream it holds within the budget
                // stays open until the read time-out).
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                    if got.windows(5).any(|w| w == b"\r\n0\r\n") {
                        break;
                    }
                }
                String::from_utf8_lossy(&got).into_owned()
            })
        })
        .collect();
    // Sample the daemon's memory while the streams arrive.
    let started = Instant::now();
    let mut peak = 0;
    while started.elapsed() < Duration::from_secs(12) {
        peak = peak.max(rss_kib(pid).0);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Meanwhile, another request is answered.
    let (status, body, took) = post_message(&addr, "hi", Duration::from_secs(20));
    assert_eq!(status, 200, "{body}");
    let (now, hwm) = rss_kib(pid);
    let outcomes: Vec<String> = streams
        .into_iter()
        .map(|t| t.join().expect("stream thread"))
        .collect();
    let failed = outcomes
        .iter()
        .filter(|o| o.contains("proxy.memory_budget_bytes"))
        .count();
    let held = outcomes
        .iter()
        .filter(|o| !o.contains("event: error"))
        .count();
    eprintln!(
        "baseline {baseline} KiB; sampled peak {peak} KiB; VmHWM {hwm} KiB; now {now} KiB; {failed} of {STREAMS} streams ended over the budget, {held} held; normal request answered in {took:?}"
    );
    // At most the budget's worth of streams can be held whole: the rest must have ended, each
    // with the error that names the setting.
    let fit = (BUDGET as usize).div_ceil(STALLED_BYTES);
    assert!(failed >= STREAMS - fit, "{failed} ended over the budget");
    assert_eq!(failed + held, STREAMS, "no other outcome: {outcomes:?}");
    for o in outcomes.iter().filter(|o| o.contains("event: error")) {
        assert!(o.contains("memory budget"), "{o}");
    }
    // The peak resident memory: the start, the budget, and a fixed allowance (buffers of the
    // connections, the allocator's slack). Without the budget the streams take 512 MiB.
    let allowance_kib = 32 * 1024;
    assert!(
        hwm <= baseline + BUDGET / 1024 + allowance_kib,
        "peak RSS {hwm} KiB over baseline {baseline} KiB + budget + {allowance_kib} KiB"
    );
}
