//! A store that falls behind: a flood of calls or connections waits for it, or is counted, and
//! never fills the daemon's memory.

use super::*;

/// After `RELAY_OPEN`, the agent sends `tools/call`s of ~200 KiB of arguments for `SECONDS`, draining its replies
/// in a thread, and prints how many it wrote.
const FLOOD_CALLS: &str = r#"
import threading
def drain():
    while os.read(r_out, 1 << 16):
        pass
threading.Thread(target=drain, daemon=True).start()
if os.environ.get("SHAPE") == "deep":
    # Parsed, many times its text; a deep branch last, which a size walk meets first.
    deep = "[" * 40 + "0" + "]" * 40
    args = '{"a":[[' + ",".join(["0"] * 65537) + '],[' + ",".join(["0"] * 32769) + '],' + deep + ']}'
else:
    args = '{"a":"' + "x" * (200 << 10) + '"}'
args = args.encode()
sent = 0
def flood():
    global sent
    while True:
        os.write(w_in, b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"t","arguments":%s}}\n' % (sent + 1, args))
        sent += 1
threading.Thread(target=flood, daemon=True).start()
time.sleep(float(os.environ["SECONDS"]))
print("sent", sent, flush=True)
os._exit(0)
"#;

/// What waits for the store is bounded in bytes. The store cannot write (a full disk), so
/// every call's record waits in the queue: the relay stops reading the agent once 32 MiB of
/// records wait, instead of queueing all it sends (unbounded, the daemon's memory grows with
/// every call, ~200 KiB each, for as long as the agent sends: 2,424 calls, 528 MB in 12 s).
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_flood_of_calls_waits_for_the_store_instead_of_filling_the_daemon() {
    let (_, most_queued, peak_kb) = flood_calls("text");
    assert!(
        most_queued > 16 << 20,
        "the store could not write, so the queue filled up ({most_queued} bytes)"
    );
    assert!(
        most_queued < (32 << 20) + (2 << 20),
        "the queue stays within its bound plus one read's calls ({most_queued} bytes)"
    );
    assert!(peak_kb < 200 << 10, "the daemon peaked at {peak_kb} kB");
}

/// A record weighs what it holds in memory: weighed by a walk that stops at the first deep
/// branch (a deep branch last in an array is walked first), or by their text where parsed
/// values hold many times it, 262 calls weigh 204 KB and hold 877 MB.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_arguments_that_are_heavy_once_parsed_weigh_what_they_hold() {
    let (sent, most_queued, peak_kb) = flood_calls("deep");
    assert!(sent > 0);
    assert!(
        most_queued < (32 << 20) + (16 << 20),
        "the queue stays within its bound plus one read's calls ({most_queued} bytes)"
    );
    assert!(peak_kb < 250 << 10, "the daemon peaked at {peak_kb} kB");
}

/// Runs [`FLOOD_CALLS`] with arguments of `shape` for 12 s against a daemon whose store
/// cannot write; (calls sent, most bytes queued, the daemon's peak kB).
fn flood_calls(shape: &str) -> (u64, u64, u64) {
    assert!(is_root());
    let small = SmallDisk::mount();
    let dir = shared_dir();
    let server = write(dir.path(), "quiet.py", QUIET_SERVER);
    let agent = write(dir.path(), "flood.py", &relay_agent(FLOOD_CALLS));
    let mut daemon = Daemon::start_with_db(
        &format!(
            "sandbox:\n  mcp:\n    servers:\n      - id: quiet\n        type: stdio\n        command: /usr/bin/python3\n        args: [{}]\n        user: nobody\n",
            server.display()
        ),
        small.db(),
    );
    small.fill();
    let run = exec_nobody(&daemon, "flood", &agent, dir.path())
        .env("SECONDS", "12")
        .env("SHAPE", shape)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("toolwall exec");
    let mut most_queued = 0u64;
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(11) {
        std::thread::sleep(std::time::Duration::from_millis(250));
        let (_, health) = http_unix(&daemon.socket, "GET", "/health", "").expect("/health");
        let health: serde_json::Value = serde_json::from_str(&health).expect("json");
        most_queued = most_queued.max(health["queued_event_bytes"].as_u64().unwrap_or(0));
        assert_eq!(
            health["queued_event_bytes_max"].as_u64(),
            Some(32 << 20),
            "{health}"
        );
    }
    let out = run.wait_with_output().expect("the agent");
    let said = String::from_utf8_lossy(&out.stdout);
    let sent: u64 = said
        .trim()
        .strip_prefix("sent ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the agent said {said:?}"));
    let peak_kb = peak_kb(daemon.child.id());
    println!(
        "{shape}: sent {sent} calls; at most {most_queued} bytes queued; daemon peak {peak_kb} kB"
    );
    let stopping = std::time::Instant::now();
    daemon.stop();
    assert!(
        stopping.elapsed() < std::time::Duration::from_secs(20),
        "stopped in {:?}",
        stopping.elapsed()
    );
    (sent, most_queued, peak_kb)
}

