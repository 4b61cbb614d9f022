//! `toolwall exec`: runs an agent inside a watched session.
//!
//! Asks the running daemon for a session (a cgroup with the kernel programs attached), starts
//! the command inside that cgroup from its first instruction, points its LLM SDKs at the proxy
//! (`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`; Codex CLI ignores the latter and gets
//! `-c openai_base_url=...`), exports the session id for shims it starts, and passes its exit
//! code through. The session's cgroup is removed afterwards.
//!
//! The agent must not be able to leave the session (issue 14, item 2): started by root, it runs
//! as an unprivileged user by default, in its own cgroup namespace (its cgroup is `/`, the
//! ancestors out of sight), with `no_new_privs` and without the capabilities that could detach
//! programs or move processes ([`DROPPED_CAPS`]), even when it is run as root on request.

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::Args;
use http::Method;
use serde::Deserialize;

use crate::{cgroup::SessionCgroup, client::ApiClient, config::Config};

/// Arguments of `toolwall exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Session name (letters, digits, `-_.`); default `s-<time>-<pid>`.
    #[arg(long)]
    pub session: Option<String>,
    /// Configuration naming the daemon's socket (`api.socket`); default: the embedded one.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Run the agent as this user (when started by root). Default: `SUDO_USER`, else the
    /// configuration's `exec.user`.
    #[arg(long, conflicts_with = "as_root")]
    pub user: Option<String>,
    /// Run the agent as root. It is still confined (cgroup and mount namespaces, no
    /// CAP_SYS_ADMIN, CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_PTRACE) but keeps root's other
    /// powers (raw sockets, kernel modules, every file); prefer `--user`.
    #[arg(long)]
    pub as_root: bool,
    /// The agent and its arguments, e.g. `-- claude -p "..."`.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

#[derive(Deserialize)]
struct SessionReply {
    cgroup: Option<PathBuf>,
    kernel: Option<String>,
    proxy: Option<String>,
}

/// Runs the command in a new session; returns its exit code (128 + signal if it was killed).
pub fn run(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let user = agent_user(&args, &config)?;
    let socket = crate::config::prepare_socket_dir(config.api.socket.as_deref(), false)?;
    let session = args.session.unwrap_or_else(|| {
        format!(
            "s-{}-{}",
            chrono::Utc::now().format("%Y%m%dT%H%M%S"),
            std::process::id()
        )
    });
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
    runtime.block_on(async move {
        let api = ApiClient::connect(&socket).await?;
        let body = serde_json::to_vec(&serde_json::json!({ "name": session }))?;
        let reply: SessionReply = serde_json::from_slice(&api.call(Method::POST, "/api/sessions", body).await?)
            .context("parse the daemon's session reply")?;

        let mut cmd = build_command(&args.command, &session, &socket, reply.proxy.as_deref());
        if let Some(user) = &user {
            cmd.env("HOME", &user.home)
                .env("USER", &user.name)
                .env("LOGNAME", &user.name);
            eprintln!("toolwall: session {session}: the agent runs as {} (uid {})", user.name, user.uid);
        } else if unsafe { libc::geteuid() } == 0 {
            eprintln!("toolwall: WARNING: session {session}: the agent runs as root (--as-root); it keeps root's powers beyond the ones toolwall drops (raw sockets, kernel modules, every file), so only trusted agents should run this way");
        }
        if is_codex(&args.command[0]) {
            for (name, command) in unshimmed_codex_servers(&codex_config_path()) {
                eprintln!(
                    "toolwall: WARNING: session {session}: Codex MCP server {name:?} runs {command:?} directly, not through `toolwall shim`: in code mode a tool whose name the code computes at run time passes the LLM layer undecided, and nothing decides it when it runs. Wrap it in {}: command = \"toolwall\", args = [\"shim\", \"--server-id\", \"{name}\", \"--\", ...its command and args]",
                    codex_config_path().display()
                );
            }
        }
        match &reply.proxy {
            Some(proxy) => eprintln!("toolwall: session {session}: LLM traffic through {proxy}"),
            None => eprintln!("toolwall: WARNING: session {session}: the daemon's LLM proxy is off; LLM calls go directly to the providers, unseen"),
        }
        let _cgroup_procs = match &reply.cgroup {
            Some(path) => {
                eprintln!("toolwall: session {session}: cgroup {} watched by the kernel layer", path.display());
                let procs = SessionCgroup::at(path).enter_on_spawn(&mut cmd)?;
                // After the cgroup is entered (closures run in the order they were added).
                confine_on_spawn(&mut cmd, user.as_ref().map(|u| (u.uid, u.gid, u.groups.clone())), &[])?;
                Some(procs)
            }
            None => {
                eprintln!(
                    "toolwall: WARNING: session {session}: kernel layer {}; connections are not watched",
                    reply.kernel.as_deref().unwrap_or("off")
                );
                confine_on_spawn(&mut cmd, user.as_ref().map(|u| (u.uid, u.gid, u.groups.clone())), &[])?;
                None
            }
        };
        let instance = daemon_instance(&api).await?;
        let (gone_tx, gone_rx) = tokio::sync::watch::channel(false);
        let watch = tokio::spawn(watch_daemon(api.clone(), session.clone(), instance.clone(), gone_tx));
        let status = run_child(cmd).await;
        watch.abort();
        // Once more, for a restart since the last check.
        let daemon_went_away = *gone_rx.borrow()
            || daemon_instance(&api).await.ok().as_ref() != Some(&instance);
        let closed = api.call(Method::DELETE, &format!("/api/sessions/{session}"), Vec::new()).await;
        if let Err(error) = closed {
            eprintln!("toolwall: closing session {session}: {error:#}");
        }
        let status = status?;
        let code = exit_code(status);
        if daemon_went_away {
            eprintln!(
                "toolwall: session {session}: the daemon went away while the agent ran (agent's exit: {status}); exiting 1"
            );
            return Ok(ExitCode::FAILURE);
        }
        Ok(code)
    })
}

