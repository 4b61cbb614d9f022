//! The kernel layer as the daemon runs it: keeps the rule maps in sync with the watched servers
//! (re-resolving their host names on a timer), turns kernel events into
//! `mcp_network_connection` events, and manages session cgroups.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use chrono::Utc;

use super::{
    KernelMonitor, NetmonError, Rule, RuleAction,
    events::{self, Connect},
};
use crate::{
    cgroup::{CgroupError, SessionCgroup},
    decision::Action,
    events::{Event, EventSink, NetworkConnection},
};

/// An endpoint the kernel watches: a network MCP server, or an LLM provider's API host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchedEndpoint {
    /// Server id (or `llm:anthropic` / `llm:openai` for provider hosts).
    pub id: String,
    /// `http`, `sse` or `llm`.
    pub kind: String,
    /// Host name or IP literal from the URL.
    pub host: String,
    /// Port from the URL (its scheme's default when the URL has none).
    pub port: u16,
    /// Flag (record) or deny (EPERM) connections from sessions.
    pub action: RuleAction,
}

/// Resolves each endpoint's host to all its addresses and lays out the rules. An endpoint whose
/// name does not resolve is reported and left out (its rule comes back when it resolves).
pub async fn resolve_rules(endpoints: &[WatchedEndpoint]) -> Vec<Rule> {
    let mut rules = Vec::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        let addrs: Vec<IpAddr> = match endpoint.host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                match tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port)).await {
                    Ok(found) => found.map(|sa| sa.ip()).collect(),
                    Err(error) => {
                        tracing::warn!(server = %endpoint.id, host = %endpoint.host, %error, "cannot resolve; no kernel rule for it until it resolves");
                        continue;
                    }
                }
            }
        };
        for addr in addrs {
            rules.push(Rule::exact(
                addr,
                endpoint.port,
                index as u32,
                endpoint.action,
            ));
        }
    }
    rules.sort_by_key(|r| (r.addr, r.port, r.action));
    rules.dedup();
    rules
}

/// The running kernel layer.
#[derive(Clone)]
pub struct NetmonService {
    monitor: Arc<Mutex<KernelMonitor>>,
    endpoints: Arc<RwLock<Vec<WatchedEndpoint>>>,
    sessions: Arc<RwLock<HashMap<u64, String>>>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    stop: Arc<tokio::sync::watch::Sender<bool>>,
}

impl NetmonService {
    /// Takes over a loaded monitor: syncs the rules now, then every `resolve_every`, and records
    /// every kernel event into `sink` until the returned service and its tasks are dropped.
    pub async fn start(
        mut monitor: KernelMonitor,
        endpoints: Vec<WatchedEndpoint>,
        sink: EventSink,
        resolve_every: Duration,
    ) -> Result<Self, NetmonError> {
        let ring = monitor.take_event_ring()?;
        monitor.sync_rules(&resolve_rules(&endpoints).await)?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let service = NetmonService {
            monitor: Arc::new(Mutex::new(monitor)),
            endpoints: Arc::new(RwLock::new(endpoints)),
            sessions: Arc::new(RwLock::new(HashMap::new())),
            tasks: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(stop),
        };

        let reader = service.clone();
        let read = tokio::spawn(async move {
            let stop = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            let emit = |connect: events::Connect| sink.emit(reader.to_event(&connect));
            if let Err(error) = events::read_events(ring, emit, stop).await {
                tracing::error!(%error, "kernel event reader stopped; connections are still enforced but no longer recorded");
            }
        });

        let resync = service.clone();
        let sync = tokio::spawn(async move {
            let mut tick = tokio::time::interval(resolve_every);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(error) = resync.resync().await {
                    tracing::error!(%error, "re-syncing kernel rules failed");
                }
            }
        });
        service
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend([read, sync]);
        Ok(service)
    }

    /// Stops the background tasks: the reader hands over what is left in the ring (and drops
    /// its event sink), the re-resolver ends. The programs stay attached until the sessions are
    /// closed or the last handle is dropped.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let mut tasks = tasks.into_iter();
        if let Some(read) = tasks.next() {
            let _ = read.await;
        }
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
    }

    /// Replaces the watched endpoints (registry or config changed); effective on the next connect.
    pub async fn set_endpoints(&self, endpoints: Vec<WatchedEndpoint>) -> Result<(), NetmonError> {
        *self.endpoints.write().unwrap_or_else(|e| e.into_inner()) = endpoints;
        self.resync().await
    }

    async fn resync(&self) -> Result<(), NetmonError> {
        let endpoints = self
            .endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let rules = resolve_rules(&endpoints).await;
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sync_rules(&rules)
    }

    /// Creates (or reuses) the session's cgroup and attaches the programs to it.
    pub fn open_session(&self, name: &str) -> Result<SessionCgroup, SessionError> {
        let cgroup = SessionCgroup::create(name)?;
        let id = cgroup.id()?;
        let mut sessions = self.sessions.write().unwrap_or_else(|e| e.into_inner());
        if let std::collections::hash_map::Entry::Vacant(slot) = sessions.entry(id) {
            self.monitor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .attach(cgroup.path())?;
            slot.insert(name.to_owned());
        }
        Ok(cgroup)
    }

    /// Detaches from the session's cgroup and removes it if it is empty.
    pub fn close_session(&self, cgroup: &SessionCgroup) -> Result<bool, SessionError> {
        let id = cgroup.id()?;
        self.sessions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .detach(cgroup.path());
        Ok(cgroup.remove_if_empty()?)
    }

    /// Counters, for the health endpoint and drop reports.
    pub fn counters(&self) -> Result<super::Counters, NetmonError> {
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counters()
    }

    fn to_event(&self, c: &Connect) -> Event {
        let endpoints = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        let endpoint = endpoints.get(c.raw.server_index as usize);
        let session = self
            .sessions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&c.raw.cgroup_id)
            .cloned();
        let process = ProcessInfo::of(c.raw.pid);
        Event::McpNetworkConnection(NetworkConnection {
            timestamp: Utc::now(),
            session_id: session.unwrap_or_default(),
            remote_addr: c.dest.to_string(),
            server_id: endpoint.map(|e| e.id.clone()).unwrap_or_default(),
            server_type: endpoint.map(|e| e.kind.clone()).unwrap_or_default(),
            action: if c.denied {
                Action::Block
            } else {
                Action::Allow
            },
            pid: c.raw.pid,
            tid: c.raw.tid,
            uid: c.raw.uid,
            comm: c.comm.clone(),
            exe: process.exe,
            cmdline: process.cmdline,
            ppid: process.ppid,
            cgroup_id: c.raw.cgroup_id,
            socket_cookie: c.raw.cookie,
            protocol: match c.raw.protocol {
                6 => "tcp".into(),
                17 => "udp".into(),
                n => n.to_string(),
            },
            family: if c.raw.family == agent_common::connect::FAMILY_INET {
                "ipv4".into()
            } else {
                "ipv6".into()
            },
        })
    }
}

