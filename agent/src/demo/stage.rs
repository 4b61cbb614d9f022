//! The demo's stage: sets up everything in a temporary directory, runs the scripted agent
//! under `toolwall exec`, shows and checks what each layer did, and takes it all down again.

use std::io::{BufRead as _, IsTerminal as _};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{ALLOWED_TOOL, DENIED_TOOL, NET_SERVER_ID, SERVER_ID, SESSION, mcp_name};

/// How long the daemon may take to come up (loading the eBPF programs included).
const DAEMON_START: Duration = Duration::from_secs(60);
/// How long the agent may run.
const AGENT_RUN: Duration = Duration::from_secs(90);
/// The correlation window the demo's daemon uses: short, so the record is ready soon.
const WINDOW_MS: u64 = 500;
/// The user the agent runs as when the demo is started by root.
const AGENT_USER: &str = "nobody";

/// Runs the demo; exit 1 when a layer did not do what the policy asks.
pub(super) fn run(no_wait: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
    // Ctrl-C anywhere: the guards below stop the daemon and remove the directory on the way out.
    let stage = Stage::new(&runtime)?;
    let interactive = !no_wait && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = stage.play(interactive) => outcome,
            _ = tokio::signal::ctrl_c() => {
                println!("\ninterrupted: cleaning up");
                Ok(false)
            }
        }
    });
    drop(stage);
    println!("demo: stopped the daemon and removed everything it made");
    Ok(if outcome? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Everything the demo started; dropping it takes it down.
struct Stage {
    dir: tempfile::TempDir,
    /// The copy of this binary the demo runs (readable by the agent's user, unlike a build
    /// directory under root's home).
    toolwall: PathBuf,
    config: PathBuf,
    daemon: Daemon,
    /// The denied network server: a listener that is never reached when the kernel layer is on.
    _net: TcpListener,
    net_addr: SocketAddr,
    api: String,
    model: SocketAddr,
}

impl Stage {
    fn new(runtime: &tokio::runtime::Runtime) -> anyhow::Result<Stage> {
        let dir = tempfile::Builder::new()
            .prefix("toolwall-demo-")
            .tempdir()
            .context("create the demo's temporary directory")?;
        // The agent runs as another user: it must reach the binary and the API socket here.
        set_mode(dir.path(), 0o711)?;
        let toolwall = dir.path().join("toolwall");
        let exe = std::env::current_exe().context("find this toolwall binary")?;
        std::fs::copy(&exe, &toolwall)
            .with_context(|| format!("copy {} to {}", exe.display(), toolwall.display()))?;
        set_mode(&toolwall, 0o755)?;

        let net = TcpListener::bind("127.0.0.1:0").context("bind the demo's network server")?;
        let net_addr = net.local_addr().context("the network server's address")?;
        let model = runtime.block_on(super::model::start())?;
        let config = dir.path().join("toolwall.yaml");
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/toolwall-demo-{}", std::process::id()));
        let yaml = configuration(dir.path(), &toolwall, model, net_addr, &pin_dir);
        std::fs::write(&config, yaml)
            .with_context(|| format!("write the demo's configuration {}", config.display()))?;
        set_mode(&config, 0o644)?;

        println!("toolwall demo: everything runs on this machine, offline, with no API key.");
        println!("  directory       {}", dir.path().display());
        println!(
            "  fake model      http://{model} (asks for `{ALLOWED_TOOL}` and `{DENIED_TOOL}` whatever it is told)"
        );
        println!(
            "  MCP server      \"{SERVER_ID}\" over stdio: `{ALLOWED_TOOL}` allowed, `{DENIED_TOOL}` denied by the policy"
        );
        println!("  network server  \"{NET_SERVER_ID}\" at {net_addr}, denied by the policy");
        let (daemon, api) = Daemon::start(dir.path(), &toolwall, &config, pin_dir)?;
        println!(
            "  daemon          pid {}, log {}",
            daemon.child.id(),
            daemon.log.display()
        );
        Ok(Stage {
            dir,
            toolwall,
            config,
            daemon,
            _net: net,
            net_addr,
            api,
            model,
        })
    }

    /// Runs the agent, shows and checks the verdicts and the record; whether all held.
    async fn play(&self, interactive: bool) -> anyhow::Result<bool> {
        let (report, kernel_on) = self.run_agent().await?;
        let mut checks = Checks::default();
        show_llm(&report["llm"], &mut checks);
        show_mcp(&report["mcp"], &mut checks);
        show_kernel(&report["kernel"], kernel_on, self.net_addr, &mut checks);

        tokio::time::sleep(Duration::from_millis(WINDOW_MS + 500)).await;
        // Which session a shim's call came from is known by the session's cgroup; without one
        // (the daemon not root) the shim's calls are recorded apart from the session, so the
        // whole (temporary) store is shown.
        let filter: &[&str] = if kernel_on {
            &["--session", SESSION]
        } else {
            println!(
                "\nThe daemon is not root, so the session has no cgroup: the calls the shim relays cannot be placed in the session and are recorded apart from it, not joined to the model's."
            );
            &[]
        };
        println!(
            "\nThe record, joined across the layers (`toolwall mcp calls {}`):",
            filter.join(" ")
        );
        let table = self.toolwall(&[&["mcp", "calls"], filter].concat())?;
        for line in String::from_utf8_lossy(&table).lines() {
            println!("  {line}");
        }
        check_records(
            &self.toolwall(&[&["mcp", "calls", "--json"], filter].concat())?,
            kernel_on,
            &mut checks,
        );

        let token_file = self.dir.path().join("web-token");
        let token = std::fs::read_to_string(&token_file)
            .with_context(|| format!("read the web view's token {}", token_file.display()))?;
        println!("\nWeb view: http://{}/#token={}", self.api, token.trim());
        let held = checks.report();
        if interactive {
            println!(
                "The daemon and the model at http://{} stay up until the demo ends.",
                self.model
            );
            println!("\nPress Enter to stop the demo and remove everything it started.");
            let mut line = String::new();
            tokio::task::spawn_blocking(move || std::io::stdin().lock().read_line(&mut line))
                .await
                .context("wait for Enter")?
                .context("read standard input")?;
        }
        Ok(held)
    }

    /// The scripted agent under `toolwall exec`: its report, and whether the kernel watched.
    async fn run_agent(&self) -> anyhow::Result<(Value, bool)> {
        let mut exec = tokio::process::Command::new(&self.toolwall);
        exec.arg("exec")
            .arg("--config")
            .arg(&self.config)
            .args(["--session", SESSION]);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            exec.args(["--user", AGENT_USER]);
        }
        exec.arg("--")
            .arg(&self.toolwall)
            .args(["demo", "agent", "--config"])
            .arg(&self.config)
            .arg("--toolwall")
            .arg(&self.toolwall)
            .arg("--net")
            .arg(self.net_addr.to_string())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let as_whom = if root {
            format!(" --user {AGENT_USER}")
        } else {
            String::new()
        };
        println!("\nThe agent runs under `toolwall exec{as_whom}` in session \"{SESSION}\":");
        let out = tokio::time::timeout(AGENT_RUN, exec.output())
            .await
            .with_context(|| format!("the agent did not finish in {AGENT_RUN:?}"))?
            .context("run toolwall exec")?;
        let said = String::from_utf8_lossy(&out.stderr);
        for line in said.lines() {
            println!("  {line}");
        }
        if !out.status.success() {
            bail!(
                "toolwall exec ended with {}; the daemon's log is {}",
                out.status,
                self.daemon.log.display()
            );
        }
        let report = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "the agent printed no report: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })?;
        let kernel_on = said.contains("watched by the kernel layer");
        Ok((report, kernel_on))
    }

    /// `toolwall ARGS --config CONFIG`: its standard output.
    fn toolwall(&self, args: &[&str]) -> anyhow::Result<Vec<u8>> {
        let out = Command::new(&self.toolwall)
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .output()
            .with_context(|| format!("run toolwall {}", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "toolwall {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(out.stdout)
    }
}

/// The demo's configuration: its own socket, store, ports and pins, and the policy.
fn configuration(
    dir: &Path,
    toolwall: &Path,
    model: SocketAddr,
    net: SocketAddr,
    pins: &Path,
) -> String {
    format!(
        r#"# The demo's configuration (`toolwall demo`): everything in {dir}.
api:
  listen: 127.0.0.1:0
  socket: {dir}/api.sock
store:
  path: {dir}/events.db
proxy:
  listen: 127.0.0.1:0
  providers:
    anthropic: http://{model}
correlator:
  window_ms: {WINDOW_MS}
netmon:
  pin_dir: {pins}
sandbox:
  mcp:
    servers:
      - id: {SERVER_ID}
        type: stdio
        command: {toolwall}
        args: [demo, mcp-server]
      - id: {NET_SERVER_ID}
        type: http
        url: http://{net}/mcp
    server_policy: denylist
    denied_servers:
      - id: {NET_SERVER_ID}
    tool_policy: denylist
    denied_tools:
      - server: {SERVER_ID}
        tool: {DENIED_TOOL}
"#,
        dir = dir.display(),
        toolwall = toolwall.display(),
        pins = pins.display(),
    )
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// The demo's daemon; stopped (SIGTERM, so it closes its sessions and unpins) when dropped.
struct Daemon {
    child: Child,
    log: PathBuf,
    pin_dir: PathBuf,
}

impl Daemon {
    /// Starts `toolwall run` and waits until it prints its API address; the daemon and that.
    fn start(
        dir: &Path,
        toolwall: &Path,
        config: &Path,
        pin_dir: PathBuf,
    ) -> anyhow::Result<(Daemon, String)> {
        let log = dir.join("daemon.log");
        let stderr =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut command = Command::new(toolwall);
        command
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe; if the demo dies without its
        // guards running (SIGKILL), the daemon is stopped all the same.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("start {} run", toolwall.display()))?;
        let stdout = child.stdout.take().context("the daemon's stdout")?;
        let daemon = Daemon {
            child,
            log,
            pin_dir,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.trim().strip_prefix("API and web view") {
                    let addr = addr
                        .trim()
                        .trim_start_matches("http://")
                        .trim_end_matches('/');
                    let _ = tx.send(addr.to_owned());
                }
            }
        });
        match rx.recv_timeout(DAEMON_START) {
            Ok(api) => Ok((daemon, api)),
            Err(_) => {
                let said = std::fs::read_to_string(&daemon.log).unwrap_or_default();
                let tail: Vec<&str> = said.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "the demo's daemon did not start within {DAEMON_START:?}; its log ({}) ends:\n{}",
                    daemon.log.display(),
                    tail.join("\n")
                )
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None))
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.pin_dir.exists()
            && let Err(error) = std::fs::remove_dir_all(&self.pin_dir)
        {
            eprintln!("demo: could not remove {}: {error}", self.pin_dir.display());
        }
    }
}

