//! What the daemon's API handlers share.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::{
    cgroup::SessionCgroup,
    config::Config,
    correlate::CallRecord,
    events::{Committer, EventSink, StoredEvent},
    netmon::service::NetmonService,
    policy::LivePolicy,
};

/// One layer's state as reported at start-up and by `/health`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct LayerStatus {
    /// `llm-proxy`, `kernel`, `correlator`, ...
    pub name: &'static str,
    /// Whether it runs.
    pub on: bool,
    /// Where it listens / what it does, or why it is off and how to turn it on.
    pub detail: String,
}

impl LayerStatus {
    /// A running layer.
    pub(crate) fn on(name: &'static str, detail: &str) -> Self {
        LayerStatus {
            name,
            on: true,
            detail: detail.to_owned(),
        }
    }

    /// A layer that is off, with the reason.
    pub(crate) fn off(name: &'static str, why: &str) -> Self {
        LayerStatus {
            name,
            on: false,
            detail: why.to_owned(),
        }
    }
}

/// What [`DaemonState::new`] is made of.
pub(crate) struct DaemonParts {
    /// The effective configuration.
    pub config: Config,
    /// The event database (also the registry's).
    pub db_path: PathBuf,
    /// The policy engine (registry inside).
    pub policy: Arc<LivePolicy>,
    /// Where events go.
    pub sink: EventSink,
    /// Where the API's posted events go.
    pub committer: Committer,
    /// Stored events, live.
    pub live_events: broadcast::Sender<StoredEvent>,
    /// Correlated call records, live.
    pub live_calls: broadcast::Sender<CallRecord>,
    /// The kernel layer, when on.
    pub netmon: Option<NetmonService>,
    /// Where the LLM proxy listens, when on.
    pub proxy_addr: Option<std::net::SocketAddr>,
    /// Start-up report of every layer.
    pub layers: Vec<LayerStatus>,
    /// The LLM proxy's session keys.
    pub session_keys: Arc<crate::llm::proxy::SessionKeys>,
    /// Calls waiting for a person.
    pub approvals: Arc<crate::approval::Approvals>,
    /// The OTLP exporter's counts, when `telemetry.otlp` is set.
    pub export: Option<Arc<super::otlp::ExportStats>>,
    /// Signed policy bundles, when `policy.bundle` is set.
    pub bundle: Option<Arc<Mutex<super::bundle::BundleStatus>>>,
    /// The LLM proxy's response bodies, when it runs.
    pub llm_stats: Option<Arc<crate::llm::RelayStats>>,
}

/// The daemon's shared state.
pub(crate) struct DaemonState {
    /// The effective configuration.
    pub config: Config,
    /// The event database (also the registry's).
    pub db_path: PathBuf,
    /// The policy engine (registry inside).
    pub policy: Arc<LivePolicy>,
    /// What `/api/check` asks: the policy, refusing calls the store cannot record
    /// (`daemon/audit_gate.rs`).
    pub gate: Arc<dyn crate::decision::Gate>,
    /// Where events go.
    pub sink: EventSink,
    /// Where the API's posted events go: acknowledged once committed.
    pub committer: Committer,
    /// Stored events, live.
    pub live_events: broadcast::Sender<StoredEvent>,
    /// Correlated call records, live.
    pub live_calls: broadcast::Sender<CallRecord>,
    /// The kernel layer, when on.
    pub netmon: Option<NetmonService>,
    /// Where the LLM proxy listens, when on.
    pub proxy_addr: Option<std::net::SocketAddr>,
    /// Start-up report of every layer.
    pub layers: Vec<LayerStatus>,
    /// The LLM proxy's `/s/<key>` keys, one per open session.
    pub session_keys: Arc<crate::llm::proxy::SessionKeys>,
    /// Calls waiting for a person (`approval.rs`): the layers put them, the API answers.
    pub approvals: Arc<crate::approval::Approvals>,
    /// What `GET /metrics` reports (`daemon/metrics.rs`).
    pub metrics: Arc<super::metrics::Metrics>,
    /// The OTLP exporter's counts, when `telemetry.otlp` is set.
    pub export: Option<Arc<super::otlp::ExportStats>>,
    /// Signed policy bundles, when `policy.bundle` is set.
    pub bundle: Option<Arc<Mutex<super::bundle::BundleStatus>>>,
    /// Open sessions by name.
    sessions: Mutex<HashMap<String, SessionCgroup>>,
    /// Sessions taken over from a daemon before this one: no `toolwall exec` will close them,
    /// so they are closed once empty.
    adopted: Mutex<std::collections::HashSet<String>>,
    /// The cgroups of the stdio servers the daemon runs (`daemon/stdio.rs`), with the session
    /// each serves.
    servers: Mutex<HashMap<String, String>>,
    /// Sessions being closed: no server starts for them (a start racing the close would
    /// outlive it). Locks: `sessions`, then `closing`, then `servers`.
    closing: Mutex<std::collections::HashSet<String>>,
    /// Which opening of a session of that name is the open one (a name closed and opened again
    /// is another session: a server started for the first must not live on in the second).
    generations: Mutex<HashMap<String, u64>>,
    /// What one user's processes may hold of the daemon at once.
    pub(super) quotas: Arc<super::peer::Quotas>,
}

