//! `exec:`: how `toolwall exec` starts agents.

use serde::{Deserialize, Serialize};

/// `exec:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecConfig {
    /// The user agents run as when `toolwall exec` is started by root without `--user` or
    /// `SUDO_USER` (an agent running as root could leave its session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// How far an agent's files are confined: `default` (its user's rights) or `strict`
    /// (Landlock: writes only where `write` says, `secrets` unreadable, login files read-only).
    #[serde(default)]
    pub confine: Confine,
    /// Under `strict`: what the agent may write besides its working directory and the
    /// temporary directories (`~/` is the agent user's home).
    #[serde(default = "default_write")]
    pub write: Vec<String>,
    /// Under `strict`: what the agent may not read.
    #[serde(default = "default_secrets")]
    pub secrets: Vec<String>,
    /// Unix sockets a session may connect and send to besides toolwall's API socket and nscd's
    /// (`agent_common::unix::ALWAYS_LISTED`): absolute paths, or `@name` for an abstract name.
    /// Every other is refused.
    #[serde(default)]
    pub allow_unix: Vec<String>,
    /// The most each of an agent's private temporary directories may hold (MiB): they are
    /// memory (tmpfs).
    #[serde(default = "default_tmp_size_mib")]
    pub tmp_size_mib: u64,
}

fn default_tmp_size_mib() -> u64 {
    1024
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            user: None,
            confine: Confine::default(),
            write: default_write(),
            secrets: default_secrets(),
            allow_unix: Vec::new(),
            tmp_size_mib: default_tmp_size_mib(),
        }
    }
}

/// One `exec.allow_unix` entry as the kernel programs key it: `/path` or `@abstract`.
pub(crate) fn unix_name(entry: &str) -> Result<agent_common::unix::UnixName, String> {
    let bytes: Vec<u8> = if let Some(name) = entry.strip_prefix('@') {
        if name.is_empty() {
            return Err(format!("{entry:?} names no abstract socket"));
        }
        std::iter::once(0).chain(name.bytes()).collect()
    } else if entry.starts_with('/') {
        if entry.contains('\0') {
            return Err(format!("{entry:?} holds a NUL byte"));
        }
        entry.as_bytes().to_vec()
    } else {
        return Err(format!(
            "{entry:?} is neither an absolute path nor an abstract name"
        ));
    };
    agent_common::unix::UnixName::of(&bytes).ok_or_else(|| {
        format!(
            "{entry:?} is longer than a Unix socket address holds ({} bytes)",
            agent_common::unix::NAME_BYTES
        )
    })
}

/// `exec.confine`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Confine {
    /// The session's confinement; files as the agent's user may use them.
    #[default]
    Default,
    /// Landlock besides (`exec/strict.rs`).
    Strict,
    /// Sessions start even where the kernel cannot confine their Unix sockets (before Linux
    /// 6.7); `exec` refuses there otherwise.
    Weaker,
}

/// Where the agents toolwall is tested with keep their state.
fn default_write() -> Vec<String> {
    ["~/.claude", "~/.codex", "~/.cache", "~/.npm"]
        .map(str::to_owned)
        .to_vec()
}

/// Credentials an agent has no business reading.
fn default_secrets() -> Vec<String> {
    [
        "~/.ssh",
        "~/.gnupg",
        "~/.aws",
        "~/.azure",
        "~/.config/gcloud",
        "~/.config/gh",
        "~/.kube",
        "~/.docker",
        "~/.netrc",
        "~/.git-credentials",
    ]
    .map(str::to_owned)
    .to_vec()
}
