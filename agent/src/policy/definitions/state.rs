//! What a policy keeps of the definitions it judged: the refusals (a tool to hide, a server to
//! block), which servers' stored definitions were judged, the policy that replaced it, and the
//! registered tools listings were last compared with. Kept apart from the checks
//! (`definitions.rs`), which are pure functions of a definition and the comparison set.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, OnceLock, RwLock},
};

use crate::policy::Policy;

/// What a policy remembers of the definitions it judged.
#[derive(Debug, Default)]
pub(crate) struct DefinitionState {
    /// Servers (tool `None`) and tools whose definitions a check refused. A tool's entry goes
    /// when a later listing shows it clean; a server's stays until the daemon restarts. Also
    /// made from the registry's stored definitions ([`Policy::judge_stored`]), and kept
    /// across a replacement (`Policy::take_over`).
    pub(in crate::policy) flagged: RwLock<HashMap<(String, Option<String>), Flag>>,
    /// The policy that replaced this one: a listing this one judges after the swap (it began
    /// before) is judged by that one too, so no refusal is lost between the two (held, not
    /// weak: two swaps during one listing still reach the last).
    pub(super) successor: OnceLock<Arc<Policy>>,
    /// Servers whose stored definitions were judged ([`Policy::judge_stored`]).
    pub(super) judged: RwLock<HashSet<String>>,
    /// Held while judging them.
    pub(super) judging: Mutex<()>,
    /// The registered tools listings were last compared with, and when.
    pub(super) others: Mutex<Option<super::cache::OthersCache>>,
}

/// A refusal by the definition checks: why, and which checks found it (a policy taking over
/// keeps it while it refuses on one of them too).
#[derive(Clone, Debug)]
pub(in crate::policy) struct Flag {
    pub(super) why: String,
    pub(super) checks: Vec<&'static str>,
    /// For a shadowing finding: the server whose tool it is named like.
    pub(super) shadows: Option<String>,
}

/// What definitions the checks judge.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judged {
    /// A server's listing, as it passes (findings logged).
    Listing,
    /// A listing the policy this one replaced judged after the swap.
    Forwarded,
    /// What the registry holds (`Policy::judge_stored`): rows of tools a server no longer
    /// lists among them, so a finding hides its tool and blocks no server (blocking it would keep
    /// the server blocked at every start for a tool it no longer lists:
    /// `a_stored_finding_hides_its_tool_and_blocks_no_server`).
    Stored,
}