/// Why a session could not be opened or closed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// cgroup trouble.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Attach trouble.
    #[error(transparent)]
    Netmon(#[from] NetmonError),
}

/// What procfs still knows about a process (it may have exited already).
#[derive(Debug, Default)]
struct ProcessInfo {
    exe: Option<String>,
    cmdline: Option<String>,
    ppid: Option<u32>,
}

impl ProcessInfo {
    fn of(pid: u32) -> Self {
        let Ok(process) = procfs::process::Process::new(pid as i32) else {
            return Self::default();
        };
        ProcessInfo {
            exe: process.exe().ok().map(|p| p.display().to_string()),
            cmdline: process
                .cmdline()
                .ok()
                .filter(|c| !c.is_empty())
                .map(|c| c.join(" ")),
            ppid: process.stat().ok().map(|s| s.ppid as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_names_to_every_address_and_keeps_literals() {
        let endpoints = vec![
            WatchedEndpoint {
                id: "a".into(),
                kind: "http".into(),
                host: "localhost".into(),
                port: 3001,
                action: RuleAction::Deny,
            },
            WatchedEndpoint {
                id: "b".into(),
                kind: "sse".into(),
                host: "[::1]".into(),
                port: 3002,
                action: RuleAction::Flag,
            },
            WatchedEndpoint {
                id: "c".into(),
                kind: "http".into(),
                host: "no-such-host.invalid".into(),
                port: 1,
                action: RuleAction::Deny,
            },
        ];
        let rules = resolve_rules(&endpoints).await;
        let a: Vec<_> = rules
            .iter()
            .filter(|r| r.server_index == 0)
            .map(|r| r.addr)
            .collect();
        assert!(
            a.contains(&"127.0.0.1".parse().unwrap()),
            "localhost → 127.0.0.1: {a:?}"
        );
        assert!(rules.iter().any(|r| r.server_index == 1
            && r.addr == "::1".parse::<IpAddr>().unwrap()
            && r.port == 3002));
        assert!(
            rules.iter().all(|r| r.server_index != 2),
            "an unresolvable host gets no rule"
        );
    }

    #[test]
    fn process_info_of_this_process_and_of_a_gone_one() {
        let me = ProcessInfo::of(std::process::id());
        assert!(me.exe.is_some() && me.cmdline.is_some() && me.ppid.is_some());
        let gone = ProcessInfo::of(u32::MAX - 1);
        assert!(gone.exe.is_none());
    }
}