/// Asks the daemon every second whether it is still the one the session was opened with; the
/// first time it is not (gone, or killed and started again), says so (the session's programs
/// stay pinned and enforcing, but its events were not recorded while no daemon ran) and flags
/// it for the exit code.
async fn watch_daemon(
    api: ApiClient,
    session: String,
    instance: Option<String>,
    gone: tokio::sync::watch::Sender<bool>,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let why = match daemon_instance(&api).await {
            Ok(now) if now == instance => continue,
            Ok(_) => "it was restarted".to_owned(),
            Err(error) => format!("{error:#}"),
        };
        eprintln!(
            "toolwall: WARNING: session {session}: the daemon went away ({why}); the session's kernel programs stay attached and enforcing, but its events are not recorded until `toolwall run` starts again and adopts it"
        );
        let _ = gone.send(true);
        return;
    }
}

/// The daemon process behind the socket (`instance` in `/health`).
async fn daemon_instance(api: &ApiClient) -> anyhow::Result<Option<String>> {
    #[derive(Deserialize)]
    struct Health {
        instance: Option<String>,
    }
    let body = api.call(Method::GET, "/health", Vec::new()).await?;
    Ok(serde_json::from_slice::<Health>(&body)?.instance)
}

/// Who the agent runs as, when that is not the caller.
#[derive(Debug)]
pub(crate) struct AgentUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    pub home: PathBuf,
}

/// The capabilities no agent keeps, root or not: each could undo the session (detach its
/// programs, move processes out of its cgroup, read the daemon's memory).
pub const DROPPED_CAPS: [(u32, &str); 5] = [
    (21, "CAP_SYS_ADMIN"),
    (39, "CAP_BPF"),
    (12, "CAP_NET_ADMIN"),
    (38, "CAP_PERFMON"),
    (19, "CAP_SYS_PTRACE"),
];

/// What a stdio server the daemon runs loses besides [`DROPPED_CAPS`]: a root server must not
/// send raw packets past its egress limit, change its ids or load kernel code.
pub(crate) const SERVER_DROPPED_CAPS: [(u32, &str); 4] = [
    (13, "CAP_NET_RAW"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (16, "CAP_SYS_MODULE"),
];

/// The user to run the agent as: none when the caller is not root (it runs as the caller) or
/// asked for root; else `--user`, `SUDO_USER`, `exec.user`, in that order.
fn agent_user(args: &ExecArgs, config: &Config) -> anyhow::Result<Option<AgentUser>> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        anyhow::ensure!(
            args.user.is_none(),
            "--user needs root: toolwall exec switches to that user before starting the agent"
        );
        return Ok(None);
    }
    if args.as_root {
        return Ok(None);
    }
    let sudo_user = std::env::var("SUDO_USER")
        .ok()
        .filter(|u| !u.is_empty() && u != "root");
    let Some(name) = args
        .user
        .clone()
        .or(sudo_user)
        .or_else(|| config.exec.user.clone())
    else {
        anyhow::bail!(
            "toolwall exec was started by root and no user to run the agent as is known: an agent running as root can leave its session. Pass --user NAME, set `exec.user` in the configuration, run it through sudo (SUDO_USER), or pass --as-root to run the agent as root anyway"
        );
    };
    let user =
        lookup_user(&name).map_err(|e| anyhow::anyhow!("{e} (--user, SUDO_USER or exec.user)"))?;
    anyhow::ensure!(
        user.uid != 0,
        "user {name:?} is root; pass --as-root to run the agent as root"
    );
    Ok(Some(user))
}

