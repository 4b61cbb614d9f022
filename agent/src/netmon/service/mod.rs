//! The kernel layer as the daemon runs it: keeps the rule maps in sync with the watched servers
//! (re-resolving their host names on a timer, re-reading the host's addresses when they change),
//! turns kernel events into `mcp_network_connection` events, manages session cgroups, and
//! watches each session for a detached program or a process that left.

mod backlog;
mod report;
mod resolve;
mod sessions;
mod takeover;

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

pub(crate) use resolve::{LastKnown, WatchedEndpoint, resolve_rules};
use sessions::Attribution;

use super::{
    KernelMonitor, NetmonError,
    boundary::{self, ALLOW_ENDPOINT, BoundaryMode},
    events,
    local::AddressChanges,
};
use crate::{
    cgroup::{CgroupError, SessionCgroup},
    events::EventSink,
};

/// The running kernel layer.
#[derive(Clone)]
pub(crate) struct NetmonService {
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
    /// Connections counted while the event queue was full (`backlog.rs`).
    backlog: Arc<Mutex<backlog::Backlog>>,
    /// What the session boundary refuses (`netmon.egress.mode`).
    boundary: BoundaryMode,
    /// The ports this daemon added to the kernel's reserved ports.
    reserved_added: Arc<Mutex<std::collections::BTreeSet<u16>>>,
}

impl NetmonService {
    /// Takes over a loaded monitor: syncs the rules now, again every `resolve_every` and on
    /// every change of the host's addresses, records every kernel event into `sink`, and every
    /// `watch_every` checks each session's programs and processes, until the returned service
    /// and its tasks are dropped. `boundary` is laid under the endpoints' rules.
    pub(crate) async fn start(
        mut monitor: KernelMonitor,
        endpoints: Vec<WatchedEndpoint>,
        boundary: BoundaryMode,
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
            backlog: Arc::default(),
            boundary,
            reserved_added: Arc::default(),
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
            let emit = |connect: events::Connect| reader.record(reader.to_event(&connect));
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
            // Events that did not fit the ring are themselves an event (not only a count in
            // /health, where no record shows them). The counters are pinned with the maps:
            // drops from before this daemon (say while none ran) are reported at its start.
            let mut reported = (0, 0);
            watcher.report_drops(&mut reported, "before this daemon started");
            watcher.report_summaries();
            let mut tick = tokio::time::interval(watch_every);
            loop {
                tick.tick().await;
                watcher.watch();
                watcher.flush_backlog();
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
    pub(crate) async fn shutdown(&self) {
        let _ = self.stop.send(true);
        {
            let mut added = self
                .reserved_added
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Err(error) = boundary::reserve_from_autobind(&Default::default(), &mut added) {
                tracing::warn!(%error, ports = ?*added, "cannot give back the ports added to net.ipv4.ip_local_reserved_ports");
            }
        }
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

    /// Watches `endpoints` from now on (a new policy's servers: `daemon/bundle.rs`), the
    /// kernel's rules synced before this returns. On failure the previous endpoints are put
    /// back and synced again, and the error returned: the kernel keeps the rules in force.
    pub(crate) async fn set_endpoints(
        &self,
        endpoints: Vec<WatchedEndpoint>,
    ) -> Result<(), NetmonError> {
        let previous = std::mem::replace(
            &mut *self.endpoints.write().unwrap_or_else(|e| e.into_inner()),
            endpoints,
        );
        let Err(error) = self.resync().await else {
            return Ok(());
        };
        *self.endpoints.write().unwrap_or_else(|e| e.into_inner()) = previous;
        if let Err(again) = self.resync().await {
            tracing::error!(error = %again, "restoring the kernel's previous rules failed too; the next resync retries");
        }
        Err(error)
    }

    async fn resync(&self) -> Result<(), NetmonError> {
        let endpoints = self
            .endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut rules = resolve_rules(&endpoints, &mut *self.known.lock().await).await;
        let locals = self
            .locals
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let table = match self.boundary {
            BoundaryMode::Off => Default::default(),
            _ => super::routes::local_table().unwrap_or_else(|error| {
                tracing::error!(%error, "cannot read the kernel's local routing table; the host is its interface addresses only, and datagrams to broadcast addresses outside the private ranges are not refused");
                Default::default()
            }),
        };
        rules.extend(boundary::refusals(self.boundary, &table));
        // Listeners: declared network servers, toolwall's own API and proxy, and the host
        // services `netmon.egress.allow` opens (a filter proxy, a database): a session holding
        // one of their ports while it restarts would answer the clients outside.
        let listener = |index: u32| {
            endpoints.get(index as usize).is_some_and(|e| {
                matches!(e.kind.as_str(), "http" | "sse" | "api" | "toolwall")
                    || e.id == ALLOW_ENDPOINT
            })
        };
        let reserved = boundary::reserved_ports(&rules, &locals, listener);
        {
            let mut added = self
                .reserved_added
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Err(error) = boundary::reserve_from_autobind(&reserved, &mut added) {
                tracing::error!(%error, "cannot add toolwall's ports to net.ipv4.ip_local_reserved_ports; a session's listen() without bind() may be given one of them while it is free");
            }
        }
        let mut monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
        monitor.sync_rules(&rules, &locals)?;
        monitor.sync_reserved_ports(&reserved)
    }

    /// Counters, for the health endpoint and drop reports.
    /// Why sessions get no Unix socket confinement; `None` when they have it.
    pub(crate) fn unix_missing(&self) -> Option<String> {
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unix_missing()
            .map(str::to_owned)
    }

    pub(crate) fn counters(&self) -> Result<super::Counters, NetmonError> {
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counters()
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
pub(crate) enum SessionError {
    /// cgroup trouble.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Attach trouble.
    #[error(transparent)]
    Netmon(#[from] NetmonError),
    /// Pin trouble.
    #[error(transparent)]
    Pins(#[from] super::pins::PinError),
    /// Another build's session that is not this daemon's to take over.
    #[error("{0}")]
    Foreign(String),
}
