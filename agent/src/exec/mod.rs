//! `toolwall exec`: runs an agent inside a watched session.
//!
//! Asks the running daemon for a session (a cgroup with the kernel programs attached), starts
//! the command inside that cgroup from its first instruction, points its LLM SDKs at the proxy
//! (`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`, `GOOGLE_GEMINI_BASE_URL`, in each agent's form:
//! `agents.rs`), names the MCP servers of the agent's configuration that do not run through
//! `toolwall shim`, exports the session id for shims it starts, and passes its exit code
//! through. The session's cgroup is removed afterwards.
//!
//! The agent must not be able to leave the session (out of it, the kernel layer's rules no
//! longer hold for it): started by root, it runs
//! as an unprivileged user by default, in its own cgroup namespace (its cgroup is `/`, the
//! ancestors out of sight), with `no_new_privs` and without the capabilities that could detach
//! programs or move processes ([`DROPPED_CAPS`]), even when it is run as root on request.

mod agents;
mod ambient;

pub(crate) use agents::install::{ShimAction, install};
mod confine;
mod init;
mod private;
mod reach;
mod strict;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context;
use clap::Args;
use http::Method;
use serde::Deserialize;

use crate::{cgroup::SessionCgroup, client::ApiClient, config::Config};
use confine::agent_user;
pub(crate) use confine::{
    Pids, SERVER_DROPPED_CAPS, confine_on_spawn, home_of, lookup_user,
    own_pid_namespace_for_children, user_name,
};

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
    /// Run the agent as root. It is still confined (cgroup, IPC and mount namespaces, no
    /// CAP_SYS_ADMIN, CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH)
    /// but keeps root's other powers (raw sockets, kernel modules, every file); prefer `--user`.
    #[arg(long)]
    pub as_root: bool,
    /// Pass this variable to the agent although it leads out of the session (a proxy, an ssh
    /// or gpg agent, a bus, a display, tmux; see docs/sessions.md); repeatable.
    #[arg(long = "env", value_name = "NAME")]
    pub keep_env: Vec<OsString>,
    /// The agent and its arguments, e.g. `-- claude -p "..."`.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

#[derive(Deserialize)]
struct SessionReply {
    cgroup: Option<PathBuf>,
    kernel: Option<String>,
    proxy: Option<String>,
    /// Why the session's Unix sockets are not confined (`exec.confine: weaker` only).
    #[serde(default)]
    unix: Option<String>,
}

