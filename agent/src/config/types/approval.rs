//! `sandbox.mcp.approval:`: how calls an argument rule asks about are put to a person
//! (`approval.rs`).

use serde::{Deserialize, Serialize};

/// `approval:` — asking a person (`approval.rs`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApprovalConfig {
    /// Seconds a call waits for an answer; then it is denied.
    #[serde(default = "default_approval_timeout")]
    pub timeout_secs: u64,
    /// Calls that may wait at once; one more is denied at once (a flood of asks must not
    /// hold the daemon's memory or a person's attention without bound).
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    /// Where each question is also POSTed (a chat bridge, a pager); the answer comes back
    /// through `toolwall approve|deny` or the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookConfig>,
}

impl Default for ApprovalConfig {
    fn default() -> Self {
        ApprovalConfig {
            timeout_secs: default_approval_timeout(),
            max_pending: default_max_pending(),
            webhook: None,
        }
    }
}

fn default_approval_timeout() -> u64 {
    120
}

fn default_max_pending() -> usize {
    64
}

/// `approval.webhook:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookConfig {
    /// `http://` or `https://` URL the question is POSTed to, as JSON.
    pub url: String,
    /// Headers sent with it (an `Authorization` the receiver wants).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
}
