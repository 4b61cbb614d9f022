//! The kernel layer as the daemon runs it: keeps the rule maps in sync with the watched servers
//! (re-resolving their host names on a timer, re-reading the host's addresses when they change),
//! turns kernel events into `mcp_network_connection` events, manages session cgroups, and
//! watches each session for a detached program or a process that left.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, Utc};

use super::{
    KernelMonitor, NetmonError, Rule, RuleAction,
    events::{self, Connect},
    local::AddressChanges,
};
use crate::{
    cgroup::{CgroupError, SessionCgroup},
    decision::Action,
    events::{Event, EventSink, KernelAlert, NetworkConnection},
};

/// An endpoint the kernel watches: a network MCP server, or an LLM provider's API host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchedEndpoint {
    /// Server id (or `llm:anthropic` / `llm:openai` for provider hosts).
    pub id: String,
    /// `http`, `sse`, `llm` or `dns`.
    pub kind: String,
    /// Host name or IP literal from the URL, or a range (`ADDR/PREFIX`).
    pub host: String,
    /// Port from the URL (its scheme's default when the URL has none).
    pub port: u16,
    /// Flag (record) or deny (EPERM) connections from sessions.
    pub action: RuleAction,
    /// Addresses carved out of a range (the allowed resolvers inside DNS to anywhere): let
    /// through unrecorded on `port`, unless another DENY covers them.
    pub except: Vec<IpAddr>,
}

/// What a host name resolved to the last time it resolved, so that a name that stops
/// resolving keeps its rules (issue 14, item 4: it used to lose them, DENY included), and when
/// the earliest of those answers expires (their DNS TTL), so that a changed address is picked up
/// then rather than at the next interval.
#[derive(Debug, Default)]
pub struct LastKnown {
    addresses: HashMap<String, Vec<IpAddr>>,
    /// The earliest TTL expiry of the last pass's names, when DNS said.
    expires: Option<std::time::Instant>,
    /// Asks DNS for the TTLs (getaddrinfo, which finds the addresses as the agent's libc does,
    /// does not report them); built on first use, `None` when the system configuration cannot
    /// be read.
    ttl: Option<Option<hickory_resolver::TokioResolver>>,
}

impl LastKnown {
    /// When the earliest answer of the last pass expires.
    pub fn expires(&self) -> Option<std::time::Instant> {
        self.expires
    }

    /// The TTL expiry of `host`'s DNS answer, if DNS has one.
    async fn ttl_of(&mut self, host: &str) -> Option<std::time::Instant> {
        let resolver = self.ttl.get_or_insert_with(|| {
            match hickory_resolver::Resolver::builder_tokio().and_then(|b| b.build()) {
                Ok(resolver) => Some(resolver),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the system's DNS configuration; names are re-resolved every resolve interval only, not on their TTL");
                    None
                }
            }
        });
        // Bounded: a name getaddrinfo found elsewhere (nss-myhostname, mDNS) may leave DNS
        // waiting; the interval still re-resolves it.
        let lookup =
            tokio::time::timeout(Duration::from_secs(2), resolver.as_ref()?.lookup_ip(host))
                .await
                .ok()?
                .ok()?;
        Some(lookup.valid_until())
    }
}