/// Runs the command in a new session; returns its exit code (128 + signal if it was killed).
pub(crate) fn run(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref())?;
    let user = agent_user(&args, &config)?;
    let socket = crate::config::prepare_socket_dir(config.api.socket.as_deref(), false)?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // Before a session exists: what cannot be made fails without leaving one behind.
    let private = if root {
        // SAFETY: getuid and getgid have no preconditions.
        let (uid, gid) = user.as_ref().map_or_else(
            || unsafe { (libc::getuid(), libc::getgid()) },
            |u| (u.uid, u.gid),
        );
        let cwd = std::env::current_dir().context("the working directory")?;
        let listed: Vec<PathBuf> = config
            .exec
            .allow_unix
            .iter()
            .filter(|n| n.starts_with('/'))
            .map(PathBuf::from)
            .collect();
        Some(private::PrivateDirs::make(
            &cwd,
            &socket,
            &listed,
            (uid, gid),
            config.exec.tmp_size_mib,
        )?)
    } else {
        None
    };
    let strict = match config.exec.confine {
        crate::config::Confine::Default | crate::config::Confine::Weaker => None,
        crate::config::Confine::Strict => {
            let home = user
                .as_ref()
                .map(|u| u.home.clone())
                .or_else(|| std::env::var_os("HOME").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from("/"));
            let cwd =
                std::env::current_dir().context("exec.confine strict: the working directory")?;
            let plan = strict::Plan::new(&cwd, &home, &config.exec.write, &config.exec.secrets)?;
            let ruleset = strict::ruleset(&plan, private.iter().flat_map(|p| p.roots()))?;
            Some((plan, ruleset))
        }
    };
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
        let weaker = config.exec.confine == crate::config::Confine::Weaker;
        let body = serde_json::to_vec(&serde_json::json!({ "name": session, "weaker": weaker }))?;
        let reply: SessionReply = serde_json::from_slice(&api.call(Method::POST, "/api/sessions", body).await?)
            .context("parse the daemon's session reply")?;

        let mut cmd = build_command(&args.command, &session, &socket, reply.proxy.as_deref());
        let dropped = ambient::drop_routes_out(&mut cmd, &ambient::kept(&args.keep_env));
        if !dropped.is_empty() {
            eprintln!(
                "toolwall: session {session}: not passed to the agent: {} (each names a service outside the session that would relay or run what the agent asks; keep one with --env NAME)",
                dropped.join(", ")
            );
        }
        // SAFETY: geteuid has no preconditions.
        let agent_uid = user.as_ref().map_or_else(|| unsafe { libc::geteuid() }, |u| u.uid);
        let services = ambient::login_services(agent_uid);
        if !services.is_empty() {
            eprintln!(
                "toolwall: WARNING: session {session}: the agent's user (uid {agent_uid}) runs {}; the session refuses their sockets, but an agent of the same user can still change their files and the files they run (a shell's startup files, ~/.ssh/authorized_keys). Run agents as a user of their own (--user, exec.user)",
                services.join(", ")
            );
        }
        if let Some(user) = &user {
            let who = reach::Who { name: &user.name, uid: user.uid, gid: user.gid, groups: &user.groups };
            // A socket right in a private directory is a mount point there: not renamed.
            let squattable = config.exec.allow_unix.iter().map(Path::new).filter(|p| p.is_absolute())
                .filter(|p| !p.parent().is_some_and(|d| private.as_ref().is_some_and(|v| v.is_root(d))))
                .filter_map(|p| reach::squattable(p, &who));
            for warning in squattable {
                eprintln!("toolwall: WARNING: session {session}: {warning}");
            }
        }
        // Abstract names belong to the whole host; no directory guards them.
        for name in config.exec.allow_unix.iter().filter(|n| n.starts_with('@')) {
            eprintln!(
                "toolwall: WARNING: session {session}: exec.allow_unix lists the abstract name {name}: while its service is not listening, the agent can bind the name itself and clients outside the session would reach the agent; list a pathname socket in a directory only its service can write"
            );
        }
        if let Some(user) = &user {
            cmd.env("HOME", &user.home)
                .env("USER", &user.name)
                .env("LOGNAME", &user.name);
            eprintln!("toolwall: session {session}: the agent runs as {} (uid {})", user.name, user.uid);
        } else if unsafe { libc::geteuid() } == 0 {
            eprintln!("toolwall: WARNING: session {session}: the agent runs as root (--as-root); it keeps root's powers beyond the ones toolwall drops (raw sockets, kernel modules, every file), so only trusted agents should run this way");
        }
        let agent = agents::Agent::of(&args.command[0]);
        let home = user
            .as_ref()
            .map(|u| u.home.clone())
            .or_else(|| std::env::var_os("HOME").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/"));
        let cwd = std::env::current_dir().unwrap_or_default();
        for server in agents::unshimmed_servers(agent, &home, &cwd) {
            eprintln!("toolwall: WARNING: session {session}: {}", agents::warning(agent, &server));
        }
        let landlock = strict.map(|(plan, ruleset)| {
            eprintln!(
                "toolwall: session {session}: files confined (exec.confine: strict): writes only to {}{}; unreadable: {}; abstract Unix sockets and signals outside the session refused",
                plan.write.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
                if private.is_some() { " and its private temporary directories" } else { "" },
                if plan.secrets.is_empty() { "none of exec.secrets exists".to_owned() } else { plan.secrets.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ") }
            );
            ruleset
        });
        match &private {
            Some(private) => {
                eprintln!(
                    "toolwall: session {session}: private to the agent (empty, at most {} MiB each, gone when it ends): {}",
                    config.exec.tmp_size_mib,
                    private.paths().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join(", ")
                );
                for note in &private.notes {
                    eprintln!("toolwall: WARNING: session {session}: {note}");
                }
            }
            None => eprintln!("toolwall: WARNING: session {session}: /tmp, /var/tmp and /dev/shm are the host's (exec was not run as root, so the agent gets no mount namespace of its own)"),
        }
        if let Some(why) = &reply.unix {
            eprintln!("toolwall: WARNING: session {session}: Unix sockets not confined (exec.confine: weaker): {why}");
        }
        match &reply.proxy {
            Some(proxy) => {
                for line in agents::coverage(agent, proxy, &home, &cwd) {
                    match line {
                        Ok(fact) => eprintln!("toolwall: session {session}: {fact}"),
                        Err(warning) => eprintln!("toolwall: WARNING: session {session}: {warning}"),
                    }
                }
                if !config.netmon.pin_llm_egress {
                    eprintln!("toolwall: session {session}: an agent that ignores these variables reaches its provider directly, unread; netmon.pin_llm_egress refuses the providers' hosts to sessions");
                }
            }
            None => eprintln!("toolwall: WARNING: session {session}: the daemon's LLM proxy is off; LLM calls go directly to the providers, unseen"),
        }
        let _cgroup_procs = match &reply.cgroup {
            Some(path) => {
                eprintln!("toolwall: session {session}: cgroup {} watched by the kernel layer", path.display());
                let procs = SessionCgroup::at(path).enter_on_spawn(&mut cmd)?;
                // After the cgroup is entered (closures run in the order they were added).
                confine_on_spawn(&mut cmd, user.as_ref().map(|u| (u.uid, u.gid, u.groups.clone())), &[], Pids::OwnUnderInit, landlock, private)?;
                crate::seccomp::apply_on_spawn(&mut cmd, crate::seccomp::agent_filters()?);
                Some(procs)
            }
            None => {
                eprintln!(
                    "toolwall: WARNING: session {session}: kernel layer {}; connections are not watched",
                    reply.kernel.as_deref().unwrap_or("off")
                );
                confine_on_spawn(&mut cmd, user.as_ref().map(|u| (u.uid, u.gid, u.groups.clone())), &[], Pids::OwnUnderInit, landlock, private)?;
                crate::seccomp::apply_on_spawn(&mut cmd, crate::seccomp::agent_filters()?);
                None
            }
        };
        let instance = daemon_instance(&api).await?;
        let (gone_tx, gone_rx) = tokio::sync::watch::channel(false);
        let watch = tokio::spawn(watch_daemon(api.clone(), session.clone(), instance.clone(), gone_tx));
        // SAFETY: geteuid has no preconditions.
        let own_pids = unsafe { libc::geteuid() } == 0;
        let status = run_child(cmd, own_pids)
            .await
            .map_err(|error| why_not_started(error, &args.command[0], user.as_ref()));
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

/// A failure to start the agent, with the part of its path the agent's user cannot reach when
/// that is the cause (the kernel says only "Permission denied").
fn why_not_started(
    error: anyhow::Error,
    program: &std::ffi::OsStr,
    user: Option<&confine::AgentUser>,
) -> anyhow::Error {
    let denied = error.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
    });
    let who = user.filter(|_| denied).map(|u| reach::Who {
        name: &u.name,
        uid: u.uid,
        gid: u.gid,
        groups: &u.groups,
    });
    let cwd = std::env::current_dir().unwrap_or_default();
    let path_var = std::env::var_os("PATH");
    match who.and_then(|who| reach::explain(program, path_var.as_deref(), &cwd, &who)) {
        Some(why) => error.context(why),
        None => error,
    }
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

/// The command with the session's environment and its model endpoint (`agents.rs`).
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
        agents::point_at_proxy(agents::Agent::of(&command[0]), proxy, &mut cmd, &mut args);
    }
    cmd.args(args);
    cmd
}