/// The user of that name from the password database, with its groups.
pub(crate) fn lookup_user(name: &str) -> anyhow::Result<AgentUser> {
    use std::ffi::{CStr, CString};
    let c_name = CString::new(name).with_context(|| format!("user name {name:?}"))?;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwnam_r writes into pwd and buf, both alive for the call.
    let rc = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    anyhow::ensure!(
        rc == 0 && !result.is_null(),
        "no user {name:?} on this host"
    );
    // SAFETY: getpwnam_r succeeded, so pw_dir points into buf.
    let home = unsafe { CStr::from_ptr(pwd.pw_dir) }
        .to_string_lossy()
        .into_owned();
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut count = groups.len() as libc::c_int;
    // SAFETY: getgrouplist writes at most `count` entries into groups.
    let rc =
        unsafe { libc::getgrouplist(c_name.as_ptr(), pwd.pw_gid, groups.as_mut_ptr(), &mut count) };
    anyhow::ensure!(rc >= 0, "user {name:?} is in more than 256 groups");
    groups.truncate(count.max(0) as usize);
    Ok(AgentUser {
        name: name.to_owned(),
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
        groups,
        home: PathBuf::from(home),
    })
}

/// The home directory of `uid` in the password database.
pub(crate) fn home_of(uid: u32) -> Option<PathBuf> {
    use std::ffi::CStr;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into pwd and buf, both alive for the call.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, so pw_dir points into buf.
    let home = unsafe { CStr::from_ptr(pwd.pw_dir) };
    Some(PathBuf::from(home.to_string_lossy().into_owned()))
}

/// Confines the agent between fork and exec, after it entered its cgroup: its own cgroup and
/// mount namespaces, with every cgroup filesystem read-only and every bpf filesystem hidden in
/// the latter (without nsdelegate, a root agent could otherwise write itself into another
/// cgroup, or open the session's pinned links and detach them; it cannot unmount without
/// CAP_SYS_ADMIN), `no_new_privs`, [`DROPPED_CAPS`]
/// gone from the bounding set (so not even a root agent gets them back at exec), then the
/// user's groups and ids. Every step must succeed, or the agent does not start.
/// Also confines the stdio servers the daemon runs for shims (`daemon/stdio.rs`): a server
/// runs outside the agent's session, so it must not get back what the agent lost. `ids`: the
/// uid, gid and groups to run as.
pub(crate) fn confine_on_spawn(
    cmd: &mut std::process::Command,
    ids: Option<(u32, u32, Vec<libc::gid_t>)>,
    also_dropped: &'static [(u32, &'static str)],
) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let read_only = if root {
        protected_mounts()?
    } else {
        Vec::new()
    };
    // SAFETY: the closure makes only async-signal-safe system calls and does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            if root {
                check(libc::unshare(libc::CLONE_NEWCGROUP | libc::CLONE_NEWNS))?;
                // Slave: the host's later mounts still show; ours do not go back.
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                ))?;
                for (path, flags, bpf) in &read_only {
                    if *bpf {
                        // Root may open a pinned link by path (no capability needed) and
                        // detach it: the pins are hidden under an empty, read-only tmpfs.
                        check(libc::mount(
                            c"toolwall-hidden".as_ptr(),
                            path.as_ptr(),
                            c"tmpfs".as_ptr(),
                            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                            c"mode=0,size=4k".as_ptr().cast(),
                        ))?;
                    } else {
                        check(libc::mount(
                            std::ptr::null(),
                            path.as_ptr(),
                            std::ptr::null(),
                            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags,
                            std::ptr::null(),
                        ))?;
                    }
                }
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            if root {
                check(libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                ))?;
                for &(cap, _) in DROPPED_CAPS.iter().chain(also_dropped) {
                    // EINVAL: a capability this kernel does not know; nothing to drop.
                    if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                        && *libc::__errno_location() != libc::EINVAL
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            if let Some((uid, gid, groups)) = &ids {
                check(libc::setgroups(groups.len(), groups.as_ptr()))?;
                check(libc::setgid(*gid))?;
                check(libc::setuid(*uid))?;
            }
            Ok(())
        });
    }
    Ok(())
}

