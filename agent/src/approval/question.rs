//! What a person is asked, and how an answer names it: by an id no other daemon run gives out
//! (a random prefix of the run and a count, `k3f9-1`), and by a digest of what was asked. An
//! id listed before a restart is refused by the next daemon, never matched to its question of
//! the same count; an answer whose digest is not the question's is refused, so a person (or a
//! script) approves exactly what they saw (`an_answer_names_its_question_by_id_and_digest`).

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Letters of a run's prefix: lowercase letters and digits, without those read alike
/// (`l`/`1`, `o`/`0`).
const PREFIX_LETTERS: &[u8; 32] = b"abcdefghijkmnpqrstuvwxyz23456789";
/// Letters in a run's prefix: 20 bits, a million runs for one prefix to come back.
const PREFIX_LEN: usize = 4;
/// Hex digits of a question's digest (64 bits of SHA-256).
const DIGEST_LEN: usize = 16;

/// A question's id: its daemon run's prefix, a dash, and its count in that run (`k3f9-1`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct QuestionId(String);

impl QuestionId {
    pub(crate) fn new(prefix: &str, count: u64) -> Self {
        QuestionId(format!("{prefix}-{count}"))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QuestionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A fresh prefix for this daemon run: random, or from the time and the process when the
/// kernel has no randomness to give (still unlike the last run's).
pub(crate) fn run_prefix() -> String {
    let mut bytes = [0u8; PREFIX_LEN];
    // SAFETY: getrandom writes at most the length given into the buffer we own.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        let digest = <sha2::Sha256 as sha2::Digest>::digest(seed.as_bytes());
        bytes.copy_from_slice(&digest[..PREFIX_LEN]);
    }
    bytes
        .iter()
        .map(|b| char::from(PREFIX_LETTERS[usize::from(b % 32)]))
        .collect()
}

/// What a person is asked: enough to decide, nothing the record would not keep (arguments
/// as recorded, redact rules applied).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Question {
    /// The id `toolwall approve` takes.
    pub id: QuestionId,
    /// What an answer names besides the id ([`digest`] of the fields below).
    pub digest: String,
    /// `llm`, `shim` or `mcp-proxy`.
    pub layer: String,
    /// The agent session, or empty.
    pub session_id: String,
    /// The server id.
    pub server_id: String,
    /// The tool's name on its server.
    pub tool: String,
    /// The call's arguments as the record keeps them.
    pub arguments: Option<Value>,
    /// Which rule asks, and why.
    pub reason: String,
    /// When it was asked.
    pub asked_at: DateTime<Utc>,
    /// When it is denied unless answered.
    pub expires_at: DateTime<Utc>,
}

impl Question {
    /// One line for a person: what is asked, escaped as every view escapes (`hidden.rs`).
    pub(crate) fn describe(&self) -> String {
        let shown = |s: &str, none: &'static str| match s {
            "" => none.to_owned(),
            s => crate::hidden::escaped(s).into_owned(),
        };
        format!(
            "approval {} (digest {}): {} on {} (session {}) with {}; asked because {}",
            shown(self.id.as_str(), "?"),
            shown(&self.digest, "?"),
            shown(&self.tool, "?"),
            shown(&self.server_id, "?"),
            shown(super::session_label(self), "-"),
            self.arguments
                .as_ref()
                .map(|a| crate::hidden::escaped(&a.to_string()).into_owned())
                .unwrap_or_else(|| "no arguments".into()),
            shown(&self.reason, "-"),
        )
    }
}

/// Short hex SHA-256 over the canonical JSON (`registry::value_hash`: sorted keys, no
/// whitespace) of a question's id, layer, session, server, tool, arguments and reason: two
/// questions that differ in any of them have different digests.
pub(crate) fn digest(
    id: &QuestionId,
    layer: &str,
    session_id: &str,
    server_id: &str,
    tool: &str,
    arguments: Option<&Value>,
    reason: &str,
) -> String {
    let mut hash = crate::registry::value_hash(&json!({
        "id": id,
        "layer": layer,
        "session_id": session_id,
        "server_id": server_id,
        "tool": tool,
        "arguments": arguments,
        "reason": reason,
    }));
    hash.truncate(DIGEST_LEN);
    hash
}
