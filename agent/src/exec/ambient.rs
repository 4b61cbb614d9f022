//! What the agent would inherit that leads out of its session: variables naming a proxy, an
//! agent holding keys, a bus or a terminal multiplexer of the user's (each a service that runs
//! or relays work outside the session), and the user's own services it could reach.

use std::ffi::OsString;

/// Variables `exec` does not pass to the agent unless named with `--env`: each names a service
/// outside the session that relays or runs what the agent asks (a proxy past the kernel's
/// rules, an ssh or gpg agent signing as the user, a session bus, a display server, a tmux or
/// screen server that opens windows outside the session, a Kerberos ticket cache).
pub(crate) const ROUTES_OUT: [&str; 22] = [
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "ftp_proxy",
    "FTP_PROXY",
    "no_proxy",
    "NO_PROXY",
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XAUTHORITY",
    "TMUX",
    "TMUX_PANE",
    "STY",
    "KRB5CCNAME",
];

/// Removes [`ROUTES_OUT`] but those in `keep` from what `cmd` passes; returns the names it
/// removed that were set.
pub(super) fn drop_routes_out(
    cmd: &mut std::process::Command,
    keep: &[String],
) -> Vec<&'static str> {
    let mut dropped = Vec::new();
    for name in ROUTES_OUT {
        if keep.iter().any(|k| k == name) {
            continue;
        }
        if std::env::var_os(name).is_some() {
            dropped.push(name);
        }
        cmd.env_remove(name);
    }
    dropped
}

/// Programs whose running as the agent's user means a way out of the session for it: each
/// serves that user on a Unix socket the kernel layer does not confine yet.
const SERVICES: [(&str, &str); 7] = [
    (
        "tmux: server",
        "a tmux server (new windows run outside the session)",
    ),
    ("tmux", "tmux"),
    ("screen", "a screen server"),
    ("sshd", "an ssh login (its agent socket, its port forwards)"),
    ("ssh-agent", "an ssh agent (signs as the user)"),
    ("gpg-agent", "a gpg agent (signs as the user)"),
    ("dbus-daemon", "a session bus (starts services as the user)"),
];

/// The user's own services running now that an agent of the same uid could reach outside its
/// session, in words (`tmux server (pid 812)`), at most one per kind.
pub(super) fn login_services(uid: u32) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let Ok(processes) = procfs::process::all_processes() else {
        return found;
    };
    for process in processes.flatten() {
        if process.uid().ok() != Some(uid) {
            continue;
        }
        let comm = process.stat().map(|s| s.comm).unwrap_or_default();
        let cmdline = process.cmdline().unwrap_or_default();
        let first = cmdline.first().map(String::as_str).unwrap_or_default();
        for (name, what) in SERVICES {
            let hit = comm == name || first == name || first.starts_with(&format!("{name} "));
            if hit && !found.iter().any(|f| f.starts_with(what)) {
                found.push(format!("{what} (pid {})", process.pid));
            }
        }
    }
    found
}

/// `--env` values as names (what the user asked to keep).
pub(super) fn kept(names: &[OsString]) -> Vec<String> {
    names
        .iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn routes_out_are_dropped_unless_kept() {
        let mut cmd = std::process::Command::new("true");
        cmd.env("HTTP_PROXY", "http://127.0.0.1:3128");
        let _ = super::drop_routes_out(&mut cmd, &["SSH_AUTH_SOCK".to_owned()]);
        let removed: Vec<_> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert!(removed.contains(&"HTTP_PROXY".to_owned()), "{removed:?}");
        assert!(removed.contains(&"http_proxy".to_owned()), "{removed:?}");
        assert!(
            !removed.contains(&"SSH_AUTH_SOCK".to_owned()),
            "kept with --env"
        );
    }

    #[test]
    fn a_users_tmux_is_found_by_its_name() {
        // A program named `tmux` (a copy of sleep) running as this user.
        let dir = tempfile::tempdir().unwrap();
        let tmux = dir.path().join("tmux");
        std::fs::copy("/bin/sleep", &tmux).unwrap();
        let mut child = std::process::Command::new(&tmux).arg("30").spawn().unwrap();
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let mut found = Vec::new();
        for _ in 0..50 {
            found = super::login_services(uid);
            if found
                .iter()
                .any(|f| f.contains(&format!("(pid {})", child.id())))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("tmux") && f.contains(&format!("(pid {})", child.id()))),
            "{found:?}"
        );
        assert!(
            super::login_services(u32::MAX - 7).is_empty(),
            "a uid with no processes"
        );
    }
}
