//! Helpers shared by the end-to-end tests: where the built `toolwall` binary and the real peers
//! (official Python SDKs in a virtualenv, reference MCP servers from npm) are.
//!
//! `cargo xtask test` builds the binary and installs the peers under `target/peers` before it
//! runs these tests, and passes both locations in the environment. Run directly with
//! `cargo test -p toolwall-tests`, they fall back to the same default places and fail with a
//! message saying to run `cargo xtask test` (or `cargo xtask peers`) when something is missing.

use std::path::{Path, PathBuf};

pub mod fake_model;
pub mod session;

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The `toolwall` binary under test: `TOOLWALL_BIN`, else `target/debug/toolwall`.
pub fn toolwall_bin() -> PathBuf {
    let bin = std::env::var_os("TOOLWALL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("debug/toolwall"));
    assert!(
        bin.exists(),
        "{} does not exist: run `cargo build -p agent` or `cargo xtask test`",
        bin.display()
    );
    bin
}

/// Where xtask installs the real peers: `TOOLWALL_PEERS_DIR`, else `target/peers`.
pub fn peers_dir() -> PathBuf {
    std::env::var_os("TOOLWALL_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("peers"))
}

fn peer(relative: &str) -> PathBuf {
    let path = peers_dir().join(relative);
    assert!(
        path.exists(),
        "{} does not exist: run `cargo xtask peers` (or `cargo xtask test`)",
        path.display()
    );
    path
}

/// The virtualenv's Python, with `anthropic`, `openai` and `mcp` installed.
pub fn python() -> PathBuf {
    peer("venv/bin/python")
}

/// The reference MCP server `@modelcontextprotocol/server-everything` (stdio, sse, streamableHttp).
pub fn server_everything() -> PathBuf {
    peer("node/node_modules/.bin/mcp-server-everything")
}

/// The official MCP conformance suite's CLI (`@modelcontextprotocol/conformance`), installed
/// apart from the other npm peers (its reference server needs zod 3).
pub fn conformance_suite() -> PathBuf {
    peer("conformance/node_modules/.bin/conformance")
}

/// The `node_modules` the conformance suite's reference server
/// (`tests/peers/conformance/everything-server.ts`) runs with: the TypeScript SDK, zod 3, `tsx`.
pub fn conformance_modules() -> PathBuf {
    peer("conformance/node_modules/tsx");
    peers_dir().join("conformance/node_modules")
}

/// Agents `toolwall exec` starts as root get a `/tmp` of their own, so a test run as root that
/// hands them files (scripts, sockets, the daemon's API socket) keeps its temporary files
/// elsewhere: `cargo xtask test` sets `TMPDIR`.
fn assert_agents_see_temp_files() {
    let tmp = std::env::temp_dir();
    assert!(
        !is_root()
            || !["/tmp", "/var/tmp", "/dev/shm"]
                .iter()
                .any(|d| tmp.starts_with(d)),
        "TMPDIR is {}: agents under `toolwall exec` would not see the test's files there (their /tmp is private); set TMPDIR to a directory others can enter, as `cargo xtask test` does (/var/lib/toolwall-tests)",
        tmp.display()
    );
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Whether this process runs as root (privileged tests need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A `toolwall run` daemon on private ports, socket and database (in a temp directory),
/// killed when dropped.
pub struct Daemon {
    /// The process.
    pub child: std::process::Child,
    /// Its API's HTTP address (`127.0.0.1:PORT`).
    pub api: String,
    /// Its LLM proxy's base URL (`http://127.0.0.1:PORT`), when on.
    pub proxy: Option<String>,
    /// Its API socket.
    pub socket: PathBuf,
    /// Its event database.
    pub db: PathBuf,
    /// The configuration file it runs with.
    pub config: PathBuf,
    /// Everything it wrote to stdout and stderr so far, once stopped.
    pub dir: tempfile::TempDir,
    /// Its own pin directory on bpffs (`netmon.pin_dir`), removed when it is dropped.
    pub pin_dir: PathBuf,
}

impl Daemon {
    /// Starts a daemon whose configuration is `extra` YAML plus private `api` and `store`
    /// settings (and `proxy.listen: 127.0.0.1:0` unless `extra` has a `proxy:` section, which
    /// should then listen on port 0 too); waits until it prints its addresses.
    pub fn start(extra: &str) -> Daemon {
        Self::start_wrapped(extra, &[])
    }

    /// [`Self::start`], with `toolwall run ...` started as the arguments of `wrapper` (say,
    /// `unshare -m ...` to give the daemon a private `/etc/hosts`).
    pub fn start_wrapped(extra: &str, wrapper: &[String]) -> Daemon {
        Self::start_full(extra, wrapper, None, &toolwall_bin())
    }

    /// [`Self::start`] of another toolwall binary (another build).
    pub fn start_of(extra: &str, bin: &Path) -> Daemon {
        Self::start_full(extra, &[], None, bin)
    }

    /// [`Self::start`], with the event database at `db` (say, on a small tmpfs).
    pub fn start_with_db(extra: &str, db: PathBuf) -> Daemon {
        Self::start_full(extra, &[], Some(db), &toolwall_bin())
    }

    fn start_full(extra: &str, wrapper: &[String], db: Option<PathBuf>, bin: &Path) -> Daemon {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DAEMONS: AtomicUsize = AtomicUsize::new(0);
        assert_agents_see_temp_files();
        let dir = tempfile::tempdir().expect("temp dir");
        // Agents run as other users (`toolwall exec --user`) reach the socket in here.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .expect("chmod temp dir");
        let socket = dir.path().join("api.sock");
        let db = db.unwrap_or_else(|| dir.path().join("events.db"));
        let config = dir.path().join("toolwall.yaml");
        let proxy = if extra.contains("proxy:") {
            ""
        } else {
            "proxy:\n  listen: 127.0.0.1:0\n"
        };
        // Each daemon pins its programs in a directory of its own: daemons of parallel tests
        // must not share maps.
        let pin_dir = PathBuf::from(format!(
            "/sys/fs/bpf/toolwall-test-{}-{}",
            std::process::id(),
            DAEMONS.fetch_add(1, Ordering::Relaxed)
        ));
        let pin_line = format!("  pin_dir: {}\n", pin_dir.display());
        let extra = if extra.contains("netmon:\n") {
            extra.replacen("netmon:\n", &format!("netmon:\n{pin_line}"), 1)
        } else {
            format!("{extra}\nnetmon:\n{pin_line}")
        };
        let yaml = format!(
            "api:\n  listen: 127.0.0.1:0\n  socket: {}\nstore:\n  path: {}\n{proxy}{extra}",
            socket.display(),
            db.display()
        );
        std::fs::write(&config, yaml).expect("write config");
        let (child, api, proxy) = launch(&dir, &config, "stderr", wrapper, bin);
        Daemon {
            child,
            api,
            proxy,
            socket,
            db,
            config,
            dir,
            pin_dir,
        }
    }

    /// Starts `toolwall run` again on this daemon's configuration, after [`Self::kill9`]; its
    /// stderr goes to `stderr_name` in its directory.
    pub fn relaunch(&mut self, stderr_name: &str) {
        self.relaunch_of(stderr_name, &toolwall_bin());
    }

    /// [`Self::relaunch`] of another toolwall binary (an upgrade).
    pub fn relaunch_of(&mut self, stderr_name: &str, bin: &Path) {
        let (child, api, proxy) = launch(&self.dir, &self.config, stderr_name, &[], bin);
        self.child = child;
        self.api = api;
        self.proxy = proxy;
    }

    /// SIGKILL: the daemon dies without cleaning anything up.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What the daemon wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits; returns the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("wait for toolwall run")
    }

    /// The JSON lines `toolwall ARGS... --json`-style views print, with this daemon's
    /// configuration appended; panics (with what it printed) on a line that is not JSON.
    ///
    /// The record views (`mcp calls`, `mcp events`) print their latest rows by default; here
    /// they print every row unless the test gives `--limit` itself.
    pub fn json_lines(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let mut args = args.to_vec();
        if args.first() == Some(&"mcp")
            && matches!(args.get(1), Some(&"calls") | Some(&"events"))
            && !args.contains(&"--limit")
        {
            args.extend(["--limit", "1000000"]);
        }
        let args = &args[..];
        let out = self.toolwall(args);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?} printed {l:?}: {e}"))
            })
            .collect()
    }

    /// `toolwall ARGS...` with this daemon's configuration appended.
    pub fn toolwall(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(toolwall_bin())
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .output()
            .expect("run toolwall")
    }
}

