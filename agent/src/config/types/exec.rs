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
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            user: None,
            confine: Confine::default(),
            write: default_write(),
            secrets: default_secrets(),
        }
    }
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