/// Runs the child, forwarding SIGTERM and SIGHUP to it (SIGINT from a terminal reaches it on
/// its own, as it shares our process group). With `own_pids` it starts in a PID namespace of
/// its own under an init of toolwall's (`exec/init.rs`), from a thread of its own (the
/// namespace is that thread's, which can start no threads after it).
async fn run_child(
    mut cmd: std::process::Command,
    own_pids: bool,
) -> anyhow::Result<std::process::ExitStatus> {
    use tokio::signal::unix::{SignalKind, signal};
    let program = cmd.get_program().to_string_lossy().into_owned();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (exited_tx, mut exited_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("agent".to_owned())
        .spawn(move || {
            let started = (if own_pids {
                own_pid_namespace_for_children().context("a PID namespace for the agent")
            } else {
                Ok(())
            })
            .and_then(|()| cmd.spawn().with_context(|| format!("start {program}")));
            match started {
                Ok(mut child) => {
                    let _ = started_tx.send(Ok(child.id() as i32));
                    let _ = exited_tx.send(child.wait());
                }
                Err(error) => {
                    let _ = started_tx.send(Err(error));
                }
            }
        })
        .context("a thread for the agent")?;
    let pid = started_rx
        .await
        .map_err(|_| anyhow::anyhow!("the agent's thread ended"))??;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut int = signal(SignalKind::interrupt())?;
    loop {
        let forward = tokio::select! {
            status = &mut exited_rx => {
                return status
                    .map_err(|_| anyhow::anyhow!("the agent's thread ended"))?
                    .context("wait for the agent");
            }
            _ = term.recv() => libc::SIGTERM,
            _ = hup.recv() => libc::SIGHUP,
            _ = int.recv() => continue,
        };
        // SAFETY: kill(2) on our own child's pid, which stays ours until it is reaped above.
        unsafe { libc::kill(pid, forward) };
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
            keep_env: Vec::new(),
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
