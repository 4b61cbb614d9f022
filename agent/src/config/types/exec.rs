//! `exec:`: how `toolwall exec` starts agents.

use serde::{Deserialize, Serialize};

/// `exec:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecConfig {
    /// The user agents run as when `toolwall exec` is started by root without `--user` or
    /// `SUDO_USER` (an agent running as root could leave its session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}
