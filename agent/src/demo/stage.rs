//! The demo's stage: sets up everything in a temporary directory, runs the scripted agent
//! under `toolwall exec`, shows and checks what each layer did, and takes it all down again —
//! also when interrupted (SIGINT, SIGTERM, SIGHUP) at any point, and, for what a killed demo
//! left, at the next demo's start.

use std::io::{BufRead as _, IsTerminal as _};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;
use tokio::signal::unix::{SignalKind, signal};

use super::daemon::{Daemon, PinDir};
use super::leftovers::{self, PREFIX, pin_dir, session_cgroup, suffix_of};
use super::verdicts::{Checks, Kernel, check_records, show_kernel, show_llm, show_mcp};
use super::{ALLOWED_TOOL, DENIED_TOOL, NET_SERVER_ID, SERVER_ID};

/// How long the agent may run.
const AGENT_RUN: Duration = Duration::from_secs(90);
/// The correlation window the demo's daemon uses: short, so the record is ready soon.
const WINDOW_MS: u64 = 500;
/// The user the agent runs as when the demo is started by root.
const AGENT_USER: &str = "nobody";

/// Runs the demo; exit 1 when a layer did not do what the policy asks, 130 when interrupted.
pub(super) fn run(no_wait: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
    let interactive = !no_wait && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let outcome = runtime.block_on(async {
        let mut signals = [
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ]
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .context("handle SIGINT, SIGTERM and SIGHUP")?;
        let interrupted =
            futures_util::future::select_all(signals.iter_mut().map(|s| Box::pin(s.recv())));
        // Dropped when interrupted: each guard in `play` (daemon, session, pins, directory)
        // takes down what it holds, in order.
        tokio::select! {
            outcome = play(interactive) => outcome.map(Some),
            _ = interrupted => Ok(None),
        }
    });
    // A read of standard input that is still waiting must not hold the exit.
    runtime.shutdown_background();
    match outcome? {
        Some(held) => {
            println!("demo: stopped the daemon and removed everything it made");
            Ok(if held {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        None => {
            println!("\ndemo: interrupted; stopped the daemon and removed everything it made");
            Ok(ExitCode::from(130))
        }
    }
}

/// Sets the stage, plays it, takes it down; whether every layer did what the policy asks.
async fn play(interactive: bool) -> anyhow::Result<bool> {
    leftovers::sweep();
    let stage = Stage::new().await?;
    stage.play(interactive).await
}

/// Everything the demo started; dropping it takes it down (fields drop in this order).
struct Stage {
    daemon: Daemon,
    /// Its pin directory, removed once the daemon has stopped.
    _pins: PinDir,
    dir: tempfile::TempDir,
    /// The copy of this binary the demo runs (readable by the agent's user, unlike a build
    /// directory under root's home).
    toolwall: PathBuf,
    config: PathBuf,
    session: String,
    /// The denied network server: a listener that is never reached when the kernel layer is on.
    _net: TcpListener,
    net_addr: SocketAddr,
    api: String,
    model: SocketAddr,
}

impl Stage {
    async fn new() -> anyhow::Result<Stage> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir()
            .context("create the demo's temporary directory")?;
        let suffix = suffix_of(dir.path()).context("the temporary directory's name")?;
        // The agent runs as another user: it must reach the binary and the API socket here.
        set_mode(dir.path(), 0o711)?;
        let toolwall = dir.path().join("toolwall");
        let exe = std::env::current_exe().context("find this toolwall binary")?;
        std::fs::copy(&exe, &toolwall)
            .with_context(|| format!("copy {} to {}", exe.display(), toolwall.display()))?;
        set_mode(&toolwall, 0o755)?;

        let net = TcpListener::bind("127.0.0.1:0").context("bind the demo's network server")?;
        let net_addr = net.local_addr().context("the network server's address")?;
        let model = super::model::start().await?;
        let pins = PinDir::create(pin_dir(std::process::id(), &suffix))?;
        let session = format!("demo-{suffix}");
        let config = dir.path().join("toolwall.yaml");
        let yaml = configuration(dir.path(), &toolwall, model, net_addr, pins.path());
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
        let (daemon, api) =
            Daemon::start(dir.path(), &toolwall, &config, session_cgroup(&session)).await?;
        println!(
            "  daemon          pid {}, log {}",
            daemon.pid(),
            daemon.log.display()
        );
        Ok(Stage {
            daemon,
            _pins: pins,
            dir,
            toolwall,
            config,
            session,
            _net: net,
            net_addr,
            api,
            model,
        })
    }

    /// Runs the agent, shows and checks the verdicts and the record; whether all held.
    async fn play(&self, interactive: bool) -> anyhow::Result<bool> {
        let (report, kernel) = self.run_agent().await?;
        let mut checks = Checks::default();
        show_llm(&report["llm"], &mut checks);
        show_mcp(&report["mcp"], &mut checks);
        show_kernel(&report["kernel"], &kernel, self.net_addr, &mut checks);
        let kernel_on = matches!(kernel, Kernel::On);

        tokio::time::sleep(Duration::from_millis(WINDOW_MS + 500)).await;
        // Which session a shim's call came from is known by the session's cgroup; without one
        // (the daemon not root) the shim's calls are recorded apart from the session, so the
        // whole (temporary) store is shown.
        let session = ["--session", self.session.as_str()];
        let filter: &[&str] = if kernel_on {
            println!(
                "\nThe record, joined across the layers (`toolwall mcp calls --session {}`):",
                self.session
            );
            &session
        } else {
            println!(
                "\nThe session has no cgroup, so the calls the shim relayed could not be placed in it: they are recorded apart from the model's, not joined (`toolwall mcp calls`):"
            );
            &[]
        };
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
            // A thread of its own, not the runtime's: a read still waiting when the demo is
            // interrupted must not hold its exit.
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = tx.send(std::io::stdin().lock().read_line(&mut line));
            });
            rx.await
                .context("wait for Enter")?
                .context("read standard input")?;
        }
        Ok(held)
    }

    /// The scripted agent under `toolwall exec`: its report, and whether the kernel watched.
    async fn run_agent(&self) -> anyhow::Result<(Value, Kernel)> {
        let mut exec = tokio::process::Command::new(&self.toolwall);
        exec.arg("exec")
            .arg("--config")
            .arg(&self.config)
            .args(["--session", &self.session]);
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
            // A Ctrl-C on the terminal is the demo's, which ends the session in order.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe: exec ends with a killed demo.
        unsafe {
            exec.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let as_whom = if root {
            format!(" --user {AGENT_USER}")
        } else {
            String::new()
        };
        println!(
            "\nThe agent runs under `toolwall exec{as_whom}` in session \"{}\":",
            self.session
        );
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
        Ok((report, kernel_layer(&said)))
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

/// Whether `toolwall exec` said the session is watched by the kernel layer, and if not, why.
fn kernel_layer(said: &str) -> Kernel {
    if said.contains("watched by the kernel layer") {
        return Kernel::On;
    }
    let why = said
        .lines()
        .find_map(|l| l.split_once("kernel layer ").map(|(_, rest)| rest))
        .map(|rest| {
            rest.trim_start_matches("off: ")
                .trim_end_matches("; connections are not watched")
                .to_owned()
        })
        .unwrap_or_else(|| "toolwall exec did not say".to_owned());
    Kernel::Off(why)
}