/// Every cgroup (v1 and v2) and bpf filesystem mount, with the flags a read-only bind remount
/// of it must keep (a remount sets them all), and whether it is a bpf one (to hide).
fn protected_mounts() -> anyhow::Result<Vec<(std::ffi::CString, libc::c_ulong, bool)>> {
    use std::os::unix::ffi::OsStrExt;
    let mut mounts = crate::cgroup::mounts_of(&["bpf", "cgroup2", "cgroup"])?;
    // bpf filesystems first: hidden before the cgroup ones turn read-only.
    mounts.sort_by_key(|(fstype, _)| fstype != "bpf");
    let mut out = Vec::with_capacity(mounts.len());
    for (fstype, mount) in mounts {
        let is_bpf = fstype == "bpf";
        let path = std::ffi::CString::new(mount.as_os_str().as_bytes())
            .with_context(|| format!("mount point {}", mount.display()))?;
        // SAFETY: statvfs writes into the zeroed struct; path is NUL-terminated.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("statvfs {}", mount.display()));
        }
        let mut flags = 0;
        for (st_flag, ms_flag) in [
            (libc::ST_NOSUID, libc::MS_NOSUID),
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ] {
            if st.f_flag & st_flag != 0 {
                flags |= ms_flag;
            }
        }
        out.push((path, flags, is_bpf));
    }
    Ok(out)
}

/// The command with the session's environment; Codex also gets its base URL as an option.
fn build_command(
    command: &[OsString],
    session: &str,
    socket: &std::path::Path,
    proxy: Option<&str>,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(&command[0]);
    let mut args: Vec<OsString> = command[1..].to_vec();
    cmd.env("TOOLWALL_SESSION", session)
        .env("TOOLWALL_API_SOCKET", socket);
    if let Some(proxy) = proxy {
        // The daemon gave the session a base URL of its own (`/s/<key>`): the shared proxy
        // tags this agent's calls with the session the key belongs to.
        cmd.env("ANTHROPIC_BASE_URL", proxy)
            .env("OPENAI_BASE_URL", format!("{proxy}/v1"));
        let program = std::path::Path::new(&command[0])
            .file_name()
            .unwrap_or_default();
        if program == "codex" {
            // Codex CLI reads its base URL from config.toml or -c, not from OPENAI_BASE_URL.
            args.splice(
                0..0,
                [
                    OsString::from("-c"),
                    OsString::from(format!("openai_base_url=\"{proxy}/v1\"")),
                ],
            );
        }
    }
    cmd.args(args);
    cmd
}

fn is_codex(program: &OsString) -> bool {
    std::path::Path::new(program).file_name() == Some(std::ffi::OsStr::new("codex"))
}