/// What the demo expected and did not see.
#[derive(Default)]
struct Checks {
    failed: Vec<String>,
}

impl Checks {
    fn expect(&mut self, held: bool, what: &str) {
        if !held {
            self.failed.push(what.to_owned());
        }
    }

    /// Prints the outcome; whether every expectation held.
    fn report(&self) -> bool {
        if self.failed.is_empty() {
            println!("\nEvery layer did what the policy asks.");
            return true;
        }
        println!("\nNOT AS EXPECTED:");
        for what in &self.failed {
            println!("  - {what}");
        }
        false
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn show_llm(llm: &Value, checks: &mut Checks) {
    println!("\n1. LLM layer: the model's answer, judged by the proxy before the agent reads it");
    if let Some(error) = llm.get("error") {
        println!("   the model could not be asked: {}", text(error));
        checks.expect(false, "the agent asks the model through the LLM proxy");
        return;
    }
    let uses: Vec<String> = llm["tool_uses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    let texts: Vec<String> = llm["texts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    for t in &texts {
        println!("   text      {t}");
    }
    for u in &uses {
        println!("   tool_use  {u}  (reached the agent)");
    }
    let allowed = mcp_name(ALLOWED_TOOL);
    let denied = mcp_name(DENIED_TOOL);
    checks.expect(
        uses.contains(&allowed),
        &format!("{allowed} reaches the agent"),
    );
    checks.expect(
        !uses.contains(&denied),
        &format!("{denied} never reaches the agent"),
    );
    let replaced = format!("[toolwall] Tool '{denied}' blocked by policy");
    checks.expect(
        texts.iter().any(|t| t.contains(&replaced)),
        &format!("the agent reads \"{replaced}\" in place of the call"),
    );
}

fn show_mcp(mcp: &Value, checks: &mut Checks) {
    println!(
        "\n2. MCP layer: the agent runs the server through `toolwall shim` and calls it directly"
    );
    if let Some(error) = mcp.get("error") {
        println!("   the server could not be reached: {}", text(error));
        checks.expect(false, "the agent reaches the MCP server through the shim");
        return;
    }
    let listed: Vec<String> = mcp["listed"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    println!("   tools/list               {}", listed.join(", "));
    for (tool, key) in [(ALLOWED_TOOL, "allowed"), (DENIED_TOOL, "denied")] {
        let answer = &mcp[key];
        match (answer.get("ok"), answer.get("error")) {
            (Some(ok), _) => println!("   tools/call {tool:<13} ran: {}", text(ok)),
            (_, Some(error)) => println!("   tools/call {tool:<13} REFUSED: {}", text(error)),
            _ => println!("   tools/call {tool:<13} {answer}"),
        }
    }
    checks.expect(
        listed.iter().any(|t| t == ALLOWED_TOOL),
        "the shim lists the allowed tool",
    );
    checks.expect(
        !listed.iter().any(|t| t == DENIED_TOOL),
        "the shim hides the denied tool",
    );
    checks.expect(mcp["allowed"].get("ok").is_some(), "the allowed tool runs");
    checks.expect(
        mcp["denied"].get("error").is_some(),
        "the denied tool is refused",
    );
}

fn show_kernel(kernel: &Value, kernel_on: bool, addr: SocketAddr, checks: &mut Checks) {
    println!("\n3. Kernel layer: the agent connects straight to the denied network server");
    if !kernel_on {
        println!(
            "   connect {addr}  {} — the kernel layer is off (it needs root and BPF; the daemon's log says why)",
            if kernel["connected"] == true {
                "connected"
            } else {
                "failed"
            }
        );
        return;
    }
    if kernel["refused_by_kernel"] == true {
        println!(
            "   connect {addr}  REFUSED by the kernel: {}",
            text(&kernel["error"])
        );
    } else {
        println!("   connect {addr}  {kernel}");
    }
    checks.expect(
        kernel["refused_by_kernel"] == true,
        "the kernel refuses the connection (EPERM)",
    );
}

/// The records the policy implies, from `toolwall mcp calls --json`; joined across the layers
/// when the session has a cgroup (`kernel_on`).
fn check_records(json: &[u8], kernel_on: bool, checks: &mut Checks) {
    let records: Vec<Value> = String::from_utf8_lossy(json)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let has = |server: &str, tool: Option<&str>, kind: &str, action: &str| {
        records.iter().any(|r| {
            r["server_id"] == server
                && tool.is_none_or(|t| r["tool"] == t)
                && r["kind"] == kind
                && r["action"] == action
        })
    };
    if kernel_on {
        checks.expect(
            has(SERVER_ID, Some(ALLOWED_TOOL), "joined", "allow"),
            "the allowed call is one record joined across the LLM and MCP layers",
        );
    } else {
        checks.expect(
            has(SERVER_ID, Some(ALLOWED_TOOL), "intercept_only", "allow")
                && has(SERVER_ID, Some(ALLOWED_TOOL), "execution_only", "allow"),
            "the allowed call is recorded at the LLM layer and as run by the shim",
        );
    }
    checks.expect(
        has(SERVER_ID, Some(DENIED_TOOL), "intercept_only", "block"),
        "the model's denied call is recorded as blocked at the LLM layer",
    );
    checks.expect(
        has(SERVER_ID, Some(DENIED_TOOL), "execution_only", "block"),
        "the agent's direct call of the denied tool is recorded as refused by the shim",
    );
    if kernel_on {
        checks.expect(
            has(NET_SERVER_ID, None, "connection_only", "block"),
            "the refused connection is recorded",
        );
    }
}