/// Starts `toolwall run --config CONFIG`, stderr into `stderr_name` in `dir`; waits until it
/// prints its addresses: (process, API address, LLM proxy URL).
fn launch(
    dir: &tempfile::TempDir,
    config: &Path,
    stderr_name: &str,
    wrapper: &[String],
    bin: &Path,
) -> (std::process::Child, String, Option<String>) {
    use std::io::BufRead;
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = std::process::Command::new(program);
            c.args(args).arg(bin);
            c
        }
        None => std::process::Command::new(bin),
    };
    let mut child = command
        .args(["run", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join(stderr_name)).expect("stderr file"))
        .spawn()
        .expect("start toolwall run");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut proxy_url = None;
    let api = loop {
        let Some(Ok(line)) = lines.next() else {
            let err = std::fs::read_to_string(dir.path().join(stderr_name)).unwrap_or_default();
            panic!("toolwall run ended before it printed its API address:\n{err}");
        };
        if let Some(rest) = line.trim().strip_prefix("LLM proxy") {
            proxy_url = rest
                .split_whitespace()
                .next()
                .filter(|u| u.starts_with("http://"))
                .map(str::to_owned);
        }
        if let Some(rest) = line.trim().strip_prefix("API and web view") {
            break rest
                .trim()
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string();
        }
    };
    // Keep draining stdout so the daemon never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, api, proxy_url)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A clean stop first: it ends the servers it runs and closes their cgroups (killed,
        // it left empty ones behind under the host's cgroup tree).
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None))
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.pin_dir);
    }
}