/// The session name of servers run for processes outside every session.
pub(super) const HOST: &str = "host";

impl DaemonState {
    /// Bundles what the API needs.
    pub(crate) fn new(parts: DaemonParts) -> Self {
        let DaemonParts {
            config,
            db_path,
            policy,
            sink,
            committer,
            live_events,
            live_calls,
            netmon,
            proxy_addr,
            layers,
            session_keys,
            approvals,
            export,
            bundle,
            llm_stats,
        } = parts;
        let metrics = super::metrics::Metrics::new(llm_stats.as_deref(), &committer.health());
        let gate = super::audit_gate::AuditGate::shared(
            policy.clone(),
            committer.health(),
            config.store.on_failure,
        );
        DaemonState {
            config,
            db_path,
            policy,
            gate,
            sink,
            committer,
            live_events,
            live_calls,
            netmon,
            proxy_addr,
            layers,
            session_keys,
            approvals,
            metrics,
            export,
            bundle,
            sessions: Mutex::new(HashMap::new()),
            adopted: Mutex::new(std::collections::HashSet::new()),
            servers: Mutex::new(HashMap::new()),
            closing: Mutex::new(std::collections::HashSet::new()),
            generations: Mutex::new(HashMap::new()),
            quotas: super::peer::Quotas::new(),
        }
    }

    /// Takes over the sessions an earlier daemon left pinned (the kernel layer adopted them at
    /// its start); returns how many.
    pub(crate) fn adopt_pinned_sessions(&self) -> usize {
        let Some(netmon) = &self.netmon else {
            return 0;
        };
        let found = netmon.take_adopted();
        let count = found.len();
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let mut adopted = self.adopted.lock().unwrap_or_else(|e| e.into_inner());
        for (name, cgroup) in found {
            // Its processes' LLM requests stay its own: the kernel says where they come from,
            // and the key `toolwall exec` gave it died with the earlier daemon
            // (`llm/proxy/sessions.rs`).
            if let Err(error) = self.session_keys.place(&name, cgroup.path()) {
                tracing::warn!(session = %name, %error, "adopted session's cgroup is gone: its LLM requests are refused");
            }
            adopted.insert(name.clone());
            sessions.insert(name, cgroup);
        }
        count
    }

    /// Closes adopted sessions whose processes are all gone.
    /// Whether sessions wait to close once empty ([`Self::close_when_empty`]).
    pub(crate) fn has_adopted_sessions(&self) -> bool {
        !self
            .adopted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    pub(crate) fn reap_adopted_sessions(&self) {
        let names: Vec<String> = self
            .adopted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        for name in names {
            let empty = self
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&name)
                .map(|c| c.all_processes().map(|p| p.is_empty()).unwrap_or(true));
            if empty != Some(false) && self.close_session(&name).unwrap_or(false) {
                tracing::info!(session = %name, "adopted session ended; closed");
            }
        }
    }

