//! Agents run inside a session the way a user runs them: `toolwall exec --user nobody` with the
//! system's Python, a script written to a directory every user can read, and the daemon's
//! stored events read back through the CLI.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use crate::{Daemon, toolwall_bin};

/// A directory every user can read and write (the agent runs as `nobody`).
pub fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    dir
}

/// Writes an agent's source to `dir/name`.
pub fn write_agent(dir: &Path, name: &str, source: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, source).expect("write agent");
    path
}

/// `toolwall exec` as root with `args` before `--`, the agent `python3 SCRIPT ARGS...` (the
/// system's Python: `nobody` cannot reach root's pyenv).
pub fn exec(daemon: &Daemon, args: &[&str], script: &Path, script_args: &[String]) -> Command {
    let mut cmd = Command::new(toolwall_bin());
    cmd.arg("exec")
        .arg("--config")
        .arg(&daemon.config)
        .args(args)
        .args(["--", "/usr/bin/python3"])
        .arg(script)
        .args(script_args)
        .env_remove("SUDO_USER");
    cmd
}

/// [`exec`] as `nobody` in session `session`; the agent's stdout, once it exited with 0.
pub fn exec_nobody(
    daemon: &Daemon,
    session: &str,
    script: &Path,
    script_args: &[String],
) -> String {
    let out = exec(
        daemon,
        &["--user", "nobody", "--session", session],
        script,
        script_args,
    )
    .output()
    .expect("exec");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "exec failed: {stderr}\n{stdout}");
    stdout
}

/// The same agent without toolwall, as `nobody`: the control that shows a route works, so a
/// refusal under `toolwall exec` is toolwall's.
pub fn without_toolwall(script: &Path, script_args: &[String]) -> Output {
    control_command(script, script_args)
        .output()
        .expect("setpriv python3")
}

/// [`without_toolwall`], started in `dir`.
pub fn without_toolwall_in(dir: &Path, script: &Path, script_args: &[String]) -> Output {
    control_command(script, script_args)
        .current_dir(dir)
        .output()
        .expect("setpriv python3")
}

fn control_command(script: &Path, script_args: &[String]) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg("/usr/bin/python3")
        .arg(script)
        .args(script_args);
    cmd
}

/// What an agent printed for `name` on a line `NAME RESULT`; panics, with all it printed, when
/// there is no such line.
pub fn outcome(stdout: &str, name: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name:?} in:\n{stdout}"))
        .to_owned()
}

/// What `file` holds once it holds `what` (an agent's output, written as it runs); panics after
/// 20 s.
pub fn wait_for_text(file: &Path, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = std::fs::read_to_string(file).unwrap_or_default();
        if seen.contains(what) {
            return seen;
        }
        assert!(Instant::now() < deadline, "no {what:?} in {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to 5 s for session `name`'s cgroup to be removed; whether it was.
pub fn session_cgroup_gone(name: &str) -> bool {
    let cgroup = toolwall::cgroup2_mount()
        .expect("cgroup2")
        .join("toolwall")
        .join(name);
    let deadline = Instant::now() + Duration::from_secs(5);
    while cgroup.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    !cgroup.exists()
}

/// A process's stdout and stderr as text.
pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The daemon's stored events of one type, waiting up to 5 s for `enough` of them.
pub fn events(
    daemon: &Daemon,
    kind: &str,
    enough: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = daemon.json_lines(&["mcp", "events", "--json", "--type", kind]);
        if enough(&found) || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A login user made for the test, with a home of its own; removed with its home on drop.
pub struct LoginUser {
    pub name: String,
    pub home: PathBuf,
}

impl LoginUser {
    pub fn create() -> LoginUser {
        let name = format!("tws{}", std::process::id());
        let home = PathBuf::from(format!("/home/{name}"));
        let _ = Command::new("userdel").args(["-r", &name]).output();
        let out = Command::new("useradd")
            .args(["-m", "-s", "/bin/bash", "-d"])
            .arg(&home)
            .arg(&name)
            .output()
            .expect("useradd");
        assert!(out.status.success(), "useradd: {out:?}");
        // No password, but not locked either: sshd lets a locked account in by no key.
        let out = Command::new("usermod")
            .args(["-p", "*", &name])
            .output()
            .expect("usermod");
        assert!(out.status.success(), "usermod: {out:?}");
        LoginUser { name, home }
    }

    /// `program` run as this user (its groups, its home), outside any session.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            &format!("--reuid={}", self.name),
            &format!("--regid={}", self.name),
            "--init-groups",
            "--",
            program,
        ])
        .env("HOME", &self.home)
        .env("USER", &self.name)
        .env("SHELL", "/bin/bash");
        cmd
    }

    /// Makes `path` (under the home) the user's.
    pub fn own(&self, path: &Path) {
        let out = Command::new("chown")
            .args(["-R", &format!("{0}:{0}", self.name)])
            .arg(path)
            .output()
            .expect("chown");
        assert!(out.status.success(), "chown: {out:?}");
    }
}

impl Drop for LoginUser {
    fn drop(&mut self) {
        let _ = Command::new("pkill").args(["-u", &self.name]).output();
        let _ = Command::new("userdel").args(["-r", &self.name]).output();
    }
}