/// One HTTP/1.1 request over a Unix socket (`Connection: close`); returns status and body.
pub fn http_unix(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: toolwall\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(status_and_body(&response))
}

/// The OTLP collector stand-in (`tests/peers/otlp_collector.py`: decodes the wire with the
/// official `opentelemetry-proto` package), writing what arrived as JSON lines; killed on drop.
pub struct OtlpCollector {
    child: std::process::Child,
    out: PathBuf,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
}

impl Drop for OtlpCollector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl OtlpCollector {
    /// Starts the collector stand-in on `port` (0: any), once it says it listens.
    pub fn start(protocol: &str, port: u16, out: &Path, args: &[&str]) -> OtlpCollector {
        let mut child = std::process::Command::new(python())
            .arg(workspace_root().join("tests/peers/otlp_collector.py"))
            .args(["--protocol", protocol, "--port", &port.to_string(), "--out"])
            .arg(out)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start otlp_collector.py");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("collector's first line");
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the collector said {line:?}"));
        OtlpCollector {
            child,
            out: out.to_owned(),
            port,
        }
    }

    /// What arrived so far, one JSON value a line.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }
}

/// One GET over plain HTTP/1.1 to `addr` (the daemon's loopback API, Prometheus), with the web
/// token as a bearer when given: (status, body); (0, "") when nothing answers.
pub fn http_get(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let _ = stream.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    );
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    status_and_body(&answer)
}

/// The status and body of a whole HTTP/1.1 answer read as text; status 0 when it has none.
pub fn status_and_body(answer: &str) -> (u16, String) {
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}