    /// Opens the cgroup of a stdio server the daemon runs for `session` (a session of its own
    /// to the kernel layer), limited to what `egress` (server id, its declaration's) allows.
    /// Returns the cgroup and the opening of `session` it was started for
    /// ([`Self::still_open`] asks again once the server runs).
    pub(super) fn open_server(
        &self,
        name: &str,
        session: &str,
        egress: Option<(&str, &crate::config::Egress)>,
    ) -> anyhow::Result<(Option<PathBuf>, Option<u64>)> {
        // Taken for an open session that is not closing, under its lock: a close marks the
        // session first and then ends the servers it finds, this one included.
        let mut generation = None;
        if session != HOST {
            let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let closing = self.closing.lock().unwrap_or_else(|e| e.into_inner());
            anyhow::ensure!(
                sessions.contains_key(session) && !closing.contains(session),
                "session {session:?} is closed or closing: no server starts for it"
            );
            generation = self
                .generations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(session)
                .copied();
            self.servers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name.to_owned(), session.to_owned());
        }
        let path = match self.open_session(name) {
            Ok(path) => path,
            Err(error) => {
                self.servers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(name);
                return Err(error);
            }
        };
        self.servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), session.to_owned());
        if let Some((server, crate::config::Egress::Only(allowed))) = egress {
            let limited = match (&path, &self.netmon) {
                (Some(_), Some(netmon)) => {
                    let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
                    match sessions.get(name) {
                        Some(cgroup) => netmon
                            .limit_egress(name, cgroup, server, allowed)
                            .map_err(anyhow::Error::from),
                        None => Err(anyhow::anyhow!("the cgroup {name} is gone")),
                    }
                }
                _ => {
                    tracing::warn!(%server, "the kernel layer is off: the server's egress is not limited to its declaration's");
                    Ok(())
                }
            };
            if let Err(error) = limited {
                let _ = self.close_session(name);
                return Err(error.context(format!("limiting the egress of MCP server {server:?}")));
            }
        }
        Ok((path, generation))
    }

    /// Whether the opening `generation` of `session` is still open and not closing: a server
    /// started for it asks once it runs (a close between its start and now did not see it).
    pub(super) fn still_open(&self, session: &str, generation: Option<u64>) -> bool {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let closing = self.closing.lock().unwrap_or_else(|e| e.into_inner());
        let generations = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        sessions.contains_key(session)
            && !closing.contains(session)
            && generations.get(session).copied() == generation
    }

    /// The session a daemon-run server's cgroup serves.
    pub(super) fn server_session(&self, cgroup: &str) -> Option<String> {
        self.servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(cgroup)
            .cloned()
    }

    /// Ends a daemon-run server's cgroup: whatever the server left running is killed (it must
    /// not outlive the server, nor the session it served), and the cgroup is closed once the
    /// kernel has reaped them.
    pub(super) fn end_server(&self, name: &str) {
        let killed = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map(|cgroup| cgroup.kill_all());
        if let Some(Err(error)) = killed {
            tracing::warn!(cgroup = %name, %error, "killing what a stdio MCP server left running");
        }
        if !matches!(self.close_session(name), Ok(true)) {
            self.close_when_empty(name);
        }
    }

    /// Marks `session` as closing: from now on no server starts for it ([`Self::open_server`]).
    pub(crate) fn mark_closing(&self, session: &str) {
        let _sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        self.closing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session.to_owned());
    }

    /// Kills every stdio server the daemon runs for `session` (its agent is done, and nothing
    /// started for it may outlive it), or for every session with `None` (shutdown); each
    /// server's thread then ends its cgroup ([`Self::end_server`]). Returns how many.
    pub(crate) fn end_servers_of(&self, session: Option<&str>) -> usize {
        let names: Vec<String> = self
            .servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, of)| session.is_none_or(|s| s == of.as_str()))
            .map(|(name, _)| name.clone())
            .collect();
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        for name in &names {
            if let Some(Err(error)) = sessions.get(name).map(|cgroup| cgroup.kill_all()) {
                tracing::warn!(cgroup = %name, %error, "ending a stdio MCP server");
            }
        }
        names.len()
    }

    /// Closes a session once its last process is gone (the reaper's check each second).
    pub(crate) fn close_when_empty(&self, name: &str) {
        self.adopted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
    }

    /// Opens a session: its cgroup, with the kernel programs attached when the kernel layer is
    /// on. Returns the cgroup directory, or `None` when the kernel layer is off (the session
    /// then runs unwatched by the kernel, and says so).
    pub(crate) fn open_session(&self, name: &str) -> anyhow::Result<Option<PathBuf>> {
        let Some(netmon) = &self.netmon else {
            return Ok(None);
        };
        // One owner per session: a second `exec --session X` closing it would unwatch the first.
        anyhow::ensure!(
            !self
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(name),
            "session {name:?} is already open; choose another name"
        );
        let cgroup = netmon.open_session(name)?;
        let path = cgroup.path().to_path_buf();
        // A new session of a name that was closed before.
        self.closing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        static OPENINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        self.generations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                name.to_owned(),
                OPENINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            );
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), cgroup);
        Ok(Some(path))
    }

    /// Closes a session: detaches and removes its cgroup if empty. Returns whether it existed.
    pub(crate) fn close_session(&self, name: &str) -> anyhow::Result<bool> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(cgroup), Some(netmon)) = (sessions.get(name), &self.netmon) else {
            return Ok(false);
        };
        // Processes left behind (an agent's background children) stay watched: the programs
        // are detached only once the cgroup is empty.
        if !cgroup.all_processes()?.is_empty() {
            anyhow::bail!("session {name:?} still has processes; it stays watched until they exit");
        }
        netmon.close_session(name, cgroup)?;
        sessions.remove(name);
        // Closed: nothing starts for it now that it is gone (`open_server` asks `sessions`, a
        // server that started meanwhile finds its opening gone: `still_open`).
        self.closing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.generations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.adopted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        Ok(true)
    }

    /// Names of the open sessions.
    pub(crate) fn session_names(&self) -> Vec<String> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Closes every session (shutdown); returns how many there were.
    pub(crate) fn close_all_sessions(&self) -> usize {
        let names = self.session_names();
        for name in &names {
            if let Err(error) = self.close_session(name) {
                tracing::warn!(session = %name, %error, "closing session at shutdown");
            }
        }
        names.len()
    }
}