/// Codex's configuration: `$CODEX_HOME/config.toml`, default `~/.codex/config.toml`.
fn codex_config_path() -> PathBuf {
    std::env::var_os("CODEX_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".codex")))
        .unwrap_or_default()
        .join("config.toml")
}

/// The stdio MCP servers of a Codex configuration that do not run through `toolwall shim`
/// (name, command): Codex's code mode can call their tools under names computed at run time,
/// which only the shim decides (issue 12, class 6). A file that is missing or not TOML lists
/// nothing (Codex itself reports a broken file).
fn unshimmed_codex_servers(config: &std::path::Path) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(config) else {
        return Vec::new();
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let Some(servers) = table.get("mcp_servers").and_then(toml::Value::as_table) else {
        return Vec::new();
    };
    servers
        .iter()
        .filter_map(|(name, server)| {
            let command = server.get("command")?.as_str()?;
            let args: Vec<&str> = server
                .get("args")
                .and_then(toml::Value::as_array)
                .map(|a| a.iter().filter_map(toml::Value::as_str).collect())
                .unwrap_or_default();
            let shimmed = std::path::Path::new(command)
                .file_name()
                .is_some_and(|f| f == "toolwall")
                && args.first() == Some(&"shim");
            (!shimmed).then(|| (name.clone(), command.to_owned()))
        })
        .collect()
}

/// Runs the child, forwarding SIGTERM and SIGHUP to it (SIGINT from a terminal reaches it on
/// its own, as it shares our process group).
async fn run_child(cmd: std::process::Command) -> anyhow::Result<std::process::ExitStatus> {
    use tokio::signal::unix::{SignalKind, signal};
    let program = cmd.get_program().to_owned();
    let mut child = tokio::process::Command::from(cmd)
        .spawn()
        .with_context(|| format!("start {}", program.to_string_lossy()))?;
    let pid = child.id().map(|p| p as i32);
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut int = signal(SignalKind::interrupt())?;
    loop {
        let forward = tokio::select! {
            status = child.wait() => return Ok(status?),
            _ = term.recv() => libc::SIGTERM,
            _ = hup.recv() => libc::SIGHUP,
            _ = int.recv() => continue,
        };
        if let Some(pid) = pid {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid, forward) };
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(signal)) => ExitCode::from(128u8.wrapping_add(signal as u8)),
        _ => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_must_name_the_agent_user_or_ask_for_root() {
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let config = Config::default();
        let args = |user: Option<&str>, as_root| ExecArgs {
            session: None,
            config: None,
            user: user.map(str::to_owned),
            as_root,
            command: vec!["true".into()],
        };
        // SAFETY (test): SUDO_USER is read only here in this test binary's exec tests.
        if std::env::var_os("SUDO_USER").is_none() {
            let error = agent_user(&args(None, false), &config).unwrap_err();
            assert!(error.to_string().contains("--user NAME"), "{error}");
        }
        assert!(agent_user(&args(None, true), &config).unwrap().is_none());
        let nobody = agent_user(&args(Some("nobody"), false), &config)
            .unwrap()
            .unwrap();
        assert_eq!(nobody.uid, 65534);
        let root = agent_user(&args(Some("root"), false), &config).unwrap_err();
        assert!(root.to_string().contains("--as-root"), "{root}");
        let missing = agent_user(&args(Some("no-such-user-x"), false), &config).unwrap_err();
        assert!(missing.to_string().contains("no user"), "{missing}");
    }

    #[test]
    fn codex_servers_outside_the_shim_are_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            "model = \"x\"\n[mcp_servers.raw]\ncommand = \"npx\"\nargs = [\"-y\", \"@modelcontextprotocol/server-everything\"]\n[mcp_servers.wrapped]\ncommand = \"/usr/local/bin/toolwall\"\nargs = [\"shim\", \"--server-id\", \"wrapped\", \"--\", \"npx\"]\n[mcp_servers.remote]\nurl = \"http://127.0.0.1:1/mcp\"\n",
        )
        .expect("write");
        assert_eq!(
            unshimmed_codex_servers(&config),
            vec![("raw".to_owned(), "npx".to_owned())]
        );
        assert!(unshimmed_codex_servers(&dir.path().join("missing.toml")).is_empty());
        assert!(is_codex(&"/usr/bin/codex".into()) && !is_codex(&"claude".into()));
    }

    fn args_of(cmd: &std::process::Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn codex_gets_its_base_url_as_an_option_others_through_the_environment() {
        let sock = std::path::Path::new("/run/toolwall/api.sock");
        let codex = build_command(
            &["/usr/bin/codex".into(), "exec".into(), "hi".into()],
            "s1",
            sock,
            Some("http://127.0.0.1:18080/s/k3y"),
        );
        assert_eq!(
            args_of(&codex),
            [
                "-c",
                "openai_base_url=\"http://127.0.0.1:18080/s/k3y/v1\"",
                "exec",
                "hi"
            ]
        );
        let claude = build_command(
            &["claude".into(), "-p".into(), "x".into()],
            "s1",
            sock,
            Some("http://127.0.0.1:18080/s/k3y"),
        );
        assert_eq!(args_of(&claude), ["-p", "x"]);
        let envs: Vec<_> = claude
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        assert!(envs.contains(&(
            "ANTHROPIC_BASE_URL".into(),
            Some("http://127.0.0.1:18080/s/k3y".into())
        )));
        assert!(envs.contains(&(
            "OPENAI_BASE_URL".into(),
            Some("http://127.0.0.1:18080/s/k3y/v1".into())
        )));
        assert!(envs.contains(&("TOOLWALL_SESSION".into(), Some("s1".into()))));
        let no_proxy = build_command(&["codex".into()], "s1", sock, None);
        assert!(args_of(&no_proxy).is_empty());
    }
}