/// A 4 MiB tmpfs for a daemon's store, unmounted when dropped.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount() -> SmallDisk {
        let dir = tempfile::tempdir().expect("temp dir");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "toolwall-small"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(mounted.success(), "mount a 4 MiB tmpfs");
        SmallDisk(dir)
    }

    fn db(&self) -> std::path::PathBuf {
        self.0.path().join("events.db")
    }

    /// From now on every write of the store fails.
    fn fill(&self) {
        let mut filler = std::fs::File::create(self.0.path().join("filler")).expect("filler");
        let chunk = vec![0u8; 64 << 10];
        while std::io::Write::write_all(&mut filler, &chunk).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.0.path().join("filler")).expect("free the disk");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// The agent re-runs itself with a 1.9 MB command line, then connects to the declared
/// server's address (nothing listens) as fast as it can for `SECONDS`.
const CONNECT_FLOOD: &str = r#"
import os, sys, socket, time
if len(sys.argv) < 3:
    os.execv(sys.executable, [sys.executable, sys.argv[0], "go"] + ["y" * 120000] * 16)
port = int(os.environ["PORT"])
t0 = time.time()
n = 0
while time.time() - t0 < float(os.environ["SECONDS"]):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        pass
    s.close()
    n += 1
print("connects", n, flush=True)
"#;

/// The kernel layer's records ask for room in the queue too, and carry at most 4 KiB of the
/// process's command line (a connect flood of records that did not ask, each with the whole
/// command line, takes the queue to 3.2 GB; reading the command line whole per connection
/// alone takes the daemon to 873 MB). While the queue is full the kernel's records are counted
/// per (session, server, destination, verdict) and stored as counts once the store writes
/// again (`netmon/service/backlog.rs`) — nothing waits past the bound, nothing goes unsaid.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_connect_flood_while_the_store_is_behind_is_counted_not_queued() {
    assert!(is_root());
    let small = SmallDisk::mount();
    let dir = shared_dir();
    let agent = write(dir.path(), "connects.py", CONNECT_FLOOD);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("addr").port()
    };
    let mut daemon = Daemon::start_with_db(
        &format!(
            "sandbox:\n  mcp:\n    servers:\n      - id: net\n        type: http\n        url: http://127.0.0.1:{port}/mcp\n"
        ),
        small.db(),
    );
    small.fill();
    let run = exec_nobody(&daemon, "connects", &agent, dir.path())
        .env("SECONDS", "8")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("toolwall exec");
    let mut most_queued = 0u64;
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(8) {
        std::thread::sleep(std::time::Duration::from_millis(250));
        let (_, health) = http_unix(&daemon.socket, "GET", "/health", "").expect("/health");
        let health: serde_json::Value = serde_json::from_str(&health).expect("json");
        most_queued = most_queued.max(health["queued_event_bytes"].as_u64().unwrap_or(0));
    }
    let out = run.wait_with_output().expect("the agent");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let peak_kb = peak_kb(daemon.child.id());
    println!("{said}; at most {most_queued} bytes queued; daemon peak {peak_kb} kB");
    assert!(said.starts_with("connects "), "{said}");
    assert!(
        most_queued < (32 << 20) + (4 << 20),
        "the queue stays near its bound ({most_queued} bytes)"
    );
    assert!(peak_kb < 300 << 10, "the daemon peaked at {peak_kb} kB");
    // The disk frees: what was counted is stored, as counts.
    small.free();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let counted = loop {
        let rows = daemon.json_lines(&[
            "mcp",
            "events",
            "--json",
            "--type",
            "mcp_network_connection",
            "--session",
            "connects",
        ]);
        let counted: u64 = rows
            .iter()
            .filter(|r| r["count"].as_u64().unwrap_or(1) > 1)
            .map(|r| r["count"].as_u64().unwrap_or(0))
            .sum();
        if counted > 0 || std::time::Instant::now() > deadline {
            for row in &rows {
                let cmdline = row["cmdline"].as_str().unwrap_or_default();
                assert!(
                    cmdline.len() < 5000,
                    "a cut command line: {} bytes",
                    cmdline.len()
                );
            }
            break counted;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(
        counted > 0,
        "the connections made while the store was behind are stored as counts"
    );
    daemon.stop();
}