/// Resolves each endpoint's host to all its addresses and lays out the rules.
///
/// A name that does not resolve keeps the addresses it last resolved to; one that never
/// resolved is, when it is DENY, denied on its port on every address (`::/0`, which covers the
/// mapped IPv4 space too) until it does. Either way it is reported.
pub async fn resolve_rules(endpoints: &[WatchedEndpoint], known: &mut LastKnown) -> Vec<Rule> {
    let mut rules = Vec::new();
    known.expires = None;
    for (index, endpoint) in endpoints.iter().enumerate() {
        let index = index as u32;
        // A range (`::/0` for DNS to any resolver).
        if let Some((addr, prefix)) = endpoint.host.split_once('/')
            && let (Ok(addr), Ok(prefix)) = (addr.parse::<IpAddr>(), prefix.parse::<u8>())
        {
            rules.push(Rule {
                addr,
                prefix,
                port: endpoint.port,
                server_index: index,
                action: endpoint.action,
            });
            rules.extend(
                endpoint
                    .except
                    .iter()
                    .map(|&a| Rule::exact(a, endpoint.port, index, RuleAction::Pass)),
            );
            continue;
        }
        let addrs: Vec<IpAddr> = match endpoint.host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                match tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port)).await {
                    Ok(found) => {
                        let mut found: Vec<IpAddr> = found.map(|sa| sa.ip()).collect();
                        found.sort();
                        found.dedup();
                        known.addresses.insert(endpoint.host.clone(), found.clone());
                        if let Some(expiry) = known.ttl_of(&endpoint.host).await {
                            known.expires = Some(known.expires.map_or(expiry, |e| e.min(expiry)));
                        }
                        found
                    }
                    Err(error) => match known.addresses.get(&endpoint.host) {
                        Some(last) => {
                            tracing::warn!(server = %endpoint.id, host = %endpoint.host, %error, addresses = ?last, "cannot resolve; its rule stays on the addresses it last resolved to");
                            last.clone()
                        }
                        None if endpoint.action == RuleAction::Deny => {
                            tracing::error!(server = %endpoint.id, host = %endpoint.host, port = endpoint.port, %error, "cannot resolve and never did; port denied on every address until it resolves");
                            rules.push(Rule {
                                addr: IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                                prefix: 0,
                                port: endpoint.port,
                                server_index: index,
                                action: RuleAction::Deny,
                            });
                            continue;
                        }
                        None => {
                            tracing::warn!(server = %endpoint.id, host = %endpoint.host, %error, "cannot resolve and never did; connections to it are not flagged until it resolves");
                            continue;
                        }
                    },
                }
            }
        };
        for addr in addrs {
            rules.push(Rule::exact(addr, endpoint.port, index, endpoint.action));
        }
    }
    rules.sort_by_key(|r| (r.addr, r.prefix, r.port, r.action));
    rules.dedup();
    rules
}

/// Session ids the reader attributes events to: open sessions, and closed ones until every
/// event they can have left in the ring was read (issue 14, item 6: events read after their
/// session closed used to lose it).
#[derive(Debug, Default)]
struct Attribution {
    open: HashMap<u64, String>,
    /// (cgroup id, session, drains completed when it closed).
    closed: Vec<(u64, String, u64)>,
}

impl Attribution {
    /// Most closed sessions remembered while no drain runs (none does while the ring is idle).
    const MAX_CLOSED: usize = 4096;

    fn name(&self, id: u64) -> Option<&str> {
        self.open.get(&id).map(String::as_str).or_else(|| {
            self.closed
                .iter()
                .rev()
                .find(|(i, _, _)| *i == id)
                .map(|(_, n, _)| n.as_str())
        })
    }

    fn close(&mut self, id: u64, drains: u64) {
        if let Some(name) = self.open.remove(&id) {
            if self.closed.len() == Self::MAX_CLOSED {
                self.closed.remove(0);
            }
            self.closed.push((id, name, drains));
        }
    }

    /// Forgets closed sessions once a whole drain ran after they closed: the drain under way at
    /// the close may have passed their last events' place already, the one after cannot.
    fn retire(&mut self, drains: u64) {
        self.closed.retain(|(_, _, at)| drains < at + 2);
    }
}

/// The running kernel layer.
#[derive(Clone)]
pub struct NetmonService {
    monitor: Arc<Mutex<KernelMonitor>>,
    endpoints: Arc<RwLock<Vec<WatchedEndpoint>>>,
    known: Arc<tokio::sync::Mutex<LastKnown>>,
    locals: Arc<RwLock<Vec<IpAddr>>>,
    sessions: Arc<RwLock<Attribution>>,
    drains: Arc<AtomicU64>,
    /// Each session's processes at the last watch, to notice one that left.
    members: Arc<Mutex<HashMap<String, HashSet<u32>>>>,
    /// Sessions adopted at start, until the daemon takes them ([`Self::take_adopted`]).
    adopted: Arc<Mutex<Vec<(String, SessionCgroup)>>>,
    sink: EventSink,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    stop: Arc<tokio::sync::watch::Sender<bool>>,
    /// Cgroups whose egress is limited to a declared stdio server's, with the server's id.
    egress_owners: Arc<RwLock<HashMap<u64, String>>>,
}

