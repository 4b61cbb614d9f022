//! The demo's daemon and what a daemon leaves in the kernel: its pin directory and its
//! session's cgroup.
//!
//! A daemon stopped while its session still has processes keeps that session pinned and
//! enforcing, for a successor to adopt; the demo has no successor. So the guard ends the
//! session's processes first (`cgroup.kill`), then stops the daemon, which then closes the
//! session and unpins, and removes what is still there. The pin directory is made by the demo
//! with an exclusive `mkdir` (bpffs is writable by every user, and a directory or link planted
//! there under the demo's name would take its pins), and removed last.

use std::io::BufRead as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// How long the daemon may take to come up (loading the eBPF programs included).
const DAEMON_START: Duration = Duration::from_secs(60);

/// A pin directory the demo made itself; removed when dropped.
pub(super) struct PinDir(PathBuf);

impl PinDir {
    /// Makes `path`, refusing one that is already there (whoever made it).
    pub(super) fn create(path: PathBuf) -> anyhow::Result<PinDir> {
        std::fs::create_dir(&path).with_context(|| {
            format!(
                "make the demo's pin directory {} (one that is already there was not made by this demo: remove it, or run the demo again)",
                path.display()
            )
        })?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod 700 {}", path.display()))?;
        Ok(PinDir(path))
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        remove_pins(&self.0);
    }
}

/// Removes a pin directory the demo made (unpinning detaches what no process holds).
pub(super) fn remove_pins(path: &Path) {
    if path.exists()
        && let Err(error) = std::fs::remove_dir_all(path)
    {
        eprintln!("demo: could not remove {}: {error}", path.display());
    }
}

/// Ends every process of a session's cgroup and removes the cgroup.
pub(super) fn end_session(cgroup: &Path) {
    if !cgroup.exists() {
        return;
    }
    if std::fs::write(cgroup.join("cgroup.kill"), "1").is_ok() {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && std::fs::read_to_string(cgroup.join("cgroup.procs"))
                .is_ok_and(|procs| !procs.trim().is_empty())
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The demo's daemon; see the module's doc for what dropping it does.
pub(super) struct Daemon {
    child: Child,
    pub(super) log: PathBuf,
    /// The session's cgroup, when the daemon makes one (root).
    session_cgroup: Option<PathBuf>,
}

impl Daemon {
    /// Starts `toolwall run` in a process group of its own (a Ctrl-C on the terminal is the
    /// demo's to handle, in order) and waits until it prints its API address.
    pub(super) async fn start(
        dir: &Path,
        toolwall: &Path,
        config: &Path,
        session_cgroup: Option<PathBuf>,
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
            .stderr(stderr)
            .process_group(0);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe; if the demo dies without its
        // guards running (SIGKILL), the daemon is stopped all the same.
        unsafe {
            command.pre_exec(|| {
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
            session_cgroup,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.trim().strip_prefix("API and web view") {
                    let addr = addr
                        .trim()
                        .trim_start_matches("http://")
                        .trim_end_matches('/');
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr.to_owned());
                    }
                }
            }
        });
        match tokio::time::timeout(DAEMON_START, rx).await {
            Ok(Ok(api)) => Ok((daemon, api)),
            _ => {
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

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(cgroup) = &self.session_cgroup {
            end_session(cgroup);
        }
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(cgroup) = &self.session_cgroup
            && cgroup.exists()
            && let Err(error) = std::fs::remove_dir(cgroup)
        {
            eprintln!("demo: could not remove {}: {error}", cgroup.display());
        }
    }
}
