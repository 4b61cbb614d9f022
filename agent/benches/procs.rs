//! Starting the processes the benchmarks drive (the release binary, its daemon, the peers), each
//! killed when its handle is dropped, on ports free a moment before.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(super) fn toolwall_bin() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    std::env::var_os("TOOLWALL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/toolwall"))
}

/// A child process killed (and reaped) on drop.
pub(super) struct Proc(pub(super) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// `toolwall run --config CONFIG`, once its socket answers.
pub(super) fn start_daemon(bin: &Path, config: &Path, socket: &Path) -> Result<Proc, String> {
    let mut proc = Proc(
        Command::new(bin)
            .args(["run", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start toolwall run: {e}"))?,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(proc);
        }
        if let Ok(Some(status)) = proc.0.try_wait() {
            return Err(format!("toolwall run exited with {status}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "toolwall run did not answer on {} within 30 s",
        socket.display()
    ))
}

/// Starts `cmd` and waits until it accepts on `port`; why not, if it does not.
pub(super) fn start_listening(cmd: &mut Command, port: u16, what: &str) -> Result<Proc, String> {
    let mut proc = Proc(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start {what}: {e}"))?,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(proc);
        }
        if let Ok(Some(status)) = proc.0.try_wait() {
            return Err(format!("{what} exited with {status}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{what} did not listen on {port} within 30 s"))
}