impl NetmonService {
    /// Takes over a loaded monitor: syncs the rules now, again every `resolve_every` and on
    /// every change of the host's addresses, records every kernel event into `sink`, and every
    /// `watch_every` checks each session's programs and processes, until the returned service
    /// and its tasks are dropped.
    pub async fn start(
        mut monitor: KernelMonitor,
        endpoints: Vec<WatchedEndpoint>,
        sink: EventSink,
        resolve_every: Duration,
        watch_every: Duration,
    ) -> Result<Self, NetmonError> {
        let ring = monitor.take_event_ring()?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let service = NetmonService {
            monitor: Arc::new(Mutex::new(monitor)),
            endpoints: Arc::new(RwLock::new(endpoints)),
            known: Arc::new(tokio::sync::Mutex::new(LastKnown::default())),
            locals: Arc::new(RwLock::new(read_locals())),
            sessions: Arc::new(RwLock::new(Attribution::default())),
            drains: Arc::new(AtomicU64::new(0)),
            members: Arc::new(Mutex::new(HashMap::new())),
            adopted: Arc::new(Mutex::new(Vec::new())),
            sink: sink.clone(),
            tasks: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(stop),
            egress_owners: Arc::new(RwLock::new(HashMap::new())),
        };
        service.resync().await?;
        // Before the reader starts: events a pinned session left in the ring are read with
        // their session known.
        match service.adopt_pinned() {
            Ok(found) => *service.adopted.lock().unwrap_or_else(|e| e.into_inner()) = found,
            Err(error) => {
                tracing::error!(%error, "re-adopting pinned sessions failed; their programs stay attached and enforcing")
            }
        }

        let reader = service.clone();
        let mut reader_stop = stopped.clone();
        let read = tokio::spawn(async move {
            let stop = async move {
                let _ = reader_stop.wait_for(|s| *s).await;
            };
            let emit = |connect: events::Connect| sink.emit(reader.to_event(&connect));
            let drained = || {
                let drains = reader.drains.fetch_add(1, Ordering::AcqRel) + 1;
                reader
                    .sessions
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .retire(drains);
            };
            if let Err(error) = events::read_events(ring, emit, drained, stop).await {
                tracing::error!(%error, "kernel event reader stopped; connections are still enforced but no longer recorded");
            }
        });

        let resync = service.clone();
        let sync = tokio::spawn(async move {
            let mut changes = match AddressChanges::subscribe() {
                Ok(changes) => Some(changes),
                Err(error) => {
                    tracing::error!(%error, "cannot subscribe to address changes (rtnetlink); the host's addresses are re-read only every resolve interval");
                    None
                }
            };
            let mut tick = tokio::time::interval(resolve_every);
            tick.tick().await;
            loop {
                let changed = async {
                    match changes.as_mut() {
                        Some(c) => c.changed().await,
                        None => std::future::pending().await,
                    }
                };
                // A name's answer expires (its TTL): resolve again then, at most once a second.
                let expires = resync.known.lock().await.expires();
                let ttl = async {
                    match expires {
                        Some(at) => {
                            let at = tokio::time::Instant::from_std(at)
                                .max(tokio::time::Instant::now() + Duration::from_secs(1));
                            tokio::time::sleep_until(at).await
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = ttl => {}
                    result = changed => if let Err(error) = result {
                        tracing::error!(%error, "address change notifications stopped; re-reading every resolve interval");
                        changes = None;
                    },
                }
                *resync.locals.write().unwrap_or_else(|e| e.into_inner()) = read_locals();
                if let Err(error) = resync.resync().await {
                    tracing::error!(%error, "re-syncing kernel rules failed");
                }
            }
        });

        let watcher = service.clone();
        let watch = tokio::spawn(async move {
            // Events that did not fit the ring are themselves an event (issue 15.2: they showed
            // only in /health). The counters are pinned with the maps: drops from before this
            // daemon (say while none ran) are reported at its start.
            let mut reported = (0, 0);
            watcher.report_drops(&mut reported, "before this daemon started");
            watcher.report_summaries();
            let mut tick = tokio::time::interval(watch_every);
            loop {
                tick.tick().await;
                watcher.watch();
                watcher.report_drops(&mut reported, "since the last check");
                watcher.report_summaries();
            }
        });
        service
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend([read, sync, watch]);
        Ok(service)
    }

    /// Stops the background tasks: the reader hands over what is left in the ring (and drops
    /// its event sink), the others end. The programs stay attached, pinned, until their
    /// sessions are closed, this daemon's or the next one's.
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
        let rules = resolve_rules(&endpoints, &mut *self.known.lock().await).await;
        let locals = self
            .locals
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sync_rules(&rules, &locals)
    }

    /// Creates (or reuses) the session's cgroup and attaches the programs to it.
    pub fn open_session(&self, name: &str) -> Result<SessionCgroup, SessionError> {
        let cgroup = SessionCgroup::create(name)?;
        if let Err(error) = self.register(name, &cgroup) {
            // Not watched, so not left behind: an empty cgroup nobody would close.
            if let Err(cleanup) = cgroup.remove_if_empty() {
                tracing::warn!(session = %name, %cleanup, "removing the cgroup of a session that failed to open");
            }
            return Err(error);
        }
        Ok(cgroup)
    }

    fn register(&self, name: &str, cgroup: &SessionCgroup) -> Result<usize, SessionError> {
        let id = cgroup.id()?;
        let adopted = self
            .monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .attach(name, cgroup.path())?;
        self.sessions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .open
            .insert(id, name.to_owned());
        Ok(adopted)
    }

    /// The sessions adopted at start (once).
    pub fn take_adopted(&self) -> Vec<(String, SessionCgroup)> {
        std::mem::take(&mut *self.adopted.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes over the sessions a daemon before this one left pinned (it died, or stopped while
    /// they still had processes): their programs never stopped enforcing; from now on their
    /// events are read and their programs watched again. A pinned session whose cgroup is gone
    /// is unpinned. Sessions pinned by another build are reported, and left as they are.
    fn adopt_pinned(&self) -> Result<Vec<(String, SessionCgroup)>, SessionError> {
        let (names, foreign) = {
            let monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
            (
                monitor.pins().sessions()?,
                monitor.pins().foreign_sessions(),
            )
        };
        for path in foreign {
            let session = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let detail = format!(
                "session {session:?} is pinned at {} by another build of toolwall: its programs still enforce that build's last rules, but this daemon cannot read its events or change its rules; end the session's processes and remove the pins (`rm -r {}`)",
                path.display(),
                path.display()
            );
            tracing::error!("{detail}");
            self.alert(&session, "foreign_pins", detail, None, Action::Allow);
        }
        let root = crate::cgroup::cgroup2_mount()?;
        let mut adopted = Vec::new();
        for name in names {
            let cgroup = SessionCgroup::create_under(&root, &name)?;
            if !cgroup.path().exists() {
                continue;
            }
            let links = self.register(&name, &cgroup)?;
            let processes = cgroup.processes().map(|p| p.len()).unwrap_or(0);
            let detail = format!(
                "re-adopted session {name:?} left pinned by an earlier daemon: {links} of {} programs were still attached, {processes} processes in it",
                super::PROGRAMS.len()
            );
            tracing::warn!("{detail}");
            self.alert(&name, "session_adopted", detail, None, Action::Allow);
            adopted.push((name, cgroup));
        }
        Ok(adopted)
    }

    /// Limits a session's cgroup (a daemon-run stdio server's) to the destinations its
    /// declaration allows (`egress:`); refused connections are recorded as the server's.
    pub fn limit_egress(
        &self,
        name: &str,
        cgroup: &SessionCgroup,
        server_id: &str,
        allowed: &[crate::config::EgressRule],
    ) -> Result<(), SessionError> {
        let id = cgroup.id()?;
        let allowed: Vec<(std::net::Ipv6Addr, u32, u16)> = allowed
            .iter()
            .map(|rule| match rule.addr {
                IpAddr::V4(v4) => (v4.to_ipv6_mapped(), 96 + u32::from(rule.prefix), rule.port),
                IpAddr::V6(v6) => (v6, u32::from(rule.prefix), rule.port),
            })
            .collect();
        self.egress_owners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, server_id.to_owned());
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .limit_egress(name, id, &allowed)?;
        Ok(())
    }

    /// The id and kind of the server a kernel event names: a rule's endpoint, or for a refused
    /// egress the declared stdio server whose cgroup it came from.
    fn server_of(&self, server_index: u32, cgroup_id: u64) -> (String, String) {
        if server_index == agent_common::rule::EGRESS_INDEX {
            let owners = self.egress_owners.read().unwrap_or_else(|e| e.into_inner());
            return (
                owners.get(&cgroup_id).cloned().unwrap_or_default(),
                "stdio".to_owned(),
            );
        }
        let endpoints = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        endpoints
            .get(server_index as usize)
            .map(|e| (e.id.clone(), e.kind.clone()))
            .unwrap_or_default()
    }

    /// Detaches from the session's cgroup, unpins it and removes the cgroup if it is empty.
    pub fn close_session(&self, name: &str, cgroup: &SessionCgroup) -> Result<bool, SessionError> {
        let id = cgroup.id()?;
        {
            let mut monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
            monitor.detach(name)?;
            monitor.forget_egress(id)?;
        }
        self.egress_owners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        let drains = self.drains.load(Ordering::Acquire);
        self.sessions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .close(id, drains);
        self.members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        Ok(cgroup.remove_if_empty()?)
    }

    /// Removes the maps' pins when no session is left pinned (a clean stop).
    pub fn unpin_if_unused(&self) -> Result<bool, NetmonError> {
        Ok(self
            .monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pins()
            .remove_if_unused()?)
    }

    /// One round of the watch: a program detached from a session is attached again, a process
    /// that left its session is moved back; each is recorded as a `kernel_alert`.
    fn watch(&self) {
        let sessions: Vec<(String, std::path::PathBuf)> = {
            let monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
            let names: Vec<String> = self
                .sessions
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .open
                .values()
                .cloned()
                .collect();
            names
                .into_iter()
                .filter_map(|n| {
                    let path = monitor.cgroup_of(&n)?.to_path_buf();
                    Some((n, path))
                })
                .collect()
        };
        for (name, path) in sessions {
            let detached = self
                .monitor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .detached(&name);
            if !detached.is_empty() {
                let result = self
                    .monitor
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .attach(&name, &path);
                let detail = match result {
                    Ok(_) => format!(
                        "{} detached from session {name:?}; attached again",
                        detached.join(", ")
                    ),
                    Err(error) => format!(
                        "{} detached from session {name:?}; attaching again failed: {error}",
                        detached.join(", ")
                    ),
                };
                tracing::error!("{detail}");
                self.alert(&name, "program_detached", detail, None, Action::Block);
            }
            self.watch_members(&name, &SessionCgroup::at(&path));
        }
    }

    fn watch_members(&self, name: &str, cgroup: &SessionCgroup) {
        let Ok(now) = cgroup.all_processes() else {
            return;
        };
        let now: HashSet<u32> = now.into_iter().collect();
        let before = self
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), now.clone())
            .unwrap_or_default();
        for pid in before.difference(&now) {
            // Gone from the session: exited (fine), or alive elsewhere (it left).
            let Some(elsewhere) = crate::cgroup::cgroup_path_of(&pid.to_string()) else {
                continue;
            };
            // A zombie still names its last cgroup.
            if crate::cgroup::session_in(&format!("0::{elsewhere}")).as_deref() == Some(name) {
                continue;
            }
            let moved_back = cgroup.add_process(*pid);
            let detail = match &moved_back {
                Ok(()) => format!(
                    "process {pid} left session {name:?} for cgroup {elsewhere}; moved back"
                ),
                Err(error) => format!(
                    "process {pid} left session {name:?} for cgroup {elsewhere}; moving it back failed: {error}"
                ),
            };
            tracing::error!("{detail}");
            self.members
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(name.to_owned())
                .or_default()
                .insert(*pid);
            let action = if moved_back.is_ok() {
                Action::Block
            } else {
                Action::Allow
            };
            self.alert(name, "process_left", detail, Some(*pid), action);
        }
    }

    fn alert(&self, session: &str, alert: &str, detail: String, pid: Option<u32>, action: Action) {
        self.sink.emit(Event::KernelAlert(KernelAlert {
            timestamp: Utc::now(),
            session_id: session.to_owned(),
            alert: alert.to_owned(),
            detail,
            pid,
            action,
        }));
    }

    /// Records an `events_lost` alert when the kernel counted ring drops past `reported.0`, and
    /// an `egress_dropped` one when the egress guards dropped packets past `reported.1`.
    fn report_drops(&self, reported: &mut (u64, u64), when: &str) {
        let Ok(counters) = self.counters() else {
            return;
        };
        if counters.ring_drops > reported.0 {
            let lost = counters.ring_drops - reported.0;
            let detail = format!(
                "{lost} kernel events did not fit the event ring {when} (their connections were still decided: denied ones refused); {} in all since the programs were loaded",
                counters.ring_drops
            );
            tracing::error!("{detail}");
            self.alert("", "events_lost", detail, None, Action::Allow);
            reported.0 = counters.ring_drops;
        }
        if counters.egress_drops > reported.1 {
            let dropped = counters.egress_drops - reported.1;
            let detail = format!(
                "{dropped} packets of daemon-run stdio servers went to or came from where their declarations' `egress:` does not allow (ICMP, raw or inbound: no connect() to refuse), {when}; dropped"
            );
            tracing::warn!("{detail}");
            self.alert("", "egress_dropped", detail, None, Action::Block);
            reported.1 = counters.egress_drops;
        }
    }

    /// Counters, for the health endpoint and drop reports.
    pub fn counters(&self) -> Result<super::Counters, NetmonError> {
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counters()
    }

    fn to_event(&self, c: &Connect) -> Event {
        let (server_id, server_type) = self.server_of(c.raw.server_index, c.raw.cgroup_id);
        let session = self
            .sessions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .name(c.raw.cgroup_id)
            .map(str::to_owned);
        let process = ProcessInfo::of(c.raw.pid);
        Event::McpNetworkConnection(NetworkConnection {
            timestamp: Utc::now(),
            session_id: session.unwrap_or_default(),
            remote_addr: c.dest.to_string(),
            server_id,
            server_type,
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
            protocol: protocol_name(c.raw.protocol, c.raw.hook),
            family: family_name(c.raw.family),
            count: 1,
            since: None,
        })
    }

    /// Turns what the kernel summarised since the last report into one event per key
    /// (`count` > 1), and forgets the keys of sessions that are gone once reported.
    fn report_summaries(&self) {
        let mut monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
        let summaries = match monitor.summaries() {
            Ok(s) => s,
            Err(error) => {
                tracing::error!(%error, "cannot read the kernel's connection summaries");
                return;
            }
        };
        let clock = KtimeClock::now();
        for (key, summary) in summaries {
            let session = self
                .sessions
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .name(key.cgroup_id)
                .map(str::to_owned);
            let new = summary.summarised.saturating_sub(summary.seen.reported);
            if new > 0 {
                let last = &summary.last;
                let first_ns = if summary.seen.reported == 0 {
                    summary.first_ns
                } else {
                    summary.seen.last_ns
                };
                let (server_id, server_type) = self.server_of(key.server_index, key.cgroup_id);
                let dest = std::net::SocketAddr::new(super::events::dest_ip(&last.addr), last.port);
                let comm = String::from_utf8_lossy(
                    last.comm.split(|b| *b == 0).next().unwrap_or_default(),
                )
                .into_owned();
                let event = Event::McpNetworkConnection(NetworkConnection {
                    timestamp: clock.wall(last.last_ns),
                    session_id: session.clone().unwrap_or_default(),
                    remote_addr: dest.to_string(),
                    server_id,
                    server_type,
                    action: if key.verdict == agent_common::connect::VERDICT_DENIED {
                        Action::Block
                    } else {
                        Action::Allow
                    },
                    pid: last.pid,
                    tid: 0,
                    uid: last.uid,
                    comm,
                    exe: None,
                    cmdline: None,
                    ppid: None,
                    cgroup_id: key.cgroup_id,
                    socket_cookie: 0,
                    protocol: protocol_name(key.protocol, key.hook),
                    family: family_name(last.family),
                    count: new,
                    since: Some(clock.wall(first_ns)),
                });
                self.sink.emit(event);
                let seen = agent_common::summary::SummarySeen {
                    reported: summary.summarised,
                    last_ns: last.last_ns,
                };
                if let Err(error) = monitor.summary_reported(key, seen) {
                    tracing::error!(%error, "cannot record a reported summary; it may be reported again");
                }
            }
            if session.is_none()
                && let Err(error) = monitor.forget_summary(key)
            {
                tracing::warn!(%error, "cannot forget the summary of a session that is gone");
            }
        }
    }
}

fn protocol_name(protocol: u8, hook: u8) -> String {
    match (protocol, hook) {
        (17, agent_common::connect::HOOK_SENDMSG) => "udp-sendmsg".into(),
        (6, _) => "tcp".into(),
        (17, _) => "udp".into(),
        (n, _) => n.to_string(),
    }
}

fn family_name(family: u16) -> String {
    if family == agent_common::connect::FAMILY_INET {
        "ipv4".into()
    } else {
        "ipv6".into()
    }
}

/// Wall-clock times of `bpf_ktime_get_ns` values (CLOCK_MONOTONIC), from one reading of both.
struct KtimeClock {
    mono_ns: u64,
    wall: DateTime<Utc>,
}

impl KtimeClock {
    fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        KtimeClock {
            mono_ns: ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            wall: Utc::now(),
        }
    }

    fn wall(&self, ktime_ns: u64) -> DateTime<Utc> {
        let ago = self.mono_ns.saturating_sub(ktime_ns);
        self.wall - chrono::Duration::nanoseconds(ago.min(i64::MAX as u64) as i64)
    }
}

/// The host's addresses, or none (loopback and unspecified are covered regardless) with an
/// error when they cannot be read.
fn read_locals() -> Vec<IpAddr> {
    super::local::local_addresses().unwrap_or_else(|error| {
        tracing::error!(%error, "cannot list the host's addresses; rules on local addresses cover loopback only");
        Vec::new()
    })
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
    /// Pin trouble.
    #[error(transparent)]
    Pins(#[from] super::pins::PinError),
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
                except: Vec::new(),
            },
            WatchedEndpoint {
                id: "b".into(),
                kind: "sse".into(),
                host: "[::1]".into(),
                port: 3002,
                action: RuleAction::Flag,
                except: Vec::new(),
            },
            WatchedEndpoint {
                id: "c".into(),
                kind: "http".into(),
                host: "no-such-host.invalid".into(),
                port: 1,
                action: RuleAction::Deny,
                except: Vec::new(),
            },
        ];
        let mut known = LastKnown::default();
        let rules = resolve_rules(&endpoints, &mut known).await;
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
        let never = rules
            .iter()
            .filter(|r| r.server_index == 2)
            .collect::<Vec<_>>();
        assert_eq!(
            never.len(),
            1,
            "a DENY name that never resolved: its port denied everywhere"
        );
        assert_eq!((never[0].prefix, never[0].port), (0, 1));
        assert!(never[0].addr.is_unspecified());
    }

    #[tokio::test]
    async fn a_name_that_stops_resolving_keeps_its_last_addresses() {
        let mut known = LastKnown::default();
        known
            .addresses
            .insert("gone.invalid".into(), vec!["192.0.2.9".parse().unwrap()]);
        let endpoint = |action| WatchedEndpoint {
            id: "a".into(),
            kind: "http".into(),
            host: "gone.invalid".into(),
            port: 80,
            action,
            except: Vec::new(),
        };
        for action in [RuleAction::Deny, RuleAction::Flag] {
            let rules = resolve_rules(&[endpoint(action)], &mut known).await;
            assert_eq!(
                rules,
                vec![Rule::exact("192.0.2.9".parse().unwrap(), 80, 0, action)]
            );
        }
        let mut fresh = LastKnown::default();
        assert!(
            resolve_rules(&[endpoint(RuleAction::Flag)], &mut fresh)
                .await
                .is_empty(),
            "a FLAG name that never resolved has nothing to flag"
        );
    }

    #[test]
    fn closed_sessions_keep_their_events_until_a_whole_drain_ran() {
        let mut attribution = Attribution::default();
        attribution.open.insert(7, "s".into());
        attribution.close(7, 10);
        assert_eq!(
            attribution.name(7),
            Some("s"),
            "closed, events may be in the ring"
        );
        attribution.retire(11);
        assert_eq!(
            attribution.name(7),
            Some("s"),
            "the drain under way at the close"
        );
        attribution.retire(12);
        assert_eq!(attribution.name(7), None, "a whole drain ran since");
    }

    #[test]
    fn process_info_of_this_process_and_of_a_gone_one() {
        let me = ProcessInfo::of(std::process::id());
        assert!(me.exe.is_some() && me.cmdline.is_some() && me.ppid.is_some());
        let gone = ProcessInfo::of(u32::MAX - 1);
        assert!(gone.exe.is_none());
    }
}
